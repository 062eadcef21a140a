"""One rank of the Ulysses SP data loader reproducer: DeepSpeed's adapter over a real DataLoader.

`UlyssesSPDataLoaderAdapter.refill` all-gathers the sequence length of each SP rank's batch as a
device tensor, then copies every tensor of the batch to the device and compares it with that
length on the host. Each rank (forked, as torchrun starts them; gloo on CPU, NCCL with one GPU
each) wraps a few batches in the adapter, all ranks forming one SP group, and draws every
micro-batch under `hostsync.detector.SyncScope`. Two data paths: a plain DataLoader, whose
batches are in host memory (what DeepSpeed's Ulysses tutorial uses: `refill` copies each tensor
to the device, a blocking copy), and batches already on the device (what accelerate's prepared
loader yields).

Returns through `rank_entry` one row per scenario: the reads of ulysses_sp.py per refill, those
of the length check apart, by source line; the reads, stalls and device work of the whole
iteration per refill (`cost`: the scope accounts); and a checksum of every micro-batch the rank
got, which the fix must leave unchanged.
"""

from __future__ import annotations

import argparse
import contextlib
from collections import Counter

import deepspeed
import deepspeed.comm as dist
import torch
from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter
from torch.utils.data import DataLoader

from hostsync.detector import SiteCount, SyncScope
from hostsync.detector.sites import DEVICE_COPY, Site
from hostsync.rank.protocol import RankRow, ReproRank, rank_entry, repro_parser

SP_FILE = "deepspeed/runtime/sequence_parallel/ulysses_sp.py"
LENGTH_CHECK = "shape[1]"  # the code of the per-tensor length check
SEQ_LEN, BATCHES = 16, 8
THREE = ("input_ids", "labels", "position_ids")
# name: the tensors of each sample, and where the batches come from
SCENARIOS = {
    "refill": (THREE, "host"),
    "extra_tensor": ((*THREE, "attention_mask"), "host"),
    "on_device": (THREE, "device"),
}


def parse_args() -> argparse.Namespace:
    return repro_parser(__doc__.splitlines()[0], known=SCENARIOS).parse_args()


def samples(keys: tuple[str, ...], count: int = BATCHES) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    found = []
    for _ in range(count):
        ids = torch.randint(0, 128, (SEQ_LEN,), generator=generator)
        tensors = {
            "input_ids": ids,
            "labels": ids.clone(),
            "position_ids": torch.arange(SEQ_LEN),
            "attention_mask": torch.ones(SEQ_LEN, dtype=torch.int64),
        }
        found.append({key: tensors[key] for key in keys})
    return found


def run_scenario(name: str, device: torch.device, no_detector: bool) -> RankRow:
    keys, batches_from = SCENARIOS[name]
    batches = DataLoader(samples(keys), batch_size=1)
    if batches_from == "device":
        # Collated and moved before the watch begins, as a prepared loader hands them over.
        batches = [{key: value.to(device) for key, value in batch.items()} for batch in batches]
    loader = UlyssesSPDataLoaderAdapter(
        batches,
        sp_rank=dist.get_rank(),
        sp_group=None,
        sp_world_size=dist.get_world_size(),
        device=device,
    )
    per_refill, copies, checks, refill = [], [], [], loader.refill

    def measured_refill() -> None:
        begin = len(scope.events) if scope else 0
        refill()
        if scope:
            scope.step()  # a refill is a step: its idle time is summed on its own
            own = [e for e in scope.events[begin:] if e.site.file == SP_FILE]
            per_refill.append(sum(1 for e in own if e.kind != DEVICE_COPY))
            copies.append(sum(1 for e in own if e.kind == DEVICE_COPY))
            checks.append(sum(1 for e in own if LENGTH_CHECK in e.site.code))

    loader.refill = measured_refill
    with contextlib.nullcontext() if no_detector else SyncScope(account=True) as scope:
        micro_batches = list(loader)
    own = [event for event in scope.events if event.site.file == SP_FILE] if scope else []
    kinds: dict[Site, set[str]] = {}
    for event in own:
        kinds.setdefault(event.site, set()).add(event.kind)
    counted = sorted(Counter(event.site for event in own).items())
    return RankRow(
        scenario=name,
        cost=scope.cost(len(per_refill)) if scope else None,
        site_lists={
            "sites": tuple(SiteCount(site, n, tuple(sorted(kinds[site]))) for site, n in counted)
        },
        figures={
            "batches_from": batches_from,
            "tensors": len(keys),
            "reads_per_refill": per_refill or None,
            "copies_per_refill": copies or None,
            "length_check_reads_per_refill": checks or None,
            "micro_batches": [
                {key: int(value.sum()) for key, value in batch.items() if torch.is_tensor(value)}
                for batch in micro_batches
            ],
        },
    )


@rank_entry
def main() -> ReproRank:
    args = parse_args()
    deepspeed.init_distributed(dist_backend="nccl" if args.device == "cuda" else "gloo")
    device = torch.device(args.device, dist.get_rank()) if args.device == "cuda" else "cpu"
    return ReproRank(tuple(run_scenario(name, device, args.no_detector) for name in args.scenarios))


if __name__ == "__main__":
    main()
