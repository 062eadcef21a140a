"""`unit.common.DistributedTest` for DeepSpeed trees made from the PyPI sdist, which ships no
tests/: the same contract as DeepSpeed's own harness, written here.

A test class sets `world_size`; pytest's call of each test method starts that many processes,
each joining one process group (`deepspeed.init_distributed`, the accelerator's backend: gloo
on CPU) and running the method with its fixture values; a failure in any process is the test's
failure, with that process's exception. `hostsync.harness.deepspeed.plugin` routes the calls
here, as DeepSpeed's tests/conftest.py does. A git clone of the tag brings the real harness, and
this one is not used.
"""

from __future__ import annotations

import inspect
import os
import socket

import pytest
import torch.multiprocessing as mp

TIMEOUT_S = int(os.environ.get("DS_UNITTEST_TIMEOUT", "600"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class DistributedTest:
    """Each test method runs on `world_size` ranks of one process group."""

    is_dist_test = True
    world_size = 2

    def __call__(self, request: pytest.FixtureRequest) -> None:
        method = request.function.__name__
        names = [n for n in inspect.signature(getattr(self, method)).parameters if n != "self"]
        kwargs = {name: request.getfixturevalue(name) for name in names}
        port = _free_port()
        context = mp.get_context("forkserver")
        with context.Pool(self.world_size) as pool:
            ranks = [
                (rank, self.world_size, port, method, kwargs) for rank in range(self.world_size)
            ]
            pool.starmap_async(self._run_rank, ranks).get(TIMEOUT_S)

    def _run_rank(self, rank: int, world_size: int, port: int, method: str, kwargs: dict) -> None:
        import deepspeed
        import deepspeed.comm as dist
        from deepspeed.accelerator import get_accelerator

        os.environ.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
            LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_SIZE=str(world_size),
        )  # fmt: skip
        backend = get_accelerator().communication_backend_name()
        deepspeed.init_distributed(dist_backend=backend, rank=rank, world_size=world_size)
        try:
            getattr(self, method)(**kwargs)
        finally:
            dist.barrier()
            dist.destroy_process_group()
