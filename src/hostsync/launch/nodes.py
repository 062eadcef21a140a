"""Runs across nodes: where this node stands in the job, and how nodes pool each world's results.

The ranks of a world meet on torchrun's c10d rendezvous (`--nnodes`, `--node-rank`,
`--rdzv-endpoint`; under SLURM taken from `SLURM_NNODES`, `SLURM_NODEID` and the first host of
`SLURM_JOB_NODELIST`). Every node runs the same command; its agent starts its share of the ranks,
which write their results as on one machine (`rank-<RANK>.json`, RANK being global). Then each
node leaves its share, a folder `node-<R>` of its ranks' files and a note naming its host, in a
folder every node reads (the workspace's `work/nodes/`, or `--node-results DIR`: a shared
filesystem, the usual SLURM case), and waits for every other node's. So every node ends a world
holding every rank's result, node 0 writes the result file, and the wait is a barrier: no node
starts the next world's rendezvous before every node has left the last one.

Without an endpoint (`--nnodes 2` on a laptop) one command starts every node's agent on this
machine, each in a folder of its own, and pools their shares the same way.
"""

from __future__ import annotations

import itertools
import os
import re
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from hostsync.detector.codec import RecordError, read_file, write_file
from hostsync.detector.words import counted
from hostsync.launch.records import NodeNote
from hostsync.rank.records import RankReport, RanOn
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.records import NodeShare

# torchrun's own default port, where SLURM names the hosts but nobody the port.
DEFAULT_PORT = 29500
SHARE_NOTE = "node.json"
_POLL_S = 0.5


@dataclass(frozen=True)
class NodeLayout:
    """How many nodes a run spans, which one this is, and where they meet: read once from the
    command line or SLURM (`from_options`). One node is the default: nothing changes then."""

    count: int = 1
    rank: int = 0
    # HOST:PORT of the c10d rendezvous (on this machine: each world picks a free port).
    endpoint: str = ""
    # The folder the nodes pool their shares in (None: inside each run's own folder, which only
    # works when every agent is on this machine).
    shares: Path | None = None
    # Names this command's rendezvous and shares, the same on every node.
    run_id: str = ""
    # Every node's agent is started here, by this command (no endpoint was given).
    on_this_machine: bool = False

    @property
    def spans_nodes(self) -> bool:
        return self.count > 1

    @property
    def writes_results(self) -> bool:
        """Node 0 writes the result files; the others hand it their ranks' results."""
        return self.rank == 0

    def per_node(self, ranks: int, what: str) -> int:
        """The ranks each node runs of a world of `ranks`; refused when they do not divide."""
        if ranks % self.count:
            raise WorkspaceError(
                f"{what} runs {counted(ranks, 'rank')}, which {self.count} nodes cannot share"
                f" evenly: choose rank counts that {self.count} divides (--ranks), or fewer"
                " --nnodes"
            )
        return ranks // self.count

    def ranks_here(self, ranks: int) -> int:
        """How many of a world's ranks run on this machine: what its GPUs must hold."""
        if self.spans_nodes and not self.on_this_machine:
            return self.per_node(ranks, f"a world of {ranks} ranks")
        return ranks

    def endpoint_parts(self) -> tuple[str, int]:
        host, _, port = self.endpoint.rpartition(":")
        return host, int(port)


SINGLE = NodeLayout()


# --- the layout, from the command line or SLURM ---------------------------------------------------


def expand_nodelist(text: str) -> list[str]:
    """SLURM's compressed host list (`gpu[01-03,07],login1`) as host names, in order; what
    `scontrol show hostnames` prints, for machines without scontrol."""
    hosts = []
    for match in re.finditer(r"([^,\[]+)(?:\[([^\]]*)\])?([^,]*)", text):
        prefix, ranges, suffix = match.groups()
        if ranges is None:
            hosts.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            width = len(first)
            for number in range(int(first), int(last or first) + 1):
                hosts.append(f"{prefix}{number:0{width}d}{suffix}")
    if not hosts:
        raise WorkspaceError(f"SLURM_JOB_NODELIST {text!r} names no host: run under srun")
    return hosts


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: node 0, where the rendezvous listens."""
    if shutil.which("scontrol"):
        done = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=60
        )
        if done.returncode == 0 and done.stdout.split():
            return done.stdout.split()[0]
    return expand_nodelist(nodelist)[0]


def from_options(
    nnodes: int | None,
    node_rank: int | None,
    endpoint: str | None,
    shares: Path | None,
    default_shares: Path,
    env: Mapping[str, str] = os.environ,
) -> NodeLayout:
    """The node layout: the options where given, else SLURM's variables, else one node."""
    slurm = int(env.get("SLURM_NNODES", "1") or "1") > 1
    count = nnodes if nnodes is not None else int(env["SLURM_NNODES"]) if slurm else 1
    from_slurm = slurm and count > 1
    rank = node_rank if node_rank is not None else int(env["SLURM_NODEID"]) if from_slurm else 0
    if count < 1 or not 0 <= rank < count:
        raise WorkspaceError(f"--node-rank {rank} with --nnodes {count}: use 0 to {count - 1}")
    if count == 1:
        return SINGLE
    if endpoint is None and from_slurm:
        port = env.get("MASTER_PORT", str(DEFAULT_PORT))
        endpoint = f"{first_host(env['SLURM_JOB_NODELIST'])}:{port}"
    if endpoint is None:
        if rank != 0:
            raise WorkspaceError(
                f"--node-rank {rank} without --rdzv-endpoint: a node of a job on several machines"
                " needs node 0's HOST:PORT (without one, node 0 starts every node here)"
            )
        return NodeLayout(count, 0, "", shares, f"local-{secrets.token_hex(4)}", True)
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise WorkspaceError(f"--rdzv-endpoint {endpoint!r}: give node 0's HOST:PORT")
    job = env.get("SLURM_JOB_ID")
    run_id = f"slurm-{job}-{env.get('SLURM_STEP_ID', '0')}" if job else f"{host}-{port}"
    return NodeLayout(count, rank, endpoint, shares or default_shares, run_id)


# --- pooling the ranks' results -------------------------------------------------------------------

# Both nodes run the same command, so the nth world one node launches is the nth of every node.
_worlds = itertools.count()


@dataclass(frozen=True)
class Pool:
    """Where the nodes pool one world's results."""

    folder: Path
    world: str
    timeout: float

    def share(self, node: int) -> Path:
        return self.folder / f"node-{node}"


def pool_for(nodes: NodeLayout, run_dir: Path, world: str, timeout: float) -> Pool:
    """The pool of the next world this command launches across nodes."""
    base = nodes.shares / nodes.run_id if nodes.shares else run_dir / "nodes"
    return Pool(base / f"{next(_worlds):04d}", world, timeout)


def clear_stale(nodes: NodeLayout) -> None:
    """Node 0 removes what an earlier command with the same run id left: no node can have shared
    anything of this one yet, since its first world needs node 0's agent to start."""
    if nodes.spans_nodes and nodes.rank == 0 and nodes.shares:
        shutil.rmtree(nodes.shares / nodes.run_id, ignore_errors=True)


T = TypeVar("T")


def node_0_first(nodes: NodeLayout, what: str, timeout: float, work: Callable[[], T]) -> T:
    """`work` (preparing the trees, say) on node 0 first, then on the others: on a shared
    filesystem they find it done rather than doing it at the same time in the same folders."""
    shares = nodes.shares  # set wherever nodes span machines
    if not nodes.spans_nodes or nodes.on_this_machine or shares is None:
        return work()
    done = shares / nodes.run_id / f"{what}.done"
    if nodes.rank == 0:
        found = work()
        done.parent.mkdir(parents=True, exist_ok=True)
        done.touch()
        return found
    _wait_for(done, timeout, f"node 0 did not finish {what} within {timeout:.0f} s (no {done})")
    return work()


def leave_share(pool: Pool, node: int, folder: Path, failure: str | None = None) -> None:
    """Copy this node's rank files (results, tracebacks, traces, reports) into its share, or
    say why it has none; published whole by a rename, so readers never see half of one."""
    target = pool.share(node)
    partial = target.with_name(f".{target.name}-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    ranks = sorted(int(path.stem.split("-")[1]) for path in folder.glob("rank-*.json"))
    for path in folder.iterdir():
        if path.is_file() and path.name != "launcher.log":
            shutil.copy2(path, partial / path.name)
    note = NodeNote(node, socket.gethostname(), pool.world, tuple(ranks), failure)
    write_file(note, partial / SHARE_NOTE)
    partial.rename(target)


def gather(pool: Pool, nodes: NodeLayout, folder: Path) -> list[RanOn]:
    """Wait for every node's share and copy the others' files into `folder`: then it holds every
    rank's result as on one machine. Returns, for each rank in order, the node that ran it and
    its host."""
    notes = {node: _wait_for_note(pool, node, nodes.count) for node in range(nodes.count)}
    for node, note in notes.items():
        if note.world != pool.world:
            raise WorkspaceError(
                f"node {node} ran {note.world!r} where this node ran {pool.world!r}: run the"
                " same command, with the same options, on every node"
            )
        if note.failure:
            raise WorkspaceError(f"node {node} ({note.host}) failed: {note.failure}")
    for node in notes:
        for path in pool.share(node).iterdir():
            if path.name != SHARE_NOTE and not (folder / path.name).exists():
                shutil.copy2(path, folder / path.name)
    by_rank = {rank: RanOn(node, note.host) for node, note in notes.items() for rank in note.ranks}
    return [by_rank[rank] for rank in sorted(by_rank)]


def _wait_for_note(pool: Pool, node: int, count: int) -> NodeNote:
    note = pool.share(node) / SHARE_NOTE
    said = f"node {node} of {count} left no results for {pool.world!r} in {pool.folder}"
    _wait_for(note, pool.timeout, f"{said} within {pool.timeout:.0f} s")
    try:
        return read_file(NodeNote, note)
    except RecordError as error:
        raise WorkspaceError(
            f"{error}: run the same version of the workspace on every node"
        ) from None


def _wait_for(path: Path, timeout: float, failure: str) -> None:
    """Until another node writes `path`; `failure` and how to mend it when none does in time."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise WorkspaceError(
                f"{failure}: start the same command on every node, with --node-results on a"
                " filesystem they all share"
            )
        time.sleep(_POLL_S)


def shares_of(world: str, rank_results: Sequence[RankReport]) -> tuple[NodeShare, ...]:
    """Per-node provenance of one world: which node, on which host, ran which ranks (nothing
    for a world on one node, whose results say no `ran_on`)."""
    by_node: dict[tuple[int, str], list[int]] = {}
    for result in rank_results:
        if result.ran_on:
            where = result.ran_on
            by_node.setdefault((where.node, where.host), []).append(result.rank)
    return tuple(
        NodeShare(world, node, host, tuple(ranks))
        for (node, host), ranks in sorted(by_node.items())
    )
