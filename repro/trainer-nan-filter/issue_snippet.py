import sys
import tempfile
import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

TORCH = torch.__file__.rsplit("/", 1)[0]

class CountLossReads(TorchDispatchMode):  # `bool(t)` and `.item()` dispatch here
    count = 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            frame = sys._getframe(1)
            while frame.f_code.co_filename.startswith(TORCH):
                frame = frame.f_back
            self.count += frame.f_code.co_name == "_run_epoch"
        return func(*args, **(kwargs or {}))

args = TrainingArguments(tempfile.mkdtemp(), max_steps=4, per_device_train_batch_size=1, logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True, use_cpu=True)
model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
trainer = Trainer(model=model, args=args, train_dataset=[{"input_ids": torch.arange(8), "labels": torch.arange(8)}] * 4)
with CountLossReads() as counter:
    trainer.train()
print(f"transformers {transformers.__version__}, torch {torch.__version__}: host reads of the loss in Trainer._run_epoch over 4 steps: {counter.count}")
