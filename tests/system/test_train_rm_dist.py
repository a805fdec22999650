"""``train-rm`` on 2 CPU processes (torchrun, gloo) against one process at the same global batch
(docs/reward-model.md, "Scaling out").

* DDP: the real command, ``torchrun --nproc_per_node 2 grouppref/__main__.py train-rm RUN``,
  2 groups per process against ``grouppref train-rm RUN --batch-size 4`` in one process: the
  logged train and held-out metrics and the saved reward model agree within fp32 noise; only
  the main process writes (one metrics line per step, one tensorboard event file, one stage
  manifest); a 2-process ``--resume-from`` the step-2 checkpoint ends where the uninterrupted
  run did, and one process may not resume it (another global batch). ``train`` in a run
  under torchrun finishes and writes once too.
* FSDP2 (accelerate's FSDP plugin needs a GPU): run as a script under torchrun, this module
  shards the reward model with ``fully_shard`` (each decoder layer, then the root, which holds
  the new score head) and trains it with the trainer's own pieces (``reward_scores``,
  ``reward_loss``); losses and the gathered, saved model equal one process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from tests.support.paths import REPO
from tests.support.tolerances import (
    MODEL_ATOL,
    MODEL_RTOL,
    assert_trained_close,
    tol_after_sgd_steps,
)

REPO = REPO
ARGS = ["--max-steps", "3", "--lr", "1e-3", "--lr-scheduler", "constant", "--logging-steps", "1",
        "--eval-steps", "2", "--save-steps", "2", "--report-to", "tensorboard"]
STEPS, GLOBAL = 3, 4  # FSDP harness: optimizer steps, groups per step (all processes)
# SGD at lr 0.5 (fsdp_train below) on gradients summed over <= 96 tokens a step in two orders
FSDP_ATOL = tol_after_sgd_steps(STEPS, 0.5, terms=96)


def _reward_model(path: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32
                                                              ).state_dict()


def _assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor],
                         atol: float | None = None, adam_steps: int = 0, lr: float = 0.0) -> None:
    """Equal weights: within ``atol`` (rtol MODEL_RTOL: weights ~1, the norms), or after
    ``adam_steps`` Adam steps at ``lr`` (:func:`assert_trained_close`), or exactly (neither)."""
    assert a.keys() == b.keys() and "score.weight" in a
    if adam_steps:
        assert_trained_close(torch.cat([a[n].flatten() for n in a]),
                             torch.cat([b[n].flatten() for n in a]), steps=adam_steps, lr=lr)
        return
    for name in a:
        if atol is None:
            assert torch.equal(a[name], b[name]), name
        else:
            torch.testing.assert_close(a[name], b[name], atol=atol, rtol=MODEL_RTOL, msg=name)


def _lines(model_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (model_dir / "metrics.jsonl").read_text().splitlines()]


def _numbers(line: dict) -> dict[str, float]:
    """A metrics line without the rates (wall-clock)."""
    return {k: v for k, v in line.items() if not k.endswith("_per_s") and k != "split"}


@pytest.mark.slow
def test_ddp_two_processes_equal_one_and_resume(tiny_lm_dir: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from grouppref.cli import app
    from tests.support.torchrun import torchrun
    from tests.support.training import _write_validate, synthetic_groups

    runs = {name: _write_validate(tmp_path / name, synthetic_groups(16, 4, seed=3))
            for name in ("single", "ddp")}
    common = ["--model", str(tiny_lm_dir), *ARGS]
    one = CliRunner().invoke(app, ["train-rm", str(runs["single"].root), "--batch-size", "4",
                                   *common])
    assert one.exit_code == 0, one.output
    main = REPO / "grouppref" / "__main__.py"
    log = torchrun(main, ["train-rm", str(runs["ddp"].root), "--batch-size", "2", *common])
    assert log.count("held-out pair accuracy") == 1  # the results table: main process only

    single, ddp = (Path(runs[n].require("train_rm").outputs["model"]) for n in ("single", "ddp"))
    a, b = _lines(single), _lines(ddp)
    assert [(x["step"], x["split"]) for x in b] == [(x["step"], x["split"]) for x in a] == [
        (0, "eval"), (1, "train"), (2, "train"), (2, "eval"), (3, "train"), (3, "eval")]
    for x, y in zip(a, b, strict=True):
        # DDP vs one process: the all-reduce sums the gradients in another order; losses and
        # metrics (~1) of weights within Adam's drift agree to MODEL_RTOL
        assert _numbers(y) == pytest.approx(_numbers(x), rel=MODEL_RTOL, abs=MODEL_ATOL / 10)
    assert b[-1]["groups"] == 4.0  # the held-out groups, scored half by each process
    stats = runs["ddp"].require("train_rm").stats
    assert stats["steps"] == 3 and stats["groups"]["train"] == 16
    initial = _reward_model(tiny_lm_dir)  # a new head: only the base weights compare
    trained = _reward_model(ddp)
    _assert_same_weights(trained, _reward_model(single), adam_steps=3, lr=1e-3)  # ARGS
    assert any(not torch.equal(trained[n], initial[n]) for n in initial if n in trained)
    events = {n: list((m / "logs").rglob("events.out.tfevents.*")) for n, m in
              (("single", single), ("ddp", ddp))}
    assert len(events["ddp"]) == len(events["single"]) > 0  # the scalars, the hparams
    assert len({f.name.split(".")[-2] for f in events["ddp"]}) == 1  # one process wrote them
    (ckpt,) = (ddp / "checkpoints").iterdir()
    assert sorted(p.name for p in ckpt.glob("random_states_*.pkl")) == [
        "random_states_0.pkl", "random_states_1.pkl"]  # each process's RNG, for the resume

    alone = CliRunner().invoke(app, ["train-rm", str(runs["ddp"].root), "--batch-size", "2",
                                     *common, "--out", str(tmp_path / "x"), "--resume-from",
                                     str(ckpt)])
    assert alone.exit_code != 0 and "processes: 2 -> 1" in str(alone.exception)
    resumed = tmp_path / "resumed"
    torchrun(main, ["train-rm", str(runs["ddp"].root), "--batch-size", "2", *common,
                    "--out", str(resumed), "--resume-from", str(ckpt)])
    assert [(x["step"], x["split"]) for x in _lines(resumed)] == [(3, "train"), (3, "eval")]
    # exact: the same 2 processes resume from bit-identical weights, Adam's moments and RNG
    # states and replay the same kernels and the same gloo all-reduce (a fixed order)
    assert _numbers(_lines(resumed)[0]) == _numbers(b[4])
    _assert_same_weights(_reward_model(resumed), trained)


@pytest.mark.slow
def test_train_in_a_run_on_two_processes_writes_once(tiny_lm_dir: Path, tmp_path: Path) -> None:
    """``train`` shares the loop, the checkpoints, the trackers and the stage's ending with
    ``train-rm``: in a run, under torchrun, it finishes (the trackers' closing once destroyed
    the process group before the stage's last barrier) and only the main process writes."""
    from tests.support.torchrun import torchrun
    from tests.support.training import _write_validate, synthetic_groups

    store = _write_validate(tmp_path / "run", synthetic_groups(8, 4, seed=3))
    torchrun(REPO / "grouppref" / "__main__.py", [
        "train", str(store.root), "--model", str(tiny_lm_dir), "--batch-size", "2",
        "--no-chat-template", *ARGS])
    manifest = store.require("train")
    assert manifest.status == "complete" and manifest.stats["steps"] == 3
    model = Path(manifest.outputs["model"])
    assert [(x["step"], x["split"]) for x in _lines(model)] == [
        (0, "eval"), (1, "train"), (2, "train"), (2, "eval"), (3, "train"), (3, "eval")]
    events = list((model / "logs").rglob("events.out.tfevents.*"))
    assert events and len({f.name.split(".")[-2] for f in events}) == 1
    (ckpt,) = (model / "checkpoints").iterdir()
    assert len(list(ckpt.glob("random_states_*.pkl"))) == 2


# -- FSDP2 -------------------------------------------------------------------------------------
def fsdp_train(model_dir: str, out_dir: str, rank: int = 0, world: int = 1) -> list[float]:
    """STEPS SGD steps on GLOBAL groups each (this process: its ``GLOBAL / world`` slice), the
    reward model sharded with FSDP2 when ``world > 1``; saves the full model into ``out_dir``
    (main process) and returns the global loss per step."""
    from grouppref.train.reward_model.encode import encode_groups
    from grouppref.train.reward_model.model import load_reward_model, reward_loss, reward_scores
    from grouppref.train.settings.reward_model import RewardModelConfig
    from grouppref.train.tensors.batch import collate_groups
    from tests.support.fsdp_train import full_state, shard
    from tests.support.training import synthetic_groups

    model, tokenizer = load_reward_model(model_dir, seed=0)
    config = RewardModelConfig(center_rewards=0.01)
    encoded, _ = encode_groups(synthetic_groups(GLOBAL * STEPS, 0, seed=5), tokenizer, 256)
    local = GLOBAL // world
    batches = [collate_groups(encoded[s * GLOBAL + rank * local: s * GLOBAL + (rank + 1) * local],
                              model.config.pad_token_id) for s in range(STEPS)]
    shard(model, world)  # each decoder layer, then the root, which holds the score head
    model.train()
    optim = torch.optim.SGD(model.parameters(), lr=0.5)  # SGD: see tests/support/fsdp_train.py
    losses = []
    for batch in batches:
        loss = reward_loss(reward_scores(model, batch), batch, config).mean()
        loss.backward()
        optim.step()
        optim.zero_grad()
        total = loss.detach().clone()
        if world > 1:
            torch.distributed.all_reduce(total)
        losses.append(total.item() / world)
    state = full_state(model, world)
    if rank == 0:
        full, tok = load_reward_model(model_dir, seed=0)
        full.load_state_dict(state)
        full.save_pretrained(out_dir)
        tok.save_pretrained(out_dir)
    return losses


@pytest.mark.slow
def test_fsdp_two_processes_equal_one(tiny_lm_dir: Path, tmp_path: Path) -> None:
    from tests.support.torchrun import torchrun

    single = fsdp_train(str(tiny_lm_dir), str(tmp_path / "single"))
    torchrun(Path(__file__), [str(tiny_lm_dir), str(tmp_path / "fsdp")], nproc=2)
    sharded = json.loads((tmp_path / "fsdp" / "losses.json").read_text())
    # a loss (~1) of the same weights summed over 2 shards vs 1: MODEL_RTOL's reduction-order
    # error, after up to STEPS-1 SGD steps of FSDP_ATOL drift (tests/support/tolerances.py)
    torch.testing.assert_close(torch.tensor(sharded), torch.tensor(single), atol=MODEL_ATOL,
                               rtol=MODEL_RTOL)
    assert single[-1] < single[0]  # it trained
    a, b = _reward_model(tmp_path / "fsdp"), _reward_model(tmp_path / "single")
    _assert_same_weights(a, b, atol=FSDP_ATOL)
    initial = _reward_model(tiny_lm_dir)
    assert not torch.equal(a["model.norm.weight"], initial["model.norm.weight"])


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    from tests.support.fsdp_train import launch

    launch(fsdp_train)
