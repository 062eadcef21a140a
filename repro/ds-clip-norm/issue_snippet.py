from types import SimpleNamespace
import torch
import deepspeed
from torch.utils._python_dispatch import TorchDispatchMode
from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

class CountHostReads(TorchDispatchMode):  # `.item()`, `bool(t)` and `float(t)` all dispatch here
    count = 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))

# The state unscale_and_clip_grads() reads, as DeepSpeed's own test of this guard builds it.
optimizer = object.__new__(DeepSpeedZeroOptimizer)
optimizer.clip_grad, optimizer.custom_loss_scaler, optimizer.device = 1.0, False, "cpu"
optimizer.loss_scaler = SimpleNamespace(cur_scale=1.0)
with CountHostReads() as reads:  # step() calls it once per parameter group
    optimizer.unscale_and_clip_grads([torch.ones(4)], total_norm=torch.tensor(4.0))
print(f"deepspeed {deepspeed.__version__}, torch {torch.__version__}: host reads per call of unscale_and_clip_grads: {reads.count}")
