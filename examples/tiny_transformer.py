"""A tiny transformer language model on random tokens, with the host reads such loops have, for
`nox -s scan`:

    nox -s scan -- examples/tiny_transformer.py --iterations 20

The gradient norm is clipped with error_if_nonfinite=True; the loss is printed every few steps,
and the model is evaluated under no_grad every few more.
"""

import argparse

import torch
from torch import nn

VOCAB, WIDTH, LENGTH = 256, 64, 32


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        layer = nn.TransformerEncoderLayer(WIDTH, 4, 4 * WIDTH, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(LENGTH))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.blocks(self.embed(tokens), mask=self.mask, is_causal=True)
        return self.head(hidden)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--eval-every", type=int, default=10)
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = TinyLM().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def loss_of(tokens: torch.Tensor) -> torch.Tensor:
        logits = model(tokens[:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))

    for step in range(args.iterations):
        tokens = torch.randint(0, VOCAB, (8, LENGTH + 1), device=device)
        loss = loss_of(tokens)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)
        optimizer.step()
        optimizer.zero_grad()
        if step % args.log_every == 0:
            print(f"step {step}: loss {loss.item():.3f}")
        if step % args.eval_every == args.eval_every - 1:
            with torch.no_grad():
                held_out = torch.randint(0, VOCAB, (8, LENGTH + 1), device=device)
                print(f"step {step}: held-out loss {loss_of(held_out).item():.3f}")


if __name__ == "__main__":
    main()
