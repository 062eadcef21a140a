"""The pytest side of `unit.common.DistributedTest` (see there): a distributed test class's
method is called through its `DistributedTest.__call__`, which runs it on every rank, instead of
once in the pytest process. Loaded with `-p hostsync.harness.deepspeed.plugin`."""

from __future__ import annotations

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    if getattr(item.cls, "is_dist_test", False):
        item.cls()(item._request)
        item.runtest = lambda: None
