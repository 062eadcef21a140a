"""A small training loop with the host reads real loops have, for `nox -s scan` to find:

    nox -s scan -- examples/tiny_training.py --iterations 30

A NaN check that skips a bad batch, a gradient-norm check, and the loss printed every few steps.
"""

import argparse

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--log-every", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(args.iterations):
        inputs, labels = torch.randn(32, 64), torch.randint(0, 8, (32,))
        loss = torch.nn.functional.cross_entropy(model(inputs), labels)
        if torch.isnan(loss):
            continue  # a bad batch: skipped
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if norm > 100:
            print(f"step {step}: gradient norm {norm:.1f}")
        optimizer.step()
        optimizer.zero_grad()
        if step % args.log_every == 0:
            print(f"step {step}: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
