"""Tools the workspace runs beside its environments, never inside them.

A project's linters and the suite's workers come from PyPI like the environments do. Each is
installed once into the download cache, in a folder of its own that joins `PYTHONPATH`. So an
environment stays as pin.toml builds it, and what it measures depends on nothing else.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from pathlib import Path

from hostsync.workspace.errors import WorkspaceError, last_line
from hostsync.workspace.layout import Layout

log = logging.getLogger(__name__)


def installed(layout: Layout, *requirements: str, deps: bool = True) -> Path:
    """The folder holding `requirements`, installed on first use.

    Without `deps`, only the named packages: they use what the interpreter running them has."""
    target = layout.cache / "tools" / "+".join(r.replace("==", "-") for r in requirements)
    if target.exists():
        return target
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    log.info("installing %s into %s", " ".join(requirements), target)
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(partial)]
    done = subprocess.run(
        [*command, *([] if deps else ["--no-deps"]), *requirements],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise WorkspaceError(
            f"cannot install {' '.join(requirements)} ({last_line(done.stderr)}): check the"
            " network to PyPI and that pip is in this environment"
        )
    partial.rename(target)
    return target
