"""remedies.toml: each remedy the scan names matched to what the detector records at real code
(the labelled cases of its truth suite), the code that needs none left without one, and a bad
table refused in one line naming the field."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from hostsync.detector import SyncScope, ops, truth
from hostsync.detector.sites import COMPILED, Site
from hostsync.sites.remedies import Remedies, load_remedies
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import ROOT, Layout

REMEDIES = load_remedies(Layout())


def logged_loss() -> float:
    """The loss read for the log every step."""
    loss = truth.values().pow(2).mean()
    total = 0.0
    total += loss.item()
    return total


def remedies_of(code: Callable[[], object]) -> list[tuple[str, str | None]]:
    """Each event the detector records running `code`: its kind and the remedy matched to it."""
    with SyncScope() as scope:
        code()
    return [
        (event.kind, getattr(REMEDIES.remedy_for((event.kind,), event.site), "name", None))
        for event in scope.events
    ]


@pytest.mark.parametrize(
    ("code", "remedy"),
    [
        (logged_loss, "device-accumulator"),
        (truth.item, "device-accumulator"),
        (truth.if_on_tensor, "if-tensor"),
        (truth.host_to_device, "pinned-batch-copy"),
        (truth.collated_batch_to_device, "pinned-batch-copy"),
        (truth.index_with_numpy_array, "device-index"),
        (truth.assign_at_numpy_index, "device-index"),
        (truth.index_with_host_tensor, "device-index"),
        (truth.clip_grad_norm_checking, "nonfinite-check"),
        (truth.linalg_inv, "linalg-ex"),
        (truth.one_hot_inferred_classes, "one-hot-classes"),
    ],
)
def test_each_remedy_is_matched_to_what_the_detector_records(
    code: Callable[[], object], remedy: str
) -> None:
    found = remedies_of(code)

    assert found and {name for _, name in found} == {remedy}, found


@pytest.mark.parametrize(
    "code",
    [
        truth.linalg_inv_ex,
        truth.one_hot_with_classes,
        truth.host_to_device_non_blocking,
        truth.index_with_long_tensor,
    ],
)
def test_the_remedied_code_makes_no_read_to_remedy(code: Callable[[], object]) -> None:
    """What a remedy says to write instead: the detector records nothing there."""
    assert remedies_of(code) == []


def test_a_read_no_remedy_covers_has_none() -> None:
    """nonzero's output size is read from the device: no table of the file says what to do."""
    assert remedies_of(truth.nonzero) == [("nonzero", None)]


def test_the_first_matching_remedy_wins() -> None:
    """An `if` on a read `.item()` is an `if`: the narrower table comes first."""
    site = Site("train.py", 3, "main", "if loss.item() > 4:")

    remedy = REMEDIES.remedy_for(("scalar_read",), site)

    assert remedy is not None and remedy.name == "if-tensor"
    assert REMEDIES.remedy_for(("nonzero",), site) is None


def test_every_kind_a_remedy_names_is_one_the_detector_records() -> None:
    recorded = {entry.kind for entry in (*ops.KERNEL_SYNCS, *ops.FUNCTION_SYNCS)} | {COMPILED}
    named = {kind for remedy in REMEDIES.remedy for kind in remedy.kinds}

    assert named <= recorded, named - recorded
    assert all(remedy.reason and remedy.cost for remedy in REMEDIES.remedy)


@pytest.mark.parametrize(
    ("pattern", "replacement", "named"),
    [
        (r"code = 'one_hot\\\(", "code = 'one_hot(", "remedy[2].code: is no regular expression"),
        (r'name = "if-tensor"', 'name = "linalg-ex"', "remedy: names ['linalg-ex'] more than once"),
        (r"cost = \"none", 'costs = "none', "remedy[2]: has unknown keys ['costs']"),
        (r'reason = "without[^\n]*', 'reason = " "', "remedy[2].reason: is blank"),
        (r'kinds = \["scalar_read"\]', "kinds = []", "remedy[0].kinds: is empty"),
    ],
)
def test_a_bad_table_is_refused_in_one_line_naming_its_field(
    tmp_path: Path, pattern: str, replacement: str, named: str
) -> None:
    text, edits = re.subn(pattern, replacement, (ROOT / "remedies.toml").read_text(), count=1)
    assert edits == 1, pattern
    (tmp_path / "remedies.toml").write_text(text)

    with pytest.raises(WorkspaceError) as refused:
        load_remedies(Layout(tmp_path))

    message = str(refused.value)
    assert message.startswith(f"remedies.toml: {named}") and "fix the remedy" in message, message
    assert "\n" not in message


def test_no_remedies_file_is_refused_naming_the_fix(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceError, match=r"no remedies\.toml at .*: restore it"):
        load_remedies(Layout(tmp_path))


def test_an_empty_table_matches_nothing() -> None:
    assert Remedies().remedy_for(("scalar_read",), Site("a.py", 1, "f", "x.item()")) is None
