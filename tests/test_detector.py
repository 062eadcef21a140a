"""The hidden-sync detector: what it catches, where it says it happened, what it leaves alone."""

from __future__ import annotations

import inspect
import json
import sys
import threading
from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from hostsync.detector import AllowRule, Site, SyncScope, package_path

HERE = package_path(__file__)
HOST_READ_METHODS = ("tolist", "cpu", "numpy")


def next_line() -> int:
    """The line after the caller's: the statement a test expects a sync at."""
    return sys._getframe(1).f_lineno + 1


def site_of(cause: Callable[[torch.Tensor], object]) -> Site:
    """Each cause below syncs on the first line of its body."""
    line = cause.__code__.co_firstlineno + 1
    code = inspect.getsource(cause).splitlines()[1].strip()
    return Site(HERE, line, cause.__name__, code)


# The device under test: a factory naming no device makes host memory on a GPU box too.
DEVICE = torch.device("cpu")


# Made outside any scope: `torch.tensor(data, device=d)` in one would be a blocking copy.
_NUMBERS = torch.tensor([1.0, -2.0, 3.0, 3.0], device=DEVICE)


def numbers() -> torch.Tensor:
    return _NUMBERS.clone()


# One cause per way of reading the device; each syncs on the first line of its body.


def item(t):
    return t.sum().item()


def if_positive(t):
    if t.sum() > 0:
        return 1


def max_with_python_int(t):
    return max(t.sum(), 1)


def int_of(t):
    return int(t.sum())


def float_of(t):
    return float(t.sum())


def equal(t):
    return torch.equal(t, t)


def nonzero(t):
    return t.nonzero()


def where_with_condition_only(t):
    return torch.where(t > 0)


def masked_select(t):
    return torch.masked_select(t, t > 0)


def unique(t):
    return torch.unique(t)


def unique_dim(t):
    return torch.unique(t, dim=0)


def unique_consecutive(t):
    return torch.unique_consecutive(t)


def repeat_by_counts(t):
    return torch.repeat_interleave(t, torch.ones_like(t, dtype=torch.long))


def bool_mask_index(t):
    return t[t > 0]


def uint8_mask_index(t):
    return t[(t > 0).to(torch.uint8)]


def assign_tensor_through_mask(t):
    t[t > 0] = t.new_zeros(3)


def accumulate_through_mask(t):
    t.index_put_((t > 0,), t.new_ones(()), accumulate=True)


def tolist(t):
    return t.tolist()


def cpu(t):
    return t.cpu()


def numpy(t):
    return t.numpy()


def numpy_array_of(t):
    return np.asarray(t)


def cpu_then_numpy(t):
    return t.cpu().numpy()


def cpu_then_tolist(t):
    return t.detach().cpu().tolist()


def case(kind: str, cause: Callable[[torch.Tensor], object], *marks: pytest.MarkDecorator):
    return pytest.param(kind, cause, marks=marks, id=f"{kind}-{cause.__name__}")


CAUSES = [
    case("scalar_read", item),
    case("scalar_read", if_positive),
    case("scalar_read", max_with_python_int),
    case("scalar_read", int_of),
    case("scalar_read", float_of),
    case("scalar_read", equal),
    case("nonzero", nonzero),
    case("nonzero", where_with_condition_only),
    case("masked_select", masked_select),
    case("unique", unique),
    case("unique", unique_dim),
    case("unique", unique_consecutive),
    case("repeat_interleave", repeat_by_counts),
    case("bool_index", bool_mask_index),
    case(
        "bool_index",
        uint8_mask_index,
        pytest.mark.filterwarnings("ignore:indexing with dtype torch.uint8"),
    ),
    case("bool_index", assign_tensor_through_mask),
    case("bool_index", accumulate_through_mask),
    case("tolist", tolist),
    case("cpu", cpu),
    case("numpy", numpy),
    case("numpy", numpy_array_of),
    case("cpu", cpu_then_numpy),
    case("cpu", cpu_then_tolist),
]


@pytest.mark.parametrize(("kind", "cause"), CAUSES)
def test_each_read_is_recorded_once_at_the_line_that_made_it(kind, cause, host_syncs):
    with host_syncs() as scope:
        cause(numbers())

    assert [(event.kind, event.site, event.allowed) for event in scope.events] == [
        (kind, site_of(cause), None)
    ]


# fmt: off
def condition_over_lines(t):
    if (
        t.is_floating_point()
        and not t.is_complex()
        and (torch.isnan(t.sum()) or torch.isinf(t.sum()))
    ):
        return 1
# fmt: on


def test_a_condition_over_several_lines_is_shown_whole_without_its_body():
    """The Trainer's NaN/inf loss filter has this shape; its first line alone says nothing."""
    with SyncScope() as scope:
        condition_over_lines(numbers())

    (site,) = scope.counts()
    assert site.line == condition_over_lines.__code__.co_firstlineno + 1
    assert site.code == (
        "if ( t.is_floating_point() and not t.is_complex()"
        " and (torch.isnan(t.sum()) or torch.isinf(t.sum())) ):"
    )


def test_a_record_names_the_aten_op_or_the_tensor_method():
    with SyncScope() as scope:
        numbers().sum().item()
        numbers().tolist()

    assert [event.op for event in scope.events] == [
        "aten._local_scalar_dense.default",
        "Tensor.tolist",
    ]


@pytest.mark.no_host_sync
def test_sync_free_code_records_nothing():
    losses, tokens = torch.tensor([0.5, 2.0, 0.0]), torch.tensor([3, 1, 0])
    values, mask = numbers(), numbers() > 0
    weighted = torch.where(tokens > 0, losses * tokens, torch.zeros_like(losses))
    per_rank = torch.stack([weighted[0], weighted[1]])
    total = sum([per_rank.sum(), weighted[2]]) / tokens.sum().clamp(min=1)
    values[mask] = 0.0  # index_put_ becomes masked_fill_: no sync on CUDA either
    values.masked_fill(mask, 1.0)
    values[mask.long()]  # a device index: no copy (a host one is copied: make_info)
    torch.repeat_interleave(values, torch.full((4,), 2), output_size=8)
    torch.repeat_interleave(values, 2)
    len(values), values.shape[0], total * 2


def test_the_loss_aggregation_pattern_counts_per_site_most_frequent_first():
    good_tokens_per_rank = torch.tensor([3, 5])
    losses_per_rank = torch.tensor([0.5, 0.25])
    with SyncScope() as scope:
        total_loss = 0
        for rank in range(2):
            if_line = next_line()
            if good_tokens_per_rank[rank] > 0:
                total_loss += losses_per_rank[rank] * good_tokens_per_rank[rank]
        max_line = next_line()
        total_loss / max(good_tokens_per_rank.sum(), 1)

    counts = {(site.line, site.code): count for site, count in scope.counts().items()}
    assert list(counts.items()) == [
        ((if_line, "if good_tokens_per_rank[rank] > 0:"), 2),
        ((max_line, "total_loss / max(good_tokens_per_rank.sum(), 1)"), 1),
    ]


def test_nested_scopes_each_keep_their_own_events_and_the_outer_sees_the_inner():
    t = numbers()
    with SyncScope() as outer:
        t.sum().item()
        with SyncScope() as inner:
            t.tolist()
        t.tolist()

    assert [event.kind for event in inner.events] == ["tolist"]
    assert [event.kind for event in outer.events] == ["scalar_read", "tolist", "tolist"]


def test_each_scope_judges_events_with_its_own_allow_list():
    t = numbers()
    inner_rules = [AllowRule(HERE, reason="inner accepts")]
    with SyncScope() as outer, SyncScope(allow=inner_rules) as inner:
        t.sum().item()

    assert [event.allowed for event in inner.events] == ["inner accepts"]
    assert [event.allowed for event in outer.events] == [None]


def test_rules_match_a_file_then_optionally_a_function_or_a_line():
    rules = [
        AllowRule(HERE, reason="this function", function="int_of"),
        AllowRule(HERE, reason="this line", line=site_of(item).line),
        AllowRule(HERE, reason="another function's line", function="item", line=1),
        AllowRule("transformers/masking_utils.py", reason="another file"),
    ]
    with SyncScope(allow=rules) as scope:
        int_of(numbers())
        item(numbers())
        float_of(numbers())

    assert [event.allowed for event in scope.events] == ["this function", "this line", None]
    assert list(scope.counts()) == [site_of(float_of)]


def test_a_rule_file_matches_a_path_suffix_on_a_separator_only():
    site = Site("transformers/integrations/deepspeed.py", 741, "deepspeed_sp_compute_loss", "")

    assert AllowRule("integrations/deepspeed.py", reason="r").matches(site)
    assert not AllowRule("speed.py", reason="r").matches(site)
    assert not AllowRule("transformers/integrations/deepspeed.py", reason="r", line=744).matches(
        site
    )


def test_an_allow_block_accepts_what_it_encloses_with_the_innermost_reason():
    t = numbers()
    with SyncScope() as scope:
        with scope.allow("model forward"):
            t.sum().item()
            with scope.allow("mask building"):
                t.tolist()
            t.sum().item()
        t.sum().item()

    assert [event.allowed for event in scope.events] == [
        "model forward",
        "mask building",
        "model forward",
        None,
    ]
    assert list(scope.allowed_counts().values()) == [1, 1, 1]
    assert {reason for _, reason in scope.allowed_counts()} == {"model forward", "mask building"}
    assert len(scope.unexpected) == 1


def test_an_allowance_needs_a_reason():
    with pytest.raises(ValueError, match="reason"):
        AllowRule(HERE, reason=" ")
    with pytest.raises(ValueError, match="reason"), SyncScope() as scope, scope.allow(""):
        pass


def test_allowed_syncs_pass_the_assertion():
    with SyncScope(allow=[AllowRule(HERE, reason="accepted here")]) as scope:
        numbers().sum().item()

    scope.assert_no_unexpected_syncs()
    assert scope.allowed_sync_sites()[0].reason == "accepted here"


def test_the_assertion_names_each_site_with_its_count_and_code_line():
    t = numbers()
    with SyncScope() as scope:
        for _ in range(2):
            line = next_line()
            t.sum().item()

    with pytest.raises(AssertionError) as raised:
        scope.assert_no_unexpected_syncs()
    message = str(raised.value)
    assert f"2x {HERE}:{line} in test_the_assertion_names_each_site" in message
    assert "[scalar_read]" in message
    assert "\n        t.sum().item()\n" in message


def test_sync_sites_write_json_with_counts():
    t = numbers()
    with SyncScope() as scope:
        line = next_line()
        t.tolist(), t.tolist()

    assert json.loads(json.dumps([site.to_json() for site in scope.sync_sites()])) == [
        {
            "file": HERE,
            "line": line,
            "function": "test_sync_sites_write_json_with_counts",
            "code": "t.tolist(), t.tolist()",
            "count": 2,
            "kinds": ["tolist"],
        }
    ]


def test_everything_is_restored_after_the_scope_also_when_the_body_raises():
    methods = {name: getattr(torch.Tensor, name) for name in HOST_READ_METHODS}
    functions = (torch.tensor, torch.save, torch.nn.functional.one_hot, torch.Tensor.to)
    with pytest.raises(RuntimeError, match="boom"), SyncScope() as scope:
        with SyncScope():
            numbers().tolist()
        raise RuntimeError("boom")

    assert {name: getattr(torch.Tensor, name) for name in HOST_READ_METHODS} == methods
    assert not any(name in torch.Tensor.__dict__ for name in (*HOST_READ_METHODS, "to"))
    assert (torch.tensor, torch.save, torch.nn.functional.one_hot, torch.Tensor.to) == functions
    assert _get_current_dispatch_mode() is None
    numbers().sum().item(), numbers().tolist()
    assert len(scope.events) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only behaviour")
def test_on_cpu_there_is_no_cuda_cross_check():
    with SyncScope() as scope:
        numbers().sum().item()

    assert scope.cuda_syncs is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_torch_sync_debug_mode_counts_the_same_sync():
    t = torch.ones(4, device="cuda")
    previous_mode = torch.cuda.get_sync_debug_mode()
    with SyncScope() as outer:
        (t * 2).sum()
        with SyncScope() as inner:
            t.sum().item()

    assert (len(outer.events), outer.cuda_syncs) == (1, 1)
    assert (len(inner.events), inner.cuda_syncs) == (1, 1)
    assert torch.cuda.get_sync_debug_mode() == previous_mode


def test_package_path_strips_the_longest_search_path_entry():
    search_path = ["/venv/lib", "/venv/lib/site-packages", "/checkout/src"]

    assert (
        package_path("/venv/lib/site-packages/transformers/trainer.py", search_path)
        == "transformers/trainer.py"
    )
    assert package_path("/checkout/src/hostsync/x.py", search_path) == "hostsync/x.py"
    assert package_path("/elsewhere/script.py", search_path) == "script.py"


def test_a_scope_observes_only_the_thread_that_opened_it():
    t = numbers()
    with SyncScope() as scope:
        other = threading.Thread(target=lambda: (t.sum().item(), t.tolist()))
        other.start()
        other.join()

    assert scope.events == []


def test_a_rule_can_accept_a_shared_helper_only_for_one_caller() -> None:
    """A read inside a helper is paid for by its caller: accept one caller, not the other."""

    def is_invalid(norm: torch.Tensor) -> bool:
        return bool(norm < 0)

    def step(norm: torch.Tensor) -> bool:
        return is_invalid(norm)

    def clip(norm: torch.Tensor) -> bool:
        return is_invalid(norm)

    rule = AllowRule(
        "test_detector.py",
        reason="decides a skipped step",
        function="is_invalid",
        caller="step",
        code="norm < 0",
    )
    with SyncScope(allow=[rule]) as scope:
        step(torch.tensor(1.0))
        clip(torch.tensor(1.0))

    (site,) = scope.sync_sites(by_caller=True)
    assert (site.site.function, site.caller, site.count) == (
        "is_invalid",
        "test_detector.py:clip",
        1,
    )
    (allowed,) = scope.allowed_sync_sites()
    assert allowed.reason == "decides a skipped step"


def test_a_factory_inside_a_device_context_is_host_memory_and_judged_once():
    """`with torch.device(...)` (transformers' from_pretrained opens one) makes torch find the
    default device by making a tensor: the scope judges the factory without observing that."""
    with SyncScope() as scope:
        with torch.device("cpu"):
            made = torch.zeros(2)
        made.tolist()

    assert scope.events == []


def test_a_model_loaded_with_scopes_open_is_the_model_loaded_without(tmp_path):
    """transformers builds a model on the meta device, then fills what its checkpoint holds and
    initializes the rest (a Llama's rotary buffers). torch's device context knows its factories
    by a set cached at first use: made first inside a scope, the replaced factories escape it."""
    transformers = pytest.importorskip("transformers")
    from torch.utils._device import _device_constructors

    config = transformers.LlamaConfig(
        vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2,
    )  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    _device_constructors.cache_clear()  # the scope's device context is the first one here
    with SyncScope():
        model = transformers.LlamaForCausalLM.from_pretrained(tmp_path)

    rotary = model.model.rotary_emb
    assert torch.equal(rotary.inv_freq, rotary.compute_default_rope_parameters(config)[0])
