import types
import torch
import torch.distributed as dist
import torch.distributed.nn  # the function uses it; importing Trainer loads it
import transformers
from torch.distributed.device_mesh import init_device_mesh
from torch.utils._python_dispatch import TorchDispatchMode
from transformers.integrations.deepspeed import deepspeed_sp_compute_loss

class CountHostSyncs(TorchDispatchMode):  # `if t > 0`, `max(t, 1)` and `.item()` all dispatch here
    count = 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))
device = "cuda" if torch.cuda.is_available() else "cpu"
dist.init_process_group("nccl" if device == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1)
mesh = init_device_mesh(device, (1,), mesh_dim_names=("sp",))  # one rank: the SP group comes from the mesh
accelerator, pc = types.SimpleNamespace(torch_device_mesh=mesh), types.SimpleNamespace(sp_backend="deepspeed", sp_size=1)
inputs = {"shift_labels": torch.tensor([[5, 7, -100, 9]], device=device)}
outputs = types.SimpleNamespace(loss=torch.tensor(2.5, device=device, requires_grad=True))  # the forward's output
with CountHostSyncs() as syncs:
    deepspeed_sp_compute_loss(accelerator, lambda **_: outputs, inputs, False, pc)
print(f"transformers {transformers.__version__}: {syncs.count} host syncs in deepspeed_sp_compute_loss")
