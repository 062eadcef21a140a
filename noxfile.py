"""Sessions of the hidden-host-sync workspace.

Each session is thin: `python -m hostsync COMMAND`, where the logic lives (src/hostsync). Options
after `--` go to the command, e.g. `nox -s repro -- --case trainer-nan-filter`. The commands run
in the workspace's own environments under work/envs/, one per distinct dependency set, shared by
every session (`python -m hostsync env` prints the one they run in); nox makes none of its own.
A prepared environment (a GPU box with its own CUDA torch) works too: run nox with its
interpreter, `python -m nox --no-venv -s repro`, which checks it instead of installing anything.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import tomllib
from pathlib import Path

import nox

# Ctrl-C stops a session even where nox started with it ignored (a job a script runs in the
# background): nox then waits for the command, which stops its processes (see INTERRUPT).
signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = Path(__file__).parent
SRC = str(ROOT / "src")

nox.needs_version = ">=2024.10.9"
nox.options.sessions = ["lint", "tests"]


def prepared(session: nox.Session) -> bool:
    """`--no-venv`: the environment is the interpreter running nox (not whatever `python` is
    first on the PATH: version managers' shims reorder it)."""
    config = session._runner.global_config  # nox offers no public view of --no-venv
    return bool(config.no_venv or config.force_venv_backend == "none")


# On Ctrl-C the command stops the process groups it started (SIGTERM, SIGKILL 3 s later): nox
# waits that long for it before ending it, so that no rank outlives the session.
INTERRUPT = {"interrupt_timeout": 15.0, "terminate_timeout": 10.0}


def workspace_env(session: nox.Session, path: str = "") -> dict[str, str]:
    """The package, then `path`, on PYTHONPATH; whether the environment is prepared."""
    python_path = os.pathsep.join(filter(None, (SRC, path)))
    return {"PYTHONPATH": python_path, "HOSTSYNC_PREPARED": "1" if prepared(session) else "0"}


def env(session: nox.Session, *args: str) -> str:
    """What `python -m hostsync env ARGS` prints: a path."""
    found = session.run(
        sys.executable,
        "-m",
        "hostsync",
        "env",
        *args,
        env=workspace_env(session),
        silent=True,
        external=True,
        **INTERRUPT,
    )
    return found.strip().splitlines()[-1]


def workspace_python(session: nox.Session) -> str:
    """The workspace environment's interpreter (built on first use), or the prepared one."""
    return sys.executable if prepared(session) else env(session)


def run_module(session: nox.Session, module: str, *args: str, path: str = "") -> None:
    """`python -m module` in the workspace's environment, or the prepared one; `path` after the
    package on PYTHONPATH."""
    session.run(
        workspace_python(session),
        "-m",
        module,
        *args,
        env=workspace_env(session, path),
        **INTERRUPT,
    )


def hostsync(session: nox.Session, command: str, *args: str) -> None:
    run_module(session, "hostsync", command, *args)


@nox.session(python=False)
def clone(session: nox.Session) -> None:
    """Materialise a case's pinned release in work/clones/<case> and apply its patches."""
    hostsync(session, "clone", *session.posargs)


@nox.session(python=False)
def export_patches(session: nox.Session) -> None:
    """Write the commits of `patched` in a case's clone back into patches/<case>/."""
    hostsync(session, "export-patches", *session.posargs)


@nox.session(python=False)
def repro(session: nox.Session) -> None:
    """A case's reproducer on real processes: pinned, patched and upstream-fixed trees."""
    hostsync(session, "repro", *session.posargs)


@nox.session(python=False)
def test_patch(session: nox.Session) -> None:
    """Red on the pinned tree, green on the patched tree and on upstream's fixed release."""
    hostsync(session, "test-patch", *session.posargs)


@nox.session(python=False)
def profile(session: nox.Session) -> None:
    """Before/after profiles of a case's measured code (the PyTorch profiler, nsys on GPUs)."""
    hostsync(session, "profile", *session.posargs)


@nox.session(python=False)
def review(session: nox.Session) -> None:
    """A case's upstream drafts, filled from its measured result files."""
    hostsync(session, "review", *session.posargs)


@nox.session(python=False)
def outbox(session: nox.Session) -> None:
    """What would be sent upstream for a case, signed by its contributor (nothing is sent)."""
    hostsync(session, "outbox", *session.posargs)


@nox.session(python=False, tags=["expensive"])
def hunt(session: nox.Session) -> None:
    """Every host sync of a full SP training step, ranked: the next contribution."""
    hostsync(session, "hunt", *session.posargs)


@nox.session(python=False, tags=["expensive"])
def census(session: nox.Session) -> None:
    """Every host sync of the training setups users run (census.toml), today and with every fix."""
    hostsync(session, "census", *session.posargs)


@nox.session(python=False, tags=["expensive"])
def bench(session: nox.Session) -> None:
    """Wall time of a case's reproducer, and the sync detector's overhead and accuracy."""
    hostsync(session, "bench", *session.posargs)


@nox.session(python=False, tags=["expensive"])
def bisect(session: nox.Session) -> None:
    """Since which release a case's sites are upstream (and with --remote, which commit)."""
    hostsync(session, "bisect", *session.posargs)


@nox.session(python=False, tags=["expensive"])
def repin(session: nox.Session) -> None:
    """Move a case's card to its project's newest release; with --run, rerun it."""
    hostsync(session, "repin", *session.posargs)


@nox.session(python=False, tags=["expensive"])
def watch(session: nox.Session) -> None:
    """The newest releases against the pins: each case's sites, series and tests there."""
    hostsync(session, "watch", *session.posargs)


@nox.session(python=False, tags=["expensive"])
def survey(session: nox.Session) -> None:
    """A project's own tests without and with the pytest plugin (`-- --project peft`)."""
    hostsync(session, "survey", *session.posargs)


@nox.session(python=False)
def scan(session: nox.Session) -> None:
    """Every host sync of your own training script, run unchanged (`-- SCRIPT [ARGS...]`)."""
    # The script, its paths and its PYTHONPATH are the caller's: it runs from where nox was
    # started (`nox -f path/to/noxfile.py` from the script's own folder).
    session.chdir(session.invoked_from)
    run_module(session, "hostsync", "scan", *session.posargs, path=os.environ.get("PYTHONPATH", ""))


# The suite's workers, kept beside the environment. Most of the suite's time is ranks starting
# and waiting, so three workers keep two cores busy (tests/conftest.py says which tests share one).
SUITE_TOOLS = ("pytest-xdist==3.8.0", "execnet==2.1.2")
WORKERS = ("-n", "3")


@nox.session(python=False)
def tests(session: nox.Session) -> None:
    """The workspace's tests (the fast lane:
    `-- -m "not distributed and not network and not long_run"`)."""
    tools = env(session, "--tools", *SUITE_TOOLS)
    run_module(session, "pytest", *WORKERS, *session.posargs, path=tools)


@nox.session
def wheel(session: nox.Session) -> None:
    """The package as another project installs it: the wheel built from this checkout, in a
    fresh environment with only torch and pytest (pin.toml's), where the plugin's tests run and
    find the plugin by its entry point."""
    # Outside the checkout, as for any project: pytester's runs find no pyproject.toml above them,
    # and the build leaves nothing in the checkout (an egg-info under src/ would register it).
    dist = Path(tempfile.mkdtemp(prefix="hostsync-wheel-"))
    source = dist / "source"
    shutil.copytree(
        ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    session.run(
        "python", "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), str(source)
    )
    (built,) = dist.glob("hostsync-*.whl")
    pins = tomllib.loads((ROOT / "pin.toml").read_text())["dependencies"]
    session.install(
        *(f"{name}=={pins[name]['install']}" for name in ("torch", "pytest")), str(built)
    )
    # The workspace's addopts load the plugin with -p; here only its entry point does.
    session.run(
        "python",
        "-m",
        "pytest",
        "tests/test_pytest_plugin.py",
        "-o",
        "addopts=-ra --strict-markers",
        "-k",
        "not registers_the_plugin_for_any_project",
        env={"OMP_NUM_THREADS": "1", "TMPDIR": str(dist)},
    )
    shutil.rmtree(dist)


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy, strict, over src/hostsync, against the workspace environment's torch."""
    session.install("mypy==2.4.1")
    session.run("mypy", "--python-executable", workspace_python(session), *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the workspace (the patches are linted with each project's rules by test_patch)."""
    session.install("ruff>=0.14")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
