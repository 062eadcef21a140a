"""The detector against its labelled suite, its operator table against the installed torch, and
what a scope does with compiled code and other threads."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from hostsync.detector import SyncScope, SyncScopeError, ops
from hostsync.detector.truth import EXAMPLES, UNDECIDED, score

pytestmark = pytest.mark.filterwarnings("ignore:To copy construct from a tensor")


def test_the_suite_is_large_and_every_case_says_where_its_truth_comes_from():
    assert len(EXAMPLES) >= 80
    assert len({case.name for case in EXAMPLES}) == len(EXAMPLES)
    assert all(case.source.strip() for case in EXAMPLES)
    syncing = [case for case in EXAMPLES if case.expected()]
    assert len(syncing) >= 40 and len(EXAMPLES) - len(syncing) >= 30


def test_an_undecided_case_says_why_and_is_not_scored():
    assert UNDECIDED
    assert all(case.source.strip() and case not in EXAMPLES for case in UNDECIDED)
    assert not {case.name for case in UNDECIDED} & {case.name for case in EXAMPLES}


@pytest.mark.parametrize("account", [False, True], ids=["gate", "accounting"])
def test_the_detector_finds_every_labelled_sync_at_its_line_and_nothing_else(account):
    result = score(account=account)

    assert result.wrong_lines == []
    assert result.precision == 1.0
    assert result.recall >= 0.95, result.misses


def _tagged_overloads(*tags: torch.Tag) -> set[str]:
    """Every registered aten overload carrying one of `tags`, as `name.overload`."""
    tagged = set()
    for qualified in torch._C._dispatch_get_all_op_names():
        name, _, overload = qualified.removeprefix("aten::").partition(".")
        packet = getattr(torch.ops.aten, name, None) if qualified.startswith("aten::") else None
        overload = overload or "default"
        known = packet is not None and overload in packet.overloads()
        if known and set(tags) & set(getattr(packet, overload).tags):
            tagged.add(f"{name}.{overload}")
    return tagged


def test_every_table_entry_names_operators_of_the_installed_torch():
    for entry in ops.KERNEL_SYNCS:
        assert entry.source.strip()
        for op in entry.ops:
            packet_name, _, overload = op.partition(".")
            packet = getattr(torch.ops.aten, packet_name)
            assert not overload or overload in packet.overloads(), op
    for entry in ops.FUNCTION_SYNCS:
        assert callable(ops.resolve(entry.name)), entry.name
        assert entry.source.strip()


def test_every_operator_tagged_data_dependent_is_judged_by_the_table():
    """tags.yaml: dynamic_output_shape / data_dependent_output mark the device-data dependent."""
    judged = {
        f"{overload._schema.name.removeprefix('aten::')}.{overload._overloadname}"
        for entry in ops.KERNEL_SYNCS
        for overload in ops.overloads(entry)
    }
    tagged = _tagged_overloads(torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output)
    named = ops.NOT_SYNCING.keys() | ops.UNDECIDED.keys()

    assert {"nonzero.default", "_local_scalar_dense.default"} <= tagged
    assert {op for op in tagged - judged if op.split(".")[0] not in named} == set()


class _Ops(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: set[torch._ops.OpOverload] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.add(func)
        return func(*args, **(kwargs or {}))


_LINALG_INPUTS = {
    "solve": lambda a: (a, a[:, 0]),
    "lstsq": lambda a: (a, a),
    "solve_ex": lambda a: (a, a[:, 0]),
}


def _documented_to_sync(doc: str) -> bool:
    return "synchronizes that device with the CPU" in doc.split("gradients")[0]


@pytest.mark.parametrize(
    "name",
    sorted(
        name
        for name in dir(torch.linalg)
        if not name.startswith("_")
        and _documented_to_sync(getattr(getattr(torch.linalg, name), "__doc__", None) or "")
    ),
)
def test_each_linalg_function_documented_to_sync_reaches_a_syncing_table_entry(name):
    matrix = torch.tensor([[2.0, 0.5], [0.5, 1.0]])
    function = getattr(torch.linalg, name)
    args = _LINALG_INPUTS.get(name, lambda a: (a,))(matrix)
    recording = _Ops()
    with recording:
        function(*args)

    syncing = {op for entry in ops.KERNEL_SYNCS for op in ops.overloads(entry)}
    assert recording.seen & syncing, sorted(map(str, recording.seen))
    with SyncScope() as scope:
        function(*args)
    assert scope.events


def test_the_ex_variants_sync_only_when_asked_to_check_errors():
    matrix = torch.tensor([[2.0, 0.5], [0.5, 1.0]])
    for name in ("inv_ex", "cholesky_ex", "lu_factor_ex", "ldl_factor_ex"):
        function = getattr(torch.linalg, name)
        with SyncScope() as quiet:
            function(matrix)
        with SyncScope() as checking:
            function(matrix, check_errors=True)
        assert (len(quiet.events), len(checking.events)) == (0, 1), name


def test_a_compiled_function_inside_a_scope_is_refused_with_the_cause_and_the_fix():
    def double(t):
        return (t * 2).sum()

    compiled = torch.compile(double, backend="eager")
    compiled(torch.ones(3))  # compiled before the scope: the common case

    with pytest.raises(SyncScopeError) as refused, SyncScope():
        compiled(torch.ones(3))
    message = str(refused.value)
    assert "\n" not in message
    assert re.search(r"compile.*eager.*set_stance\('force_eager'\)", message)

    with SyncScope() as scope, torch.compiler.set_stance("force_eager"):
        assert compiled(torch.ones(3)).item() == 6.0
    assert [event.kind for event in scope.events] == ["scalar_read"]
    assert compiled(torch.ones(3)).item() == 6.0  # outside scopes compiled code runs again


class _ListsInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        _ListsInBackward.read = grad.tolist()
        return grad * 2


def test_a_read_in_a_custom_backward_is_recorded_at_its_line():
    x = torch.ones(3, requires_grad=True)
    with SyncScope() as scope:
        _ListsInBackward.apply(x).sum().backward()

    (event,) = scope.events
    assert (event.kind, event.site.function) == ("tolist", "backward")
    assert event.site.code == "_ListsInBackward.read = grad.tolist()"


class _Doubles(torch.autograd.Function):
    """Under a torch.func transform an autograd.Function runs as the higher-order operator
    `custom_function_call` (what transformers' masks meet under vmap)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return x * 2

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


class _ScalesByItsSum(_Doubles):
    @staticmethod
    def forward(x):
        return x * x.sum().item()


def test_a_vmapped_autograd_function_runs_inside_a_scope():
    x = torch.arange(6.0).reshape(2, 3)
    with SyncScope() as scope:
        doubled = torch.func.vmap(_Doubles.apply)(x)

    assert torch.equal(doubled, x * 2)
    assert scope.events == []


@pytest.mark.parametrize("account", [False, True], ids=["gate", "accounting"])
def test_a_read_inside_a_higher_order_operator_is_recorded_at_its_line(account):
    def subgraph(x):
        return x * x.sum().item()

    x = torch.arange(3.0)
    with SyncScope(account=account) as scope:
        torch.func.grad(lambda t: _ScalesByItsSum.apply(t).sum())(x)
        torch.ops.higher_order.invoke_subgraph(subgraph, "subgraph", x)

    assert [(e.kind, e.site.function, e.site.code) for e in scope.events] == [
        ("scalar_read", "forward", "return x * x.sum().item()"),
        ("scalar_read", "subgraph", "return x * x.sum().item()"),
    ]


def test_a_function_carried_to_another_thread_is_observed_there_as_autograd_threads_are():
    x = torch.ones(3, requires_grad=True)
    errors = []

    def backward_elsewhere():
        try:
            _ListsInBackward.apply(x).sum().backward()
            x.sum().item()
        except Exception as error:
            errors.append(error)

    with SyncScope() as scope:
        worker = threading.Thread(target=scope.carry(backward_elsewhere))
        worker.start()
        worker.join()
        plain = threading.Thread(target=backward_elsewhere)
        plain.start()
        plain.join()

    assert errors == []
    assert [event.kind for event in scope.events] == ["tolist", "scalar_read"]


def test_scopes_of_two_threads_keep_their_own_events_and_restore_everything():
    saved = (torch.save, torch.serialization.save)
    both_open = threading.Barrier(2)
    scopes: dict[str, SyncScope] = {}

    def read(name: str, times: int) -> None:
        with SyncScope() as scope:
            both_open.wait()
            for _ in range(times):
                torch.ones(2).sum().item()
            both_open.wait()
        scopes[name] = scope

    threads = [threading.Thread(target=read, args=(name, n)) for name, n in (("a", 1), ("b", 2))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert {name: len(scope.events) for name, scope in scopes.items()} == {"a": 1, "b": 2}
    assert (torch.save, torch.serialization.save) == saved


def test_carry_needs_an_open_scope():
    with pytest.raises(SyncScopeError, match="open scope"):
        SyncScope().carry(print)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_cross_check_counts_per_context():
    previous_mode = torch.cuda.get_sync_debug_mode()
    t = torch.ones(4, device="cuda")
    started, finish = threading.Event(), threading.Event()
    other: dict[str, SyncScope] = {}

    def quiet_scope() -> None:
        with SyncScope() as scope:
            started.set()
            finish.wait()
        other["scope"] = scope

    thread = threading.Thread(target=quiet_scope)
    thread.start()
    started.wait()
    with SyncScope() as scope:
        t.sum().item()
        t.tolist()
    finish.set()
    thread.join()

    assert (len(scope.events), scope.cuda_syncs) == (2, 2)
    assert other["scope"].cuda_syncs == 0
    assert torch.cuda.get_sync_debug_mode() == previous_mode


def test_a_function_compiled_while_a_scope_is_open_is_refused_too(tmp_path):
    """In a fresh process dynamo is not imported when the first scope opens."""
    script = tmp_path / "compile_in_scope.py"
    script.write_text(
        "import sys, torch\n"
        "from hostsync.detector import SyncScope, SyncScopeError\n"
        "assert 'torch._dynamo.eval_frame' not in sys.modules\n"
        "with SyncScope():\n"
        "    double = torch.compile(lambda x: x * 2, backend='eager')\n"
        "    try:\n"
        "        double(torch.ones(2))\n"
        "    except SyncScopeError:\n"
        "        print('refused')\n"
        "print(double(torch.ones(2)).tolist())\n"
    )
    source = Path(ops.__file__).parents[2]
    # A hang guard, not a measurement: far above what this takes on a loaded 2-core machine.
    run = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(source), "OMP_NUM_THREADS": "1"},
        timeout=300,
        check=False,
    )

    assert run.stdout.split("\n")[:2] == ["refused", "[2.0, 2.0]"], run.stderr[-2000:]
