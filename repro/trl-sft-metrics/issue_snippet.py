import sys
import tempfile
import torch
import transformers
import trl
from datasets import Dataset
from tokenizers import Tokenizer, models
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer
from trl.trainer import sft_trainer

class CountHostReads(TorchDispatchMode):  # `.item()` and `bool(t)` dispatch here: count those of sft_trainer.py's lines
    count = 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            frame = sys._getframe(1)
            while "/torch/" in frame.f_code.co_filename:
                frame = frame.f_back
            self.count += frame.f_code.co_filename == sft_trainer.__file__
        return func(*args, **(kwargs or {}))

reads = []
class CountingSFTTrainer(SFTTrainer):
    def compute_loss(self, model, inputs, **kwargs):  # the loss and the metrics of one micro-batch
        with CountHostReads() as counter:
            loss = super().compute_loss(model, inputs, **kwargs)
        reads.append(counter.count)
        return loss

vocab = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i for i in range(2, 64)}}
tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<pad>")), pad_token="<pad>", eos_token="<eos>")
model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2))
dataset = Dataset.from_dict({"input_ids": [list(range(2, 2 + n)) for n in (6, 9, 7, 12, 8, 10, 5, 11)]})
args = SFTConfig(tempfile.mkdtemp(), per_device_train_batch_size=2, max_steps=4, logging_steps=4, use_cpu=True, report_to="none", save_strategy="no", disable_tqdm=True)
CountingSFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer).train()
print(f"trl {trl.__version__}, transformers {transformers.__version__}, torch {torch.__version__}: {max(reads)} host reads per micro-batch by SFTTrainer.compute_loss's own lines: {reads}")
