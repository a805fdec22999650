"""Shared pieces of the evidence experiments: the synthetic testbed with a known true reward.

Testbed (one per seed):

* a tiny causal LM built from a config (Llama architecture, hidden 64, 2 layers) over a
  synthetic vocabulary of ``V`` tokens; its random initialisation is the reference policy;
* prompts are ``P`` random tokens, responses ``L`` tokens sampled from the reference;
* a hidden true reward, additive over response tokens, with a prompt-independent part
  ``u[y_t]`` and a prompt-dependent part ``M[x_s, y_t]`` of equal variance:
  ``r(x, y) = (1/L) Σ_t [u[y_t] + (1/√P) Σ_s M[x_s, y_t]]``, so no prompt-independent
  scorer can order candidates perfectly (its accuracy ceiling is reported);
* a simulated annotator panel from :mod:`grouppref.pipeline.simulate.stage` ranks each group
  (Mallows around the true order, flip rate = expected share of votes against the truth);
* aggregation with the package's own tensors (:mod:`grouppref.stats.reliability`,
  :func:`grouppref.pipeline.aggregate.core.fit_groups`): reliability weights, BT ``p_ij``,
  ``w_ij``, consensus order and the noise estimate the aggregate report would show;
* training with the package's own step (:func:`grouppref.train.policy.step.run_steps`: the losses
  of :mod:`grouppref.train.objective.losses` on log-probs from
  :func:`grouppref.train.tensors.logps.group_logps`),
  fed tensors directly (the synthetic vocabulary has no tokenizer for the record path).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from grouppref.api import (
    AggregateConfig,
    AnnotatorSpec,
    GroupBatch,
    Objective,
    consensus_targets,
    estimate_reliability,
    fit_groups,
    group_logps,
    noise_rate,
    run_steps,
    simulate_order,
)

Tensor = torch.Tensor
METHODS = ("dpo_one", "dpo_consensus", "gspo_hard", "gspo_soft", "plackett_luce")
LISTWISE = ("lipo", "nca", "infonca")  # the losses of grouppref/train/objective/listwise.py


@dataclass
class Testbed:
    """Sizes of the synthetic task and of training."""

    vocab: int = 32  # synthetic tokens
    prompt_len: int = 4  # P
    resp_len: int = 6  # L
    hidden: int = 64
    layers: int = 2
    beta: float = 0.1
    lr: float = 1e-3
    batch_groups: int = 16
    eval_prompts: int = 64
    eval_k: int = 4  # candidates per held-out group (pair accuracy)
    eval_samples: int = 8  # policy samples per held-out prompt (true-reward gain)
    heads: int = 4
    inter_rank: int = 0  # rank of the prompt x response interaction M (0: full rank V)
    indep_weight: float = 1.0  # weight a of the prompt-independent part u
    inter_weight: float = 1.0  # weight b of the prompt-dependent part M


@dataclass
class Task:
    """One seed's hidden reward, reference model and data."""

    bed: Testbed
    u: Tensor  # (V,) prompt-independent token reward
    m: Tensor  # (V, V) prompt x response token interaction
    ref: Any  # frozen reference model (the policy's initialisation)
    r_std: float  # std of the true reward of reference samples (the reward unit)
    eval_prompts: Tensor  # (E, P)
    eval_cands: Tensor  # (E, K_eval, L)
    eval_ref_logps: Tensor  # (E, K_eval)
    ref_sample_reward: float  # mean true reward of reference samples on the held-out prompts
    gen: torch.Generator


def tiny_lm(bed: Testbed, seed: int) -> Any:
    """A randomly initialised Llama-architecture causal LM over the synthetic vocabulary."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=bed.vocab, hidden_size=bed.hidden, intermediate_size=2 * bed.hidden,
                      num_hidden_layers=bed.layers, num_attention_heads=bed.heads,
                      num_key_value_heads=bed.heads,
                      max_position_embeddings=64, bos_token_id=0, eos_token_id=1, pad_token_id=0,
                      tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    model.eval()  # no dropout in Llama; eval() just silences the train/eval distinction
    return model


def true_reward(task: Task, prompts: Tensor, resp: Tensor) -> Tensor:
    """``r(x, y)`` for prompts (..., P) and responses (..., L) -> (...)."""
    bed = task.bed
    inter = task.m[prompts[..., :, None], resp[..., None, :]].sum(-2) / math.sqrt(bed.prompt_len)
    return (bed.indep_weight * task.u[resp] + bed.inter_weight * inter).mean(-1)


def interaction(bed: Testbed, gen: torch.Generator) -> Tensor:
    """The (V, V) interaction ``M``: i.i.d. N(0, 1) entries (``inter_rank`` 0), or a rank-r
    product ``A Bᵀ / √r`` of N(0, 1) factors, whose entries also have variance 1."""
    if bed.inter_rank <= 0:
        return torch.randn(bed.vocab, bed.vocab, generator=gen)
    a = torch.randn(bed.vocab, bed.inter_rank, generator=gen)
    b = torch.randn(bed.vocab, bed.inter_rank, generator=gen)
    return a @ b.T / math.sqrt(bed.inter_rank)


@torch.no_grad()
def sample(model: Any, prompts: Tensor, n: int, length: int, gen: torch.Generator) -> Tensor:
    """``n`` responses of ``length`` tokens per prompt at temperature 1: (B, P) -> (B, n, L)."""
    b, p = prompts.shape
    seq = prompts.repeat_interleave(n, 0)  # (B*n, P)
    for _ in range(length):
        logits = model(input_ids=seq, use_cache=False, logits_to_keep=1).logits[:, -1].float()
        nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)
        seq = torch.cat([seq, nxt], 1)
    return seq[:, p:].reshape(b, n, length)


def make_batch(prompts: Tensor, cands: Tensor, ref_logps: Tensor | None = None,
               p_ij: Tensor | None = None, w_ij: Tensor | None = None,
               order: Tensor | None = None, labels: Tensor | None = None,
               strengths: Tensor | None = None) -> GroupBatch:
    """A :class:`GroupBatch` of fixed-length prompts (B, P) and candidates (B, K, L);
    ``labels`` (tiers below, LiPO) and ``strengths`` (NCA / InfoNCA targets), (B, K), are
    what the listwise losses read (grouppref/train/objective/listwise.py)."""
    b, k, length = cands.shape
    return GroupBatch(
        prompt_ids=prompts, prompt_mask=torch.ones_like(prompts), cand_ids=cands,
        cand_mask=torch.ones_like(cands), valid=torch.ones(b, k, dtype=torch.bool),
        p_ij=p_ij if p_ij is not None else torch.full((b, k, k), 0.5),
        w_ij=w_ij if w_ij is not None else torch.zeros(b, k, k),
        order=order if order is not None else torch.arange(k).expand(b, k).clone(),
        ref_logps=ref_logps, behavior_logps=torch.full((b, k), float("nan")),
        num_tokens=torch.full((b, k), length), group_ids=[str(i) for i in range(b)],
        labels=labels, strengths=strengths)


@torch.no_grad()
def batched_logps(model: Any, prompts: Tensor, cands: Tensor, chunk: int = 64) -> Tensor:
    """Summed response log-probs (B, K) in chunks of groups, without gradients."""
    out = [group_logps(model, make_batch(prompts[s:s + chunk], cands[s:s + chunk]))
           for s in range(0, prompts.shape[0], chunk)]
    return torch.cat(out)


def make_task(bed: Testbed, seed: int) -> Task:
    """The hidden reward, reference model and held-out set of one seed."""
    gen = torch.Generator().manual_seed(10_000 + seed)
    u = torch.randn(bed.vocab, generator=gen)
    m = interaction(bed, gen)
    ref = tiny_lm(bed, seed)
    for prm in ref.parameters():
        prm.requires_grad_(False)
    task = Task(bed=bed, u=u, m=m, ref=ref, r_std=1.0, eval_prompts=torch.empty(0),
                eval_cands=torch.empty(0), eval_ref_logps=torch.empty(0), ref_sample_reward=0.0,
                gen=gen)
    ep = torch.randint(2, bed.vocab, (bed.eval_prompts, bed.prompt_len), generator=gen)
    task.eval_prompts = ep
    task.eval_cands = sample(ref, ep, bed.eval_k, bed.resp_len, gen)
    task.eval_ref_logps = batched_logps(ref, ep, task.eval_cands)
    ref_samples = sample(ref, ep, bed.eval_samples, bed.resp_len, gen)
    r = true_reward(task, ep[:, None].expand(-1, bed.eval_samples, -1), ref_samples)
    task.r_std = float(r.std())
    task.ref_sample_reward = float(r.mean())
    return task


def make_groups(task: Task, n_prompts: int, k: int, seed: int) -> dict[str, Tensor]:
    """Training groups: prompts (N, P), K reference samples each (N, K, L), their true
    rewards (N, K) and reference log-probs (N, K)."""
    gen = torch.Generator().manual_seed(20_000 + seed)
    prompts = torch.randint(2, task.bed.vocab, (n_prompts, task.bed.prompt_len), generator=gen)
    cands = sample(task.ref, prompts, k, task.bed.resp_len, gen)
    return {"prompts": prompts, "cands": cands,
            "reward": true_reward(task, prompts[:, None].expand(-1, k, -1), cands),
            "ref_logps": batched_logps(task.ref, prompts, cands)}


def panel(condition: str) -> list[AnnotatorSpec]:
    """The simulated panel of a condition: ``noise=F`` (3 annotators with flip rate F) or
    ``adversarial`` (3 at 0.1 plus one random and one reversed annotator)."""
    if condition == "adversarial":
        return [*panel("noise=0.1"), AnnotatorSpec(id="random", behavior="random"),
                AnnotatorSpec(id="reversed", behavior="reversed")]
    f = float(condition.split("=")[1])
    return [AnnotatorSpec(id=f"sim-{i + 1}", flip_rate=f) for i in range(3)]


def annotate(reward: Tensor, specs: list[AnnotatorSpec], seed: int) -> Tensor:
    """Every annotator's strict order of every group: (N, K) rewards -> (N, A, K) tier index
    of each candidate (0 = best), as the aggregate stage encodes rankings."""
    rng = np.random.default_rng(30_000 + seed)
    n, k = reward.shape
    ranks = np.zeros((n, len(specs), k), dtype=np.int64)
    for g in range(n):
        scores = reward[g].tolist()
        for a, spec in enumerate(specs):
            order = simulate_order(scores, spec, rng)
            ranks[g, a, order] = np.arange(k)
    return torch.from_numpy(ranks)


def aggregate(ranks: Tensor, config: AggregateConfig | None = None) -> dict[str, Any]:
    """The aggregate stage's math on (N, A, K) ranks: reliability -> weighted BT fit.

    Returns p (N, K, K), w (N, K, K), order (N, K) consensus best first (ties by strength),
    hard p/w from the consensus tiers, the noise estimate and per-annotator weights.
    """
    cfg = config or AggregateConfig()
    n, a, k = ranks.shape
    ann = torch.arange(a).expand(n, a).clone()
    rel = estimate_reliability(
        ranks, ann, torch.ones(a, dtype=torch.float64), alpha=cfg.prior_strength,
        iterations=cfg.reliability_iterations, min_groups=cfg.min_groups_for_reliability,
        unreliable_tau=cfg.unreliable_tau, z=cfg.unreliable_z, drop=cfg.drop_unreliable,
        batch_size=cfg.batch_size, max_iter=cfg.max_iter, tie_tol=cfg.tie_tolerance)
    slot_w = rel.annotator_weight[ann]
    fit = fit_groups(ranks, slot_w, torch.ones(n, k, dtype=torch.bool), cfg)
    flips = torch.where(torch.isnan(rel.flip_rate), rel.loo_disagreement, rel.flip_rate)
    cal_p = posterior_targets(ranks, (slot_w > 0) & ~torch.isnan(flips[ann]), flips.nan_to_num(0.5)[ann])
    tiers = fit.tiers
    order = torch.argsort(tiers.double() * 1e6 - fit.theta, dim=1, stable=True)
    hard_p, hard_w = consensus_targets(tiers)  # the aggregate stage's hard targets
    return {"p": fit.p.float(), "w": fit.w.float(), "order": order, "hard_p": hard_p.float(),
            "hard_w": hard_w.float(), "cal_p": cal_p.float(), "noise": noise_rate(rel),
            "weights": rel.annotator_weight.tolist(), "flip_rates": rel.flip_rate.tolist(),
            # the listwise losses' targets: tiers below each candidate, and BT strengths
            "labels": (tiers.max(dim=1, keepdim=True).values - tiers).float(),
            "strengths": fit.theta.float()}


def posterior_targets(ranks: Tensor, used: Tensor, flip: Tensor, floor: float = 0.01) -> Tensor:
    """Calibrated pair targets: ``P(i truly beats j | votes)`` if annotators flip votes
    independently with their estimated rates ``f_a`` (a naive-Bayes / Dawid-Skene posterior
    with a flat prior): ``logit p_ij = Σ_a λ_a v_aij``, ``λ_a = log((1 − f_a) / f_a)`` with
    ``f_a`` clipped to ``[floor, 0.5]``, ``v_aij`` = +1 if ranking ``a`` puts ``i`` above
    ``j``, −1 below, 0 tied or not used.

    Args:
        ranks (Tensor): ``(B, A, K)`` tier indices (0 = best), ``-1`` for padding.
        used (Tensor): ``(B, A)`` bool, rankings that count.
        flip (Tensor): ``(B, A)`` estimated flip rate of each ranking's annotator.
        floor (float): smallest flip rate believed (caps one vote's log-odds at logit(1 − floor)).

    Returns:
        Tensor: ``(B, K, K)`` float64 ``p_ij`` (``p_ii`` = 0.5).
    """
    f = flip.double().clamp(floor, 0.5)
    lam = torch.where(used, torch.log((1 - f) / f), 0.0)  # (B, A)
    r = ranks.double()
    real = (ranks >= 0)[:, :, :, None] & (ranks >= 0)[:, :, None, :]
    v = torch.where(real, torch.sign(r[:, :, None, :] - r[:, :, :, None]), 0.0)  # (B, A, K, K)
    return torch.sigmoid(torch.einsum("ba,baij->bij", lam, v))


def method_data(method: str, groups: dict[str, Tensor], agg: dict[str, Any],
                ranks: Tensor) -> dict[str, Tensor]:
    """What each method trains on: candidates, ref log-probs and targets per group.

    DPO methods keep only the chosen/rejected pair (K = 2), so their steps cost what a DPO
    step costs; the group methods keep all K candidates.
    """
    n = ranks.shape[0]
    rows = torch.arange(n)
    if method in ("dpo_one", "dpo_consensus"):
        order = ranks[:, 0].argsort(1) if method == "dpo_one" else agg["order"]
        idx = torch.stack([order[:, 0], order[:, -1]], 1)  # (N, 2) best, worst
        return {"prompts": groups["prompts"], "cands": groups["cands"][rows[:, None], idx],
                "ref_logps": groups["ref_logps"][rows[:, None], idx],
                "order": torch.arange(2).expand(n, 2).clone()}
    out = {"prompts": groups["prompts"], "cands": groups["cands"], "ref_logps": groups["ref_logps"],
           "order": agg["order"]}
    if method == "gspo_hard":
        out |= {"p": agg["hard_p"], "w": agg["hard_w"]}
    elif method == "gspo_soft":
        out |= {"p": agg["p"], "w": agg["w"]}
    elif method == "gspo_cal":  # calibrated targets, the BT fit's pair weights
        out |= {"p": agg["cal_p"], "w": agg["w"]}
    elif method in LISTWISE:  # graded labels (tiers below) and BT strengths, as data.py builds
        out |= {"labels": agg["labels"], "strengths": agg["strengths"]}
    return out


def objective_of(method: str, beta: float) -> Objective:
    """The package objective of each method (its targets are in the batch: ``method_data``)."""
    loss = {"dpo_one": "dpo", "dpo_consensus": "dpo", "plackett_luce": "plackett_luce",
            **{m: m for m in LISTWISE}}
    return Objective(loss=loss.get(method, "gspo"), beta=beta)  # type: ignore[arg-type]


def batch_of(data: dict[str, Tensor], idx: Tensor) -> GroupBatch:
    """The groups ``idx`` of a method's data as a :class:`GroupBatch` with its targets."""
    return make_batch(data["prompts"][idx], data["cands"][idx], data["ref_logps"][idx],
                      p_ij=data["p"][idx] if "p" in data else None,
                      w_ij=data["w"][idx] if "w" in data else None, order=data["order"][idx],
                      labels=data["labels"][idx] if "labels" in data else None,
                      strengths=data["strengths"][idx] if "strengths" in data else None)


@torch.no_grad()
def evaluate(model: Any, task: Task) -> dict[str, float]:
    """Held-out pair accuracy of the implicit reward against the truth, and the policy's
    true-reward gain over the reference (in units of the reference samples' reward std), and
    the Monte-Carlo KL(policy || reference) per response from the same samples."""
    bed = task.bed
    s = bed.beta * (batched_logps(model, task.eval_prompts, task.eval_cands) - task.eval_ref_logps)
    r = true_reward(task, task.eval_prompts[:, None].expand(-1, bed.eval_k, -1), task.eval_cands)
    ds, dr = s[:, :, None] - s[:, None, :], r[:, :, None] - r[:, None, :]
    upper = torch.ones(bed.eval_k, bed.eval_k, dtype=torch.bool).triu(1) & (dr != 0)
    acc = ((torch.sign(ds) * torch.sign(dr) + 1) / 2)[upper.expand_as(ds)].mean()
    gen = torch.Generator().manual_seed(40_000)  # same draws for every method
    ys = sample(model, task.eval_prompts, bed.eval_samples, bed.resp_len, gen)
    reward = true_reward(task, task.eval_prompts[:, None].expand(-1, bed.eval_samples, -1), ys)
    kl = batched_logps(model, task.eval_prompts, ys) - batched_logps(task.ref, task.eval_prompts, ys)
    return {"pair_accuracy": float(acc),
            "reward_gain": (float(reward.mean()) - task.ref_sample_reward) / task.r_std,
            "kl": float(kl.mean())}


def batch_indices(n: int, batch: int, steps: int, gen: torch.Generator) -> Iterator[Tensor]:
    """``steps`` batches of group indices: shuffled passes over ``n`` groups (a new shuffle
    when a pass runs out), the same order for every method given the same generator."""
    perm, pos = torch.randperm(n, generator=gen), 0
    for _ in range(steps):
        if pos + batch > n:
            perm, pos = torch.randperm(n, generator=gen), 0
        yield perm[pos:pos + batch]
        pos += batch


def train_method(task: Task, data: dict[str, Tensor], method: str, steps: list[int],
                 seed: int) -> dict[int, dict[str, float]]:
    """Train a fresh copy of the reference with ``method``; evaluate after each of ``steps``
    (constant learning rate, so step counts are training lengths of one run). The step is the
    package's own (:func:`grouppref.train.policy.step.run_steps`)."""
    model = copy.deepcopy(task.ref)
    for prm in model.parameters():
        prm.requires_grad_(True)
    opt = torch.optim.Adam(model.parameters(), lr=task.bed.lr)
    gen = torch.Generator().manual_seed(50_000 + seed)  # same batch order for every method
    batches = (batch_of(data, idx) for idx in batch_indices(
        data["prompts"].shape[0], task.bed.batch_groups, max(steps), gen))
    out: dict[int, dict[str, float]] = {}

    def after(step: int, *_: Any) -> None:
        if step in steps:
            out[step] = evaluate(model, task)

    run_steps(model, opt, batches, objective_of(method, task.bed.beta), after_step=after)
    return out


def independent_ceiling(task: Task) -> float:
    """Held-out pair accuracy of the best prompt-independent scorer: the true reward with the
    prompt part replaced by its mean over prompts, ``q(y) = (1/L) Σ_t [u + √P·mean_x M[x, ·]][y_t]``."""
    bed = task.bed
    per_token = (bed.indep_weight * task.u  # prompts use tokens >= 2
                 + bed.inter_weight * math.sqrt(bed.prompt_len) * task.m[2:].mean(0))
    q = per_token[task.eval_cands].mean(-1)  # (E, K)
    r = true_reward(task, task.eval_prompts[:, None].expand(-1, bed.eval_k, -1), task.eval_cands)
    dq, dr = q[:, :, None] - q[:, None, :], r[:, :, None] - r[:, None, :]
    upper = torch.ones(bed.eval_k, bed.eval_k, dtype=torch.bool).triu(1) & (dr != 0)
    return float(((torch.sign(dq) * torch.sign(dr) + 1) / 2)[upper.expand_as(dq)].mean())


def realised_flip_rates(ranks: Tensor, reward: Tensor) -> list[float]:
    """Per annotator, the share of its pairwise votes against the true reward: (N, A, K) ranks."""
    dr = reward[:, None, :, None] - reward[:, None, None, :]  # (N, 1, K, K)
    dk = (ranks[:, :, None, :] - ranks[:, :, :, None]).double()  # > 0: i ranked above j
    decided = dr > 0
    against = (dk < 0) & decided
    return (against.sum((0, 2, 3)) / decided.sum((0, 2, 3))).tolist()
