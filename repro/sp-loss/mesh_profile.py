"""One rank of the loss case without DeepSpeed: the issue snippet's call, profiled per step.

`deepspeed_sp_compute_loss` through its mesh branch at world size 1 (the SP group from a device
mesh; NCCL refuses two ranks on one GPU, and this branch needs no DeepSpeed), on a loss that
stands for the forward's output and labels with a masked position. Each step's loss aggregation
runs in the measured range, its backward after it; warmed up first, then recorded
(`rankkit.profiled_steps`). What `gpu/case_on_gpu.py --script mesh_profile.py` runs where
DeepSpeed is not installed, as on the lent GPU machine.
"""

from __future__ import annotations

import argparse
import time
import types

import torch
import torch.distributed as dist
import torch.distributed.nn  # the function under test uses it; importing the Trainer loads it
from torch.distributed.device_mesh import init_device_mesh
from transformers.integrations.deepspeed import deepspeed_sp_compute_loss

from hostsync.rank.protocol import MEASURED_RANGE, ProfiledRank, profile_parser, rank_entry
from hostsync.rank.rankkit import named_range, profiled_rank, profiled_steps


def parse_args() -> argparse.Namespace:
    parser = profile_parser(__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="all_tokens", choices=("all_tokens",))
    return parser.parse_args()


@rank_entry
def main() -> ProfiledRank:
    args = parse_args()
    device, cuda, nvtx = args.device, args.device == "cuda", args.profiler == "nsys"
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    mesh = init_device_mesh(device, (1,), mesh_dim_names=("sp",))
    accelerator = types.SimpleNamespace(torch_device_mesh=mesh)
    pc = types.SimpleNamespace(sp_backend="deepspeed", sp_size=1)
    labels = torch.tensor([[5, 7, -100, 9]], device=device)

    def step() -> float:
        outputs = types.SimpleNamespace(loss=torch.tensor(2.5, device=device, requires_grad=True))
        started = time.perf_counter()
        with named_range(MEASURED_RANGE, nvtx):
            total = deepspeed_sp_compute_loss(
                accelerator, lambda **_: outputs, {"shift_labels": labels}, False, pc
            )
        seconds = time.perf_counter() - started
        total.backward()
        return seconds

    seconds, trace = profiled_steps(args, step, cuda)
    return profiled_rank(args, device, seconds, trace)


if __name__ == "__main__":
    main()
