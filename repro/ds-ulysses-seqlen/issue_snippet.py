import os
import torch
import deepspeed
from torch.utils._python_dispatch import TorchDispatchMode
from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter

class CountHostReads(TorchDispatchMode):  # `.item()`, `bool(t)` and `float(t)` all dispatch here
    count = 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29511", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")  # one process
deepspeed.init_distributed(dist_backend="gloo")
batch = {key: torch.arange(16)[None] for key in ("input_ids", "labels", "position_ids")}
with CountHostReads() as reads:
    UlyssesSPDataLoaderAdapter([batch], sp_rank=0, sp_group=None, sp_world_size=1, device="cpu").refill()
print(f"deepspeed {deepspeed.__version__}, torch {torch.__version__}: {reads.count} host reads per refill of UlyssesSPDataLoaderAdapter, for {len(batch)} tensors and 1 SP rank")
