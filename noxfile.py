"""Sessions of the hidden-host-sync workspace.

Each session is thin: it prepares an environment and runs `python -m hostsync COMMAND`, where the
logic lives (src/hostsync). Options after `--` go to the command, e.g. `nox -s repro -- --sp 2`.
A prepared environment (a GPU box with its own CUDA torch) works too: run nox with its
interpreter, `python -m nox --no-venv -s repro`, which checks it against pin.toml instead of
installing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nox
from nox.virtualenv import PassthroughEnv

ROOT = Path(__file__).parent
SRC = ROOT / "src"
sys.path.insert(0, str(SRC))

from hostsync import pin  # noqa: E402 (standard library only: safe before any install)

nox.needs_version = ">=2024.10.9"
nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["lint", "tests"]


def prepare(session: nox.Session) -> None:
    """Install pin.toml's versions, or check that a prepared environment satisfies it."""
    if prepared(session):
        hostsync(session, "check-env")
    else:
        session.install(*pin.load().install_specs())


def prepared(session: nox.Session) -> bool:
    """`--no-venv`: the environment is the interpreter running nox, not whatever `python` is
    first on the PATH (version managers' shims reorder it)."""
    return isinstance(session.virtualenv, PassthroughEnv)


def hostsync(session: nox.Session, command: str, *args: str, python: str = "python") -> None:
    python = sys.executable if prepared(session) else python
    session.run(python, "-m", "hostsync", command, *args, env={"PYTHONPATH": str(SRC)})


@nox.session(python=False)
def clone(session: nox.Session) -> None:
    """Materialise the pinned transformers in work/transformers and apply patches/ (git only)."""
    hostsync(session, "clone", *session.posargs, python=sys.executable)


@nox.session(python=False)
def export_patches(session: nox.Session) -> None:
    """Write the commits of `patched` in work/transformers back into patches/."""
    hostsync(session, "export-patches", *session.posargs, python=sys.executable)


@nox.session
def repro(session: nox.Session) -> None:
    """The multi-rank SP reproducer: pinned, patched and upstream-fixed trees side by side."""
    prepare(session)
    hostsync(session, "repro", *session.posargs)


@nox.session
def test_patch(session: nox.Session) -> None:
    """Red on the pinned tree, green on the patched tree and on upstream's fixed release."""
    prepare(session)
    hostsync(session, "test-patch", *session.posargs)


@nox.session
def profile(session: nox.Session) -> None:
    """Before/after profiles of the loss computation (Nsight Systems, else the PyTorch profiler)."""
    prepare(session)
    hostsync(session, "profile", *session.posargs)


@nox.session
def review(session: nox.Session) -> None:
    """Issue and PR drafts, and the review bundle, from the measured result files."""
    prepare(session)
    hostsync(session, "review", *session.posargs)


@nox.session
def hunt(session: nox.Session) -> None:
    """Every host sync of a full SP training step, ranked: the next contribution."""
    prepare(session)
    hostsync(session, "hunt", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Wall time of the reproducer, cold and warm, and the sync detector's overhead."""
    prepare(session)
    hostsync(session, "bench", *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """The workspace's tests, including the red/green proof of the patch series."""
    prepare(session)
    python = sys.executable if prepared(session) else "python"
    session.run(python, "-m", "pytest", *session.posargs, env={"PYTHONPATH": str(SRC)})


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the workspace (the patches are linted with transformers' rules by test_patch)."""
    session.install("ruff>=0.14")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
