"""A small CNN trained on random images, with the host reads image loops have, for `nox -s scan`:

    nox -s scan -- examples/small_cnn.py --iterations 20

Each batch comes from a DataLoader and is copied to the device without pinning; the accuracy is
summed with `.item()` every step; the loss is printed every few steps.
"""

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--log-every", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    images = torch.randn(args.iterations * 16, 1, 28, 28)
    labels = torch.randint(0, 10, (args.iterations * 16,))
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(images, labels), batch_size=16
    )
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 7 * 7, 10),
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    correct = 0
    for step, (inputs, targets) in enumerate(loader):
        inputs, targets = inputs.to(device), targets.to(device)
        logits = model(inputs)
        loss = nn.functional.cross_entropy(logits, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        correct += (logits.argmax(1) == targets).sum().item()
        if step % args.log_every == 0:
            accuracy = correct / (16 * (step + 1))
            print(f"step {step}: loss {loss.item():.3f}, accuracy {accuracy:.2f}")


if __name__ == "__main__":
    main()
