"""A labelled suite for `hostsync.detector`: small cases, each with what a CUDA device does.

Every case is a function building its own tensors (on CPU they stand for device tensors). A line
the host would wait on with CUDA tensors ends in `# sync`, or `# sync N` for N waits; nothing
else may be recorded. `source` says where the truth comes from: PyTorch's CUDA sources and docs
(paths under aten/src/ATen/native/ unless said otherwise), or, where a case was decided from the
sources without a GPU at hand, says so. `score()` runs them all under a scope.

The suite grows by family, not case by case: each Python protocol of Tensor (truth, numbers,
index, formatting, hashing, iteration, containment, comparisons, numpy and buffer interop,
pickling and copying), the torch functions that return Python numbers, outputs sized by device
data, writes and fills with tensor values, indexing with tensors, host copies, and the library
code that reads (distributions, nn utilities, linalg). Cases whose CUDA truth is not settled are
kept apart in `UNDECIDED`, with the reason, and not scored.
"""

from __future__ import annotations

import copy
import inspect
import io
import logging
import math
import pickle
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from hostsync.detector import SyncScope

_MARKER = re.compile(r"#\s*sync(?:\s+(\d+))?\s*$")


@dataclass(frozen=True)
class Example:
    function: Callable[[], object]
    family: str
    source: str

    @property
    def name(self) -> str:
        return self.function.__name__

    def expected(self) -> Counter[int]:
        """Host waits per line of this file, from the `# sync` markers."""
        lines, first = inspect.getsourcelines(self.function)
        expected: Counter[int] = Counter()
        for offset, line in enumerate(lines):
            marker = _MARKER.search(line)
            if marker:
                expected[first + offset] += int(marker.group(1) or 1)
        return expected


EXAMPLES: list[Example] = []
# Cases whose CUDA truth is ambiguous or not decided from the sources: kept, not scored.
UNDECIDED: list[Example] = []


def example(family: str, source: str) -> Callable[[Callable[[], object]], Callable[[], object]]:
    def register(function: Callable[[], object]) -> Callable[[], object]:
        EXAMPLES.append(Example(function, family, source))
        return function

    return register


def undecided(family: str, reason: str) -> Callable[[Callable[[], object]], Callable[[], object]]:
    def register(function: Callable[[], object]) -> Callable[[], object]:
        UNDECIDED.append(Example(function, family, reason))
        return function

    return register


# The device under test: a statement that names no device makes host memory on a GPU box too,
# so the cases' tensors name this one, as training code names its device.
DEVICE = torch.device("cpu")


# Device tensors made once, outside any scope: a case clones them, a copy on the device, so that
# no case pays for building its inputs (`torch.tensor(data, device=d)` is a blocking copy).
_VALUES = torch.tensor([1.0, -2.0, 3.0, 3.0], device=DEVICE)
_COUNTS = torch.tensor([0, 2, 1, 2], device=DEVICE)
_SQUARE = torch.tensor([[2.0, 0.5], [0.5, 1.0]], device=DEVICE)
_FLOATS = torch.tensor([1.5, -2.0], device=DEVICE)
_INTEGERS = torch.tensor([3, 1], device=DEVICE)
_ZERO_DIM = torch.tensor(5.0, device=DEVICE)


def values() -> torch.Tensor:
    return _VALUES.clone()


def counts() -> torch.Tensor:
    return _COUNTS.clone()


def square() -> torch.Tensor:
    return _SQUARE.clone()


SCALAR = "cuda/CUDAScalar.cu _local_scalar_dense_cuda: memcpy_and_sync of one value"

# --- scalar reads: what Python makes of a tensor --------------------------------------------


@example("scalar_read", SCALAR + "; Tensor.item docs")
def item():
    t = values()
    return t.sum().item()  # sync


@example("scalar_read", SCALAR + " (inference_mode changes no read)")
def item_under_inference_mode():
    t = values()
    with torch.inference_mode():
        return (t * 2).sum().item()  # sync


@example("scalar_read", SCALAR + " (Tensor.__bool__ -> is_nonzero -> item)")
def if_on_tensor():
    t = values()
    if t.sum() > 0:  # sync
        return 1
    return 0


@example("scalar_read", SCALAR + " (max compares with __bool__)")
def python_max():
    t = values()
    return max(t.sum(), 1)  # sync


@example("scalar_read", SCALAR + " (__int__)")
def int_of():
    t = values()
    return int(t.sum())  # sync


@example("scalar_read", SCALAR + " (__float__)")
def float_of():
    t = values()
    return float(t.sum())  # sync


@example("scalar_read", SCALAR + " (__bool__)")
def bool_of_any():
    t = values()
    return bool((t > 2).any())  # sync


@example("scalar_read", SCALAR + ": one read per loop test, the loop runs 3 times")
def while_loop():
    t = values()
    n = 0
    while n < t[2]:  # sync 4
        n += 1
    return n


@example("scalar_read", SCALAR + " (assert calls __bool__)")
def assert_all():
    t = values()
    assert (t > -10).all()  # sync


@example("scalar_read", SCALAR + " (list indexing calls __index__)")
def list_index_by_tensor():
    t = values()
    names = ["a", "b", "c", "d"]
    return names[t.argmax()]  # sync


@example("scalar_read", SCALAR + " (math functions call __float__)")
def math_isfinite():
    t = values()
    return math.isfinite(t.sum())  # sync


@example("scalar_read", SCALAR + " (torch/_tensor.py __format__: self.item() for 0-d)")
def format_zero_dim():
    t = values()
    return f"{t.sum():.2f}"  # sync


@example("scalar_read", "cuda/Equal.cpp cuda_equal: eq(...).all().item<bool>()")
def torch_equal():
    t = values()
    return torch.equal(t, t.clone())  # sync


@example("scalar_read", "TensorCompare.cpp allclose: isclose(...).all().item<uint8_t>()")
def torch_allclose():
    t = values()
    return torch.allclose(t, t + 1e-9)  # sync


@example(
    "scalar_read", "torch/csrc/utils/python_arg_parser.cpp: a Tensor for a Scalar is .item()'d"
)
def tensor_as_fill_value():
    t = values()
    return torch.full((2,), t.sum())  # sync


@example("scalar_read", "python_arg_parser.cpp: a Tensor for an int is read with .item()")
def tensor_as_arange_end():
    t = counts()
    return torch.arange(t.sum())  # sync


@example("scalar_read", "python_arg_parser.cpp: a Tensor for a SymInt start is read")
def tensor_as_narrow_start():
    t = values()
    return t.narrow(0, counts()[2], 2)  # sync


@example("scalar_read", "python_arg_parser.cpp: alpha is a Scalar")
def tensor_as_alpha():
    t = values()
    return t.add(t, alpha=t[0])  # sync


@example("scalar_read", SCALAR + " (is_nonzero is CompositeImplicit: item)")
def is_nonzero():
    t = values()
    return t[0].is_nonzero()  # sync


@example(
    "scalar_read",
    "torch/distributions/distribution.py __init__: `if not torch._is_all_true(valid)` per"
    " constraint (loc, scale): two reads, made inside torch, shown at the caller",
)
def distribution_validation():
    t = values()
    return torch.distributions.Normal(t, t.abs() + 1, validate_args=True)  # sync 2


@example("scalar_read", "torch/nn/utils/clip_grad.py: error_if_nonfinite tests the norm with `if`")
def clip_grad_norm_checking():
    weight = torch.nn.Parameter(values())
    weight.grad = values()
    torch.nn.utils.clip_grad_norm_([weight], 1.0, error_if_nonfinite=True)  # sync


@example("scalar_read", "custom autograd.Function: backward's .item() syncs in autograd's thread")
def backward_reads_item():
    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            scale = grad.abs().max().item()  # sync
            return grad * 2 / max(scale, 1.0)

    x = values().requires_grad_()
    Scaled.apply(x).sum().backward()


INDEXING = "ATen/TensorIndexing.h handleDimInMultiDimIndexing: a 0-d integer/bool index is read"


@example("scalar_read", INDEXING + " with tensor.item<int64_t>() and becomes a select")
def index_by_zero_dim_tensor():
    t = values()
    return t[counts()[2]]  # sync


@example("scalar_read", INDEXING + " with tensor.item<bool>()")
def index_by_zero_dim_bool():
    t = values()
    return t[t.sum() > 0]  # sync


@example("scalar_read", INDEXING + "; assignment goes through the same index conversion")
def assign_at_zero_dim_index():
    t = values()
    t[counts()[1]] = 0.0  # sync
    return t


# --- outputs sized by device data ------------------------------------------------------------

TAG = "tagged dynamic_output_shape in native_functions.yaml; "


@example("nonzero", TAG + "cuda/Nonzero.cu; torch.nonzero docs: 'causes host-device sync'")
def nonzero():
    t = values()
    return t.nonzero()  # sync


@example("nonzero", "torch.where docs: where(condition) is nonzero(condition, as_tuple=True)")
def where_condition_only():
    t = values()
    return torch.where(t > 0)  # sync


@example("nonzero", "torch.argwhere docs: 'causes host-device synchronization'")
def argwhere():
    t = values()
    return torch.argwhere(t)  # sync


@example("nonzero", TAG + "nonzero(as_tuple=True)")
def nonzero_as_tuple():
    t = values()
    return t.nonzero(as_tuple=True)  # sync


@example("masked_select", TAG + "masked_select sizes its output by the mask")
def masked_select():
    t = values()
    return torch.masked_select(t, t > 0)  # sync


@example("bool_index", TAG + "IndexingUtils.h expandTensors: a bool mask goes through nonzero")
def bool_mask_index():
    t = values()
    return t[t > 0]  # sync


@example("bool_index", TAG + "expandTensors: a 2-D bool mask the same")
def bool_mask_rows():
    t = square()
    return t[t.sum(dim=1) > 2]  # sync


@example("bool_index", "TensorAdvancedIndexing.cpp index_put_: a tensor value is not masked_fill")
def assign_tensor_through_mask():
    t = values()
    t[t > 0] = t.new_zeros(3)  # sync


@example("bool_index", "index_put_ with accumulate=True never becomes masked_fill")
def accumulate_through_mask():
    t = values()
    t.index_put_((t > 0,), t.new_ones(()), accumulate=True)  # sync


@example("unique", TAG + "cuda/Unique.cu")
def unique():
    t = values()
    return torch.unique(t)  # sync


@example("unique", TAG + "cuda/Unique.cu unique_dim")
def unique_dim():
    t = square()
    return torch.unique(t, dim=0)  # sync


@example("unique", TAG + "cuda/Unique.cu unique_consecutive")
def unique_consecutive():
    t = values()
    return torch.unique_consecutive(t)  # sync


@example("unique", TAG + "cuda/Unique.cu, return_counts in the same call")
def unique_with_counts():
    t = counts()
    return torch.unique(t, return_counts=True)  # sync


@example("repeat_interleave", TAG + "Repeat.h: the total length is read without output_size")
def repeat_by_counts():
    t = values()
    return torch.repeat_interleave(t, counts())  # sync


@example("bincount", TAG + "cuda/SummaryOps.cu _bincount_cuda_template: min().cpu() and max()")
def bincount():
    return torch.bincount(counts())  # sync 2


@example("bincount", "cuda/SummaryOps.cu: uint8 input skips the min() check, max() remains")
def bincount_uint8():
    return torch.bincount(counts().to(torch.uint8))  # sync


@example("bincount", "cuda/SummaryOps.cu: minlength does not avoid the reads")
def bincount_with_minlength():
    return torch.bincount(counts(), minlength=8)  # sync 2


@example("histc", "cuda/SummaryOps.cu _histc_cuda_template: min == max (default) reads the range")
def histc_default_range():
    t = values()
    return torch.histc(t, bins=4)  # sync 2


@example("none", "Distributions.cpp multinomial (torch 2.13): checked by _assert_async, no read")
def multinomial_without_replacement():
    p = values().abs()
    return torch.multinomial(p, 2)


@example("none", "Distributions.cpp multinomial (torch 2.13): n_sample == 1 takes the same path")
def multinomial_one_sample():
    p = values().abs()
    return torch.multinomial(p, 1, replacement=True)


LINALG = "torch.linalg docs: 'synchronizes that device with the CPU'; _linalg_check_errors"


@example("linalg_check", LINALG)
def linalg_inv():
    return torch.linalg.inv(square())  # sync


@example("linalg_check", LINALG)
def linalg_cholesky():
    return torch.linalg.cholesky(square())  # sync


@example("linalg_check", LINALG)
def linalg_solve():
    return torch.linalg.solve(square(), values()[:2])  # sync


@example("linalg_check", "torch.linalg.inv_ex docs: 'synchronizes only when check_errors = True'")
def linalg_inv_ex_checking():
    return torch.linalg.inv_ex(square(), check_errors=True)  # sync


@example("linalg_check", LINALG + " (eigh: linalg_eigh kernel checks its infos)")
def linalg_eigh():
    return torch.linalg.eigh(square())  # sync


@example("scalar_read", "Onehot.cpp: on CUDA, num_classes=-1 reads self.max().item()")
def one_hot_inferred_classes():
    return F.one_hot(counts())  # sync


# --- device-to-host copies -------------------------------------------------------------------

COPY = "cuda/Copy.cu copy_kernel_cuda: a blocking device-to-host copy synchronizes the stream"


@example("tolist", "torch/csrc/utils/tensor_list.cpp tensor_to_list copies to the host first")
def tolist():
    t = values()
    return t.tolist()  # sync


@example("cpu", COPY)
def cpu():
    t = values()
    return t.cpu()  # sync


@example("numpy", "torch/csrc/utils/tensor_numpy.cpp: a CUDA tensor needs .cpu() first")
def numpy_after_cpu():
    t = values()
    return t.cpu().numpy()  # sync


@example("numpy", "Tensor.__array__ calls numpy(); on CUDA behind a host copy")
def numpy_array_of():
    t = values()
    return np.asarray(t.cpu())  # sync


@example("cpu", COPY + "; a chain on one line copies once")
def detach_cpu_tolist():
    t = values()
    return t.detach().cpu().tolist()  # sync


@example("cpu", COPY + " (.to with a device string)")
def to_cpu_string():
    t = values()
    return t.to("cpu")  # sync


@example("cpu", COPY + " (.to with a torch.device)")
def to_cpu_device():
    t = values()
    return t.to(torch.device("cpu"))  # sync


@example("cpu", COPY + " (.to with device=)")
def to_cpu_keyword():
    t = values()
    return t.to(device="cpu", dtype=torch.float64)  # sync


@example("cpu", COPY + "; the result is host memory: reading it is free")
def read_of_host_result():
    t = values()
    host = t.to("cpu", torch.float64)  # sync
    return host.sum().item() + len(host.tolist())


@example("host_copy", COPY + " (copy_ into a host tensor)")
def copy_into_host():
    t = values()
    host = torch.empty(4, device="cpu")
    host.copy_(t)  # sync
    return host


# --- copies to the device: each blocking one waits like a read -------------------------------

TO_DEVICE_SHORT = "cuda/Copy.cu: a blocking host-to-device copy ends in memcpy_and_sync"
TO_DEVICE = (
    "cuda/Copy.cu copy_kernel_cuda: a host-to-device copy without non_blocking ends in"
    " at::cuda::memcpy_and_sync (cudaStreamSynchronize)"
)


@example("device_copy", TO_DEVICE + " (.to(device) of a tensor made on the host)")
def host_to_device():
    host = torch.tensor([1.0, 2.0])
    return host.to(DEVICE)  # sync


@example("none", "cuda/Copy.cu: with non_blocking the copy is queued, no wait")
def host_to_device_non_blocking():
    host = torch.tensor([1.0, 2.0])
    return host.to(DEVICE, non_blocking=True)


@example("device_copy", "torch/csrc/utils/tensor_new.cpp: built on the host, then " + TO_DEVICE)
def tensor_on_the_device():
    return torch.tensor([1.0, 2.0], device=DEVICE)  # sync


@example("device_copy", "torch.as_tensor of host data with a device: as torch.tensor")
def as_tensor_on_the_device():
    return torch.as_tensor(np.ones(3), device=DEVICE)  # sync


NEW_TENSOR = (
    "torch/csrc/utils/tensor_new.cpp new_tensor: internal_new_from_data builds the data on the"
    " host, then .to(self's device, non_blocking=false); " + TO_DEVICE
)


@example("device_copy", NEW_TENSOR)
def new_tensor_from_a_list():
    t = values()
    return t.new_tensor([1.0, 2.0])  # sync


@example("device_copy", NEW_TENSOR + " (a Python number)")
def new_tensor_from_a_number():
    t = values()
    return t.new_tensor(0.5)  # sync


@example(
    "none", "TensorFactories.cpp new_zeros, new_ones, new_full, new_empty: filled on the device"
)
def new_filled_on_the_device():
    t = values()
    return t.new_zeros(3), t.new_ones(2), t.new_full((2,), 1.0), t.new_empty(4)


@example("none", "new_tensor of host memory is made where it is, on the host: no copy, no read")
def new_tensor_of_host_memory():
    host = torch.zeros(2)
    return host.new_tensor([1.0, 2.0]).tolist(), host.new_zeros(2).tolist()


@example("none", "new_tensor with device='cpu' is built on the host and stays there")
def new_tensor_on_the_host():
    t = values()
    return t.new_tensor([1.0], device="cpu").tolist()


@example("device_copy", TO_DEVICE + " (copy_ from host memory into a device tensor)")
def copy_into_device():
    target = values()
    target.copy_(torch.zeros(4))  # sync
    return target


@example("none", "copy_ from the host with non_blocking=True is queued")
def copy_into_device_non_blocking():
    target = values()
    target.copy_(torch.zeros(4), non_blocking=True)
    return target


@example("device_copy", TO_DEVICE + " (torch.from_numpy shares the array's host memory)")
def numpy_array_to_device():
    host = torch.from_numpy(np.ones(3))
    return host.to(DEVICE)  # sync


@example("none", "torch.from_numpy: a tensor over the array's host memory; reading it is free")
def read_of_numpy_backed_tensor():
    host = torch.from_numpy(np.ones(1))
    return host.item(), host.tolist()


@example("device_copy", "torch/csrc/utils/tensor_new.cpp legacy_tensor_ctor: built on the host")
def legacy_constructor_to_device():
    host = torch.Tensor(np.ones(2, dtype=np.float32))
    return host.to(DEVICE)  # sync


@example("none", "torch.Tensor(data), the legacy constructor, lies on the host: reading it is free")
def read_of_legacy_constructor():
    return torch.Tensor([1.0]).item(), torch.Tensor(np.ones(2)).tolist()


@example("none", "a view of host memory made with frombuffer is host memory: reading it is free")
def read_of_host_view():
    host = torch.frombuffer(bytearray(4), dtype=torch.uint8).view(2, 2)
    return int(host[0, 1]), host[1].numpy(), host.long()[0, 0].item()


@example("none", "a factory given a host tensor's device (`device=x.device`) makes host memory")
def factory_on_a_host_tensors_device():
    image = torch.from_numpy(np.ones((1, 2, 2)))
    mean = torch.as_tensor([0.5], dtype=image.dtype, device=image.device)
    return bool((mean == 0).any()), image.sub(mean.view(-1, 1, 1)).tolist()


@example("device_copy", TO_DEVICE + " (a factory given a device tensor's device)")
def factory_on_a_device_tensors_device():
    t = values()
    return torch.as_tensor([0.5], device=t.device)  # sync


# A rank's device with its index (accelerate names `cpu:0` on a CPU rank): on CPU, `.to` then
# makes a copy from host memory, which stands for the device's copy as the tensor itself does.
INDEXED = torch.device(DEVICE.type, 0)


@example("device_copy", TO_DEVICE + " (to an indexed device; the copy is on the device after)")
def host_to_indexed_device_then_again():
    host = torch.tensor([1.0, 2.0])
    moved = host.to(INDEXED)  # sync
    return moved.to(INDEXED)


@example("scalar_read", SCALAR + " (a view of host memory copied to the device, then viewed)")
def read_of_moved_host_view():
    host = torch.zeros(4)
    moved = host[1:].to(DEVICE)  # sync
    return moved[0].item()  # sync


@example("device_copy", "torch/utils/data: a DataLoader collates on the host; " + TO_DEVICE)
def collated_batch_to_device():
    loader = torch.utils.data.DataLoader([_VALUES, _VALUES], batch_size=2)
    batch = next(iter(loader))
    return batch.to(DEVICE)  # sync


@example("cpu", COPY + "; the copy is host memory: reading it is no read")
def read_of_cpu_copy():
    t = values()
    host = t.cpu()  # sync
    return host.sum().item(), host.tolist()


PACKED = (
    "torch/nn/utils/rnn.py PackedSequence.cpu: on CUDA, .to('cpu') of data, then of each index"
    " tensor (call_to); " + COPY
)


@example("cpu", PACKED)
def packed_sequence_to_host():
    packed = torch.nn.utils.rnn.pack_padded_sequence(values().view(2, 2, 1), [2, 1])
    return packed.cpu()  # sync


@example("cpu", PACKED + ": sorted and unsorted indices too, after their copy to the device")
def unsorted_packed_sequence_to_host():
    lengths = [1, 2]
    padded = values().view(2, 2, 1)
    # the sorted indices, sorted on the host, are copied to the device: rnn.py, `.to(input.device)`
    packed = torch.nn.utils.rnn.pack_padded_sequence(padded, lengths, enforce_sorted=False)  # sync
    return packed.cpu()  # sync 3


@example("none", "a PackedSequence of host memory: .cpu() returns it, nothing is copied")
def packed_sequence_of_host_memory_to_host():
    packed = torch.nn.utils.rnn.pack_padded_sequence(torch.zeros(2, 2, 1), [2, 1])
    return packed.cpu().data.tolist()


@example("none", "a device tensor moved to the device is the same tensor: no copy")
def device_to_device():
    return values().to(DEVICE)


@example("scalar_read", "Fill.cpp fill_ / copy_: a 0-d device value written into host memory")
def assign_into_host():
    t = values()
    host = torch.zeros(4, device="cpu")
    host[0] = t.sum()  # sync
    return host


@example("host_copy", "torch/serialization.py _save: storage.cpu() for each device storage")
def torch_save():
    t = values()
    torch.save({"weight": t, "bias": values()}, io.BytesIO())  # sync 2


@example("host_copy", "torch/serialization.py _save: views of one storage are written once")
def torch_save_views():
    t = values()
    torch.save([t, t[1:]], io.BytesIO())  # sync


@example("scalar_read", "torch/csrc/utils/tensor_new.cpp: each tensor element is read (.item())")
def tensor_of_device_scalars():
    t = values()
    return torch.tensor([t.sum(), t.max()])  # sync 2


@example("scalar_read", "tensor_new.cpp: a list of 0-d tensors built in a loop, one read each")
def tensor_of_collected_losses():
    t = values()
    losses = [t[i] * 2 for i in range(3)]
    return torch.tensor(losses)  # sync 3


@example("scalar_read", "torch.as_tensor shares torch.tensor's recursive_store for sequences")
def as_tensor_of_device_scalars():
    t = values()
    return torch.as_tensor([t.sum()])  # sync


# --- no sync on CUDA -------------------------------------------------------------------------


@example("none", "arithmetic and reductions stay on the device")
def arithmetic():
    t = values()
    return (t * 2).sum() / t.numel()


@example("none", "shapes are host metadata")
def shapes():
    t = values()
    return len(t), t.shape[0], t.numel(), t.dim()


@example("none", "the workspace's fixed loss aggregation: torch.where + clamp, no host read")
def loss_aggregation_without_sync():
    losses, tokens = values().abs(), counts()
    weighted = torch.where(tokens > 0, losses * tokens, torch.zeros_like(losses))
    return weighted.sum() / tokens.sum().clamp(min=1)


@example("none", "torch.stack of 0-d tensors stays on the device")
def stack_of_scalars():
    t = values()
    return torch.stack([t.sum(), t.max()])


@example("none", "torch.where with three arguments is elementwise")
def where_three_args():
    t = values()
    return torch.where(t > 0, t, 0.0)


@example("none", "index_put_ -> masked_fill_ (canDispatchToMaskedFill): no nonzero")
def assign_scalar_through_mask():
    t = values()
    t[t > 0] = 0.0
    return t


@example("none", "masked_fill is elementwise")
def masked_fill():
    t = values()
    return t.masked_fill(t > 0, 1.0)


@example("none", "advanced indexing with a device index: no output size to read, no copy")
def index_with_long_tensor():
    t = values()
    return t[counts()]


INDEX_COPY = (
    "TensorAdvancedIndexing.cpp make_info: an index on another device is moved with"
    " `.to(self.device())`, non_blocking false; " + TO_DEVICE_SHORT
)


@example("device_copy", INDEX_COPY + " (an index made with no device lies on the host)")
def index_with_host_tensor():
    t = values()
    return t[torch.tensor([0, 2])]  # sync


@example(
    "device_copy",
    INDEX_COPY + "; torch/csrc/autograd/python_variable_indexing.cpp sequenceToVariable builds"
    " a numpy index over the array, in host memory",
)
def index_with_numpy_array():
    t = values()
    return t[np.array([0, 2])]  # sync


@example("device_copy", INDEX_COPY + " (index_put_ of a numpy index: the same make_info)")
def assign_at_numpy_index():
    t = values()
    t[np.array([0, 2])] = 0.0  # sync
    return t


@example("none", "a host tensor indexed by numpy: the index is already where the tensor is")
def host_tensor_with_numpy_index():
    host = torch.zeros(4)
    return host[np.array([0, 2])]


@example("none", "Repeat.h: output_size given, nothing read")
def repeat_with_output_size():
    t = values()
    return torch.repeat_interleave(t, torch.full((4,), 2), output_size=8)


@example("none", "repeat_interleave with an int repeats: size from the host")
def repeat_by_int():
    t = values()
    return torch.repeat_interleave(t, 2)


@example("none", "cuda/Nonzero.cu nonzero_static_cuda: fixed output size, no read")
def nonzero_static():
    t = values()
    return torch.nonzero_static(t, size=4)


@example("none", "cuda/SummaryOps.cu: min != max, the range is known")
def histc_explicit_range():
    t = values()
    return torch.histc(t, bins=4, min=-3, max=3)


@example("none", "Distributions.cpp: with replacement and several samples the CUDA kernel checks")
def multinomial_with_replacement():
    p = values().abs()
    return torch.multinomial(p, 3, replacement=True)


@example("none", "cuda/SummaryOps.cu: an empty 1-D input returns zeros(minlength) before reading")
def bincount_empty():
    return torch.bincount(torch.tensor([], dtype=torch.long), minlength=3)


@example("none", "torch.linalg.inv_ex docs: no sync unless check_errors=True")
def linalg_inv_ex():
    return torch.linalg.inv_ex(square())


@example("none", "torch.linalg.cholesky_ex docs: no sync unless check_errors=True")
def linalg_cholesky_ex():
    return torch.linalg.cholesky_ex(square())


@example("none", "torch.linalg.det has no sync note; LU without error check")
def linalg_det():
    return torch.linalg.det(square())


@example("none", "TensorConversions.cpp _to_copy pins the result of a non_blocking copy to cpu")
def to_cpu_non_blocking():
    t = values()
    return t.to("cpu", non_blocking=True)


@example("none", "a device variable is the training device (cuda on the GPU box): no host copy")
def to_training_device():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t = values()
    return t.to(device)


@example("none", "host memory read on the host: no device involved")
def read_host_tensor():
    host = torch.zeros(3, device="cpu")
    return host.sum().item(), host.tolist()


@example("none", "torch.tensor of Python numbers, no device: made in host memory")
def tensor_of_python_numbers():
    return torch.tensor([1.0, 2.0, 3.0])


@example("none", "torch.tensor of a tensor keeps its device (a copy on the device)")
def tensor_of_tensor():
    t = values()
    return torch.tensor(t)


@example("none", "reductions over a dim return device tensors")
def max_over_dim():
    t = square()
    return t.max(dim=0)


@example("none", "clamp with Python bounds is elementwise")
def clamp():
    t = values()
    return t.clamp(min=1)


@example("none", "clip_grad.py without error_if_nonfinite: no host read")
def clip_grad_norm_plain():
    weight = torch.nn.Parameter(values())
    weight.grad = values()
    return torch.nn.utils.clip_grad_norm_([weight], 1.0)


@example("none", "sort/topk keep values and indices on the device")
def topk():
    t = values()
    return t.topk(2)


@example("none", "cumsum/argmax stay on the device")
def cumsum_argmax():
    t = values()
    return t.cumsum(0).argmax()


@example("none", "torch.distributions sampling without validation")
def distribution_sample():
    t = values()
    return torch.distributions.Normal(t, t.abs() + 1, validate_args=False).sample()


@example("none", "dropout draws on the device")
def dropout():
    t = values()
    return F.dropout(t, 0.5, training=True)


# --- CPU kernels that check on the host where CUDA asserts on the device ----------------------


@example("none", "Onehot.cpp: 'for cuda, rely on device assert thrown by scatter' (CPU reads)")
def one_hot_with_classes():
    return F.one_hot(counts(), num_classes=4)


@example("none", "cuda/Indexing.cu index_select: CUDA_KERNEL_ASSERT on the bounds")
def index_select():
    t = values()
    return t.index_select(0, counts())


@example("none", "cuda/ScatterGatherKernel.cu: bounds by CUDA_KERNEL_ASSERT")
def gather():
    t = values()
    return t.gather(0, counts())


@example("none", "Embedding.cpp: index_select on CUDA, device-side bounds check")
def embedding():
    return F.embedding(counts(), square().repeat(2, 1))


@example("none", "cuda/Loss.cu nll_loss: target range by CUDA_KERNEL_ASSERT")
def cross_entropy():
    logits = square().repeat(2, 2)
    return F.cross_entropy(logits, counts())


@example("none", "cuda/ScatterGatherKernel.cu scatter_add: device-side bounds check")
def scatter_add():
    t = values()
    return torch.zeros(4).scatter_add(0, counts(), t)


@example("none", "cuda/TensorCompare.cu _assert_async_cuda: a device-side assert, no read")
def assert_async():
    t = values()
    return torch._assert_async((t > -10).all())


@example(
    "none", "cuda/IndexKernel.cu launch_masked_scatter_kernel: prefix sum and a size-check kernel"
)
def masked_scatter():
    t = values()
    return t.masked_scatter(t > 0, t * 2)


@example("none", "cuda/Embedding.cu embedding_renorm_cuda_: cub::unique, count stays on device")
def embedding_with_max_norm():
    return F.embedding(counts(), square().repeat(2, 1), max_norm=1.0)


@example("none", "Distributions.cpp: bernoulli draws on the device")
def bernoulli():
    return torch.bernoulli(values().abs() / 4)


# --- Python protocols of Tensor, one by one (torch/_tensor.py) -------------------------------


@example("scalar_read", SCALAR + " (not calls __bool__)")
def not_of_tensor():
    t = values()
    return not (t > 5).any()  # sync


@example("scalar_read", SCALAR + ": `a or b` tests a only and returns b, a tensor")
def or_of_tensors():
    t = values()
    return (t > 5).any() or (t < 0).any()  # sync


@example("scalar_read", SCALAR + ": `0 < t < 10` tests the first comparison, returns the second")
def chained_comparison():
    t = values().sum()
    return 0 < t < 10  # sync


@example("scalar_read", SCALAR + " (__complex__)")
def complex_of():
    return complex(values().sum())  # sync


@example("scalar_read", SCALAR + " (Tensor has no __floor__: math.floor takes __float__)")
def math_floor():
    return math.floor(values().sum())  # sync


@example("scalar_read", SCALAR + " (range() takes __index__)")
def range_of_tensor():
    return list(range(counts()[1]))  # sync


@example("scalar_read", INDEXING + ": each tensor bound of a slice is read (__index__)")
def slice_by_tensor_bounds():
    t, bounds = values(), counts()
    return t[bounds[0] : bounds[1]]  # sync 2


@example("scalar_read", "torch/_tensor.py __contains__: (element == self).any().item()")
def contains():
    return 3.0 in values()  # sync


@example("scalar_read", SCALAR + ": list.__contains__ tests == with __bool__ per item until found")
def tensor_in_list():
    t = values()
    return t[2] in [t[0], t[1], t[2]]  # sync 3


@example("scalar_read", SCALAR + ": CPython's sort makes 3 comparisons (__lt__) for these values")
def sorted_scalars():
    t = values()
    return sorted([t[0], t[1], t[2]])  # sync 3


@example("scalar_read", SCALAR + ": builtin max() iterates and compares, one read per later item")
def builtin_max_over_tensor():
    return max(values())  # sync 3


@example("scalar_read", SCALAR + ": math.fsum takes __float__ of each element")
def math_fsum():
    return math.fsum(values())  # sync 4


@example("scalar_read", SCALAR + ": any() tests each element until one is true (the third)")
def builtin_any_over_tensor():
    return any(values() > 2)  # sync 3


@example("none", "builtin sum() adds device tensors: 0 + t[0] + ..., no read")
def builtin_sum_over_tensor():
    return sum(values())


@example("none", "torch/_tensor.py __hash__: id(self), no read")
def tensor_as_dict_key():
    return {values(): "loss"}


@example("none", "torch/_tensor.py __iter__: unbind(0), no read")
def iterate_over_tensor():
    return [value * 2 for value in values()]


@example("none", "== is elementwise: a device tensor, no read")
def equality_is_a_tensor():
    t = values()
    return t == t.flip(0)


@example("none", "torch/_tensor.py __deepcopy__: the storage is cloned on the device")
def deepcopy_tensor():
    return copy.deepcopy(values())


@example("none", "copy.copy rebuilds from __reduce_ex__ with the same storage: nothing is copied")
def shallow_copy_tensor():
    return copy.copy(values())


PICKLE = "torch/storage.py __reduce__: torch.save of the storage, one device-to-host copy"


@example("host_copy", PICKLE)
def pickle_tensor():
    return pickle.dumps(values())  # sync


@example("host_copy", PICKLE + " per tensor: each pickles its storage on its own")
def pickle_two_views():
    t = values()
    return pickle.dumps([t, t[1:]])  # sync 2


@example("numpy", "torch/_tensor.py numpy(force=True): detach().cpu() before numpy")
def numpy_forced():
    return values().numpy(force=True)  # sync


# --- formatting: torch/_tensor_str.py runs the same Python on CUDA ----------------------------

FLOATS = (
    "torch/_tensor_str.py _Formatter: masked_select of the finite non-zero values (1);"
    " `value != torch.ceil(value)` until a fraction (1); sci_mode = `a or b or c` reads a and b"
    " (2) and keeps c, a tensor, read by `if self.sci_mode` (1); `format(value)` per value (2);"
    " _vector_str: tolist (1); format() tests `if self.sci_mode` per value (2)"
)


@example("format", FLOATS)
def str_of_floats():
    return str(_FLOATS.clone())  # sync 10


@example("format", "Tensor.__repr__ is torch._tensor_str._str, as str(); " + FLOATS)
def repr_of_floats():
    return repr(_FLOATS.clone())  # sync 10


@example("format", "print() calls str(); " + FLOATS)
def print_floats():
    print(_FLOATS.clone(), file=io.StringIO())  # sync 10


@example(
    "format", "f-string without a spec: Tensor.__format__ -> str() for a 1-D tensor; " + FLOATS
)
def fstring_of_floats():
    return f"{_FLOATS.clone()}"  # sync 10


@example("format", "%-formatting calls str(); " + FLOATS)
def percent_format_of_floats():
    return "loss %s" % (_FLOATS.clone(),)  # noqa: UP031  # sync 10


@example(
    "format", "torch/_tensor_str.py _Formatter: integers, f'{value}' per element (2); tolist (1)"
)
def str_of_integers():
    return str(_INTEGERS.clone())  # sync 3


@example(
    "format",
    "torch/_tensor_str.py, a 0-d float: masked_select (1), ceil test (1), sci_mode a, b (2),"
    " `if self.sci_mode` (1), f'{value:.0f}' (1); _scalar_str: item (1), format() `if"
    " self.sci_mode` (1)",
)
def str_of_zero_dim():
    return str(_ZERO_DIM.clone())  # sync 8


@example("none", "logging formats lazily: a record below the logger's level is never formatted")
def logging_below_level():
    log = logging.getLogger("hostsync.detector.truth")
    log.setLevel(logging.WARNING)
    log.debug("loss %s", values())


# --- torch calls that take a device tensor for a Python number --------------------------------

ARG_PARSER = "torch/csrc/utils/python_arg_parser.cpp: a Tensor given for "


@example("scalar_read", ARG_PARSER + "an int size is read (__index__)")
def zeros_of_tensor_size():
    return torch.zeros(counts()[1])  # sync


@example("scalar_read", ARG_PARSER + "a SymInt size is read")
def view_by_tensor_size():
    return values().view(counts()[1], -1)  # sync


@example("scalar_read", ARG_PARSER + "topk's k is read")
def topk_by_tensor():
    return values().topk(counts()[1])  # sync


@example("scalar_read", ARG_PARSER + "repeat's sizes is read")
def repeat_by_tensor():
    return values().repeat(counts()[1])  # sync


@example("scalar_read", ARG_PARSER + "randperm's n is read")
def randperm_of_tensor():
    return torch.randperm(counts()[1])  # sync


@example("scalar_read", ARG_PARSER + "randint's high is read")
def randint_below_tensor():
    return torch.randint(0, counts()[1] + 1, (3,))  # sync


@example("scalar_read", ARG_PARSER + "full_like's fill_value (a Scalar) is read")
def full_like_device_scalar():
    t = values()
    return torch.full_like(t, t.max())  # sync


@example("scalar_read", ARG_PARSER + "new_full's fill_value (a Scalar) is read")
def new_full_device_scalar():
    t = values()
    return t.new_full((2,), t.max())  # sync


@example("scalar_read", ARG_PARSER + "addcmul's value (a Scalar) is read")
def addcmul_device_value():
    t = values()
    return torch.addcmul(t, t, t, value=t.max())  # sync


@example("scalar_read", "torch/__init__.py _check_tensor_all: cond._is_all_true().item()")
def check_tensor_all():
    torch._check_tensor_all(values() > -10)  # sync


@example("scalar_read", SCALAR + ": a norm read as a Python number")
def norm_item():
    return values().norm().item()  # sync


@example("tolist", "split sizes made on the device are listed to the host first")
def split_by_device_sizes():
    t = values()
    return t.split((counts()[:2] + 1).tolist())  # sync


@example("none", "count_nonzero returns a device tensor")
def count_nonzero():
    return torch.count_nonzero(values())


# --- writes and fills with a tensor value -----------------------------------------------------

MASKED_FILL = (
    "cuda/Indexing.cu masked_fill__cuda(Tensor value): masked_fill__cuda(..., value.item())"
)


@example("scalar_read", MASKED_FILL)
def masked_fill_device_scalar():
    t = values()
    return t.masked_fill_(t > 0, t.min())  # sync


@example("scalar_read", MASKED_FILL + "; masked_fill clones, then masked_fill_")
def masked_fill_out_of_place_device_scalar():
    t = values()
    return t.masked_fill(t > 0, t.min())  # sync


@example("none", MASKED_FILL + ": a value in host memory is read on the host")
def masked_fill_host_scalar():
    t = values()
    fill = torch.tensor(0.5, device="cpu")
    return t.masked_fill(t > 0, fill)


@example("scalar_read", "TensorAdvancedIndexing.cpp index_fill_(Tensor source): source.item()")
def index_fill_device_scalar():
    t = values()
    return t.index_fill_(0, counts()[:2], t.max())  # sync


@example(
    "bool_index",
    "TensorAdvancedIndexing.cpp canDispatchToMaskedFill needs a CPU value: a 0-d CUDA value"
    " goes through nonzero of the mask",
)
def assign_device_scalar_through_mask():
    t = values()
    t[t > 0] = t.min()  # sync
    return t


@example("none", "Fill.cpp fill_(Tensor value) on the same device: copy_, no read")
def fill_device_scalar():
    t = values()
    return t.fill_(t.max())


@example("none", "TensorIndexing.h copy_to: a basic-index write is a copy on the device")
def assign_slice_device_scalar():
    t = values()
    t[1:3] = t.min()
    return t


@example("none", "index_put_ with integer indices broadcasts a 0-d value on the device")
def index_put_device_scalar():
    t = values()
    return t.index_put_((counts()[:2],), t.min())


@example("none", "clamp has Tensor overloads: the bounds stay on the device")
def clamp_device_bounds():
    t = values()
    return t.clamp(min=t.min(), max=t.max())


@example("none", "in-place arithmetic with a 0-d tensor is elementwise")
def add_device_scalar_in_place():
    t = values()
    return t.add_(t.min())


# --- writes into host memory -----------------------------------------------------------------


@example(
    "host_copy", "TensorIndexing.h copy_to: a slice of host memory gets a device-to-host copy_"
)
def assign_slice_into_host():
    t = values()
    host = torch.zeros(4, device="cpu")
    host[0:2] = t[:2]  # sync
    return host


@example("host_copy", "copy_to: a 0-d CUDA value into a host slice is expanded and copied")
def assign_scalar_into_host_slice():
    t = values()
    host = torch.zeros(4, device="cpu")
    host[1:3] = t.sum()  # sync
    return host


# --- library code that validates on the host ------------------------------------------------

VALIDATE = "torch/distributions/distribution.py __init__: `if not torch._is_all_true(valid)` per"


@example("scalar_read", VALIDATE + " given parameter (probs; logits is lazy)")
def categorical_validation():
    return torch.distributions.Categorical(probs=values().abs(), validate_args=True)  # sync


@example("scalar_read", VALIDATE + " given parameter (probs)")
def bernoulli_validation():
    return torch.distributions.Bernoulli(probs=values().abs() / 4, validate_args=True)  # sync


# --- undecided: not scored ------------------------------------------------------------------


@undecided(
    "numpy",
    "Tensor.__array__ calls numpy(), which raises for a CUDA tensor: on the GPU an error, not a"
    " wait; on the CPU stand-in it converts and the detector counts a numpy read",
)
def numpy_protocol_of_device_tensor():
    return np.asarray(values())


@example(
    "none",
    'torch/optim/adam.py _init_group: `step` is torch.tensor(0.0, device="cpu") unless'
    " capturable or fused; _single_tensor_adam reads it with .item() (_get_value): host memory",
)
def adam_step():
    weight = torch.nn.Parameter(values())
    weight.grad = values()
    torch.optim.Adam([weight]).step()


@example("none", "torch.optim.AdamW, the same _init_group and step (adamw.py is Adam's subclass)")
def adamw_step_twice():
    weight = torch.nn.Parameter(values())
    weight.grad = values()
    optimizer = torch.optim.AdamW([weight])
    optimizer.step()
    optimizer.step()


@example("none", "torch.tensor / torch.zeros without device= make a CPU tensor (default device)")
def factory_without_device():
    return torch.tensor(0.0).item(), torch.zeros(()).item(), torch.full((2,), 1.0).tolist()


@example("scalar_read", SCALAR + "; a factory given the device under test makes device memory")
def factory_on_the_device():
    return torch.zeros((), device=DEVICE).item()  # sync


@undecided(
    "scalar_read",
    "torch.testing.assert_close: the number of reads depends on its comparison path (dtype,"
    " tolerances, the mismatch report), not decided from the sources",
)
def assert_close():
    torch.testing.assert_close(values(), values())


@dataclass
class Score:
    """Syncs matched line by line: true positives, false ones (wrong line included), misses."""

    cases: int = 0
    true: int = 0
    false: int = 0
    missed: int = 0
    wrong_lines: list[str] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)

    @property
    def precision(self) -> float:
        return self.true / (self.true + self.false) if self.true + self.false else 1.0

    @property
    def recall(self) -> float:
        return self.true / (self.true + self.missed) if self.true + self.missed else 1.0


def detected(case: Example, account: bool = False) -> tuple[Counter[int], list[str]]:
    """Events at this file's lines, and the description of any event elsewhere; with
    `account`, under the accounting that repro, the census and scan run."""
    with SyncScope(account=account) as scope:
        case.function()
    here = Path(__file__).name
    lines: Counter[int] = Counter()
    elsewhere = []
    for event in scope.events:
        if Path(event.site.file).name == here:
            lines[event.site.line] += 1
        else:
            elsewhere.append(f"{case.name}: {event.kind} at {event.site}")
    return lines, elsewhere


def score(cases: list[Example] = EXAMPLES, account: bool = False) -> Score:
    result = Score(cases=len(cases))
    for one in cases:
        expected = one.expected()
        found, elsewhere = detected(one, account)
        result.false += len(elsewhere)
        result.wrong_lines += elsewhere
        for line in expected.keys() | found.keys():
            result.true += min(expected[line], found[line])
            result.missed += max(0, expected[line] - found[line])
            extra = max(0, found[line] - expected[line])
            result.false += extra
            if extra and not expected[line]:
                result.wrong_lines.append(f"{one.name}: {extra} at line {line}")
            if expected[line] > found[line]:
                result.misses.append(f"{one.name}: {expected[line] - found[line]} at {line}")
    return result


def score_by_family(cases: list[Example] = EXAMPLES) -> dict[str, Score]:
    """The score of each family's cases."""
    families: dict[str, list[Example]] = {}
    for one in cases:
        families.setdefault(one.family, []).append(one)
    return {family: score(members) for family, members in families.items()}
