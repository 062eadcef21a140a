"""A fix's verdict from its cost before and after, and the claims a draft may make with it.

Each pair below is a pinned and a patched version of one step, measured with an accounting
scope: the verdict comes from what the scopes counted.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hostsync.detector import SyncScope
from hostsync.detector.records import Cost, DeviceWork
from hostsync.drafting.claims import check_claims
from hostsync.measure import cost
from hostsync.measure.cost import BOUND, assess, compare_costs, verdict_table
from hostsync.measure.records import CostComparison, FixVerdict, ScenarioRow
from hostsync.workspace import results
from hostsync.workspace.errors import WorkspaceError

import made
from conftest import make_workspace

DEVICE = torch.device("cpu")  # the device under test


def gradients() -> list[torch.Tensor]:
    return [torch.full((8,), 0.01, device=DEVICE) for _ in range(4)]


def clip_with_if(grads: list[torch.Tensor]) -> None:
    norm = torch.stack([g.norm() for g in grads]).norm()
    coefficient = 1.0 / (norm + 1e-6)
    if coefficient < 1:  # does not bind here: the multiply is skipped
        for g in grads:
            g.mul_(coefficient)


def clip_always_multiplying(grads: list[torch.Tensor]) -> None:
    norm = torch.stack([g.norm() for g in grads]).norm()
    coefficient = torch.clamp(1.0 / (norm + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coefficient)


def log_twice(grads: list[torch.Tensor]) -> tuple[float, float]:
    total = torch.stack([g.sum() for g in grads]).sum()
    return total.item(), total.item()


def log_once(grads: list[torch.Tensor]) -> tuple[float, float]:
    value = torch.stack([g.sum() for g in grads]).sum().item()
    return value, value


def read_twice(grads: list[torch.Tensor]) -> float:
    """A read in the middle of the step, then the step's own read, which waits for the rest."""
    for g in grads:
        g.mul_(0.5)
    grads[0].sum().item()
    for g in grads:
        g.add_(1.0)
    return grads[1].sum().item()


def read_at_the_end(grads: list[torch.Tensor]) -> float:
    for g in grads:
        g.mul_(0.5)
    for g in grads:
        g.add_(1.0)
    return grads[1].sum().item()


def log() -> int:
    """The host's work after a step's last read (formatting, logging): a window of
    milliseconds, whose spread from step to step dwarfs a window of microseconds."""
    return sum(i * i for i in range(50_000))


def measured(step) -> ScenarioRow:
    """Six optimizer steps of `step`, each then logged, under one accounting scope."""
    grads = gradients()
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
    with SyncScope(account=True) as scope:
        for _ in range(6):
            step(grads)
            log()
            optimizer.step()
    return ScenarioRow("tree", "python", 1, "step", costs=(scope.cost(steps=6),))


@pytest.mark.parametrize(
    ("pinned", "patched", "verdict"),
    [
        (read_twice, read_at_the_end, FixVerdict.MOVES_WAIT),
        (log_twice, log_once, FixVerdict.CLEANUP),
        (clip_with_if, clip_always_multiplying, FixVerdict.COSTS_MORE),
        (log_once, log_once, FixVerdict.NO_CHANGE),
    ],
)
def test_each_fix_is_judged_by_idle_time_saved_against_work_added(pinned, patched, verdict):
    judgement = assess(measured(pinned).cost, measured(patched).cost)
    assert judgement.verdict == verdict, judgement


def idle(*per_step: float, stalls: int = 1) -> Cost:
    """A cost of `len(per_step)` steps with these idle times, `stalls` stalls per step."""
    steps = len(per_step)
    return Cost(steps, stalls * steps, stalls * steps, DeviceWork(10 * steps), idle_us=per_step)


@pytest.mark.parametrize(
    ("before", "after", "verdict"),
    [
        (idle(900, 400, 410, 420), idle(900, 100, 105, 110, stalls=0), FixVerdict.SAVES_IDLE),
        (idle(900, 400, 300, 500), idle(900, 350, 360, 370, stalls=0), FixVerdict.MOVES_WAIT),
        (idle(30, 20, 21, 22), idle(30, 15, 16, 17, stalls=0), FixVerdict.MOVES_WAIT),
        (idle(400.0), idle(100.0, stalls=0), FixVerdict.MOVES_WAIT),
    ],
    ids=["drop beyond the spread", "within the spread", "below a launch", "one step"],
)
def test_idle_time_is_saved_only_beyond_its_spread_between_steps(before, after, verdict):
    judgement = assess(before, after)
    assert judgement.verdict == verdict, judgement


def test_the_first_of_three_or_more_steps_is_left_out_of_the_idle_verdict():
    judgement = assess(idle(5000, 400, 410, 420), idle(100, 100, 105, 110, stalls=0))
    assert judgement.idle_us == (410.0, 105.0)
    assert judgement.idle_spread_us == 20.0
    assert judgement.reason == (
        "idle 410 -> 105 us per step (host time, measured on CPU), a drop beyond the spread of"
        " 20 us between steps"
    )


def test_a_fix_that_removes_the_read_but_multiplies_every_step_costs_more_naming_why():
    judgement = assess(measured(clip_with_if).cost, measured(clip_always_multiplying).cost)

    assert judgement.stalls == (1.0, 0.0)
    assert judgement.kernels[1] > judgement.kernels[0]
    assert judgement.reason == ("bytes up beyond the bound, though it saves 1 stall per step")


def test_trees_are_compared_with_the_first_per_scenario_and_printed_with_the_bound():
    pinned = measured(log_twice)
    patched = ScenarioRow("patched", "python", 1, "step", costs=measured(log_once).costs)
    (compared,) = compare_costs([pinned, patched])

    assert (compared.before, compared.after) == ("tree", "patched")
    assert compared.judgement.verdict == FixVerdict.CLEANUP
    assert ScenarioRow.from_json(patched.to_json()) == patched
    printed = verdict_table([compared])
    assert "tree -> patched" in printed and "2 -> 1" in printed
    assert printed.endswith(
        "per step, every rank's together; idle: host time after the stalls until the next"
        f" kernel, measured on CPU; verdict bound: {BOUND}"
    )
    assert BOUND == (
        "bytes and FLOPs per step up by at most 1%, kernels by at most 1% or 4 per stall saved"
    )


def compared(pinned, patched) -> CostComparison:
    return compare_costs(
        [
            measured(pinned),
            ScenarioRow("patched", "python", 1, "step", costs=measured(patched).costs),
        ]
    )[0]


def judged(before: Cost, after: Cost) -> CostComparison:
    return CostComparison("python", 1, "step", "pinned", "patched", assess(before, after))


def test_a_draft_may_say_a_fix_saves_a_wait_only_where_idle_time_drops_beyond_its_spread():
    saves = [judged(idle(900, 400, 410, 420), idle(900, 100, 105, 110, stalls=0))]
    moves = [judged(idle(900, 400, 300, 500), idle(900, 350, 360, 370, stalls=0))]

    check_claims("pr.md", "This saves one wait per step.", saves, gpu_figures=False)
    with pytest.raises(WorkspaceError, match=r"says 'saves one wait', but the idle windows do"):
        check_claims("pr.md", "This saves one wait per step.", moves, gpu_figures=False)


def test_an_idle_time_in_a_draft_is_a_measured_figure_labelled_as_host_time():
    saves = [judged(idle(900, 400, 410, 420), idle(900, 100, 105, 110, stalls=0))]
    said = "The fix saves idle time: the GPU idles while the host runs {} us{}."
    label = " (host time, measured on CPU)"

    check_claims("pr.md", said.format(410, label), saves, gpu_figures=False)
    with pytest.raises(WorkspaceError, match=r"runs 400 us, which no verdict measured"):
        check_claims("pr.md", said.format(400, label), saves, gpu_figures=False)
    with pytest.raises(WorkspaceError, match=r"label it as its verdict is"):
        check_claims("pr.md", said.format(410, ""), saves, gpu_figures=False)


def test_a_draft_may_claim_a_stall_only_where_one_is_removed():
    saves = [compared(read_twice, read_at_the_end)]
    cleanup = [compared(log_twice, log_once)]

    check_claims("issue.md", "Each read waits for the device, or the wait moves.", saves, False)
    with pytest.raises(WorkspaceError, match=r"says 'waiting for the device', but no read"):
        check_claims("issue.md", "A cleanup: each waiting for the device.", cleanup, False)
    with pytest.raises(WorkspaceError, match=r"issue.md says 'waits for the device', but no read"):
        check_claims("issue.md", "A cleanup: it waits for the device.", cleanup, False)


def test_a_cleanup_is_drafted_as_one_and_faster_needs_a_gpu_figure():
    cleanup = [compared(log_twice, log_once)]

    check_claims("pr.md", "A cleanup: one read fewer.", cleanup, gpu_figures=False)
    with pytest.raises(WorkspaceError, match=r"is a cleanup .* draft it as one"):
        check_claims("pr.md", "One read fewer.", cleanup, gpu_figures=False)
    with pytest.raises(WorkspaceError, match="says 'faster' with no GPU figure"):
        check_claims("pr.md", "A cleanup, and faster.", cleanup, gpu_figures=False)
    check_claims("pr.md", "A cleanup, and faster.", cleanup, gpu_figures=True)


def test_a_fix_that_costs_more_is_not_drafted():
    costly = [compared(clip_with_if, clip_always_multiplying)]

    with pytest.raises(WorkspaceError, match=r"the fix costs more .* it is not drafted"):
        check_claims("pr.md", "Removes one read.", costly, gpu_figures=True)


def test_test_patch_prints_the_verdicts_of_the_newest_fresh_repro(tmp_path):
    workspace = make_workspace(tmp_path / "workspace")
    assert cost.case_verdicts(workspace) == (
        "fix verdict: no repro result yet; run `nox -s repro -- --case sp-loss`"
    )
    pinned = dataclasses.replace(measured(log_twice), tree="pinned")
    patched = dataclasses.replace(measured(log_once), tree="patched")
    result = made.repro(workspace, (pinned, patched))
    result = dataclasses.replace(result, verdicts=tuple(compare_costs(result.runs)))
    path = results.write(workspace.profiles, result, workspace.unsaved)

    printed = cost.case_verdicts(workspace)

    assert printed.startswith(f"fix verdicts, from {path.name}:")
    assert "pinned -> patched" in printed and "cleanup: 1 wait per step fewer" in printed
