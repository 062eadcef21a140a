import os
import torch
import accelerate
import deepspeed
from torch.utils._python_dispatch import TorchDispatchMode
from accelerate import Accelerator
from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs

class CountHostReads(TorchDispatchMode):  # `.item()`, `bool(t)` and `float(t)` all dispatch here
    count = 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))

os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", ACCELERATE_USE_DEEPSPEED="true")  # one process, no launcher
os.environ.setdefault("MASTER_PORT", "29500")
plugin = DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=1, gradient_clipping=1.0)
accelerator = Accelerator(deepspeed_plugin=plugin, kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])
model = torch.nn.Linear(4, 1)
loader = torch.utils.data.DataLoader(torch.randn(8, 4), batch_size=8)
model, optimizer, loader = accelerator.prepare(model, torch.optim.AdamW(model.parameters()), loader)
accelerator.backward(model(next(iter(loader))).pow(2).mean())  # the engine's step runs here
with CountHostReads() as reads:  # the clip a training loop makes after backward, each optimizer step
    grad_norm = accelerator.clip_grad_norm_(model.parameters(), max_norm=1.0)
print(f"accelerate {accelerate.__version__}, deepspeed {deepspeed.__version__}, torch {torch.__version__}: host reads in clip_grad_norm_: {reads.count}; it returned a {type(grad_norm).__name__}")
