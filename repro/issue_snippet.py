"""Count the host syncs of transformers' `deepspeed_sp_compute_loss` in one process (CPU or GPU).

`if t > 0`, `max(t, 1)` and `.item()` on a tensor all reach PyTorch's dispatcher as
`aten._local_scalar_dense`, the op that copies a device value to the host and waits for it; this
counts them. One process stands in for an SP group of one rank: the function's aggregation is
the same for every group size, and costs sp_size + 1 syncs where it reads on the host.
"""

import os
import types

import torch
import torch.distributed as dist
import transformers
from torch.utils._python_dispatch import TorchDispatchMode
from transformers.integrations.deepspeed import deepspeed_sp_compute_loss


class CountHostSyncs(TorchDispatchMode):
    syncs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.syncs += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))


device = "cuda" if torch.cuda.is_available() else "cpu"
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29533")
dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=0, world_size=1)

# An SP group of one rank, reached the way the function's non-DeepSpeed branch reaches it.
sp_mesh = types.SimpleNamespace(get_group=lambda: dist.group.WORLD)
accelerator = types.SimpleNamespace(torch_device_mesh={"sp": sp_mesh})
pc = types.SimpleNamespace(sp_backend="torch", sp_size=1)
inputs = {"shift_labels": torch.tensor([[5, 7, -100, 9]], device=device)}


def model(**inputs):  # stands in for the forward: its loss is all the function reads
    return types.SimpleNamespace(loss=torch.tensor(2.5, device=device, requires_grad=True))


with CountHostSyncs() as counter:
    loss = deepspeed_sp_compute_loss(accelerator, model, inputs, False, pc)
version = transformers.__version__
print(f"transformers {version}: {counter.syncs} host syncs, loss {loss.detach().item():.4f}")
dist.destroy_process_group()
