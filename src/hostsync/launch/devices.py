"""What a tree's interpreter offers (versions, GPUs), and which device its ranks run on.

The launcher runs in a plain interpreter without torch; each tree runs in the environment that
fits it (`envs`). So questions about torch, CUDA and installed versions go to that environment's
interpreter, once per interpreter.
"""

from __future__ import annotations

import functools
import json
import subprocess

from hostsync.workspace.errors import WorkspaceError, last_line
from hostsync.workspace.projects import probed_packages
from hostsync.workspace.records import Device, Environment

# Without a GPU driver (NVIDIA's, or ROCm's /dev/kfd) torch.cuda cannot be available: the probe
# then skips importing torch, a second and more of each run on a machine without a GPU.
_PROBE = """
import json, os, platform, sys
from importlib import metadata
packages = {}
for name in sys.argv[1:]:
    try:
        packages[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        packages[name] = "not installed"
driver = os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/kfd")
if driver:
    import torch
cuda = driver and torch.cuda.is_available()
print(json.dumps({
    "python": platform.python_version(), "packages": packages, "platform": platform.platform(),
    "device": torch.cuda.get_device_name(0) if cuda else "cpu",
    "device_count": torch.cuda.device_count() if cuda else 0,
}))
"""


@functools.cache
def describe(python: str) -> Environment:
    """The environment a result was measured in: versions (of what is installed there; the tree
    under test reports its own), device, platform."""
    probe = [python, "-c", _PROBE, *probed_packages()]
    done = subprocess.run(probe, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise WorkspaceError(f"cannot probe the environment {python}: {last_line(done.stderr)}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return Environment(**found)


def resolve_device(requested: str, ranks: int, python: str) -> Device:
    """`cuda` (NCCL) needs one GPU per rank: NCCL refuses two ranks on one GPU."""
    gpus = describe(python).device_count
    if requested == "auto":
        return Device.CUDA if gpus >= ranks else Device.CPU
    if requested == Device.CUDA and gpus < ranks:
        raise WorkspaceError(
            f"--device cuda with {ranks} ranks needs {ranks} GPUs, one per rank (NCCL refuses two"
            f" ranks on one GPU), and this machine has {gpus}: pass --device cpu, or fewer ranks"
        )
    return Device(requested)


def device_env(device: Device) -> dict[str, str]:
    """On CPU, hide any GPU: DeepSpeed and accelerate would otherwise pick CUDA."""
    return {"CUDA_VISIBLE_DEVICES": ""} if device == Device.CPU else {}
