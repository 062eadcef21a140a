"""`scan`: a training script of the test's own run unchanged under the detector, on real
processes: its reads found at their lines with their cost and disposition, its reports, the
gate, ranks under torchrun and DeepSpeed's launcher, and each bad input refused in one line that
leaves no process behind and keeps what was measured, marked partial."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hostsync.measure.records import ScanEnd, ScanResult
from hostsync.scan import gate
from hostsync.scan.measure import read_rank
from hostsync.workspace import results
from hostsync.workspace.layout import ROOT, Layout

from conftest import hostsync, one_line_error, processes_running, wait_until

# A plain training loop: `PLANTED` becomes a host read, or nothing.
LOOP = """
    import sys

    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(int(sys.argv[1])):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        PLANTED
"""
READ = 'print(f"loss {loss.item():.3f}")'
# Why a gate test is long: it scans twice.
BASELINE_THEN_GATE = (
    "two scans, each a fresh interpreter importing torch: the baseline's, then the gate's"
)


def script(folder: Path, name: str, text: str, planted: str = "pass") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text).replace("PLANTED", planted))
    return path


def line_of(path: Path, code: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if code in line)


def scan(layout: Layout, *args: str | Path) -> subprocess.CompletedProcess[str]:
    """`python -m hostsync scan ARGS`, from the folder of the scripts (the test's own)."""
    folder = next((Path(a).parent for a in args if str(a).endswith(".py")), layout.root)
    return hostsync(layout, "scan", *map(str, args), env_extra={"OMP_NUM_THREADS": "1"}, cwd=folder)


def written(layout: Layout) -> tuple[Path, ScanResult]:
    (path,) = (layout.root / "profiles" / "scan").glob("scan-*.json")
    return path, results.read(path, ScanResult)


def test_a_planted_read_is_found_at_its_line_with_its_wait_and_reported(
    workspace: Layout, tmp_path: Path
) -> None:
    loop = script(tmp_path, "loop.py", LOOP, READ)

    done = scan(workspace, loop, "5")

    assert done.returncode == 0, done.stderr
    path, result = written(workspace)
    (site,) = result.sites
    assert (site.site.file, site.site.line, site.site.code) == (
        "loop.py",
        line_of(loop, READ),
        READ,
    )
    assert (site.rate, site.stall_rate, site.when) == (1.0, 1.0, "every step")
    assert (site.carried, site.allowed, result.partial) == (None, None, None)
    assert result.threads == "1" and "OMP_NUM_THREADS=1" in done.stdout
    assert f"{loop} 5 (log: " in done.stderr  # the command echoed whole
    (rank,) = result.ranks
    assert (rank.ended, len(rank.steps), result.warmup) == (ScanEnd.FINISHED, 5, 1)
    assert result.cost.stalls == result.cost.reads == result.cost.steps == 4
    assert f"loop.py:{site.site.line}" in done.stdout and "candidate" in done.stdout
    report = path.with_suffix(".md").read_text()
    assert "| candidate |" in report and "Blocking copies of host memory to the device" in report
    assert "<svg" in path.with_suffix(".svg").read_text()
    trace = json.loads(
        gzip.decompress((results.attachments(path) / "rank-0.trace.json.gz").read_bytes())
    )
    waits = [e for e in trace["traceEvents"] if e.get("cat") == "stall"]
    spans = [e["name"] for e in trace["traceEvents"] if e["ph"] == "X"]
    # One read a step, the last one's after the last step (its optimizer step ends a step).
    assert spans == [*(f"step {n}" for n in range(1, 6)), "after the last step"]
    assert len(waits) == 5 and waits[0]["name"] == f"loop.py:{site.site.line}"
    assert waits[0]["args"]["waited for"]["kernels"] > 0


def test_steps_stops_the_script_once_it_has_run_them_and_the_result_is_complete(
    workspace: Layout, tmp_path: Path
) -> None:
    loop = script(tmp_path, "loop.py", LOOP, READ)

    done = scan(workspace, "--steps", "3", loop, "1000000")

    assert done.returncode == 0, done.stderr
    _, result = written(workspace)
    (rank,) = result.ranks
    assert (rank.ended, len(rank.steps), result.partial) == (ScanEnd.STOPPED, 4, None)
    assert [step.hunt.warmup for step in rank.steps] == [True, False, False, False]


STEPS_BY_HAND = """
    import torch

    from helpers import train_step

    device = torch.device("cpu")  # stands for the GPU: a tensor made with no device is the host's
    weight = torch.ones(4, requires_grad=True, device=device)
    for _ in range(4):
        train_step(weight)
"""
HELPERS = """
    import torch


    def train_step(weight):
        loss = (weight * torch.randn(4)).sum()
        loss.backward()
        with torch.no_grad():
            weight -= 0.1 * weight.grad
            weight.grad = None
        return bool(loss > 0)
"""


@pytest.mark.parametrize("where", ["helpers", "__main__"])
def test_a_step_function_is_a_step_each_call(workspace: Layout, tmp_path: Path, where: str) -> None:
    """No optimizer: `--step-fn` names the step, in a module beside the script or in the
    script itself."""
    if where == "__main__":
        train = script(tmp_path, "train.py", HELPERS + STEPS_BY_HAND.replace("from helpers", "#"))
    else:
        script(tmp_path, "helpers.py", HELPERS)
        train = script(tmp_path, "train.py", STEPS_BY_HAND)

    done = scan(workspace, "--step-fn", f"{where}:train_step", train)

    assert done.returncode == 0, done.stderr
    _, result = written(workspace)
    assert len(result.ranks[0].steps) == 4
    (site,) = result.sites
    assert (site.site.function, site.site.code, site.rate) == (
        "train_step",
        "return bool(loss > 0)",
        1.0,
    )


COMPILED = """
    import torch

    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_of = torch.compile(lambda out: out.pow(2).mean(), backend="eager")
    for step in range(4):
        loss = loss_of(model(torch.randn(4, 8)))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
"""


def test_a_compiled_call_is_reported_compiled_not_judged(workspace: Layout, tmp_path: Path) -> None:
    train = script(tmp_path, "train.py", COMPILED)

    done = scan(workspace, train)

    assert done.returncode == 0, done.stderr
    path, result = written(workspace)
    (site,) = result.sites
    assert (site.kinds, site.site.line) == (("compiled",), line_of(train, "loss_of(model"))
    assert result.cost.reads == 0 and gate.judged_sites(result) == []
    assert "compiled, not judged" in done.stdout
    assert "## Compiled, not judged" in path.with_suffix(".md").read_text()


# --- the gate ------------------------------------------------------------------------------------


@pytest.mark.long_run(BASELINE_THEN_GATE)
def test_fail_on_new_fails_a_ci_run_on_a_planted_read_the_baseline_does_not_hold(
    workspace: Layout, tmp_path: Path
) -> None:
    baseline = tmp_path / "host-syncs.json"
    clean = script(tmp_path, "loop.py", LOOP)
    assert scan(workspace, "--baseline", baseline, clean, "4").returncode == 0
    assert baseline.exists()
    planted = script(tmp_path, "loop.py", LOOP, READ)
    line = line_of(planted, READ)

    done = scan(
        workspace, "--baseline", baseline, "--fail-on", "new", "--max-waits", "0", planted, "4"
    )

    assert done.returncode == 1, done.stderr
    failures = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(failures) == 2, done.stderr
    assert failures[0].startswith(f"error: new host sync at loop.py:{line} in <module>: `{READ}`")
    assert "over the budget of 0 stalls per step" in failures[1]
    assert f"loop.py:{line}" in failures[1]


@pytest.mark.long_run(BASELINE_THEN_GATE)
def test_a_baseline_holding_the_read_passes_and_lines_that_move_still_match(
    workspace: Layout, tmp_path: Path
) -> None:
    baseline = tmp_path / "host-syncs.json"
    planted = script(tmp_path, "loop.py", LOOP, READ)
    assert scan(workspace, "--baseline", baseline, planted, "3").returncode == 0
    moved = script(tmp_path, "loop.py", "\n\n" + textwrap.dedent(LOOP), READ)

    done = scan(workspace, "--baseline", baseline, "--fail-on", "new", moved, "3")

    assert done.returncode == 0, done.stderr


@pytest.mark.long_run(
    "four scans, each a fresh interpreter importing torch: one per way to type the path"
)
def test_the_baseline_key_does_not_depend_on_how_the_path_was_typed(
    workspace: Layout, tmp_path: Path
) -> None:
    """Relative to the repository, absolute, or from the script's folder: one key. A baseline
    with no entry for the script warns that every site counts as new."""
    baseline = tmp_path / "host-syncs.json"
    repository = tmp_path / "repository"
    (repository / ".git").mkdir(parents=True)
    (repository / "examples").mkdir()
    loop = script(repository / "examples", "loop.py", LOOP, READ)

    def gate_run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
        words = ("scan", "--baseline", str(baseline), *map(str, args))
        return hostsync(workspace, *words, env_extra={"OMP_NUM_THREADS": "1"}, cwd=cwd)

    assert gate_run("examples/loop.py", "3", cwd=repository).returncode == 0
    assert list(json.loads(baseline.read_text())["tests"]) == ["examples/loop.py"]
    for typed, cwd in ((loop, tmp_path), ("loop.py", loop.parent)):
        done = gate_run("--fail-on", "new", typed, "3", cwd=cwd)
        assert done.returncode == 0, done.stderr
        assert "warning:" not in done.stderr
    baseline.write_text(baseline.read_text().replace('"examples/loop.py"', '"loop.py"'))

    done = gate_run("--fail-on", "new", loop, "3", cwd=tmp_path)

    assert done.returncode == 1
    assert "warning: no entry of the baseline" in done.stderr
    assert "is for examples/loop.py (it holds: loop.py)" in done.stderr


# --- bad input -----------------------------------------------------------------------------------


def test_a_script_that_does_not_exist_is_refused_before_anything_runs(
    workspace: Layout, tmp_path: Path
) -> None:
    done = scan(workspace, tmp_path / "missing.py")

    assert "no script at" in one_line_error(done)
    assert not (workspace.root / "profiles" / "scan").exists()


def test_a_syntax_error_is_refused_at_its_line_before_anything_runs(
    workspace: Layout, tmp_path: Path
) -> None:
    train = script(tmp_path, "train.py", "import torch\nif True\n    pass\n")

    done = scan(workspace, train)

    assert one_line_error(done) == (
        f"error: {train}:2: expected ':': fix the script (nothing was started)"
    )
    assert not (workspace.root / "profiles" / "scan").exists()


OWN_PACKAGE = """
    import torch

    from mine import model

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with open("steps.txt") as steps:
        for step in range(int(steps.read())):
            model(torch.randn(4, 8)).pow(2).mean().backward()
            optimizer.step()
"""


def test_the_script_runs_from_its_folder_with_the_users_pythonpath(
    workspace: Layout, tmp_path: Path
) -> None:
    """It opens a file beside itself and imports its own package from the user's PYTHONPATH."""
    package = tmp_path / "lib" / "mine"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("import torch\n\nmodel = torch.nn.Linear(8, 2)\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "steps.txt").write_text("3")
    train = script(tmp_path / "run", "train.py", OWN_PACKAGE)
    path = os.pathsep.join([str(ROOT / "src"), str(tmp_path / "lib")])

    done = hostsync(
        workspace,
        *("scan", str(train)),
        env_extra={"PYTHONPATH": path},
        cwd=train.parent,
    )

    assert done.returncode == 0, done.stderr
    _, result = written(workspace)
    assert len(result.ranks[0].steps) == 3
    assert result.threads == os.environ.get("OMP_NUM_THREADS")  # as the user set them


RAISES = """
    import torch

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
        if step == 2:
            raise ValueError("the loss diverged")
"""
NEVER_STEPS = """
    import torch


    def train_step(weight):
        (weight * 2).sum().backward()


    print(torch.ones(3).sum().item())
"""
HANGS = """
    import time

    import torch

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
    time.sleep(3600)
"""


@pytest.mark.parametrize(
    ("text", "options", "said", "steps"),
    [
        (RAISES, (), "raised ValueError: the loss diverged (train.py:10 in <module>)", 3),
        (NEVER_STEPS, (), "without a step", 0),
        pytest.param(
            HANGS,
            ("--timeout", "15"),
            "run hung: no exit after 15 s",
            3,
            marks=pytest.mark.long_run("the script hangs until scan's 15 s timeout stops it"),
        ),
    ],
    ids=["raises", "never-steps", "hangs"],
)
def test_a_script_that_fails_is_named_in_one_line_and_its_partial_result_kept(
    workspace: Layout,
    tmp_path: Path,
    text: str,
    options: tuple[str, ...],
    said: str,
    steps: int,
) -> None:
    train = script(tmp_path, "train.py", text)

    done = scan(workspace, *options, train)

    line = one_line_error(done)
    assert said in line and "the partial result is profiles/scan/scan-" in line
    if "never" in said:
        assert "--step-fn MODULE:FUNCTION; candidates, which call backward() or step():" in line
        assert "__main__:train_step" in line
    _, result = written(workspace)
    assert result.partial and said in result.partial
    assert sum(len(rank.steps) for rank in result.ranks) == steps
    assert processes_running(str(tmp_path)) == {}


def test_ctrl_c_stops_the_script_and_keeps_the_partial_result(
    workspace: Layout, tmp_path: Path
) -> None:
    train = script(tmp_path, "train.py", HANGS)
    env = os.environ | {
        "PYTHONPATH": str(ROOT / "src"),
        "HOSTSYNC_ROOT": str(workspace.root),
        "OMP_NUM_THREADS": "1",
    }
    log = tmp_path / "output.txt"
    with log.open("w") as output:
        started = subprocess.Popen(
            [sys.executable, "-m", "hostsync", "scan", str(train)],
            env=env,
            cwd=tmp_path,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stepped() -> bool:
        snapshots = list(workspace.work.glob("runs/scan-*/world-*/rank-0.partial.jsonl"))
        return bool(snapshots) and len(snapshots[0].read_text().splitlines()) > 3

    wait_until(lambda: stepped() or started.poll() is not None)
    assert started.poll() is None, log.read_text()
    os.killpg(started.pid, signal.SIGINT)
    started.wait(timeout=30)

    output = log.read_text()
    assert started.returncode == 130, output
    assert "interrupted: every process it started was stopped; the partial result is" in output
    assert "Traceback" not in output
    assert processes_running(str(tmp_path)) == {}
    _, result = written(workspace)
    assert result.partial == "interrupted by Ctrl-C"
    assert result.ranks[0].ended == ScanEnd.RUNNING and len(result.ranks[0].steps) == 3


def test_a_rank_snapshot_cut_short_keeps_its_whole_steps(tmp_path: Path) -> None:
    """A rank killed while it wrote a step: the steps before it stand."""
    line = json.dumps({"rank": 1, "world_size": 2})
    (tmp_path / "rank-1.partial.jsonl").write_text(f'{line}\n{{"step": 1, "warm')

    found = read_rank(tmp_path, 1)

    assert (found.rank, found.ended, found.steps) == (1, ScanEnd.RUNNING, ())
    assert read_rank(tmp_path, 0) is None


# --- ranks ---------------------------------------------------------------------------------------

DDP = """
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    for step in range(5):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0:
            print(f"step {step}: loss {loss.item():.3f}")
        PLANTED
    dist.destroy_process_group()
"""


@pytest.mark.distributed
def test_two_ranks_on_torchrun_are_scanned_each_and_together(
    workspace: Layout, tmp_path: Path
) -> None:
    train = script(tmp_path, "train.py", DDP)

    done = scan(workspace, "--nproc_per_node", "2", train)  # torchrun's spelling

    assert done.returncode == 0, done.stderr
    path, result = written(workspace)
    assert (result.launcher, result.world_size, len(result.ranks)) == ("torchrun", 2, 2)
    (site,) = [s for s in result.sites if "loss.item()" in s.site.code]
    assert site.rate == 0.5  # one read per step on rank 0, none on rank 1: per rank
    assert [len(rank.steps) for rank in result.ranks] == [5, 5]
    traces = sorted(p.name for p in results.attachments(path).iterdir())
    assert traces == ["rank-0.trace.json.gz", "rank-1.trace.json.gz"]


@pytest.mark.distributed
def test_two_nodes_on_this_machine_pool_their_ranks(workspace: Layout, tmp_path: Path) -> None:
    train = script(tmp_path, "train.py", DDP)

    done = scan(workspace, "--nnodes", "2", "--nproc-per-node", "1", "--steps", "2", train)

    assert done.returncode == 0, done.stderr
    _, result = written(workspace)
    assert (result.world_size, [rank.rank for rank in result.ranks]) == (2, [0, 1])
    assert all(rank.ended == ScanEnd.STOPPED for rank in result.ranks)


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("planted", "then"),
    [
        # Rank 0 waits in a collective: it raises as its peer goes, or is stopped first.
        ("if rank == 1 and step == 2: os._exit(3)", ("rank 0 raised", "rank 0 of 2 was stopped")),
        # Rank 0 waits on nothing that fails: its launcher stops it, as on a busy machine.
        (
            "if step == 2: os._exit(3) if rank == 1 else signal.pause()",
            ("rank 0 of 2 was stopped by SIGTERM",),
        ),
    ],
    ids=["in-a-collective", "stopped"],
)
def test_a_rank_that_dies_is_named_and_what_it_measured_kept(
    workspace: Layout, tmp_path: Path, planted: str, then: tuple[str, ...]
) -> None:
    train = script(tmp_path, "train.py", DDP, planted)
    train.write_text("import os\nimport signal\n" + train.read_text())

    done = scan(workspace, "--nproc-per-node", "2", "--timeout", "120", train)

    line = one_line_error(done)
    assert line.startswith("error: rank 1 of 2 stopped mid-run without an error")
    assert any(f"; then {stopped}" in line for stopped in then), line
    assert "the partial result is profiles/scan/scan-" in line
    _, result = written(workspace)
    assert result.partial
    assert len(result.ranks[1].steps) == 3 and result.ranks[1].ended == ScanEnd.RUNNING
    assert processes_running(str(tmp_path)) == {}


DEEPSPEED_ENGINE = """
    import argparse

    import deepspeed
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    model = torch.nn.Linear(8, 2)
    engine, *_ = deepspeed.initialize(
        model=model,
        optimizer=torch.optim.AdamW(model.parameters(), lr=0.01),
        config={
            "train_micro_batch_size_per_gpu": 4,
            "zero_optimization": {"stage": 1},
            "gradient_clipping": 1.0,
        },
    )
    for step in range(args.steps):
        loss = engine(torch.randn(4, 8)).pow(2).mean()
        engine.backward(loss)
        engine.step()
"""


@pytest.mark.distributed
def test_deepspeeds_launcher_starts_a_script_that_expects_it(
    workspace: Layout, tmp_path: Path
) -> None:
    """The script parses the `--local_rank` DeepSpeed gives it; ZeRO's inner optimizer steps."""
    pytest.importorskip("deepspeed", reason="the environment has no DeepSpeed")
    train = script(tmp_path, "train.py", DEEPSPEED_ENGINE)

    done = scan(
        workspace, "--launcher", "deepspeed", "--nproc-per-node", "2", train, "--steps", "4"
    )

    assert done.returncode == 0, done.stderr
    _, result = written(workspace)
    assert [len(rank.steps) for rank in result.ranks] == [4, 4]
    clip = [s for s in result.sites if s.carried == "ds-clip-norm"]
    assert clip and clip[0].site.function == "is_invalid_grad_norm"


@pytest.mark.long_run("bench times whole runs of the script with and without scan, interleaved")
def test_bench_prints_what_scan_adds_to_a_whole_run_and_where_it_goes(
    workspace: Layout, tmp_path: Path
) -> None:
    loop = script(tmp_path, "loop.py", LOOP, READ)

    done = hostsync(
        workspace,
        *("bench", "--scan", str(loop), "--scan-args", "6", "--warm-runs", "1"),
        env_extra={"OMP_NUM_THREADS": "1"},
    )

    assert done.returncode == 0, done.stderr
    assert "1 run each way, interleaved" in done.stdout
    row = next(line for line in done.stdout.splitlines() if line.startswith("loop.py"))
    _, steps, python, scanned, ratio, *_, writing, share, timed, _, detected = row.split()
    assert steps == "5" and float(scanned) / float(python) == pytest.approx(float(ratio[1:]), 0.01)
    assert 0 < float(writing) < float(scanned) and share.endswith("%)")
    assert 0 < float(timed) < float(detected)
    # The bench's scans are written in a workspace of their own: no one's results.
    assert not (workspace.root / "profiles" / "scan").exists()


# A loop whose reads come every step, every third (the log), every fourth (an evaluation under
# no_grad, whose nonzero no remedy covers) and once after training.
EVALUATED = """
    import sys

    import torch

    torch.manual_seed(0)
    DEVICE = torch.device("cpu")
    model = torch.nn.Linear(8, 2).to(DEVICE)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


    def evaluate():
        with torch.no_grad():
            return model(torch.randn(4, 8, device=DEVICE)).argmax(1).nonzero().numel()


    for step in range(int(sys.argv[1])):
        loss = model(torch.randn(4, 8, device=DEVICE)).pow(2).mean()
        loss.backward()
        if loss > 100:
            print("diverged")
        optimizer.step()
        optimizer.zero_grad()
        if step % 3 == 0:
            print(f"loss {loss.item():.3f}")
        if step % 4 == 3:
            evaluate()
    print(f"final loss {loss.item():.3f}")
"""


def test_the_summary_says_when_each_site_is_made_and_what_to_change(
    workspace: Layout, tmp_path: Path
) -> None:
    loop = script(tmp_path, "evaluated.py", EVALUATED)

    done = scan(workspace, loop, "13")

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()

    def row(code: str) -> str:
        (found,) = [line for line in lines if code in line]
        return found

    (every,) = [n for n, line in enumerate(lines) if line.startswith("every step (mean")]
    (apart,) = [n for n, line in enumerate(lines) if line.startswith("not every step:")]
    assert "12 steps measured per rank" in done.stdout and "(the mean)" in done.stdout
    assert every < lines.index(row("if loss > 100:")) < apart
    assert row("if loss > 100:").split()[:2] == ["1", "1"]
    assert row("if loss > 100:").endswith("if-tensor")
    assert row('print(f"loss').startswith("every 3rd step (4 of 12)")
    assert row('print(f"loss').endswith("device-accumulator")
    assert row("return model(").startswith("every 4th step (3 of 12)")
    assert row("return model(").endswith("none")
    assert row('print(f"final').startswith("after training (1 wait)")
    assert row('print(f"final').endswith("device-accumulator")
    assert lines.index(row("if loss > 100:")) < apart < lines.index(row("return model("))
    assert "what to do: if-tensor: compute both outcomes on the device" in done.stdout
    assert "what to do: none: no remedy in remedies.toml" in done.stdout
    path, _ = written(workspace)
    report = path.with_suffix(".md").read_text()
    sections = report.split("\n## ")
    (sites,) = [s for s in sections if s.startswith("Sites")]
    (apart_section,) = [s for s in sections if s.startswith("Not every step")]
    (to_change,) = [s for s in sections if s.startswith("What to change")]
    assert "`if loss > 100:`" in sites and ".nonzero()" not in sites
    assert "every 4th step (3 of 12)" in apart_section and "final loss" in apart_section
    assert "**if-tensor** (#1): compute both outcomes" in to_change and "*Cost:*" in to_change
    assert "no remedy in remedies.toml: #" in to_change and "(nonzero)" in to_change
