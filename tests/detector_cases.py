"""A labelled suite for `hostsync.detector`: small cases, each with what a CUDA device does.

Every case is a function building its own tensors (on CPU they stand for device tensors). A line
the host would wait on with CUDA tensors ends in `# sync`, or `# sync N` for N waits; nothing
else may be recorded. `source` says where the truth comes from: PyTorch's CUDA sources and docs
(paths under aten/src/ATen/native/ unless said otherwise), or, where a case was decided from the
sources without a GPU at hand, says so. `score()` runs them all under a scope.
"""

from __future__ import annotations

import inspect
import io
import math
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
class Case:
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


CASES: list[Case] = []


def case(family: str, source: str) -> Callable[[Callable[[], object]], Callable[[], object]]:
    def register(function: Callable[[], object]) -> Callable[[], object]:
        CASES.append(Case(function, family, source))
        return function

    return register


def values() -> torch.Tensor:
    return torch.tensor([1.0, -2.0, 3.0, 3.0])


def counts() -> torch.Tensor:
    return torch.tensor([0, 2, 1, 2])


def square() -> torch.Tensor:
    return torch.tensor([[2.0, 0.5], [0.5, 1.0]])


SCALAR = "cuda/CUDAScalar.cu _local_scalar_dense_cuda: memcpy_and_sync of one value"

# --- scalar reads: what Python makes of a tensor --------------------------------------------


@case("scalar_read", SCALAR + "; Tensor.item docs")
def item():
    t = values()
    return t.sum().item()  # sync


@case("scalar_read", SCALAR + " (Tensor.__bool__ -> is_nonzero -> item)")
def if_on_tensor():
    t = values()
    if t.sum() > 0:  # sync
        return 1
    return 0


@case("scalar_read", SCALAR + " (max compares with __bool__)")
def python_max():
    t = values()
    return max(t.sum(), 1)  # sync


@case("scalar_read", SCALAR + " (__int__)")
def int_of():
    t = values()
    return int(t.sum())  # sync


@case("scalar_read", SCALAR + " (__float__)")
def float_of():
    t = values()
    return float(t.sum())  # sync


@case("scalar_read", SCALAR + " (__bool__)")
def bool_of_any():
    t = values()
    return bool((t > 2).any())  # sync


@case("scalar_read", SCALAR + ": one read per loop test, the loop runs 3 times")
def while_loop():
    t = values()
    n = 0
    while n < t[2]:  # sync 4
        n += 1
    return n


@case("scalar_read", SCALAR + " (assert calls __bool__)")
def assert_all():
    t = values()
    assert (t > -10).all()  # sync


@case("scalar_read", SCALAR + " (list indexing calls __index__)")
def list_index_by_tensor():
    t = values()
    names = ["a", "b", "c", "d"]
    return names[t.argmax()]  # sync


@case("scalar_read", SCALAR + " (math functions call __float__)")
def math_isfinite():
    t = values()
    return math.isfinite(t.sum())  # sync


@case("scalar_read", SCALAR + " (torch/_tensor.py __format__: self.item() for 0-d)")
def format_zero_dim():
    t = values()
    return f"{t.sum():.2f}"  # sync


@case("scalar_read", "cuda/Equal.cpp cuda_equal: eq(...).all().item<bool>()")
def torch_equal():
    t = values()
    return torch.equal(t, t.clone())  # sync


@case("scalar_read", "TensorCompare.cpp allclose: isclose(...).all().item<uint8_t>()")
def torch_allclose():
    t = values()
    return torch.allclose(t, t + 1e-9)  # sync


@case("scalar_read", "torch/csrc/utils/python_arg_parser.cpp: a Tensor for a Scalar is .item()'d")
def tensor_as_fill_value():
    t = values()
    return torch.full((2,), t.sum())  # sync


@case("scalar_read", "python_arg_parser.cpp: a Tensor for an int is read with .item()")
def tensor_as_arange_end():
    t = counts()
    return torch.arange(t.sum())  # sync


@case("scalar_read", "python_arg_parser.cpp: a Tensor for a SymInt start is read")
def tensor_as_narrow_start():
    t = values()
    return t.narrow(0, counts()[2], 2)  # sync


@case("scalar_read", "python_arg_parser.cpp: alpha is a Scalar")
def tensor_as_alpha():
    t = values()
    return t.add(t, alpha=t[0])  # sync


@case("scalar_read", SCALAR + " (is_nonzero is CompositeImplicit: item)")
def is_nonzero():
    t = values()
    return t[0].is_nonzero()  # sync


@case(
    "scalar_read",
    "torch/distributions/distribution.py __init__: `if not torch._is_all_true(valid)` per"
    " constraint (loc, scale): two reads, made inside torch, shown at the caller",
)
def distribution_validation():
    t = values()
    return torch.distributions.Normal(t, t.abs() + 1, validate_args=True)  # sync 2


@case("scalar_read", "torch/nn/utils/clip_grad.py: error_if_nonfinite tests the norm with `if`")
def clip_grad_norm_checking():
    weight = torch.nn.Parameter(values())
    weight.grad = values()
    torch.nn.utils.clip_grad_norm_([weight], 1.0, error_if_nonfinite=True)  # sync


@case("scalar_read", "custom autograd.Function: backward's .item() syncs in autograd's thread")
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


@case("scalar_read", INDEXING + " with tensor.item<int64_t>() and becomes a select")
def index_by_zero_dim_tensor():
    t = values()
    return t[counts()[2]]  # sync


@case("scalar_read", INDEXING + " with tensor.item<bool>()")
def index_by_zero_dim_bool():
    t = values()
    return t[t.sum() > 0]  # sync


@case("scalar_read", INDEXING + "; assignment goes through the same index conversion")
def assign_at_zero_dim_index():
    t = values()
    t[counts()[1]] = 0.0  # sync
    return t


# --- outputs sized by device data ------------------------------------------------------------

TAG = "tagged dynamic_output_shape in native_functions.yaml; "


@case("nonzero", TAG + "cuda/Nonzero.cu; torch.nonzero docs: 'causes host-device sync'")
def nonzero():
    t = values()
    return t.nonzero()  # sync


@case("nonzero", "torch.where docs: where(condition) is nonzero(condition, as_tuple=True)")
def where_condition_only():
    t = values()
    return torch.where(t > 0)  # sync


@case("nonzero", "torch.argwhere docs: 'causes host-device synchronization'")
def argwhere():
    t = values()
    return torch.argwhere(t)  # sync


@case("nonzero", TAG + "nonzero(as_tuple=True)")
def nonzero_as_tuple():
    t = values()
    return t.nonzero(as_tuple=True)  # sync


@case("masked_select", TAG + "masked_select sizes its output by the mask")
def masked_select():
    t = values()
    return torch.masked_select(t, t > 0)  # sync


@case("bool_index", TAG + "IndexingUtils.h expandTensors: a bool mask goes through nonzero")
def bool_mask_index():
    t = values()
    return t[t > 0]  # sync


@case("bool_index", TAG + "expandTensors: a 2-D bool mask the same")
def bool_mask_rows():
    t = square()
    return t[t.sum(dim=1) > 2]  # sync


@case("bool_index", "TensorAdvancedIndexing.cpp index_put_: a tensor value is not masked_fill")
def assign_tensor_through_mask():
    t = values()
    t[t > 0] = t.new_zeros(3)  # sync


@case("bool_index", "index_put_ with accumulate=True never becomes masked_fill")
def accumulate_through_mask():
    t = values()
    t.index_put_((t > 0,), t.new_ones(()), accumulate=True)  # sync


@case("unique", TAG + "cuda/Unique.cu")
def unique():
    t = values()
    return torch.unique(t)  # sync


@case("unique", TAG + "cuda/Unique.cu unique_dim")
def unique_dim():
    t = square()
    return torch.unique(t, dim=0)  # sync


@case("unique", TAG + "cuda/Unique.cu unique_consecutive")
def unique_consecutive():
    t = values()
    return torch.unique_consecutive(t)  # sync


@case("unique", TAG + "cuda/Unique.cu, return_counts in the same call")
def unique_with_counts():
    t = counts()
    return torch.unique(t, return_counts=True)  # sync


@case("repeat_interleave", TAG + "Repeat.h: the total length is read without output_size")
def repeat_by_counts():
    t = values()
    return torch.repeat_interleave(t, counts())  # sync


@case("bincount", TAG + "cuda/SummaryOps.cu _bincount_cuda_template: min().cpu() and max()")
def bincount():
    return torch.bincount(counts())  # sync 2


@case("bincount", "cuda/SummaryOps.cu: uint8 input skips the min() check, max() remains")
def bincount_uint8():
    return torch.bincount(counts().to(torch.uint8))  # sync


@case("bincount", "cuda/SummaryOps.cu: minlength does not avoid the reads")
def bincount_with_minlength():
    return torch.bincount(counts(), minlength=8)  # sync 2


@case("histc", "cuda/SummaryOps.cu _histc_cuda_template: min == max (default) reads the range")
def histc_default_range():
    t = values()
    return torch.histc(t, bins=4)  # sync 2


@case("multinomial", "Distributions.cpp multinomial_out: two .item() checks without replacement")
def multinomial_without_replacement():
    p = values().abs()
    return torch.multinomial(p, 2)  # sync 2


@case("multinomial", "Distributions.cpp multinomial_out: n_sample == 1 takes the same path")
def multinomial_one_sample():
    p = values().abs()
    return torch.multinomial(p, 1, replacement=True)  # sync 2


LINALG = "torch.linalg docs: 'synchronizes that device with the CPU'; _linalg_check_errors"


@case("linalg_check", LINALG)
def linalg_inv():
    return torch.linalg.inv(square())  # sync


@case("linalg_check", LINALG)
def linalg_cholesky():
    return torch.linalg.cholesky(square())  # sync


@case("linalg_check", LINALG)
def linalg_solve():
    return torch.linalg.solve(square(), values()[:2])  # sync


@case("linalg_check", "torch.linalg.inv_ex docs: 'synchronizes only when check_errors = True'")
def linalg_inv_ex_checking():
    return torch.linalg.inv_ex(square(), check_errors=True)  # sync


@case("linalg_check", LINALG + " (eigh: linalg_eigh kernel checks its infos)")
def linalg_eigh():
    return torch.linalg.eigh(square())  # sync


@case("scalar_read", "Onehot.cpp: on CUDA, num_classes=-1 reads self.max().item()")
def one_hot_inferred_classes():
    return F.one_hot(counts())  # sync


# --- device-to-host copies -------------------------------------------------------------------

COPY = "cuda/Copy.cu copy_kernel_cuda: a blocking device-to-host copy synchronizes the stream"


@case("tolist", "torch/csrc/utils/tensor_list.cpp tensor_to_list copies to the host first")
def tolist():
    t = values()
    return t.tolist()  # sync


@case("cpu", COPY)
def cpu():
    t = values()
    return t.cpu()  # sync


@case("numpy", "torch/csrc/utils/tensor_numpy.cpp: a CUDA tensor needs .cpu() first")
def numpy_after_cpu():
    t = values()
    return t.cpu().numpy()  # sync


@case("numpy", "Tensor.__array__ calls numpy(); on CUDA behind a host copy")
def numpy_array_of():
    t = values()
    return np.asarray(t.cpu())  # sync


@case("cpu", COPY + "; a chain on one line copies once")
def detach_cpu_tolist():
    t = values()
    return t.detach().cpu().tolist()  # sync


@case("cpu", COPY + " (.to with a device string)")
def to_cpu_string():
    t = values()
    return t.to("cpu")  # sync


@case("cpu", COPY + " (.to with a torch.device)")
def to_cpu_device():
    t = values()
    return t.to(torch.device("cpu"))  # sync


@case("cpu", COPY + " (.to with device=)")
def to_cpu_keyword():
    t = values()
    return t.to(device="cpu", dtype=torch.float64)  # sync


@case("cpu", COPY + "; the result is host memory: reading it is free")
def read_of_host_result():
    t = values()
    host = t.to("cpu", torch.float64)  # sync
    return host.sum().item() + len(host.tolist())


@case("host_copy", COPY + " (copy_ into a host tensor)")
def copy_into_host():
    t = values()
    host = torch.empty(4, device="cpu")
    host.copy_(t)  # sync
    return host


@case("scalar_read", "Fill.cpp fill_ / copy_: a 0-d device value written into host memory")
def assign_into_host():
    t = values()
    host = torch.zeros(4, device="cpu")
    host[0] = t.sum()  # sync
    return host


@case("host_copy", "torch/serialization.py _save: storage.cpu() for each device storage")
def torch_save():
    t = values()
    torch.save({"weight": t, "bias": values()}, io.BytesIO())  # sync 2


@case("host_copy", "torch/serialization.py _save: views of one storage are written once")
def torch_save_views():
    t = values()
    torch.save([t, t[1:]], io.BytesIO())  # sync


@case("scalar_read", "torch/csrc/utils/tensor_new.cpp: each tensor element is read (.item())")
def tensor_of_device_scalars():
    t = values()
    return torch.tensor([t.sum(), t.max()])  # sync 2


@case("scalar_read", "tensor_new.cpp: a list of 0-d tensors built in a loop, one read each")
def tensor_of_collected_losses():
    t = values()
    losses = [t[i] * 2 for i in range(3)]
    return torch.tensor(losses)  # sync 3


@case("scalar_read", "torch.as_tensor shares torch.tensor's recursive_store for sequences")
def as_tensor_of_device_scalars():
    t = values()
    return torch.as_tensor([t.sum()])  # sync


# --- no sync on CUDA -------------------------------------------------------------------------


@case("none", "arithmetic and reductions stay on the device")
def arithmetic():
    t = values()
    return (t * 2).sum() / t.numel()


@case("none", "shapes are host metadata")
def shapes():
    t = values()
    return len(t), t.shape[0], t.numel(), t.dim()


@case("none", "the workspace's fixed loss aggregation: torch.where + clamp, no host read")
def loss_aggregation_without_sync():
    losses, tokens = values().abs(), counts()
    weighted = torch.where(tokens > 0, losses * tokens, torch.zeros_like(losses))
    return weighted.sum() / tokens.sum().clamp(min=1)


@case("none", "torch.stack of 0-d tensors stays on the device")
def stack_of_scalars():
    t = values()
    return torch.stack([t.sum(), t.max()])


@case("none", "torch.where with three arguments is elementwise")
def where_three_args():
    t = values()
    return torch.where(t > 0, t, 0.0)


@case("none", "index_put_ -> masked_fill_ (canDispatchToMaskedFill): no nonzero")
def assign_scalar_through_mask():
    t = values()
    t[t > 0] = 0.0
    return t


@case("none", "masked_fill is elementwise")
def masked_fill():
    t = values()
    return t.masked_fill(t > 0, 1.0)


@case("none", "advanced indexing with integer indices: no output size to read")
def index_with_long_tensor():
    t = values()
    return t[torch.tensor([0, 2])]


@case("none", "Repeat.h: output_size given, nothing read")
def repeat_with_output_size():
    t = values()
    return torch.repeat_interleave(t, torch.full((4,), 2), output_size=8)


@case("none", "repeat_interleave with an int repeats: size from the host")
def repeat_by_int():
    t = values()
    return torch.repeat_interleave(t, 2)


@case("none", "cuda/Nonzero.cu nonzero_static_cuda: fixed output size, no read")
def nonzero_static():
    t = values()
    return torch.nonzero_static(t, size=4)


@case("none", "cuda/SummaryOps.cu: min != max, the range is known")
def histc_explicit_range():
    t = values()
    return torch.histc(t, bins=4, min=-3, max=3)


@case("none", "Distributions.cpp: with replacement and several samples the CUDA kernel checks")
def multinomial_with_replacement():
    p = values().abs()
    return torch.multinomial(p, 3, replacement=True)


@case("none", "cuda/SummaryOps.cu: an empty 1-D input returns zeros(minlength) before reading")
def bincount_empty():
    return torch.bincount(torch.tensor([], dtype=torch.long), minlength=3)


@case("none", "torch.linalg.inv_ex docs: no sync unless check_errors=True")
def linalg_inv_ex():
    return torch.linalg.inv_ex(square())


@case("none", "torch.linalg.cholesky_ex docs: no sync unless check_errors=True")
def linalg_cholesky_ex():
    return torch.linalg.cholesky_ex(square())


@case("none", "torch.linalg.det has no sync note; LU without error check")
def linalg_det():
    return torch.linalg.det(square())


@case("none", "TensorConversions.cpp _to_copy pins the result of a non_blocking copy to cpu")
def to_cpu_non_blocking():
    t = values()
    return t.to("cpu", non_blocking=True)


@case("none", "a device variable is the training device (cuda on the GPU box): no host copy")
def to_training_device():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t = values()
    return t.to(device)


@case("none", "host memory read on the host: no device involved")
def read_host_tensor():
    host = torch.zeros(3, device="cpu")
    return host.sum().item(), host.tolist()


@case("none", "torch.tensor of Python numbers is a host-to-device copy")
def tensor_of_python_numbers():
    return torch.tensor([1.0, 2.0, 3.0])


@case("none", "torch.tensor of a tensor keeps its device (a copy on the device)")
def tensor_of_tensor():
    t = values()
    return torch.tensor(t)


@case("none", "reductions over a dim return device tensors")
def max_over_dim():
    t = square()
    return t.max(dim=0)


@case("none", "clamp with Python bounds is elementwise")
def clamp():
    t = values()
    return t.clamp(min=1)


@case("none", "clip_grad.py without error_if_nonfinite: no host read")
def clip_grad_norm_plain():
    weight = torch.nn.Parameter(values())
    weight.grad = values()
    return torch.nn.utils.clip_grad_norm_([weight], 1.0)


@case("none", "sort/topk keep values and indices on the device")
def topk():
    t = values()
    return t.topk(2)


@case("none", "cumsum/argmax stay on the device")
def cumsum_argmax():
    t = values()
    return t.cumsum(0).argmax()


@case("none", "torch.distributions sampling without validation")
def distribution_sample():
    t = values()
    return torch.distributions.Normal(t, t.abs() + 1, validate_args=False).sample()


@case("none", "dropout draws on the device")
def dropout():
    t = values()
    return F.dropout(t, 0.5, training=True)


# --- CPU kernels that check on the host where CUDA asserts on the device ----------------------


@case("none", "Onehot.cpp: 'for cuda, rely on device assert thrown by scatter' (CPU reads)")
def one_hot_with_classes():
    return F.one_hot(counts(), num_classes=4)


@case("none", "cuda/Indexing.cu index_select: CUDA_KERNEL_ASSERT on the bounds")
def index_select():
    t = values()
    return t.index_select(0, counts())


@case("none", "cuda/ScatterGatherKernel.cu: bounds by CUDA_KERNEL_ASSERT")
def gather():
    t = values()
    return t.gather(0, counts())


@case("none", "Embedding.cpp: index_select on CUDA, device-side bounds check")
def embedding():
    return F.embedding(counts(), square().repeat(2, 1))


@case("none", "cuda/Loss.cu nll_loss: target range by CUDA_KERNEL_ASSERT")
def cross_entropy():
    logits = square().repeat(2, 2)
    return F.cross_entropy(logits, counts())


@case("none", "cuda/ScatterGatherKernel.cu scatter_add: device-side bounds check")
def scatter_add():
    t = values()
    return torch.zeros(4).scatter_add(0, counts(), t)


@case("none", "cuda/TensorCompare.cu _assert_async_cuda: a device-side assert, no read")
def assert_async():
    t = values()
    return torch._assert_async((t > -10).all())


@case(
    "none", "cuda/IndexKernel.cu launch_masked_scatter_kernel: prefix sum and a size-check kernel"
)
def masked_scatter():
    t = values()
    return t.masked_scatter(t > 0, t * 2)


@case("none", "cuda/Embedding.cu embedding_renorm_cuda_: cub::unique, count stays on device")
def embedding_with_max_norm():
    return F.embedding(counts(), square().repeat(2, 1), max_norm=1.0)


@case("none", "Distributions.cpp: bernoulli draws on the device")
def bernoulli():
    return torch.bernoulli(values().abs() / 4)


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


def detected(case: Case) -> tuple[Counter[int], list[str]]:
    """Events at this file's lines, and the description of any event elsewhere."""
    with SyncScope() as scope:
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


def score(cases: list[Case] = CASES) -> Score:
    result = Score(cases=len(cases))
    for one in cases:
        expected = one.expected()
        found, elsewhere = detected(one)
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
