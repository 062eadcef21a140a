"""Check that a prepared environment (nox --no-venv) satisfies pin.toml, and describe it."""

from __future__ import annotations

import argparse
import platform
import sys
from importlib import metadata

from hostsync.errors import WorkspaceError
from hostsync.pin import load as load_pin


def main(argv: list[str]) -> int:
    argparse.ArgumentParser(
        prog="python -m hostsync check-env",
        description="Refuse an environment whose packages fall outside pin.toml's ranges.",
    ).parse_args(argv)
    check()
    print("environment satisfies pin.toml:", ", ".join(f"{k} {v}" for k, v in versions().items()))
    return 0


def check() -> None:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    problems = []
    for requirement in load_pin().requirements:
        try:
            installed = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            problems.append(f"{requirement.name} is not installed")
            continue
        if Version(installed) not in SpecifierSet(requirement.supported, prereleases=True):
            problems.append(f"{requirement.name} {installed} is outside {requirement.supported}")
    if problems:
        raise WorkspaceError(
            "the prepared environment does not fit pin.toml: "
            + "; ".join(problems)
            + f" in {sys.executable} (install the pinned versions there, or drop --no-venv to get"
            " a fresh virtualenv)"
        )


def resolve_device(requested: str, ranks: int) -> str:
    """`cuda` (NCCL) needs one GPU per rank: NCCL refuses two ranks on one GPU."""
    import torch

    gpus = torch.cuda.device_count()
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


def versions() -> dict[str, str]:
    """Installed versions of what a run depends on (the tree under test reports its own)."""
    found = {"python": platform.python_version()}
    for name in ("torch", "accelerate", "deepspeed", "tokenizers", "huggingface_hub"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def describe() -> dict:
    """The environment a result was measured in: versions, device, platform."""
    import torch

    cuda = torch.cuda.is_available()
    return {
        **versions(),
        "platform": platform.platform(),
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "device_count": torch.cuda.device_count() if cuda else 0,
    }
