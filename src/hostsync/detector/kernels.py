"""The aten calls judged in C++ dispatch, without a Python call for any other operator.

Kernels are registered at a dispatch key no torch feature uses (its fallback falls through),
enabled in the thread-local state of a context with an open scope. The key sits above
autograd, so it sees what Python code calls; what an operator's own kernel calls below
autograd (CPU-only validations, `nonzero` inside a mask index) runs with ADInplaceOrView
excluded, and passes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import cast

import torch

from hostsync.detector import ops
from hostsync.detector.observer import KEY, KEY_NAME, Observer

_BELOW_KEY = torch._C._dispatch_keyset_full_after(KEY)
_NESTED = torch._C.DispatchKey.ADInplaceOrView
# A kernel receives a wrapped number (the tensor C++ makes of `t * 2.0`) as a Python number.
Scalar = bool | int | float | complex
WRAPPED_DTYPES = {
    bool: torch.bool,
    int: torch.int64,
    float: torch.float64,
    complex: torch.complex128,
}

_KERNEL_RULES: dict[torch._ops.OpOverload, list[ops.OpSync]] = {}
for _entry in ops.KERNEL_SYNCS:
    for _overload in ops.overloads(_entry):
        _KERNEL_RULES.setdefault(_overload, []).append(_entry)


def _seen_in_dispatch(op: torch._ops.OpOverload) -> bool:
    """CompositeImplicitAutograd operators decompose before any kernel: their parts are seen."""
    try:
        return not torch._C._dispatch_has_kernel_for_dispatch_key(
            op.name(), "CompositeImplicitAutograd"
        )
    except RuntimeError:  # an overload the dispatcher does not know (`Tensor_hacked_twin`)
        return False


def _judging_kernel(
    op: torch._ops.OpOverload, rules: Sequence[ops.OpSync]
) -> Callable[..., object]:
    handle = op._handle
    tensors = [
        position
        for position, argument in enumerate(op._schema.arguments)
        if not argument.kwarg_only and argument.type == torch._C.TensorType.get()
    ]

    def judged(keyset: torch._C.DispatchKeySet, *args: object, **kwargs: object) -> object:
        if tensors and any(type(args[i]) in WRAPPED_DTYPES for i in tensors if i < len(args)):
            args = tuple(
                torch.scalar_tensor(cast(Scalar, value), dtype=WRAPPED_DTYPES[type(value)])
                if position in tensors and type(value) in WRAPPED_DTYPES
                else value
                for position, value in enumerate(args)
            )
        below = keyset & _BELOW_KEY
        observer = None
        if not torch._C._dispatch_tls_is_dispatch_key_excluded(_NESTED):
            observer = Observer.current()
        if observer is None or observer.quiet:
            return handle.redispatch_boxed(below, *args, **kwargs)
        return observer.judge_kernel(
            op,
            rules,
            lambda: handle.redispatch_boxed(below, *args, **kwargs),
            ops.OpCall(args, kwargs),
        )

    return judged


@functools.cache
def registered() -> tuple[torch.library.Library, ...]:
    """The kernels, registered once per process; idle wherever no scope enables the key."""
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(torch.library.fallthrough_kernel, KEY_NAME)
    library = torch.library.Library("aten", "IMPL")
    for op, rules in _KERNEL_RULES.items():
        if _seen_in_dispatch(op):
            library.impl(op, _judging_kernel(op, rules), KEY_NAME, with_keyset=True)
    _higher_order_operators_fall_through()
    return fallback, library


def _higher_order_operators_fall_through() -> None:
    """Every higher-order operator passes the key, as the fallback lets every other operator.

    torch dispatches them in Python (`HigherOrderOperator.dispatch`): a key in the thread's state
    with no kernel of theirs raises "could not find kernel" (vmap's `custom_function_call`,
    which transformers' masks run, and `invoke_subgraph`). A fall-through key leaves the state
    as it is, so the aten calls of their bodies still meet the judging kernels. Those made
    later take it from torch's list of keys every new one falls through.
    """
    torch._ops._HIGHER_ORDER_OP_DEFAULT_FALLTHROUGH_DISPATCH_KEYS.append(KEY)
    for operator in torch._ops._higher_order_ops.values():
        operator.fallthrough(KEY)
