"""``grouppref train-rm`` like ``grouppref train``: resume from a checkpoint, LoRA on a
sequence classifier (peft task SEQ_CLS: the score head trains fully), ``report_to`` trackers,
and its section of the run's HTML report. Tiny 2-layer Llama from a config (tests/conftest.py),
the known-preference task of tests/support/training.py, CPU.

Resume measured (2026-12-01, CPU): 8 updates straight against 4 updates, a checkpoint
mid-epoch (batch 4, grad_accum 2: 3 updates per epoch), then a resume to 8 (crossing an
epoch), with LoRA (dropout 0.1) and with every weight trained: the final weights are bit-equal
(max |dw| = 0.0), as are the logged losses and the held-out loss; the test allows 1e-6.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from grouppref.cli import app
from grouppref.errors import ConfigError, StageError
from grouppref.pipeline.rank.rankers import RewardRanker
from grouppref.pipeline.rank.settings import RewardRankerSettings
from grouppref.pipeline.report.stage import run_report
from grouppref.schemas.reports import RewardModelStats
from grouppref.train.reward_model.model import load_reward_model
from grouppref.train.reward_model.trainer import train_reward_model
from grouppref.train.settings.reward_model import RewardModelConfig
from grouppref.train.settings.shared import LoraSettings
from tests.support.training import _write_validate, synthetic_groups

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _weights(folder: Path) -> torch.Tensor:
    model, _ = load_reward_model(str(folder))
    return torch.cat([p.detach().float().flatten() for p in model.parameters()])


def _train_losses(folder: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if r["split"] == "train"}


def test_resume_continues_exactly(tiny_lm_dir: Path, tmp_path: Path) -> None:
    """12 updates straight == 4, a checkpoint mid-epoch, resume to 12 (crossing an epoch):
    optimizer, scheduler, RNG and the data position come back."""
    groups = synthetic_groups(24, 8, seed=1)  # 6 micro-batches of 4, grad_accum 2: 3 steps/epoch
    base = dict(model=str(tiny_lm_dir), lr=5e-3, lr_scheduler="constant", batch_size=4,
                grad_accum=2, logging_steps=1, warmup_steps=2,
                lora=LoraSettings(r=4, alpha=8, dropout=0.1))  # LoRA dropout: the RNG matters
    train_reward_model(RewardModelConfig(**base, max_steps=8), groups, tmp_path / "a")
    train_reward_model(RewardModelConfig(**base, max_steps=4, save_steps=4), groups,
                       tmp_path / "b")
    with pytest.raises(ConfigError, match="lr: 0.005 -> 0.001"):
        train_reward_model(RewardModelConfig(**{**base, "lr": 1e-3}, max_steps=8), groups,
                           tmp_path / "b", resume=True)
    resumed = train_reward_model(RewardModelConfig(**base, max_steps=8), groups,
                                 tmp_path / "b", resume=True)
    assert resumed.stats.steps == 8 and resumed.stats.eval_start.measured()
    # exact: the resume restores the weights (safetensors: lossless), Adam's moments and the
    # RNG (the LoRA dropout's masks) and replays the same kernels on the same batches
    diff = (_weights(tmp_path / "a") - _weights(tmp_path / "b")).abs().max().item()
    assert diff == 0.0, diff
    straight, again = _train_losses(tmp_path / "a"), _train_losses(tmp_path / "b")
    assert list(again) == list(range(1, 9))  # the log goes on from the checkpoint's step
    assert again == straight  # exact, as the weights: the same computation replayed


def test_training_longer_on_resume_follows_the_new_schedule(tiny_lm_dir: Path,
                                                            tmp_path: Path) -> None:
    """2 steps of a linear decay, then ``--resume`` with max_steps 4: the rate after the resume
    is the 4-step schedule's (lr·2/4, lr·1/4), not the restored 2-step one's (0 at its end)."""
    groups = synthetic_groups(16, 0, seed=2)
    base = dict(model=str(tiny_lm_dir), lr=1e-3, batch_size=4, logging_steps=1)
    train_reward_model(RewardModelConfig(**base, max_steps=2, save_steps=2), groups, tmp_path)
    train_reward_model(RewardModelConfig(**base, max_steps=4), groups, tmp_path, resume=True)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rates = {r["step"]: r["lr"] for r in rows if r["split"] == "train"}
    # the schedule's float64 lr (one multiply per step): float64, a few operations: approx's default rel
    # 1e-6 is ~1e9 eps64
    assert rates == pytest.approx({1: 1e-3, 2: 5e-4, 3: 5e-4, 4: 2.5e-4})


def test_resume_without_a_checkpoint_fails_before_loading(tmp_path: Path) -> None:
    with pytest.raises(StageError, match="no complete checkpoint"):
        train_reward_model(RewardModelConfig(model="/no/such/model"), synthetic_groups(2, 0),
                           tmp_path, resume=True)


@pytest.fixture(scope="module")
def lora_run(tiny_lm_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """``grouppref train-rm RUN --lora --save-steps 6 --report-to tensorboard``, then
    ``grouppref report RUN``."""
    store = _write_validate(tmp_path_factory.mktemp("rm-lora") / "run",
                            synthetic_groups(48, 16))
    args = ["train-rm", str(store.root), "--model", str(tiny_lm_dir), "--max-steps", "12",
            "--batch-size", "8", "--lr", "2e-2", "--lr-scheduler", "constant",
            "--logging-steps", "3", "--eval-steps", "6", "--save-steps", "6", "--lora",
            "--lora-r", "8", "--lora-alpha", "16", "--report-to", "tensorboard"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return store, args, result.output


def test_lora_trains_adapters_and_the_score_head(lora_run, tiny_lm_dir: Path) -> None:
    """The merged folder is a plain 1-output classifier the ranker loads; the score head and
    the adapted projections moved, the embeddings (not adapted) did not; accuracy rises."""
    store, _, output = lora_run
    stats = RewardModelStats.model_validate(store.require("train_rm").stats)
    assert stats.eval.pair_accuracy > stats.eval_start.pair_accuracy
    assert stats.eval.pair_accuracy >= 0.9, stats.eval
    folder = Path(store.require("train_rm").outputs["model"])
    assert not (folder / "adapter_config.json").exists()
    trained, _ = load_reward_model(str(folder))
    base, _ = load_reward_model(str(tiny_lm_dir), seed=0)  # the same seeded new head
    before, after = dict(base.named_parameters()), dict(trained.named_parameters())
    assert not torch.equal(before["score.weight"], after["score.weight"])
    assert not torch.equal(before["model.layers.0.self_attn.q_proj.weight"],
                           after["model.layers.0.self_attn.q_proj.weight"])
    assert torch.equal(before["model.embed_tokens.weight"], after["model.embed_tokens.weight"])
    assert "r=8, alpha=16.0" in (folder / "README.md").read_text()
    RewardRanker(RewardRankerSettings(model=str(folder))).check()
    assert "margin" in output


def test_trackers_and_checkpoints(lora_run) -> None:
    store, _, _ = lora_run
    folder = Path(store.require("train_rm").outputs["model"])
    assert list((folder / "logs").rglob("events.out.tfevents*"))  # tensorboard backend
    steps = sorted(p.name for p in (folder / "checkpoints").iterdir())
    assert steps == ["step-00000006", "step-00000012"]


def test_resume_in_a_run_is_never_cached(lora_run, tmp_path: Path) -> None:
    """``--resume`` in a run trains on from the newest checkpoint (here the last step: no
    update left) instead of answering from the cache; a changed setting is a ConfigError naming
    it (one line, exit 2 from the CLI)."""
    store, args, _ = lora_run
    before = store.require("train_rm").finished_at
    result = CliRunner().invoke(app, [*args, "--resume"])
    assert result.exit_code == 0, result.output
    assert "skipped" not in result.output
    assert store.require("train_rm").finished_at != before
    assert store.require("train_rm").stats["steps"] == 12
    bad = CliRunner().invoke(app, [*args, "--resume", "--lora-r", "4"])
    assert isinstance(bad.exception, ConfigError), bad.output
    assert "lora: {'r': 8" in str(bad.exception) and "'r': 4" in str(bad.exception)
    assert store.require("train_rm").stats["steps"] == 12  # the stage was not touched


def test_report_has_a_reward_model_section(lora_run) -> None:
    store, _, _ = lora_run
    page = Path(run_report(store).outputs["html"]).read_text()
    stats = RewardModelStats.model_validate(store.require("train_rm").stats)
    section = page[page.index("id='reward-model'"):]
    assert "Reward model" in page and "held-out" in section
    assert f"{stats.eval.pair_accuracy:.3f}" in section
    assert "margin" in section and "data:image/png;base64," in section
