"""The GSPO losses against independent references: TRL's DPO loss on the same model and batch,
naive per-pair / per-position loops, worked examples and autograd.gradcheck."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from grouppref.errors import ConfigError
from grouppref.train.objective.losses import (
    dpo_loss,
    gspo_loss,
    implicit_rewards,
    importance_weights,
    pair_accuracy,
    plackett_luce_loss,
    sft_loss,
)
from grouppref.train.tensors.batch import TokenizedGroup, collate_groups
from grouppref.train.tensors.logps import group_logps

# TRL's float32 losses vs ours in float32: a few ops on values ~1, ~10 eps32 = 1.2e-6; 1e-5 with room
TRL_ATOL = 1e-5
# float64 vectorised loss vs a naive loop over <= K^2 pairs: ~1e-15; 1e-6 also covers float32 scalars
# (~1 * eps32 * ops)
ATOL = 1e-6


def _random_group(k: int, seed: int, dtype: torch.dtype = torch.float64):
    """s (1, K), a soft consistent p_ij, symmetric w_ij with some zero pairs, all valid."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(1, k, generator=g, dtype=dtype)
    strength = torch.randn(k, generator=g, dtype=dtype)
    p = torch.sigmoid(strength[:, None] - strength[None, :])[None]  # (1, K, K), p_ii = 0.5
    w = torch.rand(k, k, generator=g, dtype=dtype)
    w = ((w + w.T) / 2 * (1 - torch.eye(k, dtype=dtype)))[None]
    w[0, 0, 1] = w[0, 1, 0] = 0.0  # a pair without preference
    return s, p, w, torch.ones(1, k, dtype=torch.bool)


def _naive_gspo(s, p, w, eps=0.0, rho=None):
    """Double loop over ordered pairs i != j: gspo_loss's formula (train/objective/losses.py), term
    by term."""
    num = den = 0.0
    k = s.shape[1]
    for i in range(k):
        for j in range(k):
            if i == j:
                continue
            pt = p[0, i, j] * (1 - 2 * eps) + eps
            term = -pt * math.log(torch.sigmoid(s[0, i] - s[0, j])) - (1 - pt) * math.log(
                torch.sigmoid(s[0, j] - s[0, i]))
            r = 1.0 if rho is None else float(rho[0, i] * rho[0, j])
            num += float(w[0, i, j]) * r * float(term)
            den += float(w[0, i, j])
    return num / den


def _naive_pl(s, order, n):
    """−Σ_k log( exp(s_τk) / Σ_{m≥k} exp(s_τm) ), one position at a time."""
    total = 0.0
    for k in range(n):
        rest = [float(s[order[m]]) for m in range(k, n)]
        total -= float(s[order[k]]) - math.log(sum(math.exp(x) for x in rest))
    return total


# -- gspo ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_gspo_matches_naive_pair_loop(eps):
    s, p, w, valid = _random_group(5, seed=1)
    rho = torch.rand(1, 5, dtype=torch.float64) + 0.5
    got = gspo_loss(s, p, w, valid, label_smoothing=eps, rho=rho)
    torch.testing.assert_close(got.item(), _naive_gspo(s, p, w, eps, rho), atol=ATOL, rtol=0)


def test_gspo_worked_example_and_padding():
    # K = 2, p = 1, w = 1: −log σ(1 − 0) = log(1 + e^−1) = 0.31326.
    s = torch.tensor([[1.0, 0.0, 7.0]])
    p = torch.tensor([[[0.5, 1.0, 0.5], [0.0, 0.5, 0.5], [0.5, 0.5, 0.5]]])
    w = torch.tensor([[[0.0, 1.0, 1.0], [1.0, 0.0, 1.0], [1.0, 1.0, 0.0]]])
    valid = torch.tensor([[True, True, False]])  # the padded third slot must not count
    # float32 result of a few ops vs float64 math: assert_close's float32 default (rtol 1.3e-6 ~ 11
    # eps32)
    torch.testing.assert_close(gspo_loss(s, p, w, valid), torch.tensor([math.log1p(math.exp(-1))]))


def test_gspo_soft_target_minimum_at_logit_of_p():
    # One pair with p = 0.8: the loss is minimal where σ(s_1 − s_2) = 0.8, i.e. Δ = logit(0.8).
    p = torch.tensor([[[0.5, 0.8], [0.2, 0.5]]])
    w = torch.tensor([[[0.0, 1.0], [1.0, 0.0]]])
    delta = torch.tensor(math.log(0.8 / 0.2), requires_grad=True)
    s = torch.stack([delta, torch.tensor(0.0)])[None]
    gspo_loss(s, p, w, torch.ones(1, 2, dtype=torch.bool)).sum().backward()
    assert abs(delta.grad.item()) < 1e-6


def test_gspo_zero_weight_group_is_zero_not_nan():
    s, p, _, valid = _random_group(3, seed=2)
    assert gspo_loss(s, p, torch.zeros(1, 3, 3, dtype=s.dtype), valid).item() == 0.0


def test_smoothing_arguments_checked():
    s, p, w, valid = _random_group(3, seed=3)
    with pytest.raises(ConfigError, match="label_smoothing"):
        gspo_loss(s, p, w, valid, label_smoothing=0.5)
    with pytest.raises(ConfigError, match="robust"):
        dpo_loss(s, torch.tensor([[0, 1, 2]]), valid, robust=True)


# -- plackett-luce -------------------------------------------------------------------------------
def test_plackett_luce_matches_naive_per_position():
    g = torch.Generator().manual_seed(4)
    s = torch.randn(3, 5, generator=g, dtype=torch.float64)
    valid = torch.tensor([[True] * 5, [True] * 3 + [False] * 2, [True] * 2 + [False] * 3])
    order = torch.tensor([[3, 1, 4, 0, 2], [2, 0, 1, 3, 4], [1, 0, 2, 3, 4]])
    got = plackett_luce_loss(s, order, valid)
    want = [_naive_pl(s[b], order[b].tolist(), int(valid[b].sum())) for b in range(3)]
    # float64 Plackett-Luce over <= 5 items vs a naive loop: ~10 log-sum-exps of ~1: ~1e-15, 1e-10 with
    # room
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), atol=1e-10, rtol=0)


def test_plackett_luce_gradcheck_float64():
    g = torch.Generator().manual_seed(5)
    s = torch.randn(2, 4, generator=g, dtype=torch.float64, requires_grad=True)
    order = torch.tensor([[2, 0, 3, 1], [1, 2, 0, 3]])
    valid = torch.tensor([[True] * 4, [True, True, True, False]])
    assert torch.autograd.gradcheck(lambda x: plackett_luce_loss(x, order, valid), (s,))


def test_gspo_and_dpo_gradcheck_float64():
    s, p, w, valid = _random_group(4, seed=6)
    s.requires_grad_(True)
    order = torch.tensor([[2, 0, 3, 1]])
    assert torch.autograd.gradcheck(lambda x: gspo_loss(x, p, w, valid, 0.1), (s,))
    assert torch.autograd.gradcheck(lambda x: dpo_loss(x, order, valid, 0.1, robust=True), (s,))


def test_k2_losses_agree():
    # With two candidates, PL, DPO and GSPO (p = 1, w = 1) are all −log σ(s_best − s_worst).
    s = torch.tensor([[0.3, 1.2], [-0.5, 0.4]])
    order = torch.tensor([[1, 0], [0, 1]])
    valid = torch.ones(2, 2, dtype=torch.bool)
    p = torch.tensor([[[0.5, 0.0], [1.0, 0.5]], [[0.5, 1.0], [0.0, 0.5]]])
    w = torch.tensor([[[0.0, 1.0], [1.0, 0.0]]]).expand(2, 2, 2)
    want = -F.logsigmoid(torch.tensor([0.9, -0.9]))
    # float32, a few ops on values ~1: assert_close's float32 defaults (~11 eps32 relative)
    torch.testing.assert_close(plackett_luce_loss(s, order, valid), want)
    torch.testing.assert_close(dpo_loss(s, order, valid), want)
    torch.testing.assert_close(gspo_loss(s, p, w, valid), want)


def test_dpo_uses_best_and_last_valid():
    s = torch.tensor([[0.0, 2.0, 1.0, 9.0]])
    order = torch.tensor([[1, 2, 0, 3]])  # slot 3 is padding: the worst is candidate 0
    valid = torch.tensor([[True, True, True, False]])
    eps = 0.2  # cDPO: −(1 − ε) log σ(2) − ε log σ(−2)
    want = -(1 - eps) * math.log(torch.sigmoid(torch.tensor(2.0))) - eps * math.log(
        torch.sigmoid(torch.tensor(-2.0)))
    torch.testing.assert_close(dpo_loss(s, order, valid, eps).item(), want, atol=ATOL, rtol=0)


# -- rewards, weights, sft, accuracy -------------------------------------------------------------
def test_implicit_rewards_and_length_normalisation():
    pol, ref = torch.tensor([[-10.0, -4.0]]), torch.tensor([[-12.0, -3.0]])
    n = torch.tensor([[4, 2]])
    # exact in float32 (small binary fractions), assert_close's defaults as an upper bound
    torch.testing.assert_close(implicit_rewards(pol, ref, 0.5), torch.tensor([[1.0, -0.5]]))
    # β (π − ref)/n = 0.5 * [2/4, −1/2]
    torch.testing.assert_close(implicit_rewards(pol, ref, 0.5, n, length_normalise=True),
                               torch.tensor([[0.25, -0.25]]))
    with pytest.raises(ConfigError, match="reference log-probs are missing"):
        implicit_rewards(pol, None, 0.5)
    with pytest.raises(ConfigError, match="num_tokens"):
        implicit_rewards(pol, ref, 0.5, length_normalise=True)


def test_importance_weights_clip_unknown_and_detached():
    pol = torch.tensor([[-10.0, -10.0, -10.0, -10.0]], requires_grad=True)
    beh = torch.tensor([[-10.0 - 0.2 * 5, -10.0 + 5.0, -10.0 - 5.0, float("nan")]])
    n = torch.tensor([[5, 5, 5, 5]])
    rho = importance_weights(pol, beh, n, clip=(0.5, 2.0))
    # exp(0.2) = 1.2214 inside the clip; exp(−1) → 0.5 (low); exp(1) → 2.0 (high); NaN → 1.
    # float32 exp vs float64 exp rounded to float32: <= 1 ulp (assert_close float32 rtol = 11 ulp)
    torch.testing.assert_close(rho, torch.tensor([[math.exp(0.2), 0.5, 2.0, 1.0]]))
    assert not rho.requires_grad
    with pytest.raises(ConfigError, match="clip"):
        importance_weights(pol, beh, n, clip=(1.5, 2.0))


def test_sft_loss_is_per_token_nll_of_best():
    pol = torch.tensor([[-6.0, -3.0, -9.0]])
    n = torch.tensor([[3, 2, 3]])
    order = torch.tensor([[2, 0, 1]])
    # exact in float32
    torch.testing.assert_close(sft_loss(pol, n, order), torch.tensor([3.0]))  # 9 / 3


def test_pair_accuracy_weighted_with_ties():
    s = torch.tensor([[3.0, 2.0, 2.0]])
    p = torch.tensor([[[0.5, 0.9, 0.2], [0.1, 0.5, 0.7], [0.8, 0.3, 0.5]]])
    w = torch.tensor([[[0.0, 1.0, 2.0], [1.0, 0.0, 1.0], [2.0, 1.0, 0.0]]])
    valid = torch.ones(1, 3, dtype=torch.bool)
    # (0,1) right, weight 1; (0,2) wrong (2 ≻ 0 wanted), weight 2; (1,2) tie → ½, weight 1.
    # exact in float32 (a binary fraction)
    torch.testing.assert_close(pair_accuracy(s, p, w, valid), torch.tensor([1.5 / 4]))
    assert torch.isnan(pair_accuracy(s, torch.full_like(p, 0.5), w, valid)).all()


# -- TRL -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trl_setup(tiny_lm_dir, tmp_path_factory):
    """TRL's DPOTrainer on the tiny model, with a perturbed copy as the reference model."""
    from datasets import Dataset
    from transformers import AutoTokenizer, LlamaForCausalLM
    from trl import DPOConfig, DPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(tiny_lm_dir)
    policy = LlamaForCausalLM.from_pretrained(tiny_lm_dir, dtype=torch.float32)
    ref = copy.deepcopy(policy)
    torch.manual_seed(1)
    with torch.no_grad():
        for param in ref.parameters():
            param.add_(0.05 * torch.randn_like(param))
    data = Dataset.from_dict({
        "prompt": ["Name a colour.", "What is two plus two? Answer in one word please.",
                   "Hi"],
        "chosen": [" Blue.", " Four", " Hello there, how can I help?"],
        "rejected": [" A cat sat on the mat.", " Five, I think", " Go away"],
    })
    args = DPOConfig(output_dir=str(tmp_path_factory.mktemp("trl")), beta=0.1,
                     loss_type=["sigmoid"], precompute_ref_log_probs=False, bf16=False,
                     fp16=False, gradient_checkpointing=False, report_to=[], use_cpu=True,
                     per_device_train_batch_size=3)
    trainer = DPOTrainer(model=policy, ref_model=ref, args=args, train_dataset=data,
                         processing_class=tokenizer)
    rows = [trainer.train_dataset[i] for i in range(len(data))]
    return trainer, ref, rows, tokenizer.pad_token_id


def _trl_loss(trainer, rows, loss_type: str, eps: float) -> float:
    trainer.loss_types, trainer.label_smoothing = [loss_type], eps
    inputs = trainer.data_collator([{k: r[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")}
                                    for r in rows])
    with torch.no_grad():
        return float(trainer._compute_loss(trainer.model, inputs, False))


def _our_rewards(trainer, ref, rows, pad_id):
    """s for K = 2 groups [chosen, rejected] built from TRL's own token ids."""
    groups = [TokenizedGroup(group_id=str(i), prompt_ids=r["prompt_ids"],
                             cand_ids=[r["chosen_ids"], r["rejected_ids"]],
                             p_ij=[[0.5, 1.0], [0.0, 0.5]], w_ij=[[0.0, 1.0], [1.0, 0.0]],
                             order=[0, 1], ref_logps=None, behavior_logps=[None, None], split=None)
              for i, r in enumerate(rows)]
    batch = collate_groups(groups, pad_id)
    with torch.no_grad():
        policy_logps = group_logps(trainer.model, batch)
        ref_logps = group_logps(ref, batch)
    return implicit_rewards(policy_logps, ref_logps, trainer.beta), batch


@pytest.mark.parametrize(("loss_type", "eps"), [("sigmoid", 0.0), ("robust", 0.1)])
def test_k2_hard_labels_equal_trl_dpo_loss(trl_setup, loss_type, eps):
    trainer, ref, rows, pad_id = trl_setup
    want = _trl_loss(trainer, rows, loss_type, eps)
    s, batch = _our_rewards(trainer, ref, rows, pad_id)
    robust = loss_type == "robust"
    gspo = gspo_loss(s, batch.p_ij, batch.w_ij, batch.valid, eps, robust=robust).mean().item()
    dpo = dpo_loss(s, batch.order, batch.valid, eps, robust=robust).mean().item()
    assert want > 0.05 and abs(want - math.log(2)) > 1e-3  # rewards are not all zero
    assert abs(gspo - want) < TRL_ATOL, (gspo, want)
    assert abs(dpo - want) < TRL_ATOL, (dpo, want)
