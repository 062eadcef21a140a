"""`scan` on training scripts nobody here wrote, unchanged, offline: the ones the environment's
accelerate and TRL wheels ship (the installed files themselves, never copied here), each given a
tiny Llama built from a config and tiny local data. Each must find its sites with their
dispositions: carried by a case, accepted by known_sites.toml, read and not carried, or a
candidate (the sp-loss pattern in accelerate's own loss code)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from hostsync.measure.records import ScanResult
from hostsync.rank.rankkit import tiny_tokenizer
from hostsync.scan.report import scan_sites
from hostsync.sites.dispositions import known_now
from hostsync.sites.records import HuntSite
from hostsync.workspace import results
from hostsync.workspace.layout import Layout

from conftest import hostsync

# The name accelerate's ALST script loads its model by: a folder of that name where it runs.
ALST_MODEL = "hf-internal-testing/tiny-random-LlamaForCausalLM"
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def installed(package: str, *path: str) -> Path:
    """A file of a package installed in this environment (the scan runs in it too)."""
    pytest.importorskip(package, reason=f"the environment has no {package}")
    return Path(importlib.util.find_spec(package).origin).parent.joinpath(*path)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama and its word-level tokenizer, saved where the scripts look for them."""
    import torch
    import transformers

    folder = tmp_path_factory.mktemp("models") / ALST_MODEL
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=256,  # the ALST script's token ids reach 228
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,  # Ulysses splits the heads over its 2 ranks
        num_key_value_heads=4,
        max_position_embeddings=256,
        pad_token_id=0,
        eos_token_id=1,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def words(seed: int, count: int) -> str:
    """Words of the tiny tokenizer's vocabulary (`t2` ... `t121`)."""
    return " ".join(f"t{2 + (seed * 7 + n * 3) % 120}" for n in range(count))


def scan(layout: Layout, folder: Path, *args: str | Path) -> ScanResult:
    """`hostsync scan ARGS` from `folder`, offline, its cache there too; the result it wrote."""
    env = OFFLINE | {"HF_HOME": str(folder / "hf-home")}
    done = hostsync(layout, "scan", *map(str, args), env_extra=env, cwd=folder)
    assert done.returncode == 0, done.stderr
    (path,) = (layout.root / "profiles" / "scan").glob("scan-*.json")
    return results.read(path, ScanResult)


def site(result: ScanResult, file: str, code: str) -> HuntSite:
    """The one site of `file` (a path suffix) whose statement holds `code`."""
    (found,) = [s for s in result.sites if s.site.file.endswith(file) and code in s.site.code]
    return found


def trl_args(tiny_model: Path, data: Path, out: Path) -> list[str]:
    return [
        *("--model_name_or_path", tiny_model),
        *("--dataset_name", data),
        *("--output_dir", out),
        *("--max_steps", "4", "--per_device_train_batch_size", "2", "--max_length", "24"),
        *("--logging_steps", "1", "--save_strategy", "no", "--report_to", "none", "--use_cpu"),
    ]


@pytest.mark.long_run("TRL's own SFT trainer, end to end, on a tiny Llama")
def test_trl_sft_finds_the_carried_metric_reads_and_the_trainers_own(
    workspace: Layout, tmp_path: Path, tiny_model: Path
) -> None:
    """`trl sft` as TRL ships it (trl/scripts/sft.py), on a local text dataset."""
    sft = installed("trl", "scripts", "sft.py")
    data = tmp_path / "text"
    data.mkdir()
    rows = [json.dumps({"text": words(i, 12)}) for i in range(32)]
    (data / "train.jsonl").write_text("\n".join(rows) + "\n")

    result = scan(workspace, tmp_path, sft, *trl_args(tiny_model, data, tmp_path / "out"))

    for code in ('["entropy"].append(', '["mean_token_accuracy"].append(', "num_tokens_in_batch ="):
        found = site(result, "trl/trainer/sft_trainer.py", code)
        assert (found.carried, found.when) == ("trl-sft-metrics", "every step"), code
    nan_filter = site(result, "transformers/trainer.py", "torch.isnan(tr_loss_step)")
    assert nan_filter.carried == "trainer-nan-filter" and nan_filter.stall_rate > 0
    logged = [s for s in result.sites if s.site.function == "_maybe_log_save_evaluate"]
    assert logged and all(s.allowed and "logging step" in s.allowed for s in logged)


@pytest.mark.long_run("TRL's own DPO trainer, end to end, on a tiny Llama")
def test_trl_dpo_finds_the_metric_reads_left_not_carried_with_why(
    workspace: Layout, tmp_path: Path, tiny_model: Path
) -> None:
    """`trl dpo` as TRL ships it (trl/scripts/dpo.py), on local preference pairs."""
    dpo = installed("trl", "scripts", "dpo.py")
    data = tmp_path / "pairs"
    data.mkdir()
    rows = [
        json.dumps(
            {
                "prompt": words(i, 5),
                "chosen": " " + words(i + 1, 5),
                "rejected": " " + words(i + 2, 5),
            }
        )
        for i in range(16)
    ]
    (data / "train.jsonl").write_text("\n".join(rows) + "\n")

    result = scan(workspace, tmp_path, dpo, *trl_args(tiny_model, data, tmp_path / "out"))

    shown = scan_sites(result, known_now(workspace))
    metrics = [s for s in shown if s.hunted.site.file == "trl/trainer/dpo_trainer.py"]
    assert len(metrics) >= 5
    assert all(s.disposed.disposition == "not carried" for s in metrics)
    assert all("TRL #6943" in str(s.disposed) for s in metrics)
    nan_filter = site(result, "transformers/trainer.py", "torch.isnan(tr_loss_step)")
    assert nan_filter.carried == "trainer-nan-filter"


@pytest.mark.distributed
def test_accelerates_alst_script_repeats_the_sp_loss_reads_in_its_own_loss(
    workspace: Layout, tmp_path: Path, tiny_model: Path
) -> None:
    """accelerate's ALST test script under `accelerate launch` with DeepSpeed ZeRO 2 and
    Ulysses SP over 2 ranks, as accelerate's own test starts it (fp32 here: a CPU)."""
    installed("deepspeed")
    alst = installed("accelerate", "test_utils", "scripts", "external_deps")
    alst /= "test_ds_alst_ulysses_sp.py"
    models = tiny_model.parents[1]

    result = scan(
        workspace,
        models,
        *("--launcher", "accelerate", "--nproc-per-node", "2"),
        *("--launcher-args", "--use_deepspeed --zero_stage 2 --mixed_precision no"),
        alst,
    )

    assert result.world_size == 2 and all(len(rank.steps) == 8 for rank in result.ranks)
    script = "test_ds_alst_ulysses_sp.py"
    # The sp-loss case's two reads, in the script's own copy of the loss: candidates here.
    per_rank = site(result, script, "if good_tokens_per_rank[rank] > 0")
    clamp = site(result, script, "loss = total_loss / max(total_good_tokens, 1)")
    for found, reads in ((per_rank, 2.0), (clamp, 1.0)):
        assert (found.rate, found.carried, found.allowed) == (reads, None, None)
    refill = site(result, "deepspeed/runtime/sequence_parallel/ulysses_sp.py", "seqlen !=")
    assert refill.carried == "ds-ulysses-seqlen"
    norm = [s for s in result.sites if s.site.function == "is_invalid_grad_norm"]
    assert {s.carried or "accepted" for s in norm} == {"ds-clip-norm", "accepted"}
