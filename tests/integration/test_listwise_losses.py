"""The listwise losses (LiPO-λ, InfoNCA, NCA) and the reference-free (SimPO) rewards against
naive loops written from the papers' equations (values and autograd gradients, on random
groups with padding and ties), their K = 2 reductions (DPO; TRL's ``nca_pair``), and short
trainings through the trainer and the CLI."""

from __future__ import annotations

import inspect
import json
import math
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from grouppref.cli import app
from grouppref.errors import ConfigError
from grouppref.models.loading import load_causal_lm, load_tokenizer
from grouppref.schemas import ValidatedGroup, to_dataset
from grouppref.schemas.reports import TrainStats
from grouppref.train.data.tokenize import list_targets, tokenize_groups
from grouppref.train.engine import checkpoint
from grouppref.train.objective.candidates import trim_for_loss
from grouppref.train.objective.dispatch import score_loss
from grouppref.train.objective.listwise import (
    current_ranks,
    infonca_loss,
    lipo_lambda_loss,
    nca_loss,
    soft_targets,
)
from grouppref.train.objective.losses import dpo_loss
from grouppref.train.policy.step import Objective, group_loss
from grouppref.train.policy.trainer import train
from grouppref.train.refresh.buffer import concat_batches
from grouppref.train.reward_model.model import reward_loss
from grouppref.train.reward_model.trainer import train_reward_model
from grouppref.train.settings.policy import TrainConfig
from grouppref.train.settings.reward_model import RewardModelConfig
from grouppref.train.tensors.batch import GroupBatch, collate_groups
from tests.support.training import PLAIN, synthetic_groups

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

# float64 throughout: the vectorised and the naive loss run the same operations in another
# order, so they agree to rounding (~1e-15 relative); 1e-10 leaves room for the sums of K² terms.
ATOL = 1e-10
# The trainer's step runs the tiny model in float32, batched with a shared prefix; the naive
# SimPO check runs one unbatched forward per candidate: float32 rounding of ~20-token sums.
MODEL_ATOL = 1e-4


def _random_batch(seed: int, b: int = 4, k: int = 6):
    """Rewards s, graded labels ψ with ties, explicit rewards r and a valid mask with padding
    (group 1 has 3 candidates, group 2 has 2), all float64; s requires grad."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(b, k, generator=g, dtype=torch.float64)
    s[0, 3] = s[0, 1]  # a reward tie: the ranks break it by index
    labels = torch.randint(0, 3, (b, k), generator=g).to(torch.float64)  # 3 tiers: many ties
    r = torch.randn(b, k, generator=g, dtype=torch.float64)
    valid = torch.ones(b, k, dtype=torch.bool)
    valid[1, 3:] = False
    valid[2, 2:] = False
    labels[2, :2] = torch.tensor([1.0, 0.0])
    return s.requires_grad_(True), labels, r, valid


# -- naive references, one group at a time, straight from the equations --------------------
def _naive_lipo(s: torch.Tensor, labels, valid, gamma: float, normalise: bool) -> torch.Tensor:
    """LiPO-λ: −Σ_{ψ_i>ψ_j} Δ_ij log σ(s_i − s_j − γ), Δ_ij = |G_i − G_j|·|1/D(τ_i) − 1/D(τ_j)|,
    G = 2^ψ − 1, D(τ) = log2(1 + τ), τ the 1-based rank under s (stable sort), Δ constant."""
    out = []
    for row in range(s.shape[0]):
        idx = [i for i in range(s.shape[1]) if valid[row, i]]
        values = [float(s[row, i].detach()) for i in idx]
        ranked = sorted(range(len(idx)), key=lambda m: -values[m])  # stable: index breaks ties
        tau = {idx[m]: pos + 1 for pos, m in enumerate(ranked)}
        total, norm = s.new_zeros(()), 0.0
        for i in idx:
            for j in idx:
                if labels[row, i] <= labels[row, j]:
                    continue
                gain = abs((2 ** float(labels[row, i]) - 1) - (2 ** float(labels[row, j]) - 1))
                delta = gain * abs(1 / math.log2(1 + tau[i]) - 1 / math.log2(1 + tau[j]))
                total = total - delta * F.logsigmoid(s[row, i] - s[row, j] - gamma)
                norm += delta
        out.append(total / norm if normalise and norm > 0 else total)
    return torch.stack(out)


def _naive_q(r, valid, alpha: float) -> list[list[float]]:
    rows = []
    for row in range(r.shape[0]):
        e = [math.exp(float(r[row, i]) / alpha) if valid[row, i] else 0.0 for i in range(r.shape[1])]
        rows.append([x / sum(e) for x in e])
    return rows


def _naive_infonca(s, q, valid) -> torch.Tensor:
    """−Σ_i q_i log( e^{s_i} / Σ_j e^{s_j} ) over the valid candidates."""
    out = []
    for row in range(s.shape[0]):
        idx = [i for i in range(s.shape[1]) if valid[row, i]]
        log_z = torch.log(sum(torch.exp(s[row, j]) for j in idx))
        out.append(-sum(q[row][i] * (s[row, i] - log_z) for i in idx))
    return torch.stack(out)


def _naive_nca(s, q, valid) -> torch.Tensor:
    """−Σ_i q_i log σ(s_i) − (1/K) Σ_i log σ(−s_i) over the K valid candidates."""
    out = []
    for row in range(s.shape[0]):
        idx = [i for i in range(s.shape[1]) if valid[row, i]]
        pull = sum(q[row][i] * torch.log(torch.sigmoid(s[row, i])) for i in idx)
        push = sum(torch.log(torch.sigmoid(-s[row, i])) for i in idx) / len(idx)
        out.append(-pull - push)
    return torch.stack(out)


def _value_and_grad(fn, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    value = fn(s)
    (grad,) = torch.autograd.grad(value.sum(), s)
    return value.detach(), grad


# -- LiPO-λ -------------------------------------------------------------------------------
def test_current_ranks_stable_and_padded() -> None:
    s = torch.tensor([[0.2, 0.9, 0.2, -1.0, 5.0]])
    valid = torch.tensor([[True, True, True, True, False]])
    assert current_ranks(s, valid).tolist() == [[2, 1, 3, 4, 0]]


@pytest.mark.parametrize("normalise", [True, False])
@pytest.mark.parametrize("gamma", [0.0, 0.7])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lipo_matches_the_paper_loop(seed: int, gamma: float, normalise: bool) -> None:
    s, labels, _, valid = _random_batch(seed)
    ours, g_ours = _value_and_grad(lambda x: lipo_lambda_loss(
        x, labels, valid, target_margin=gamma, normalise=normalise), s)
    ref, g_ref = _value_and_grad(lambda x: _naive_lipo(x, labels, valid, gamma, normalise), s)
    torch.testing.assert_close(ours, ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(g_ours, g_ref, atol=ATOL, rtol=0)
    assert (g_ours[~valid] == 0).all()  # padding gets no gradient


def test_lipo_gives_ties_no_term_and_a_one_tier_group_zero() -> None:
    s = torch.tensor([[0.3, -0.2, 1.0]], dtype=torch.float64, requires_grad=True)
    valid = torch.ones(1, 3, dtype=torch.bool)
    loss = lipo_lambda_loss(s, torch.tensor([[1.0, 1.0, 1.0]]), valid)
    assert loss.item() == 0.0 and not torch.isnan(loss).any()
    # candidates 0 and 1 tied: only the pairs with candidate 2 (label 0) have a term
    loss = lipo_lambda_loss(s, torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64), valid)
    (grad,) = torch.autograd.grad(loss.sum(), s)
    assert grad[0, 0] < 0 and grad[0, 1] < 0 and grad[0, 2] > 0


def test_lipo_at_k2_is_dpo_up_to_a_constant() -> None:
    """Normalised (ours): exactly DPO. Unnormalised (the paper): DPO × (2^1 − 1)(1 − 1/log2 3),
    the one pair's Δ with ψ = (1, 0) and ranks (1, 2) or (2, 1)."""
    s = torch.randn(8, 2, dtype=torch.float64)
    order = torch.tensor([[0, 1]] * 4 + [[1, 0]] * 4)
    labels = (order[:, :1] == torch.arange(2)).to(torch.float64)  # order's best has ψ = 1
    valid = torch.ones(8, 2, dtype=torch.bool)
    dpo = dpo_loss(s, order, valid)
    constant = 1 - 1 / math.log2(3)  # ≈ 0.3691
    torch.testing.assert_close(lipo_lambda_loss(s, labels, valid), dpo, atol=ATOL, rtol=0)
    torch.testing.assert_close(lipo_lambda_loss(s, labels, valid, normalise=False), constant * dpo,
                               atol=ATOL, rtol=0)


# -- InfoNCA / NCA ------------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [0.3, 1.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_soft_targets_infonca_and_nca_match_the_paper_loops(seed: int, alpha: float) -> None:
    s, _, r, valid = _random_batch(seed)
    q = soft_targets(r, valid, alpha)
    torch.testing.assert_close(q, torch.tensor(_naive_q(r, valid, alpha), dtype=q.dtype), atol=ATOL,
                               rtol=0)
    q_list = q.tolist()
    for ours_fn, naive_fn in ((infonca_loss, _naive_infonca), (nca_loss, _naive_nca)):
        ours, g_ours = _value_and_grad(lambda x, f=ours_fn: f(x, q, valid), s)
        ref, g_ref = _value_and_grad(lambda x, f=naive_fn: f(x, q_list, valid), s)
        torch.testing.assert_close(ours, ref, atol=ATOL, rtol=0, msg=ours_fn.__name__)
        torch.testing.assert_close(g_ours, g_ref, atol=ATOL, rtol=0, msg=ours_fn.__name__)
        assert (g_ours[~valid] == 0).all()


def test_infonca_is_shift_invariant_and_dpo_at_k2() -> None:
    s = torch.randn(5, 2, dtype=torch.float64)
    onehot = torch.tensor([[1.0, 0.0]] * 5, dtype=torch.float64)
    valid = torch.ones(5, 2, dtype=torch.bool)
    dpo = dpo_loss(s, torch.tensor([[0, 1]] * 5), valid)
    torch.testing.assert_close(infonca_loss(s, onehot, valid), dpo, atol=ATOL, rtol=0)
    torch.testing.assert_close(infonca_loss(s - 3.0, onehot, valid), dpo, atol=ATOL, rtol=0)


def _trl_nca_pair():
    """TRL's own ``nca_pair`` lines, taken from the installed DPOTrainer._compute_loss.

    In trl 1.16 the loss sits inline in the method that also runs the policy and reference
    forwards, so it is not callable on tensors; its branch is cut out of the method's source
    and run as it stands, on the variables it reads (``self.beta``, ``chosen_logratios``,
    ``rejected_logratios``)."""
    from trl.trainer.dpo_trainer import DPOTrainer

    lines = inspect.getsource(DPOTrainer._compute_loss).splitlines()
    start = next(n for n, line in enumerate(lines) if 'loss_type == "nca_pair"' in line)
    indent = len(lines[start]) - len(lines[start].lstrip())
    body = []
    for line in lines[start + 1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        body.append(line)
    code = compile(textwrap.dedent("\n".join(body)), "trl_nca_pair", "exec")

    def run(beta: float, chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
        scope = {"self": SimpleNamespace(beta=beta), "F": F, "torch": torch,
                 "chosen_logratios": chosen, "rejected_logratios": rejected}
        exec(code, scope)  # noqa: S102 - TRL's installed source, not user input
        return scope["per_sequence_loss"]

    return run


def test_nca_at_k2_with_one_hot_targets_is_trl_nca_pair() -> None:
    pytest.importorskip("trl")
    trl_nca = _trl_nca_pair()
    beta = 0.3
    g = torch.Generator().manual_seed(0)
    log_ratios = 4 * torch.randn(16, 2, generator=g, dtype=torch.float64)  # chosen, rejected
    s = beta * log_ratios
    q = torch.tensor([[1.0, 0.0]] * 16, dtype=torch.float64)
    ours = nca_loss(s, q, torch.ones(16, 2, dtype=torch.bool))
    theirs = trl_nca(beta, log_ratios[:, 0], log_ratios[:, 1])
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0)
    # and through the strengths: a tiny temperature makes softmax(θ/α) one-hot on the best
    q_soft = soft_targets(torch.tensor([[1.0, -1.0]] * 16, dtype=torch.float64),
                          torch.ones(16, 2, dtype=torch.bool), temperature=1e-3)
    torch.testing.assert_close(nca_loss(s, q_soft, torch.ones(16, 2, dtype=torch.bool)), theirs,
                               atol=ATOL, rtol=0)


# -- the targets in the batch, the dispatch, the settings ---------------------------------
def test_labels_and_strengths_reach_the_batch(tiny_lm_dir: Path) -> None:
    groups = synthetic_groups(3, 0)
    tok = load_tokenizer(str(tiny_lm_dir))
    tokenized, _ = tokenize_groups(groups, tok, PLAIN)
    assert tokenized[0].labels == [1.0, 1.0, 0.0, 0.0]  # two tiers: sunny above rainy
    assert tokenized[0].strengths == [1.0, 1.0, -1.0, -1.0]
    short = trim_for_loss(tokenized[1], "dpo")
    assert short.labels == [1.0, 0.0] and short.strengths == [1.0, -1.0]
    batch = collate_groups([tokenized[0], short], tok.pad_token_id)
    assert batch.labels.tolist() == [[1, 1, 0, 0], [1, 0, 0, 0]]
    assert batch.strengths.tolist() == [[1, 1, -1, -1], [1, -1, 0, 0]]
    both = concat_batches(batch, collate_groups(tokenized[2:], tok.pad_token_id), tok.pad_token_id)
    assert both.labels.shape == (3, 4) and both.strengths[2].tolist() == [1, 1, -1, -1]
    # a tier with no kept candidate does not count
    g = groups[0]
    ids = [c.candidate_id for c in g.candidates]
    assert list_targets(g, [ids[2], ids[0]]) == ([0.0, 1.0], [-1.0, 1.0])


def test_a_batch_without_labels_is_refused() -> None:
    batch = GroupBatch(prompt_ids=torch.zeros(1, 1), prompt_mask=torch.ones(1, 1),
                       cand_ids=torch.zeros(1, 2, 1), cand_mask=torch.ones(1, 2, 1),
                       valid=torch.ones(1, 2, dtype=torch.bool), p_ij=torch.full((1, 2, 2), 0.5),
                       w_ij=torch.zeros(1, 2, 2), order=torch.tensor([[0, 1]]), ref_logps=None,
                       behavior_logps=torch.zeros(1, 2), num_tokens=torch.ones(1, 2),
                       group_ids=["g"])
    for loss, field in (("lipo", "labels"), ("nca", "strengths"), ("infonca", "strengths")):
        with pytest.raises(ConfigError, match=f"needs GroupBatch.{field}"):
            score_loss(loss, torch.zeros(1, 2), batch)


def _batch_with_targets(seed: int) -> tuple[GroupBatch, torch.Tensor]:
    s, labels, r, valid = _random_batch(seed)
    b, k = valid.shape
    order = torch.argsort(-labels.masked_fill(~valid, -1.0), dim=1, stable=True)
    batch = GroupBatch(prompt_ids=torch.zeros(b, 1), prompt_mask=torch.ones(b, 1),
                       cand_ids=torch.zeros(b, k, 1), cand_mask=torch.ones(b, k, 1), valid=valid,
                       p_ij=torch.full((b, k, k), 0.5, dtype=torch.float64),
                       w_ij=torch.zeros(b, k, k, dtype=torch.float64), order=order,
                       ref_logps=None, behavior_logps=torch.full((b, k), math.nan),
                       num_tokens=torch.randint(1, 20, (b, k)) * valid, group_ids=["g"] * b,
                       labels=labels, strengths=r)
    return batch, s.detach()


@pytest.mark.parametrize("loss", ["lipo", "nca", "infonca"])
def test_reward_model_loss_uses_the_same_dispatch(loss: str) -> None:
    batch, s = _batch_with_targets(3)
    config = RewardModelConfig(loss=loss, target_temperature=0.5)
    expected = {"lipo": lambda: lipo_lambda_loss(s, batch.labels, batch.valid),
                "nca": lambda: nca_loss(s, soft_targets(batch.strengths, batch.valid, 0.5), batch.valid),
                "infonca": lambda: infonca_loss(s, soft_targets(batch.strengths, batch.valid, 0.5),
                                                batch.valid)}[loss]()
    torch.testing.assert_close(reward_loss(s, batch, config), expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("settings,message", [
    ({"loss": "nca", "reference_free": True}, "reads absolute rewards"),
    ({"loss": "sft", "reference_free": True}, "has no reference in its loss"),
    ({"reference_free": True, "ref_model": "x"}, "drop ref_model"),
    ({"loss": "plackett_luce", "target_margin": 0.5}, "target_margin applies"),
    ({"loss": "infonca", "target_margin": 0.5}, "target_margin applies"),
    ({"loss": "gspo", "target_temperature": 0.5}, "target_temperature applies"),
    ({"loss": "lipo", "label_smoothing": 0.1}, "label_smoothing applies"),
])
def test_settings_that_make_no_sense_are_refused(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainConfig(**settings)


# -- reference-free (SimPO) ---------------------------------------------------------------
@pytest.mark.parametrize("loss,pair_targets", [("gspo", "soft"), ("gspo", "hard"), ("dpo", "soft"),
                                               ("lipo", "soft"), ("plackett_luce", "soft"),
                                               ("infonca", "soft")])
def test_reference_free_step_reads_no_reference(loss: str, pair_targets: str) -> None:
    """group_loss with reference_free on a batch without ref_logps: the loss of s = β·log π / n,
    with γ in the pairwise losses (SimPO at K = 2 for dpo: −log σ(s_w − s_l − γ))."""
    batch, _ = _batch_with_targets(4)
    g = torch.Generator().manual_seed(4)
    logps = -10 * torch.rand(batch.valid.shape, generator=g, dtype=torch.float64)
    gamma = 0.4 if loss in ("gspo", "dpo", "lipo") else 0.0
    objective = Objective(loss=loss, pair_targets=pair_targets, beta=2.0, length_normalise=True,
                          reference_free=True, target_margin=gamma)
    got, _ = group_loss(logps, batch, objective)
    s = 2.0 * logps / batch.num_tokens.clamp(min=1)
    if loss == "dpo":
        best, worst = batch.order[:, 0], batch.order.gather(1, (batch.valid.sum(1) - 1)[:, None])[:, 0]
        want = torch.stack([-F.logsigmoid(s[b, best[b]] - s[b, worst[b]] - gamma)
                            for b in range(s.shape[0])])
    else:
        want = score_loss(loss, s, batch, pair_targets=pair_targets, target_margin=gamma)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def _naive_logp(model, prompt_ids: list[int], resp: list[int]) -> float:
    ids = torch.tensor([prompt_ids + resp])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1].float()
    return float(torch.log_softmax(logits, -1).gather(1, torch.tensor(resp)[:, None]).sum())


def test_reference_free_training_runs_no_reference_pass_and_its_loss_is_simpo(
        tiny_lm_dir: Path, tmp_path: Path) -> None:
    """One step of gspo with reference_free on 4 groups in one batch: no reference cache entry
    is written, the stats have no reference, and the step's logged loss is SimPO's
    −log σ(β/|y_w|·log π(y_w) − β/|y_l|·log π(y_l) − γ), averaged over each group's four
    (sunny, rainy) pairs (weight 1, p = 1) and over the groups, from naive forwards."""
    beta, gamma = 2.0, 0.5
    groups = synthetic_groups(4, 2)
    config = TrainConfig(model=str(tiny_lm_dir), reference_free=True, length_normalise=True,
                         beta=beta, target_margin=gamma, batch_size=4, max_steps=1,
                         logging_steps=1, data=PLAIN)
    result = train(config, groups, tmp_path / "out")
    assert result.stats.reference is None
    assert not (tmp_path / "out" / "reference").exists()  # every reference pass writes here
    assert "kl" not in result.stats.eval  # no reference: no KL estimate
    tok, model = load_tokenizer(str(tiny_lm_dir)), load_causal_lm(str(tiny_lm_dir))
    losses = []
    for g in groups[:4]:
        prompt = tok(g.prompt.text)["input_ids"]
        s = {}
        for c in g.candidates:
            resp = tok(c.text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            s[c.candidate_id] = beta * _naive_logp(model, prompt, resp) / len(resp)
        terms = [-math.log(1 / (1 + math.exp(-(s[p.winner] - s[p.loser] - gamma))))
                 for p in g.pairs]
        losses.append(sum(terms) / len(terms))
    assert result.stats.train["loss"] == pytest.approx(sum(losses) / 4, abs=MODEL_ATOL)


# -- end to end ---------------------------------------------------------------------------
@pytest.mark.parametrize("loss", ["lipo", "nca"])
def test_cli_trains_with_the_listwise_losses(tiny_lm_dir: Path, tmp_path: Path, loss: str) -> None:
    data = tmp_path / "groups"
    to_dataset(synthetic_groups(8, 2), ValidatedGroup).save_to_disk(str(data))
    res = CliRunner().invoke(app, [
        "train", str(data), "--out", str(tmp_path / loss), "--loss", loss, "--model",
        str(tiny_lm_dir), "--no-chat-template", "--lr", "5e-3", "--batch-size", "4",
        "--max-steps", "3", "--logging-steps", "1", "--beta", "0.5"])
    assert res.exit_code == 0, res.output
    stats = TrainStats.model_validate_json((tmp_path / loss / "metrics.json").read_text())
    assert stats.steps == 3 and math.isfinite(stats.train["loss"])
    assert stats.train["margin"] > 0  # three steps already put sunny above rainy


def test_a_checkpoint_from_before_these_settings_resumes_at_their_defaults(tmp_path: Path) -> None:
    """A checkpoint written before reference_free / target_margin / target_temperature existed
    ran at their defaults: resuming it with the defaults is allowed, with another value not."""
    old = checkpoint._resume_key(TrainConfig())
    for name in ("reference_free", "target_margin", "target_temperature"):
        del old[name]
    (tmp_path / checkpoint.STATE_FILE).write_text(json.dumps({"config": old}))
    checkpoint.check_compatible(tmp_path, TrainConfig())
    with pytest.raises(ConfigError, match="target_margin: 0.0 -> 0.5"):
        checkpoint.check_compatible(tmp_path, TrainConfig(target_margin=0.5))


@pytest.mark.parametrize("loss", ["lipo", "infonca"])
def test_reward_model_trains_with_the_listwise_losses(tiny_lm_dir: Path, tmp_path: Path,
                                                      loss: str) -> None:
    """train-rm's groups carry the tier labels and strengths (reward_model/encode.py's encode_group) too."""
    config = RewardModelConfig(model=str(tiny_lm_dir), loss=loss, max_steps=3, batch_size=4,
                               logging_steps=1, lr=1e-3)
    result = train_reward_model(config, synthetic_groups(8, 4), tmp_path / loss)
    assert result.stats.steps == 3 and math.isfinite(result.stats.train.loss)
