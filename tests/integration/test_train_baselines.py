"""The trainer's baselines: best-of-K SFT (``loss="sft"``), hard pair targets for GSPO, and the
trimming that makes ``dpo`` / ``sft`` forward only the candidates they train on. Checked
against naive computations and by training the 2-layer tiny Llama on the known-preference
task of tests/support/training.py."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from grouppref.cli import app
from grouppref.models.loading import load_causal_lm, load_tokenizer
from grouppref.schemas import ValidatedGroup, to_dataset
from grouppref.train.data.tokenize import tokenize_groups
from grouppref.train.objective.candidates import trim_for_loss
from grouppref.train.objective.dispatch import loss_candidates
from grouppref.train.objective.losses import gspo_loss, hard_pair_targets
from grouppref.train.policy.step import Objective, group_loss
from grouppref.train.policy.trainer import split_groups
from grouppref.train.settings.policy import TrainConfig
from grouppref.train.tensors.batch import collate_groups
from grouppref.train.tensors.logps import group_logps
from tests.support.training import PLAIN, synthetic_group, synthetic_groups

# float32 losses (~1) of <= K^2 = 25 pair terms, vectorised vs a loop: 25 * eps32 = 3e-6 worst;
# gradients: the same plus rtol 1e-4 (MODEL_RTOL)
ATOL = 1e-5
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def test_hard_pair_targets_against_a_loop() -> None:
    g = torch.Generator().manual_seed(0)
    p = torch.rand(3, 5, 5, generator=g)
    p = torch.triu(p, 1) + torch.tril(1 - p.transpose(1, 2), -1) + 0.5 * torch.eye(5)
    p[0, 1, 2], p[0, 2, 1] = 0.5, 0.5  # a tie
    w = torch.rand(3, 5, 5, generator=g)
    w = (w + w.transpose(1, 2)) / 2
    w[1, 0, 3] = w[1, 3, 0] = 0.0  # no preference
    hp, hw = hard_pair_targets(p, w)
    for b in range(3):
        for i in range(5):
            for j in range(5):
                ordered = abs(p[b, i, j] - 0.5) > 1e-6 and w[b, i, j] > 0
                assert hw[b, i, j] == (1.0 if ordered else 0.0)
                assert hp[b, i, j] == ((1.0 if p[b, i, j] > 0.5 else 0.0) if ordered else 0.5)
    # with hard targets gspo is the mean over ordered pairs of DPO's -log sigmoid(s_w - s_l)
    s = torch.randn(3, 5, generator=g)
    valid = torch.ones(3, 5, dtype=torch.bool)
    got = gspo_loss(s, hp, hw, valid)
    for b in range(3):
        terms = [-torch.nn.functional.logsigmoid(s[b, i] - s[b, j] if p[b, i, j] > 0.5
                                                 else s[b, j] - s[b, i])
                 for i in range(5) for j in range(i + 1, 5) if hw[b, i, j] > 0]
        assert got[b].item() == pytest.approx(torch.stack(terms).mean().item(), abs=ATOL)


def test_loss_candidates() -> None:
    assert loss_candidates([2, 0, 3, 1], "dpo") == [2, 1]
    assert loss_candidates([2, 0, 3, 1], "sft") == [2]
    assert loss_candidates([2, 0, 3, 1], "gspo") == [0, 1, 2, 3]


@pytest.mark.parametrize("loss", ["dpo", "sft"])
def test_trimmed_groups_give_the_same_loss_and_gradients(tiny_lm_dir: Path, loss: str) -> None:
    """The loss of a trimmed batch equals the loss of the full batch (same model), and so do
    the gradients: trimming only skips candidates the loss never reads."""
    tokenizer = load_tokenizer(str(tiny_lm_dir), padding_side="right")
    model = load_causal_lm(str(tiny_lm_dir))
    rng = random.Random(1)
    groups = [synthetic_group(i, "train", rng) for i in range(3)]
    tokenized, _ = tokenize_groups(groups, tokenizer, PLAIN)
    for g in tokenized:
        g.order = [1, 3, 0, 2]  # any consensus order: best 1, worst 2
        g.ref_logps = [-1.0, -2.0, -3.0, -4.0]
    trimmed = [trim_for_loss(g, loss) for g in tokenized]
    assert [len(g.cand_ids) for g in trimmed] == [2 if loss == "dpo" else 1] * 3
    assert trimmed[0].cand_ids[0] == tokenized[0].cand_ids[1]
    assert trimmed[0].ref_logps == ([-2.0, -3.0] if loss == "dpo" else [-2.0])
    objective = Objective.of(TrainConfig(loss=loss))
    results = []
    for batch_groups in (tokenized, trimmed):
        model.zero_grad()
        batch = collate_groups(batch_groups, tokenizer.pad_token_id)
        value, _ = group_loss(group_logps(model, batch), batch, objective)
        value.mean().backward()
        grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results.append((value.detach(), grad))
    (full, g_full), (cut, g_cut) = results
    torch.testing.assert_close(cut, full, atol=ATOL, rtol=0)
    torch.testing.assert_close(g_cut, g_full, atol=ATOL, rtol=1e-4)


def test_split_groups_trims_training_groups_only(tiny_lm_dir: Path) -> None:
    tokenizer = load_tokenizer(str(tiny_lm_dir), padding_side="right")
    groups = synthetic_groups(4, 2)
    for loss, k in (("gspo", 4), ("dpo", 2), ("sft", 1)):
        train_set, held_out, _ = split_groups(groups, tokenizer, TrainConfig(loss=loss, data=PLAIN))
        assert {len(g.cand_ids) for g in train_set} == {k}
        assert {len(g.cand_ids) for g in held_out} == {4}


@pytest.mark.parametrize("settings,message", [
    ({"loss": "dpo", "pair_targets": "hard"}, "applies to loss 'gspo'"),
    ({"loss": "sft", "sft_weight": 0.5}, "leave it at 0"),
])
def test_inconsistent_settings(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainConfig(**settings)


@pytest.mark.slow
def test_cli_sft_and_hard_gspo_learn_the_known_preference(tiny_lm_dir: Path, tmp_path: Path
                                                           ) -> None:
    """``grouppref train --loss sft`` raises the likelihood of the best candidates; ``--loss gspo
    --pair-targets hard`` separates best from worst on held-out groups."""
    data = tmp_path / "groups"
    to_dataset(synthetic_groups(32, 8), ValidatedGroup).save_to_disk(str(data))
    common = ["--model", str(tiny_lm_dir), "--no-chat-template", "--lr", "5e-3",
              "--lr-scheduler", "constant", "--batch-size", "8", "--max-steps", "8",
              "--logging-steps", "4", "--beta", "0.5"]
    runner = CliRunner()
    res = runner.invoke(app, ["train", str(data), "--out", str(tmp_path / "sft"), "--loss", "sft",
                              *common])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["train", str(data), "--out", str(tmp_path / "hard"),
                              "--pair-targets", "hard", *common])
    assert res.exit_code == 0, res.output
    from grouppref.schemas.reports import TrainStats

    sft = TrainStats.model_validate_json((tmp_path / "sft" / "metrics.json").read_text())
    hard = TrainStats.model_validate_json((tmp_path / "hard" / "metrics.json").read_text())
    # SFT trains on one candidate per group (no pair to score in training), and the model's
    # own likelihood comes to prefer the held-out best candidates ("sunny ...")
    assert sft.groups.train == 32 and sft.train["pair_accuracy"] is None
    assert sft.eval_start["logp_pair_accuracy"] < 0.5  # measured 0.03
    assert sft.eval["logp_pair_accuracy"] >= 0.9  # measured 1.0
    assert sft.eval["reward_best"] > sft.eval["reward_worst"]  # measured 4.4 > 1.7
    assert hard.eval["pair_accuracy"] >= 0.9 and hard.eval["margin"] > 1.0  # measured 1.0 / 4.9
