"""Experiment 3: SmolLM2-135M-Instruct on arithmetic prompts with a checkable answer.

Offline pipeline, once: K samples per training prompt from the model (temperature 1), scored
by the rule ranker (:mod:`research.real_model.smol`: correct answer 1 + answer-only format
0.5); a simulated panel (3 annotators, flip rate F) ranks each group around those scores;
aggregation gives p_ij / w_ij / consensus. Groups whose candidates all score the same carry
no signal and are left out (counted). Then short runs of ``gspo_soft`` and ``dpo_consensus``
from the same model, same groups, same steps and batch order.

Metrics: held-out pair accuracy of the implicit reward against the rule scores (held-out
groups sampled the same way), and the share of held-out prompts whose greedy answer is
correct / in the required format, before and after.

    .venv/bin/python -m research.real_model.real_model
    .venv/bin/python -m research.real_model.real_model --quick
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch

from grouppref.api import Objective, TokenizedGroup, collate_groups, group_logps, run_steps
from research import common as c
from research.real_model import smol

METHODS = ("dpo_consensus", "gspo_soft")


def settings(quick: bool) -> dict[str, Any]:
    if quick:
        return {"seed": 0, "train_prompts": 12, "test_prompts": 8, "k": 4, "max_new_tokens": 8,
                "steps": 2, "batch_groups": 2, "lr": 2e-5, "beta": 0.1,
                "conditions": ["noise=0.2"]}
    return {"seed": 0, "train_prompts": 64, "test_prompts": 48, "k": 4, "max_new_tokens": 12,
            "steps": 24, "batch_groups": 4, "lr": 3e-5, "beta": 0.1,
            "conditions": ["noise=0.1", "noise=0.3"]}


def tokenized(prompt_ids: list[int], cands: list[list[int]], order: list[int], p: Any, w: Any,
              ref: list[float], gid: str) -> TokenizedGroup:
    return TokenizedGroup(group_id=gid, prompt_ids=prompt_ids, cand_ids=cands, p_ij=p, w_ij=w,
                          order=order, ref_logps=ref, behavior_logps=[None] * len(cands),
                          split=None)


@torch.no_grad()
def ref_logps(model: Any, groups: list[TokenizedGroup], pad: int, batch: int = 8) -> None:
    """Fill ``ref_logps`` of every group with the (frozen) model's summed log-probs."""
    for s in range(0, len(groups), batch):
        part = groups[s:s + batch]
        lp = group_logps(model, collate_groups(part, pad))
        for g, row in zip(part, lp.tolist(), strict=True):
            g.ref_logps = row[:len(g.cand_ids)]


def build_groups(items: list[smol.Item], ids: list[list[list[int]]], scores: list[list[float]],
                 condition: str, seed: int) -> tuple[dict[str, list[TokenizedGroup]], dict[str, Any]]:
    """Per method, the training groups of a panel condition; plus aggregation statistics."""
    keep = [i for i, s in enumerate(scores) if max(s) > min(s)]
    reward = torch.tensor([scores[i] for i in keep])
    ranks = c.annotate(reward, c.panel(condition), seed)
    agg = c.aggregate(ranks)
    out: dict[str, list[TokenizedGroup]] = {m: [] for m in METHODS}
    for row, i in enumerate(keep):
        order = agg["order"][row].tolist()
        best, worst = order[0], order[-1]
        out["dpo_consensus"].append(tokenized(items[i].ids, [ids[i][best], ids[i][worst]], [0, 1],
                                              [[0.5, 1.0], [0.0, 0.5]], [[0.0, 1.0], [1.0, 0.0]],
                                              [], f"g{i}"))
        out["gspo_soft"].append(tokenized(items[i].ids, ids[i], order, agg["p"][row].tolist(),
                                          agg["w"][row].tolist(), [], f"g{i}"))
    return out, {"groups_kept": len(keep), "groups_without_signal": len(scores) - len(keep),
                 "noise_estimate": agg["noise"],
                 "realised_flip_rates": c.realised_flip_rates(ranks, reward)}


def train(model0: Any, groups: list[TokenizedGroup], method: str, cfg: dict[str, Any],
          pad: int) -> tuple[Any, dict[str, float]]:
    """A fresh copy of ``model0`` trained with the package's step
    (:func:`grouppref.train.policy.step.run_steps`), AdamW at a constant rate."""
    model = copy.deepcopy(model0)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=0.0)
    gen = torch.Generator().manual_seed(cfg["seed"])
    batches = (collate_groups([groups[i] for i in idx.tolist()], pad)
               for idx in c.batch_indices(len(groups), cfg["batch_groups"], cfg["steps"], gen))
    losses: list[float] = []
    tokens, t0 = 0, time.perf_counter()

    def after(step: int, out: Any, batch: Any) -> None:
        nonlocal tokens
        losses.append(float(out.loss.detach().mean()))
        tokens += int(batch.prompt_mask.sum() + batch.cand_mask.sum())

    objective = Objective(loss="dpo" if method == "dpo_consensus" else "gspo", beta=cfg["beta"])
    run_steps(model, opt, batches, objective, after_step=after)
    model.eval()
    return model, {"train_wall_s": time.perf_counter() - t0, "tokens_trained": tokens,
                   "first_loss": losses[0], "last_loss": losses[-1]}


@torch.no_grad()
def held_out_accuracy(model: Any, ref_model: Any, groups: list[TokenizedGroup],
                      scores: list[list[float]], beta: float, pad: int) -> float:
    """Pair accuracy of s = β(log π − log π_ref) against the rule scores (pairs with distinct
    scores; reward ties count ½)."""
    right = total = 0.0
    for s0 in range(0, len(groups), 8):
        part = groups[s0:s0 + 8]
        batch = collate_groups(part, pad)
        s = beta * (group_logps(model, batch) - group_logps(ref_model, batch))
        for b, g in enumerate(part):
            sc = scores[int(g.group_id[1:])]
            for i in range(len(sc)):
                for j in range(i + 1, len(sc)):
                    if sc[i] == sc[j]:
                        continue
                    d = (s[b, i] - s[b, j]) * (1 if sc[i] > sc[j] else -1)
                    right += 1.0 if d > 0 else 0.5 if d == 0 else 0.0
                    total += 1
    return right / total if total else float("nan")


def markdown(result: dict[str, Any]) -> str:
    """The results as a markdown table (one row per condition and method)."""
    b = result["before"]
    lines = ["| condition | method | est. noise | groups used | held-out pair acc. | greedy correct "
             "| greedy format | final loss | train wall s |", "|---|---|---|---|---|---|---|---|---|",
             f"| — | reference (before) | — | — | 0.500 | {b['greedy_correct']:.3f} | "
             f"{b['greedy_format']:.3f} | — | — |"]
    for cond, per in result["conditions"].items():
        agg = per["aggregation"]
        noise = "none" if agg["noise_estimate"] is None else f"{agg['noise_estimate']:.3f}"
        for m in METHODS:
            r = per[m]
            lines.append(f"| {cond} | {m} | {noise} | {agg['groups_kept']} | "
                         f"{r['held_out_pair_accuracy']:.3f} | {r['greedy_correct']:.3f} | "
                         f"{r['greedy_format']:.3f} | {r['last_loss']:.3f} | {r['train_wall_s']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = c.evidence_parser(__doc__, c.results_of(__file__), "the JSON", threads=2)
    ap.add_argument("--seed", type=int, default=0, help="seed of prompts, samples, panel, order")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = {**settings(args.quick), "seed": args.seed}
    t_all = time.perf_counter()
    model, tok = smol.load_smol()
    ranker = smol.rule_ranker()
    items = smol.make_items(tok, cfg["train_prompts"] + cfg["test_prompts"], cfg["seed"])
    train_items, test_items = items[:cfg["train_prompts"]], items[cfg["train_prompts"]:]
    with smol.Timer() as t_gen:
        ids, texts, gen_tokens = smol.generate(model, tok, train_items, cfg["k"], cfg["max_new_tokens"],
                                               cfg["seed"])
        test_ids, test_texts, _ = smol.generate(model, tok, test_items, cfg["k"], cfg["max_new_tokens"],
                                                cfg["seed"] + 1)
    scores = [smol.score_texts(ranker, it, t) for it, t in zip(train_items, texts, strict=True)]
    test_scores = [smol.score_texts(ranker, it, t) for it, t in zip(test_items, test_texts, strict=True)]
    test_groups = [tokenized(it.ids, g, list(range(len(g))), [[0.5] * len(g)] * len(g),
                             [[0.0] * len(g)] * len(g), [], f"g{i}")
                   for i, (it, g) in enumerate(zip(test_items, test_ids, strict=True))]
    c.log(f"generated {gen_tokens} tokens in {t_gen.s:.0f} s")
    before = smol.greedy_scores(model, tok, test_items, ranker, cfg["max_new_tokens"])
    c.log(f"generated {gen_tokens} tokens in {t_gen.s:.0f} s; greedy before {before}")
    results: dict[str, Any] = {"before": before, "conditions": {}}
    for cond in cfg["conditions"]:
        groups, stats = build_groups(train_items, ids, scores, cond, cfg["seed"])
        per: dict[str, Any] = {"aggregation": stats}
        for method in METHODS:
            with smol.Timer() as t_ref:
                ref_logps(model, groups[method], tok.pad_token_id)
            trained, info = train(model, groups[method], method, cfg, tok.pad_token_id)
            per[method] = {**info, "ref_wall_s": t_ref.s,
                           "held_out_pair_accuracy": held_out_accuracy(
                               trained, model, test_groups, test_scores, cfg["beta"], tok.pad_token_id),
                           **smol.greedy_scores(trained, tok, test_items, ranker, cfg["max_new_tokens"])}
            c.log(f"{cond} {method}: {per[method]}")
        results["conditions"][cond] = per
    share = [s for row in scores for s in row]
    result = {"experiment": "real_model", "quick": args.quick, "settings": cfg,
              "model": "SmolLM2-135M-Instruct (embedded, float32)", "environment": c.environment(),
              "generation": {"tokens": gen_tokens, "wall_s": t_gen.s,
                             "train_candidate_correct": sum(s >= 1 for s in share) / len(share),
                             "train_candidate_format": sum(s in (0.5, 1.5) for s in share) / len(share)},
              "wall_s": time.perf_counter() - t_all, **results}
    name = ("real_model_quick" if args.quick else "real_model") + (f"_seed{args.seed}" if args.seed else "")
    c.write_json(args.out / f"{name}.json", result)
    (args.out / f"{name}_table.md").write_text(markdown(result) + "\n", encoding="utf-8")
    c.log(f"done in {result['wall_s']:.0f} s")
    return result


if __name__ == "__main__":
    main()
