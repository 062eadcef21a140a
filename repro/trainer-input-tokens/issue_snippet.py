import tempfile
import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

class CountHostReads(TorchDispatchMode):  # `.item()`, `bool(t)` and `float(t)` all dispatch here
    count = 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))

reads = []
def track(self, inputs, track=Trainer._track_num_input_tokens):  # called after every micro-batch's backward
    with CountHostReads() as counter:
        track(self, inputs)
    reads.append(counter.count)
Trainer._track_num_input_tokens = track

args = TrainingArguments(tempfile.mkdtemp(), include_num_input_tokens_seen="all", gradient_accumulation_steps=4, max_steps=2, per_device_train_batch_size=1, logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True, use_cpu=True)
model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
trainer = Trainer(model=model, args=args, train_dataset=[{"input_ids": torch.arange(8), "labels": torch.arange(8)}] * 8)
trainer.train()
per_step = [sum(reads[i:i + 4]) for i in range(0, len(reads), 4)]
print(f"transformers {transformers.__version__}, torch {torch.__version__}: host reads of the input-token count per optimizer step: {per_step}, num_input_tokens_seen={trainer.state.num_input_tokens_seen}")
