"""What a tree's environment offers (versions, GPUs), asked of its own interpreter.

The launcher runs in a plain interpreter without torch; each tree runs in the environment that
fits it (`envs`). So questions about torch, CUDA and installed versions go to that environment's
interpreter, once per interpreter.
"""

from __future__ import annotations

import functools
import json
import subprocess

from hostsync.errors import WorkspaceError, last_line

_PROBE = """
import json, platform
from importlib import metadata
found = {"python": platform.python_version()}
for name in ("torch", "transformers", "accelerate", "deepspeed", "tokenizers", "huggingface_hub"):
    try:
        found[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        found[name] = "not installed"
import torch
cuda = torch.cuda.is_available()
found["platform"] = platform.platform()
found["device"] = torch.cuda.get_device_name(0) if cuda else "cpu"
found["device_count"] = torch.cuda.device_count() if cuda else 0
print(json.dumps(found))
"""


@functools.cache
def describe(python: str) -> dict:
    """The environment a result was measured in: versions (of what is installed there; the tree
    under test reports its own), device, platform."""
    done = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise WorkspaceError(f"cannot probe the environment {python}: {last_line(done.stderr)}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def resolve_device(requested: str, ranks: int, python: str) -> str:
    """`cuda` (NCCL) needs one GPU per rank: NCCL refuses two ranks on one GPU."""
    gpus = describe(python)["device_count"]
    if requested == "auto":
        return "cuda" if gpus >= ranks else "cpu"
    if requested == "cuda" and gpus < ranks:
        raise WorkspaceError(
            f"--device cuda with {ranks} ranks needs {ranks} GPUs, one per rank (NCCL refuses two"
            f" ranks on one GPU), and this machine has {gpus}: pass --device cpu, or fewer ranks"
        )
    return requested


def device_env(device: str) -> dict[str, str]:
    """On CPU, hide any GPU: DeepSpeed and accelerate would otherwise pick CUDA."""
    return {"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {}
