"""Which torch operations make the host wait for a CUDA device, how often, and how we know.

The detector runs on CPU tensors and judges each call by what its CUDA kernel would do. The
aten part starts from the two tags `native_functions.yaml` gives the operators whose output
depends on device data (`dynamic_output_shape`, `data_dependent_output`, defined in
`aten/src/ATen/native/tags.yaml`); every tagged overload of the installed torch is an entry
here, in `NOT_SYNCING` or in `UNDECIDED` (tests/test_detector_truth.py checks it). The
`torch.linalg` part follows the functions whose documentation says they synchronize; the rest
is read from the CUDA kernels, each entry naming its file and function. Counts are host waits
per call on success (an error path may read more).

Importable with torch alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from hostsync.detector.sites import DEVICE_COPY

_MASK_DTYPES = (torch.bool, torch.uint8)


class HostMemory(Protocol):
    """What a rule may ask about the call: which tensors live in host memory."""

    def holds(self, tensor: torch.Tensor) -> bool: ...

    def named(self) -> bool:
        """Whether the calling statement names host memory ("cpu") as a destination."""
        ...


@dataclass(frozen=True)
class OpCall:
    """An intercepted torch call as torch passes it: positional and keyword arguments, each any
    value torch takes (tensors, shapes, devices, dtypes, Python numbers)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def argument(self, position: int, name: str, default: object = None) -> Any:
        """A parameter given by position or by name, else `default`."""
        return self.args[position] if len(self.args) > position else self.kwargs.get(name, default)


Syncs = Callable[[OpCall, HostMemory], int]


@dataclass(frozen=True)
class OpSync:
    """aten overloads (`packet` or `packet.overload`) and the host waits one CUDA call takes."""

    kind: str
    ops: tuple[str, ...]
    syncs: Syncs
    source: str


@dataclass(frozen=True)
class FunctionSync:
    """A Python-level torch callable (dotted name) whose CUDA path waits where CPU shows nothing.

    `replaces_kernels`: the CPU path reads the host where CUDA does not (a validation done with
    `.item()` on CPU only); inside the call, `syncs` is the whole truth.
    """

    kind: str
    name: str
    syncs: Syncs
    source: str
    replaces_kernels: bool = False


def _one(call: OpCall, host: HostMemory) -> int:
    return 0 if host.holds(call.args[0]) else 1


def _reads_device(call: OpCall, host: HostMemory) -> bool:
    tensors = [t for t in _flat(call.args) if isinstance(t, torch.Tensor)]
    return bool(tensors) and not all(host.holds(t) for t in tensors)


def _flat(values: Iterable[object]) -> Iterator[object]:
    for value in values:
        if isinstance(value, list | tuple):
            yield from _flat(value)
        else:
            yield value


def _if_device(count: int) -> Syncs:
    def syncs(call: OpCall, host: HostMemory) -> int:
        return count if _reads_device(call, host) else 0

    return syncs


def _repeats_counted(call: OpCall, host: HostMemory) -> int:
    if call.kwargs.get("output_size") is not None or not _reads_device(call, host):
        return 0
    return 1


def _with_mask(call: OpCall, host: HostMemory) -> int:
    indices = call.args[1]
    if not any(index is not None and index.dtype in _MASK_DTYPES for index in indices):
        return 0
    return 1 if _reads_device(call, host) else 0


def _indices_copied(call: OpCall, host: HostMemory) -> int:
    """Index tensors in host memory, each copied to a device tensor's device, blocking
    (TensorAdvancedIndexing.cpp make_info: `indice.to(self.device())`). A numpy index is one:
    the indexing binding builds it over the array (python_variable_indexing.cpp
    sequenceToVariable). Masks are counted as reads (`_with_mask`)."""
    if host.holds(call.args[0]):
        return 0
    return sum(
        1
        for index in call.args[1]
        if index is not None
        and index.dtype not in _MASK_DTYPES
        and (host.holds(index) or _over_foreign_memory(index))
    )


def _over_foreign_memory(tensor: torch.Tensor) -> bool:
    """Whether `tensor` lies in memory torch did not allocate (a numpy array's): host memory."""
    return torch._C._has_storage(tensor) and not tensor.untyped_storage().resizable()


def _put_through_mask(call: OpCall, host: HostMemory) -> int:
    """A masked index_put_ syncs, unless it is the masked_fill_ case (canDispatchToMaskedFill)."""
    if not _with_mask(call, host):
        return 0
    target, indices = call.args[0], call.args[1]
    values = call.argument(2, "values")
    accumulate = call.argument(3, "accumulate", False)
    masks = [index for index in indices if index is not None]
    fills_masked = (
        not accumulate
        and values.numel() == 1
        and host.holds(values)
        and len(masks) == 1
        and masks[0].dtype in _MASK_DTYPES
        and masks[0].device == target.device
    )
    return 0 if fills_masked else 1


def _never(call: OpCall, host: HostMemory) -> int:
    return 0


def _device_value(position: int, name: str) -> Syncs:
    """A 0-d tensor argument used as a Scalar: read with .item() unless it is in host memory."""

    def syncs(call: OpCall, host: HostMemory) -> int:
        value = call.argument(position, name)
        return int(isinstance(value, torch.Tensor) and not host.holds(value))

    return syncs


def _bincount(call: OpCall, host: HostMemory) -> int:
    values = call.args[0]
    if (values.dim() == 1 and values.numel() == 0) or not _reads_device(call, host):
        return 0
    return 1 if values.dtype == torch.uint8 else 2


def _histc(call: OpCall, host: HostMemory) -> int:
    low, high = call.argument(2, "min", 0), call.argument(3, "max", 0)
    if low != high or call.args[0].numel() == 0 or not _reads_device(call, host):
        return 0
    return 2


def _checking_errors(call: OpCall, host: HostMemory) -> int:
    return 1 if call.kwargs.get("check_errors") and _reads_device(call, host) else 0


def _copy_to_host(call: OpCall, host: HostMemory) -> int:
    target, source = call.args[0], call.args[1]
    blocking = not call.argument(2, "non_blocking", False)
    return int(blocking and host.holds(target) and not host.holds(source))


def _fill_host_from_device(call: OpCall, host: HostMemory) -> int:
    target, value = call.args[0], call.args[1]
    return int(host.holds(target) and not host.holds(value))


def _put_device_values_on_host(call: OpCall, host: HostMemory) -> int:
    values = call.argument(2, "values")
    return int(host.holds(call.args[0]) and not host.holds(values))


_NATIVE = "aten/src/ATen/native/"
_TAGGED = "tagged dynamic_output_shape (native_functions.yaml); "

KERNEL_SYNCS: tuple[OpSync, ...] = (
    OpSync(
        "scalar_read",
        ("_local_scalar_dense", "item"),
        _one,
        "tagged data_dependent_output; cuda/CUDAScalar.cu _local_scalar_dense_cuda copies one"
        " value with at::cuda::memcpy_and_sync (`bool(t)`, `.item()`, `int(t)` reach it)",
    ),
    OpSync(
        "scalar_read",
        ("equal",),
        _if_device(1),
        f"{_NATIVE}cuda/Equal.cpp cuda_equal: at::eq(self, src).all().item<bool>()",
    ),
    OpSync(
        "scalar_read",
        ("allclose",),
        _if_device(1),
        f"{_NATIVE}TensorCompare.cpp allclose: isclose(...).all().item<uint8_t>(), shared by"
        " all devices",
    ),
    OpSync(
        "nonzero",
        ("nonzero",),
        _if_device(1),
        _TAGGED + f"{_NATIVE}cuda/Nonzero.cu nonzero_out_cuda copies the count to the host;"
        " torch.nonzero docs: 'causes host-device synchronization'",
    ),
    OpSync(
        "masked_select",
        ("masked_select",),
        _if_device(1),
        _TAGGED + f"{_NATIVE}TensorAdvancedIndexing.cpp masked_select: nonzero of the mask",
    ),
    OpSync(
        "unique",
        ("_unique", "_unique2", "unique_dim", "unique_consecutive", "unique_dim_consecutive"),
        _if_device(1),
        _TAGGED + f"{_NATIVE}cuda/Unique.cu: the number of unique values is read to size the"
        " output (unique_dim_consecutive is untagged but shares _unique_dim_cuda_template)",
    ),
    OpSync(
        "repeat_interleave",
        ("repeat_interleave.Tensor", "repeat_interleave.Tensor_out"),
        _repeats_counted,
        _TAGGED + f"{_NATIVE}Repeat.h repeat_interleave_common: without output_size the total"
        " is read from the device",
    ),
    OpSync(
        "bool_index",
        ("index.Tensor", "index.Tensor_out", "index.Tensor_hacked_twin"),
        _with_mask,
        _TAGGED + f"{_NATIVE}TensorAdvancedIndexing.cpp / IndexingUtils.h expandTensors: a"
        " bool/uint8 mask becomes indices through nonzero",
    ),
    OpSync(
        DEVICE_COPY,
        ("index.Tensor", "index.Tensor_out", "index.Tensor_hacked_twin", "index_put", "index_put_"),
        _indices_copied,
        f"{_NATIVE}TensorAdvancedIndexing.cpp make_info: each index moved to self's device with"
        " `.to(self.device())`, non_blocking false: a host-to-device copy ends in"
        f" memcpy_and_sync ({_NATIVE}cuda/Copy.cu)",
    ),
    OpSync(
        "bool_index",
        ("index_put", "index_put_", "_index_put_impl_"),
        _put_through_mask,
        f"{_NATIVE}TensorAdvancedIndexing.cpp index_put_: masks go through nonzero, except"
        " the canDispatchToMaskedFill case (one mask, one value on the CPU:"
        " torch/csrc/autograd/python_variable_indexing.cpp THPVariable_setitem puts a Python"
        " number there for a CUDA self; a 0-d CUDA tensor value does not qualify)",
    ),
    OpSync(
        "scalar_read",
        ("masked_fill.Tensor", "masked_fill_.Tensor"),
        _device_value(2, "value"),
        f"{_NATIVE}cuda/Indexing.cu masked_fill__cuda(Tensor value):"
        " masked_fill__cuda(self, mask, value.item()) (masked_fill clones, then masked_fill_)",
    ),
    OpSync(
        "scalar_read",
        ("index_fill.int_Tensor", "index_fill_.int_Tensor"),
        _device_value(3, "value"),
        f"{_NATIVE}TensorAdvancedIndexing.cpp index_fill_(..., const Tensor& source), all"
        " devices: self.index_fill_(dim, index, source.item())",
    ),
    OpSync(
        "scalar_read",
        ("_assert_async",),
        _never,
        f"{_NATIVE}cuda/TensorCompare.cu _assert_async_cuda: a device-side assert, no read."
        " The CPU kernel reads its argument (is_nonzero); judged here so that CPU read passes"
        " also where nothing else marks it as an operator's own (inference mode)",
    ),
    OpSync(
        "bincount",
        ("bincount",),
        _bincount,
        _TAGGED + f"{_NATIVE}cuda/SummaryOps.cu _bincount_cuda_template: self.min().cpu()"
        " (not for uint8) and self.max().item() size the output",
    ),
    OpSync(
        "histc",
        ("histc", "histc.out"),
        _histc,
        f"{_NATIVE}cuda/SummaryOps.cu _histc_cuda_template: with min == max (the default) the"
        " range is read from the device, two values",
    ),
    OpSync(
        "linalg_check",
        ("_linalg_check_errors",),
        _one,
        f"{_NATIVE}BatchLinearAlgebra.cpp _linalg_check_errors: infos.any().item<bool>();"
        " torch.linalg docs (inv, cholesky, solve, lu_factor, ldl_factor): 'synchronizes that"
        " device with the CPU'",
    ),
    OpSync(
        "linalg_check",
        (
            "linalg_inv_ex",
            "linalg_cholesky_ex",
            "linalg_lu_factor_ex",
            "linalg_ldl_factor_ex",
            "linalg_solve_ex",
            "_linalg_solve_ex",
            "linalg_lu",
        ),
        _checking_errors,
        "torch.linalg docs of the _ex variants: 'synchronizes only when check_errors = True'"
        f" ({_NATIVE}BatchLinearAlgebra.cpp calls _linalg_check_errors then)",
    ),
    OpSync(
        "linalg_check",
        ("_linalg_eigh", "_linalg_svd", "linalg_eig", "_linalg_eigvals", "linalg_pinv"),
        _if_device(1),
        "torch.linalg docs of eigh, eigvalsh, svdvals, matrix_rank, eig, eigvals, pinv:"
        " 'synchronizes that device with the CPU' (the kernels call _linalg_check_errors; svd"
        " may also read gesvdj's convergence info, eig runs on the host: at least one)",
    ),
    OpSync(
        "host_copy",
        ("_ctc_loss.Tensor", "_use_cudnn_ctc_loss.Tensor"),
        _if_device(2),
        f"{_NATIVE}LossCTC.cpp ctc_loss_tensor / cudnn/LossCTC.cpp: input_lengths and"
        " target_lengths .to(kCPU) (decided from sources)",
    ),
    OpSync(
        "scalar_read",
        ("fill_.Tensor",),
        _fill_host_from_device,
        f"{_NATIVE}Fill.cpp fill_: a 0-d value on another device is read with .item()"
        " (`host[i] = t0`)",
    ),
    OpSync(
        "host_copy",
        ("index_put_", "_index_put_impl_"),
        _put_device_values_on_host,
        f"{_NATIVE}TensorAdvancedIndexing.cpp index_put_: values are copied to the host target",
    ),
)

# Operators one might expect to sync, or tagged ones, that do not on CUDA, and why.
NOT_SYNCING: dict[str, str] = {
    "one_hot": "tagged dynamic_output_shape, but CompositeImplicit: never reaches a dispatch"
    " mode; FUNCTION_SYNCS judges torch.nn.functional.one_hot",
    "nonzero_static": f"{_NATIVE}cuda/Nonzero.cu nonzero_static_cuda: fixed size, no read",
    "masked_scatter": f"{_NATIVE}cuda/IndexKernel.cu launch_masked_scatter_kernel: a prefix sum"
    " on the device, the source size checked by a kernel (masked_scatter_size_check)",
    "index_select": f"{_NATIVE}cuda/Indexing.cu: bounds checked with CUDA_KERNEL_ASSERT (the CPU"
    " kernel checks on the host, inside C++: not seen on CPU either)",
    "gather": f"{_NATIVE}cuda/ScatterGatherKernel.cu: CUDA_KERNEL_ASSERT bounds check",
    "embedding": f"{_NATIVE}Embedding.cpp: index_select; bounds by device assert",
    "nll_loss_forward": f"{_NATIVE}cuda/Loss.cu: target range by CUDA_KERNEL_ASSERT",
    "embedding_renorm_": f"{_NATIVE}cuda/Embedding.cu embedding_renorm_cuda_: cub::unique"
    " keeps the count on the device (torch >= 2.3)",
    "randperm": f"{_NATIVE}cuda/Randperm.cu: no host read",
    "multinomial": f"{_NATIVE}Distributions.cpp multinomial (torch 2.13): the fast path (no"
    " replacement, or one sample) checks the probabilities with at::_assert_async, a device-side"
    " assert on CUDA; with replacement the CUDA kernel checks. No read for any argument (the CPU"
    " kernel of _assert_async reads, inside C++, unseen)",
    "argwhere": "CompositeImplicit: reaches nonzero, which is judged",
    "_ctc_loss": "tagged; the default overload takes host IntArrayRef lengths (the .Tensor"
    " overload is judged)",
}

# Tagged operators not decided from the sources yet: not counted, named so that the table test
# lists every tagged operator somewhere.
UNDECIDED: dict[str, str] = {
    "linalg_lstsq": "tagged dynamic_output_shape (rank/residuals shapes); no sync note in the"
    " torch.linalg.lstsq docs; torch.profiler on CPU shows one read, CPU-only or not unknown",
}


def _tensor_elements(call: OpCall, host: HostMemory) -> int:
    """torch.tensor([t0, t1]): each device tensor element is read with .item()."""
    data = call.argument(0, "data")
    if isinstance(data, torch.Tensor):
        device = call.kwargs.get("device")
        moves_to_host = device is not None and torch.device(device).type == "cpu"
        return int(moves_to_host and host.named() and not host.holds(data))
    if not isinstance(data, list | tuple):
        return 0
    return sum(
        1 for value in _flat(data) if isinstance(value, torch.Tensor) and not host.holds(value)
    )


def destination(call: OpCall) -> torch.device | None:
    """Where a factory or `t.to(...)` puts its result: `device=`, or a device or a tensor
    argument after the first."""
    device = call.kwargs.get("device")
    for value in call.args[1:]:
        if isinstance(value, str | torch.device):
            device = value
        elif isinstance(value, torch.Tensor):
            device = value.device
    return None if device is None else torch.device(device)


def _to_host(call: OpCall, host: HostMemory) -> int:
    """`t.to("cpu")`, `t.to(torch.device("cpu"))`: a blocking copy, unless non_blocking."""
    device = destination(call)
    if device is None or device.type != "cpu" or call.kwargs.get("non_blocking"):
        return 0
    return int(host.named() and not host.holds(call.args[0]))


def _blocking(call: OpCall) -> bool:
    """No `non_blocking=True`, by keyword or as the first bool after the destination."""
    given = call.kwargs.get("non_blocking")
    if given is None:
        given = next((value for value in call.args[1:] if isinstance(value, bool)), False)
    return not given


def _to_device(call: OpCall, host: HostMemory) -> int:
    """`host.to(device)`: host memory copied to a destination the statement does not spell as
    the host, blocking unless non_blocking."""
    device = destination(call)
    if device is None or not host.holds(call.args[0]) or not _blocking(call):
        return 0
    target = next((v for v in call.args[1:] if isinstance(v, torch.Tensor)), None)
    to_host = host.holds(target) if target is not None else device.type == "cpu" and host.named()
    return int(not to_host)


def _cuda(call: OpCall, host: HostMemory) -> int:
    return int(host.holds(call.args[0]) and _blocking(call))


def _copy_to_device(call: OpCall, host: HostMemory) -> int:
    target, source = call.args[0], call.args[1]
    blocking = not call.argument(2, "non_blocking", False)
    return int(blocking and host.holds(source) and not host.holds(target))


def _built_then_copied(call: OpCall, host: HostMemory) -> int:
    """`torch.tensor(data, device=d)`: the data is laid out in host memory, then copied to `d`."""
    device = call.kwargs.get("device")
    if device is None or (torch.device(device).type == "cpu" and host.named()):
        return 0
    return _copies_data(call.argument(0, "data"), host)


def _new_from_data(call: OpCall, host: HostMemory) -> int:
    """`t.new_tensor(data)`: as `torch.tensor(data)`, copied to `t`'s device (or `device=`)."""
    device = call.kwargs.get("device")
    if device is None and host.holds(call.args[0]):
        return 0
    if device is not None and torch.device(device).type == "cpu" and host.named():
        return 0
    return _copies_data(call.argument(1, "data"), host)


def _copies_data(data: object, host: HostMemory) -> int:
    """Whether data built on the host is copied to a device: a device tensor as the data is
    copied on the device; device tensors inside a list are read one by one, by
    `_tensor_elements`, which leaves the copy nothing to wait for."""
    if isinstance(data, torch.Tensor):
        return int(host.holds(data))
    if isinstance(data, torch.UntypedStorage | torch.TypedStorage):
        # A storage is viewed where it lies: safetensors hands over its file's storage with the
        # device it loads to, which only a run on a GPU box tells apart from the storage's.
        return 0
    elements = _flat(data) if isinstance(data, list | tuple) else ()
    return int(not any(isinstance(value, torch.Tensor) for value in elements))


def _packed_to_host(call: OpCall, host: HostMemory) -> int:
    """`packed.cpu()`: its data and index tensors each copied to the host (`batch_sizes` is
    always the host's)."""
    packed = call.args[0]
    tensors = (packed.data, packed.sorted_indices, packed.unsorted_indices)
    return sum(1 for tensor in tensors if tensor is not None and not host.holds(tensor))


def _one_hot(call: OpCall, host: HostMemory) -> int:
    classes = call.argument(1, "num_classes", -1)
    return int(classes == -1 and call.args[0].numel() > 0 and not host.holds(call.args[0]))


_TO_DEVICE = (
    f"{_NATIVE}cuda/Copy.cu copy_kernel_cuda: a host-to-device copy without non_blocking ends"
    " in at::cuda::memcpy_and_sync (cudaMemcpyAsync, then cudaStreamSynchronize;"
    " c10/cuda/CUDAFunctions.h), which set_sync_debug_mode('warn') flags"
)

FUNCTION_SYNCS: tuple[FunctionSync, ...] = (
    FunctionSync(
        "tolist",
        "torch.Tensor.tolist",
        _one,
        "torch/csrc/utils/tensor_list.cpp tensor_to_list: copies the tensor to the host first",
    ),
    FunctionSync("cpu", "torch.Tensor.cpu", _one, f"{_NATIVE}cuda/Copy.cu: blocking D2H copy"),
    FunctionSync(
        "cpu",
        "torch.nn.utils.rnn.PackedSequence.cpu",
        _packed_to_host,
        "torch/nn/utils/rnn.py PackedSequence.cpu: on CUDA, .to('cpu') of data and of each index"
        " tensor; on the host, the branch that copies nothing",
        replaces_kernels=True,
    ),
    FunctionSync(
        "host_copy",
        "torch.Tensor.copy_",
        _copy_to_host,
        f"{_NATIVE}cuda/Copy.cu copy_kernel_cuda: a blocking device-to-host copy ends in"
        " stream synchronize (warned by set_sync_debug_mode); judged where Python calls it, as"
        " the copies aten makes inside other operators are theirs",
    ),
    FunctionSync("cpu", "torch.Tensor.to", _to_host, f"{_NATIVE}cuda/Copy.cu: blocking D2H copy"),
    FunctionSync(
        DEVICE_COPY,
        "torch.Tensor.to",
        _to_device,
        _TO_DEVICE + " (TensorConversions.cpp _to_copy: copy_ with the call's non_blocking)",
    ),
    FunctionSync(DEVICE_COPY, "torch.Tensor.cuda", _cuda, _TO_DEVICE + " (.cuda() is .to)"),
    FunctionSync(
        DEVICE_COPY, "torch.Tensor.copy_", _copy_to_device, _TO_DEVICE + " (copy_ from the host)"
    ),
    FunctionSync(
        DEVICE_COPY,
        "torch.tensor",
        _built_then_copied,
        "torch/csrc/utils/tensor_new.cpp internal_new_from_data: built on the host, then"
        " .to(device, non_blocking=false); " + _TO_DEVICE,
    ),
    FunctionSync(DEVICE_COPY, "torch.as_tensor", _built_then_copied, "as torch.tensor"),
    FunctionSync(
        DEVICE_COPY,
        "torch.Tensor.new_tensor",
        _new_from_data,
        "torch/csrc/utils/tensor_new.cpp new_tensor: internal_new_from_data on self's device,"
        " as torch.tensor",
    ),
    FunctionSync(DEVICE_COPY, "torch.asarray", _built_then_copied, "as torch.tensor"),
    FunctionSync(
        "numpy",
        "torch.Tensor.numpy",
        _one,
        "torch/csrc/utils/tensor_numpy.cpp: a CUDA tensor must be copied to the host first",
    ),
    FunctionSync(
        "scalar_read",
        "torch.tensor",
        _tensor_elements,
        "torch/csrc/utils/tensor_new.cpp recursive_store: each tensor element is read with"
        " .item() (torch.profiler on CPU: one aten::_local_scalar_dense per element)",
    ),
    FunctionSync("scalar_read", "torch.as_tensor", _tensor_elements, "as torch.tensor"),
    FunctionSync("scalar_read", "torch.asarray", _tensor_elements, "as torch.tensor"),
    FunctionSync(
        "scalar_read",
        "torch.nn.functional.one_hot",
        _one_hot,
        f"{_NATIVE}Onehot.cpp one_hot: on CPU self_min/self_max are read to validate; on CUDA"
        " only num_classes=-1 reads self.max().item() ('for cuda, rely on device assert')",
        replaces_kernels=True,
    ),
)


def resolve(name: str) -> object:
    """The object a dotted name like `torch.Tensor.tolist` names in the installed torch."""
    module, *attributes = name.split(".")
    value: object = {"torch": torch}[module]
    for attribute in attributes:
        value = getattr(value, attribute)
    return value


def overloads(entry: OpSync) -> Iterator[torch._ops.OpOverload]:
    """The installed overloads an entry covers (packets missing from this torch are skipped)."""
    for op in entry.ops:
        packet_name, _, overload = op.partition(".")
        packet = getattr(torch.ops.aten, packet_name, None)
        if packet is None:
            continue
        for name in [overload] if overload else packet.overloads():
            if name in packet.overloads():
                yield getattr(packet, name)
