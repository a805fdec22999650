"""Experiment 1 at a larger scale, for one GPU: an ensemble of policies trained side by side.

Self-contained on purpose (the GPU machine may have only torch and numpy: no transformers,
pydantic or scipy): a small pre-LN causal transformer written with an explicit *ensemble* dimension,
so every (seed, method) policy of one condition trains in the same batched forward pass
(Adam is element-wise, so the members stay independent: each has its own parameters, data
and loss). Only three package modules are imported, all pure torch: the losses
(:mod:`grouppref.train.objective.losses`) and the aggregation numerics (:mod:`grouppref.stats`).

Task (per seed, as in ``common.py``): vocabulary V = 32, prompts of P = 4 tokens,
responses of L = 6 tokens, hidden reward
``r(x, y) = (1/L) Σ_t [a·u[y_t] + b·(1/√P) Σ_s M[x_s, y_t]]``; ``--reward full`` is the
original testbed (full-rank M, a = b = 1), ``--reward rank2`` the separating one of
``curves.py`` (rank-2 M, a = 0.5, b = 1.5). The reference policy is the random
initialisation (``--hidden``, ``--layers``); training groups are K reference samples of
``--prompts`` prompts, ranked by a Mallows panel and aggregated with the package's
reliability + BT fit; methods ``dpo_consensus``, ``gspo_hard``, ``gspo_soft``, ``gspo_cal``,
``plackett_luce`` (as in ``curves.py``), Adam, β = 0.1, same batches for every method.

The run is budgeted: conditions run in ``--conditions`` order and the script stops starting
new ones when less than the time one took is left of ``--budget-s``. Rows (same fields as
``curves.py``'s) go to ``$OUT/gpu_scale.json`` after every condition.

    python -m research.learning_curves.gpu_scale --quick                   # CPU smoke test
    python -m research.learning_curves.gpu_scale --budget-s 300            # one H200, < 6 min
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from grouppref.api import dpo_loss, gspo_loss, plackett_luce_loss

Tensor = torch.Tensor
METHODS = ("dpo_consensus", "gspo_hard", "gspo_soft", "gspo_cal", "plackett_luce")
REWARDS = {"full": (0, 1.0, 1.0), "rank2": (2, 0.5, 1.5)}  # (rank, a, b)
V, P, L, BETA = 32, 4, 6, 0.1


# -- ensemble transformer ---------------------------------------------------------------------
def init_params(e: int, d: int, layers: int, gen: torch.Generator, device: str) -> dict[str, Tensor]:
    """Parameters of ``e`` pre-LN causal transformers (N(0, 0.02) weights, tied embeddings)."""
    def w(*shape: int) -> Tensor:
        return (torch.randn(e, *shape, generator=gen) * 0.02).to(device)

    p = {"emb": w(V, d), "pos": w(P + L, d), "lnf": torch.ones(e, d, device=device)}
    for i in range(layers):
        p |= {f"ln1.{i}": torch.ones(e, d, device=device), f"qkv.{i}": w(d, 3 * d),
              f"o.{i}": w(d, d), f"ln2.{i}": torch.ones(e, d, device=device),
              f"up.{i}": w(d, 4 * d), f"down.{i}": w(4 * d, d)}
    return p


def _ln(x: Tensor, g: Tensor) -> Tensor:  # (E, N, T, D), (E, D)
    return F.layer_norm(x, x.shape[-1:]) * g[:, None, None, :]


def forward(p: dict[str, Tensor], ids: Tensor, heads: int) -> Tensor:
    """Logits (E, N, T, V) of token ids (E, N, T)."""
    e, n, t = ids.shape
    d = p["emb"].shape[-1]
    x = torch.gather(p["emb"], 1, ids.reshape(e, -1, 1).expand(-1, -1, d)).view(e, n, t, d)
    x = x + p["pos"][:, None, :t]
    layers = sum(1 for k in p if k.startswith("qkv."))
    for i in range(layers):
        h = _ln(x, p[f"ln1.{i}"])
        q, k, v = torch.einsum("entd,edf->entf", h, p[f"qkv.{i}"]).view(
            e * n, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (E*N, H, T, dh)
        x = x + torch.einsum("entd,edf->entf", a.transpose(1, 2).reshape(e, n, t, d), p[f"o.{i}"])
        h = _ln(x, p[f"ln2.{i}"])
        x = x + torch.einsum("entf,efd->entd", F.gelu(torch.einsum("entd,edf->entf", h, p[f"up.{i}"])),
                             p[f"down.{i}"])
    return torch.einsum("entd,evd->entv", _ln(x, p["lnf"]), p["emb"])


def response_logps(p: dict[str, Tensor], prompts: Tensor, resp: Tensor, heads: int) -> Tensor:
    """Summed response log-probs: prompts (E, N, P), responses (E, N, K, L) -> (E, N, K)."""
    e, n, k, _ = resp.shape
    ids = torch.cat([prompts[:, :, None].expand(-1, -1, k, -1), resp], -1).reshape(e, n * k, P + L)
    logits = forward(p, ids[:, :, :-1], heads)[:, :, P - 1:]  # predicts the L response tokens
    lp = -F.cross_entropy(logits.reshape(-1, V).float(), ids[:, :, P:].reshape(-1), reduction="none")
    return lp.view(e, n, k, L).sum(-1)


@torch.no_grad()
def sample(p: dict[str, Tensor], prompts: Tensor, k: int, heads: int, gen: torch.Generator) -> Tensor:
    """``k`` responses per prompt at temperature 1: (E, N, P) -> (E, N, k, L)."""
    e, n, _ = prompts.shape
    seq = prompts.repeat_interleave(k, 1)  # (E, N*k, P)
    for _ in range(L):
        logits = forward(p, seq, heads)[:, :, -1].float()
        u = torch.rand(logits.shape, generator=gen, device="cpu").to(logits.device)
        nxt = (logits - torch.log(-torch.log(u.clamp_min(1e-20)))).argmax(-1, keepdim=True)  # Gumbel
        seq = torch.cat([seq, nxt], -1)
    return seq[:, :, P:].reshape(e, n, k, L)


# -- task, panel, aggregation -----------------------------------------------------------------
def make_reward(kind: str, gen: torch.Generator) -> tuple[Tensor, Tensor, float, float]:
    rank, a, b = REWARDS[kind]
    u = torch.randn(V, generator=gen)
    if rank == 0:
        m = torch.randn(V, V, generator=gen)
    else:
        m = torch.randn(V, rank, generator=gen) @ torch.randn(V, rank, generator=gen).T / math.sqrt(rank)
    return u, m, a, b


def true_reward(task: dict[str, Any], prompts: Tensor, resp: Tensor) -> Tensor:
    """prompts (..., P), resp (..., L) -> (...), on the CPU."""
    prompts, resp = prompts.cpu(), resp.cpu()
    inter = task["m"][prompts[..., :, None], resp[..., None, :]].sum(-2) / math.sqrt(P)
    return (task["a"] * task["u"][resp] + task["b"] * inter).mean(-1)


def mallows_phi(f: float, k: int) -> float:
    """Dispersion whose Mallows model votes against the truth on a share ``f`` of pairs."""
    def rate(phi: float) -> float:
        tot = sum(sum(j * phi**j for j in range(i)) / sum(phi**j for j in range(i)) for i in range(2, k + 1))
        return tot / (k * (k - 1) / 2)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rate(mid) < f else (lo, mid)
    return (lo + hi) / 2


def panel(condition: str) -> list[tuple[str, float]]:
    if condition == "adversarial":
        return [("noisy", 0.1)] * 3 + [("random", 0.5), ("reversed", 1.0)]
    return [("noisy", float(condition.split("=")[1]))] * 3


def annotate(reward: Tensor, condition: str, rng: np.random.Generator) -> Tensor:
    """(N, K) true rewards -> (N, A, K) tier index per candidate (0 = best), strict orders."""
    n, k = reward.shape
    specs = panel(condition)
    truth = np.argsort(-reward.numpy(), axis=1, kind="stable")
    ranks = np.zeros((n, len(specs), k), dtype=np.int64)
    for a, (kind, f) in enumerate(specs):
        phi = mallows_phi(f, k) if kind == "noisy" else 0.0
        for g in range(n):
            if kind == "random":
                order = list(rng.permutation(k))
            elif kind == "reversed":
                order = list(truth[g][::-1])
            else:  # repeated insertion around the true order
                order = []
                for i, item in enumerate(truth[g]):
                    cum = np.cumsum(phi ** np.arange(i, -1, -1, dtype=float))
                    pos = int(np.searchsorted(cum, rng.random() * cum[-1], side="right")) if phi > 0 else i
                    order.insert(min(pos, i), item)
            ranks[g, a, order] = np.arange(k)
    return torch.from_numpy(ranks)


def aggregate(ranks: Tensor) -> dict[str, Any]:
    """The aggregate stage's defaults on (N, A, K) ranks (see ``common.aggregate``)."""
    from grouppref.api import (
        confidence_pairwise,
        consensus_targets,
        covariance_pairwise,
        estimate_reliability,
        map_pairwise,
        noise_rate,
        probabilities_pairwise,
        tiers_strengths,
        wins_rankings,
    )

    n, a, k = ranks.shape
    ann = torch.arange(a).expand(n, a).clone()
    rel = estimate_reliability(ranks, ann, torch.ones(a, dtype=torch.float64), alpha=0.1,
                               iterations=3, min_groups=5, unreliable_tau=0.0, z=2.0, drop=True,
                               batch_size=4096, max_iter=100, tie_tol=1e-6)
    slot_w = rel.annotator_weight[ann]
    wins = wins_rankings(ranks, slot_w)
    theta = torch.cat([map_pairwise(wins[s:s + 4096], 0.1, max_iter=100) for s in range(0, n, 4096)])
    w = confidence_pairwise(covariance_pairwise(theta, wins, 0.1), 0.1)
    tiers = tiers_strengths(theta, torch.ones(n, k, dtype=torch.bool), 1e-6)
    order = torch.argsort(tiers.double() * 1e6 - theta, dim=1, stable=True)
    hard_p, hard_w = consensus_targets(tiers)
    flips = torch.where(torch.isnan(rel.flip_rate), rel.loo_disagreement, rel.flip_rate)
    used = (slot_w > 0) & ~torch.isnan(flips[ann])
    f = flips.nan_to_num(0.5)[ann].clamp(0.01, 0.5)
    lam = torch.where(used, torch.log((1 - f) / f), 0.0)
    r = ranks.double()
    cal_p = torch.sigmoid(torch.einsum("ba,baij->bij", lam, torch.sign(r[:, :, None, :] - r[:, :, :, None])))
    return {"p": probabilities_pairwise(theta).float(), "w": w.float(), "order": order,
            "hard_p": hard_p.float(), "hard_w": hard_w.float(),
            "cal_p": cal_p.float(), "noise": noise_rate(rel), "weights": rel.annotator_weight.tolist()}


# -- one condition: every (seed, method) member trained together -----------------------------
def build_seed(seed: int, args: argparse.Namespace, condition: str, device: str) -> dict[str, Any]:
    """Reward, reference policy, training groups + aggregation and the held-out set of a seed."""
    gen = torch.Generator().manual_seed(10_000 + seed)
    u, m, a, b = make_reward(args.reward, gen)
    ref = init_params(1, args.hidden, args.layers, torch.Generator().manual_seed(seed), device)
    task: dict[str, Any] = {"u": u, "m": m, "a": a, "b": b, "ref": ref}
    sgen = torch.Generator().manual_seed(20_000 + seed)
    prompts = torch.randint(2, V, (1, args.prompts, P), generator=sgen).to(device)
    cands = sample(ref, prompts, args.k, args.heads, sgen)
    reward = true_reward(task, prompts[0, :, None].expand(-1, args.k, -1), cands[0])
    ranks = annotate(reward, condition, np.random.default_rng(30_000 + seed))
    ep = torch.randint(2, V, (1, args.eval_prompts, P), generator=gen).to(device)
    ecands = sample(ref, ep, 4, args.heads, gen)
    refs = sample(ref, ep, args.eval_samples, args.heads, gen)
    rr = true_reward(task, ep[0, :, None].expand(-1, args.eval_samples, -1), refs[0])
    with torch.no_grad():
        train_ref = torch.cat([response_logps(ref, prompts[:, s:s + 2048], cands[:, s:s + 2048], args.heads)
                               for s in range(0, args.prompts, 2048)], 1)[0]
        eval_ref = response_logps(ref, ep, ecands, args.heads)[0]
    task |= {"prompts": prompts[0], "cands": cands[0], "reward": reward, "ranks": ranks,
             "agg": aggregate(ranks), "train_ref": train_ref, "eval_prompts": ep[0],
             "eval_cands": ecands[0], "eval_ref": eval_ref, "r_mean": float(rr.mean()),
             "r_std": float(rr.std()), "ceiling": ceiling(task, ep[0], ecands[0].cpu())}
    return task


def ceiling(task: dict[str, Any], ep: Tensor, ec: Tensor) -> float:
    """Pair accuracy of the best prompt-independent scorer on the held-out candidates."""
    per_token = task["a"] * task["u"] + task["b"] * math.sqrt(P) * task["m"][2:].mean(0)
    q = per_token[ec].mean(-1)
    r = true_reward(task, ep[:, None].expand(-1, 4, -1), ec)
    return _pair_acc(q, r)


def _pair_acc(s: Tensor, r: Tensor) -> float:
    ds, dr = s[:, :, None] - s[:, None, :], r[:, :, None] - r[:, None, :]
    upper = torch.ones(s.shape[1], s.shape[1], dtype=torch.bool).triu(1) & (dr != 0)
    return float(((torch.sign(ds) * torch.sign(dr) + 1) / 2)[upper.expand_as(ds)].mean())


def member_loss(method: str, s: Tensor, task: dict[str, Any], idx: Tensor) -> Tensor:
    agg = task["agg"]
    valid = torch.ones_like(s, dtype=torch.bool)
    order = agg["order"][idx].to(s.device)
    if method == "dpo_consensus":
        return dpo_loss(s, order, valid).mean()
    if method == "plackett_luce":
        return plackett_luce_loss(s, order, valid).mean()
    p, w = {"gspo_hard": ("hard_p", "hard_w"), "gspo_soft": ("p", "w"), "gspo_cal": ("cal_p", "w")}[method]
    return gspo_loss(s, agg[p][idx].to(s.device), agg[w][idx].to(s.device), valid).mean()


@torch.no_grad()
def evaluate(params: dict[str, Tensor], members: list[tuple[int, str]], tasks: dict[int, Any],
             args: argparse.Namespace) -> list[dict[str, float]]:
    """Held-out pair accuracy, true-reward gain (ref. std units) and KL per member."""
    ep = torch.stack([tasks[s]["eval_prompts"] for s, _ in members])
    ec = torch.stack([tasks[s]["eval_cands"] for s, _ in members])
    lp = response_logps(params, ep, ec, args.heads)
    ys = sample(params, ep, args.eval_samples, args.heads, torch.Generator().manual_seed(40_000))
    ref_lp = torch.stack([response_logps(tasks[s]["ref"], ep[i:i + 1], ys[i:i + 1], args.heads)[0]
                          for i, (s, _) in enumerate(members)])
    pol_lp = response_logps(params, ep, ys, args.heads)
    out = []
    for i, (s, _) in enumerate(members):
        t = tasks[s]
        r = true_reward(t, t["eval_prompts"][:, None].expand(-1, 4, -1), t["eval_cands"])
        ry = true_reward(t, t["eval_prompts"][:, None].expand(-1, args.eval_samples, -1), ys[i])
        out.append({"pair_accuracy": _pair_acc((BETA * (lp[i] - t["eval_ref"])).cpu(), r),
                    "reward_gain": (float(ry.mean()) - t["r_mean"]) / t["r_std"],
                    "kl": float((pol_lp[i] - ref_lp[i]).mean())})
    return out


def run_condition(condition: str, args: argparse.Namespace, device: str, rows: list[dict[str, Any]],
                  save: Any) -> None:
    """Train every (seed, method) member of ``condition``; append rows, ``save()`` after each eval."""
    t0 = time.perf_counter()
    tasks = {s: build_seed(s, args, condition, device) for s in args.seeds}
    members = [(s, m) for s in args.seeds for m in METHODS]
    params = {k: torch.cat([tasks[s]["ref"][k] for s, _ in members]).clone().requires_grad_(True)
              for k in tasks[args.seeds[0]]["ref"]}
    opt = torch.optim.Adam(params.values(), lr=args.lr)
    gens = {s: torch.Generator().manual_seed(50_000 + s) for s in args.seeds}
    perms = {s: torch.randperm(args.prompts, generator=gens[s]) for s in args.seeds}
    pos, setup = 0, time.perf_counter() - t0
    for step in range(1, args.steps + 1):
        if pos + args.batch > args.prompts:
            perms, pos = {s: torch.randperm(args.prompts, generator=gens[s]) for s in args.seeds}, 0
        idx = {s: perms[s][pos:pos + args.batch] for s in args.seeds}
        pos += args.batch
        pr = torch.stack([tasks[s]["prompts"][idx[s]] for s, _ in members])
        cd = torch.stack([tasks[s]["cands"][idx[s]] for s, _ in members])
        logps = response_logps(params, pr, cd, args.heads)  # (E, B, K)
        loss = sum(member_loss(m, BETA * (logps[i] - tasks[s]["train_ref"][idx[s]]), tasks[s], idx[s].cpu())
                   for i, (s, m) in enumerate(members))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step in args.eval_steps:
            for (s, m), res in zip(members, evaluate(params, members, tasks, args), strict=True):
                t = tasks[s]
                per = args.batch * (P + (2 if m.startswith("dpo") else args.k) * L)
                rows.append({"experiment": "gpu_scale", "k": args.k,
                             "setting": f"{args.reward}_h{args.hidden}_l{args.layers}",
                             "prompts": args.prompts, "condition": condition, "seed": s,
                             "method": m, "step": step, "tokens": step * per, **res,
                             "noise_estimate": t["agg"]["noise"], "annotator_weights": t["agg"]["weights"],
                             "independent_ceiling": t["ceiling"], "wall_s": time.perf_counter() - t0})
            save()
            print(f"{condition} step {step}: {time.perf_counter() - t0:.0f} s (setup {setup:.0f} s)",
                  flush=True)


def t975(df: int) -> float:
    """Student-t 97.5% quantile: scipy's where installed, else a table (the GPU machine may
    have torch and numpy only; df > 10 uses 1.96 + 2.4/df, within 1% of the exact value)."""
    try:
        from scipy import stats
    except ImportError:
        table = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)
        return table[df - 1] if df <= 10 else 1.96 + 2.4 / df
    return float(stats.t.ppf(0.975, df))


def summary_table(rows: list[dict[str, Any]]) -> str:
    """Per condition and method at the last evaluated step: pair accuracy and reward gain
    (mean over seeds), and the paired difference against dpo_consensus with a t 95% CI."""
    def ci(d: list[float]) -> str:
        m = float(np.mean(d))
        if len(d) < 2:
            return f"{m:+.3f}"
        h = float(t975(len(d) - 1) * np.std(d, ddof=1) / math.sqrt(len(d)))
        return f"{m:+.3f} [{m - h:+.3f}, {m + h:+.3f}]"

    lines = ["| condition | step | ceiling | method | pair acc | Δ vs DPO | reward gain | Δ vs DPO | KL |",
             "|---|---|---|---|---|---|---|---|---|"]
    for cond in dict.fromkeys(r["condition"] for r in rows):
        sel = [r for r in rows if r["condition"] == cond]
        step = max(r["step"] for r in sel)
        at = {(r["method"], r["seed"]): r for r in sel if r["step"] == step}
        seeds = sorted({s for _, s in at})
        ceil = np.mean([at[("dpo_consensus", s)]["independent_ceiling"] for s in seeds])
        for m in METHODS:
            if not all((m, s) in at for s in seeds):
                continue
            d = {x: [at[(m, s)][x] - at[("dpo_consensus", s)][x] for s in seeds]
                 for x in ("pair_accuracy", "reward_gain")}
            mean = {x: np.mean([at[(m, s)][x] for s in seeds])
                    for x in ("pair_accuracy", "reward_gain", "kl")}
            lines.append(f"| {cond} | {step} | {ceil:.3f} | {m} | {mean['pair_accuracy']:.3f} | "
                         f"{ci(d['pair_accuracy']) if m != 'dpo_consensus' else '—'} | "
                         f"{mean['reward_gain']:.2f} | "
                         f"{ci(d['reward_gain']) if m != 'dpo_consensus' else '—'} | {mean['kl']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="CPU smoke test at toy sizes")
    ap.add_argument("--reward", choices=tuple(REWARDS), default="full")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--conditions", nargs="+", default=["noise=0.0", "noise=0.3", "noise=0.2",
                                                        "adversarial", "noise=0.1", "noise=0.4"])
    ap.add_argument("--eval-prompts", type=int, default=1000)
    ap.add_argument("--eval-samples", type=int, default=4)
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    ap.add_argument("--summarise", type=Path, help="print the table of a finished gpu_scale.json")
    args = ap.parse_args(argv)
    if args.summarise:
        rows = json.loads(args.summarise.read_text())["runs"]
        print(summary_table(rows))
        return rows
    if args.quick:
        args.hidden, args.layers, args.heads, args.prompts, args.batch = 32, 1, 2, 64, 8
        args.steps, args.seeds, args.conditions, args.eval_prompts = 6, [0, 1], ["noise=0.2"], 16
    args.eval_steps = sorted({*range(args.steps // 8, args.steps + 1, max(1, args.steps // 8)), args.steps})
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = True  # TF32 matmuls on the GPU (no effect on CPU)
    t0, rows, last = time.perf_counter(), [], 0.0
    args.out.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        (args.out / "gpu_scale.json").write_text(json.dumps(
            {"args": {k: v for k, v in vars(args).items() if k != "out"}, "device": device,
             "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
             "torch": torch.__version__, "wall_s": time.perf_counter() - t0, "runs": rows}, indent=1))

    for cond in args.conditions:
        left = args.budget_s - (time.perf_counter() - t0)
        if left < 1.2 * last:
            print(f"budget: skipping {cond} and later ({left:.0f} s left, one took {last:.0f} s)")
            break
        c0 = time.perf_counter()
        run_condition(cond, args, device, rows, save)
        last = time.perf_counter() - c0
        print(f"{cond} done in {last:.0f} s", flush=True)
    if rows:
        print(summary_table(rows))
    return rows


if __name__ == "__main__":
    main()
