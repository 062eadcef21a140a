import os
import tempfile
import torch
import accelerate
import deepspeed
import transformers
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

class CountHostReads(TorchDispatchMode):  # `.item()`, `bool(t)` and `float(t)` all dispatch here
    count = 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))

reads = []
if hasattr(Trainer, "_clip_grad_norm"):  # transformers 5.3+; older releases clip inside the training loop
    def clip_grad_norm(self, model, clip=Trainer._clip_grad_norm):  # called on every optimizer step
        with CountHostReads() as counter:
            norm = clip(self, model)
        reads.append(counter.count)
        return norm
    Trainer._clip_grad_norm = clip_grad_norm

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29500"), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")  # one process, no launcher
ds_config = {"zero_optimization": {"stage": 1}, "train_micro_batch_size_per_gpu": "auto", "gradient_clipping": "auto"}
args = TrainingArguments(tempfile.mkdtemp(), deepspeed=ds_config, max_steps=4, per_device_train_batch_size=1, logging_steps=4, ddp_backend="gloo", report_to="none", save_strategy="no", disable_tqdm=True)
model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
Trainer(model=model, args=args, train_dataset=[{"input_ids": torch.arange(8), "labels": torch.arange(8)}] * 4).train()
print(f"transformers {transformers.__version__}, accelerate {accelerate.__version__}, deepspeed {deepspeed.__version__}, torch {torch.__version__}: host reads in _clip_grad_norm per optimizer step: {reads}")
