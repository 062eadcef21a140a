"""Who calls a function, found in real releases' sdists (the cards' pinned ones, verified and
cached, so no test here downloads them once the cache holds them), and in small sources whose
calls each rule of the search decides."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hostsync.upstream.callers import calls, parameters
from hostsync.upstream.presence import sdist_sources
from hostsync.workspace import cases
from hostsync.workspace.cases import load as load_case
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import ROOT, Layout
from hostsync.workspace.projects import PROJECTS


def pinned(layout: Layout, case: str) -> dict[str, str]:
    """The package source of the release a case's card pins."""
    card = load_case(ROOT, case)
    return sdist_sources(layout, card.card.pin.sdist, card.project)


def found(sources: dict[str, str], project: str, target: str) -> list[tuple[str, int, str, bool]]:
    return [
        (call.file, call.line, call.function, call.sure)
        for call in calls(sources, PROJECTS[project], target, parameters(sources, target) or ())
    ]


def test_the_trainer_calls_clip_grad_norm_and_trl_never_does(workspace: Layout) -> None:
    """transformers 5.25.0 calls `Accelerator.clip_grad_norm_` twice, each on
    `self.accelerator`; TRL 1.16.0's package calls no `clip_grad_norm_` at all."""
    transformers = pinned(workspace, "trainer-grad-norm")
    trl = pinned(workspace, "trl-sft-metrics")

    assert found(transformers, "transformers", "Accelerator.clip_grad_norm_") == [
        ("transformers/trainer.py", 2831, "Trainer._clip_grad_norm", True),
        ("transformers/trainer.py", 2840, "Trainer._get_grad_norm", True),
    ]
    assert "accelerator.clip_grad_norm_(" in transformers["src/transformers/trainer.py"]
    assert not any("clip_grad_norm_(" in text for text in trl.values())
    assert found(trl, "trl", "Accelerator.clip_grad_norm_") == []


def test_self_calls_reach_a_method_only_through_its_own_class(workspace: Layout) -> None:
    """In DeepSpeed 0.19.8 five classes call a `unscale_and_clip_grads` of their own on `self`;
    only ZeRO 1/2's class and ZenFlow's subclass of it reach `DeepSpeedZeroOptimizer`'s. A call
    on a parameter is kept, marked unsure, as other classes define that name too."""
    deepspeed = pinned(workspace, "ds-clip-norm")

    reached = found(deepspeed, "deepspeed", "DeepSpeedZeroOptimizer.unscale_and_clip_grads")

    assert reached == [
        (
            "deepspeed/runtime/zenflow/engine_stage3.py",
            547,
            "zenflow_cpu_optimizer_overlap_step",
            False,
        ),
        (
            "deepspeed/runtime/zenflow/zenflow_stage_1_and_2.py",
            765,
            "ZenFlowZeroOptimizerParallel.zenflow_cpu_optimizer_step",
            True,
        ),
        ("deepspeed/runtime/zero/stage_1_and_2.py", 3080, "DeepSpeedZeroOptimizer.step", True),
        ("deepspeed/runtime/zero/stage_1_and_2.py", 3133, "DeepSpeedZeroOptimizer.step", True),
    ]
    by_name = [
        path
        for path, text in deepspeed.items()
        if "self.unscale_and_clip_grads(" in text and "zero/stage3.py" in path
    ]
    assert by_name, "ZeRO 3 calls a method of that name on self"


SOURCES = {
    "pkg/base.py": """
import torch
from torch import nn

class Base:
    def clip(self, norm, val=-1.0):
        return norm

    def step(self):
        return self.clip(1.0)

class Child(Base):
    def step(self):
        nn.utils.clip(2.0)
        return super().clip(2.0, val=0.0)

class Other:
    def clip(self, norm):
        return norm

    def step(self):
        return self.clip(3.0)

def loop(optimizer, args):
    clip(4.0)
    torch.nn.utils.clip(4.0)
    return optimizer.clip(*args)
""",
}
PACKAGE = PROJECTS["deepspeed"]  # its package lies at the tree's top, as `pkg/` does here


def test_the_search_follows_classes_and_leaves_modules_and_other_classes_out() -> None:
    """A method: `self` and `super()` calls by class, module functions and another class's
    method left out, a call on a parameter kept as unsure, each with the parameters it passes.
    A function: its calls by name, alone or through a module."""
    signature = parameters(SOURCES, "Base.clip")

    reached = calls(SOURCES, PACKAGE, "Base.clip", signature or ())

    assert signature == ("norm", "val")
    assert [(c.line, c.function, c.passes, c.sure) for c in reached] == [
        (10, "Base.step", ("norm",), True),
        (15, "Child.step", ("norm", "val"), True),
        (27, "loop", ("*",), False),
    ]
    assert parameters(SOURCES, "Base.missing") is None
    assert [c.line for c in calls(SOURCES, PACKAGE, "clip")] == [14, 25, 26]


@pytest.mark.parametrize("target", ["Other.clip", "Child.clip"])
def test_a_method_a_class_only_inherits_or_shares_the_name_of_is_not_its_callers(
    target: str,
) -> None:
    """`Other.clip` is called by `Other.step` alone; `Child.clip` is `Base.clip`, which
    `Child` does not define: `super().clip` and `self.clip` in `Base` are not its calls."""
    lines = [c.line for c in calls(SOURCES, PACKAGE, target) if c.sure]

    assert lines == ([22] if target == "Other.clip" else [])


@pytest.mark.parametrize(
    ("table", "complaint"),
    [
        (
            'function = "torch.nn.utils.clip_grad_norm_"\nprojects = ["accelerate"]',
            "upstream.callers[0].function: must be `Class.method` or a function's name",
        ),
        (
            'function = "clip_grad_norm_"\nprojects = ["torch"]',
            "upstream.callers[0].projects: must name projects of transformers",
        ),
    ],
)
def test_a_card_s_callers_are_checked_when_it_is_read(
    tmp_path: Path, table: str, complaint: str
) -> None:
    card = tmp_path / "cases" / "sp-loss.toml"
    card.parent.mkdir()
    card.write_text(
        cases.card_path(ROOT, "sp-loss").read_text() + "\n[[upstream.callers]]\n" + table
    )

    with pytest.raises(WorkspaceError, match=re.escape(f"cases/sp-loss.toml: {complaint}")):
        load_case(tmp_path, "sp-loss")
