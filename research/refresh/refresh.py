"""Experiment 9 (research/refresh/README.md): offline GSPO, offline + refresh at two rates, and
online RL (TRL's GRPOTrainer), on the synthetic testbed with a known reward.

Per seed (testbed of :mod:`research.common`: a tiny Llama over 32 tokens as the
reference policy, a hidden reward ``r(x, y)``), with the reward itself as the only judge (the
verifiable-reward setting: no annotator noise; one "rule" ranking per group, aggregated by the
package's Bradley-Terry fit):

* ``offline``: K reference samples for each of ``prompts`` training prompts, ranked once;
  ``steps`` updates of the gspo loss on batches of ``batch`` groups;
* ``offline_is``: the same with clipped importance weights (``importance_clip``) against the
  reference, which sampled the data;
* ``refresh_slow`` / ``refresh_fast``: the same offline data and importance weights, plus
  refresh rounds (every ``every`` updates: ``prompts`` training prompts, K samples each from
  the current policy, ranked and aggregated the same way, reference log-probs, the newest
  ``buffer`` groups kept); each batch takes ``fresh_share`` of its groups from the buffer. The
  buffer, the draws, the prompt schedule and the importance-weight statistics are the
  package's own (:mod:`grouppref.train.refresh.buffer`,
  :func:`~grouppref.train.refresh.fresh_groups.round_prompts`);
* ``grpo``: TRL ``GRPOTrainer`` on the same model, prompts and reward (TRL defaults: beta 0,
  ``dapo`` loss, group-scaled advantages; ``min_new_tokens = max_new_tokens = L`` so that
  every completion has the testbed's length), ``grpo_prompts`` prompts x K completions per
  update, one update per generation round.

Every method starts from the reference, uses Adam(W) at the testbed's constant learning rate
without clipping, and is evaluated every ``eval_every`` updates on held-out prompts (true-reward
gain of its samples in reference-std units, pair accuracy of its implicit reward, KL), with the
wall time (evaluation excluded), the tokens trained (prompt + candidate tokens of each batch;
TRL: prompt + completion of each completion) and the tokens generated. Results are read at
equal trained tokens (those of ``offline``'s whole run) and at equal wall time (the shortest
run of the seed), and at equal KL(policy || reference) (offline's at its end: how much reward
each method buys per distance from the reference), by linear interpolation between
evaluations.

    .venv/bin/python -m research.refresh.refresh --workers 1 [--seeds N]
    .venv/bin/python -m research.refresh.refresh --quick
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grouppref.api import (
    FreshBuffer,
    Objective,
    RhoStats,
    TokenizedGroup,
    collate_groups,
    mix_batch,
    round_prompts,
    run_steps,
)
from research import common as c

METHODS = ("offline", "offline_is", "refresh_slow", "refresh_fast", "grpo")
METRICS = ("reward_gain", "pair_accuracy", "kl")


def settings(quick: bool) -> dict[str, Any]:
    """Sizes of the full run and of ``--quick``."""
    base = {"k": 4, "batch": 16, "fresh_share": 0.5, "importance_clip": [0.5, 2.0],
            "slow": {"every": 10, "prompts": 32, "buffer": 64},
            "fast": {"every": 2, "prompts": 16, "buffer": 64}, "grpo_prompts": 16}
    if quick:
        return {**base, "seeds": [0, 1], "prompts": 32, "steps": 6, "eval_every": 3, "batch": 4,
                "eval_prompts": 8, "eval_samples": 2, "grpo_prompts": 2,
                "slow": {"every": 3, "prompts": 4, "buffer": 8},
                "fast": {"every": 1, "prompts": 4, "buffer": 8}}
    return {**base, "seeds": list(range(8)), "prompts": 384, "steps": 120, "eval_every": 10,
            "eval_prompts": 96, "eval_samples": 8}


# -- data -------------------------------------------------------------------------------------
def judged_groups(task: c.Task, model: Any, prompts: torch.Tensor, k: int,
                  gen: torch.Generator, tag: str) -> list[TokenizedGroup]:
    """K samples per prompt from ``model``, ranked by the true reward (one noise-free judge)
    and aggregated by the package's BT fit, with behaviour (``model``) and reference log-probs."""
    cands = c.sample(model, prompts, k, task.bed.resp_len, gen)  # (N, K, L)
    reward = c.true_reward(task, prompts[:, None].expand(-1, k, -1), cands)  # (N, K)
    ranks = torch.empty(reward.shape[0], 1, k, dtype=torch.long)
    ranks[:, 0].scatter_(1, reward.argsort(1, descending=True),
                         torch.arange(k).expand_as(reward).contiguous())
    agg = c.aggregate(ranks)
    behaviour = c.batched_logps(model, prompts, cands)
    ref = c.batched_logps(task.ref, prompts, cands)
    return [TokenizedGroup(
        group_id=f"{tag}-{i}", prompt_ids=prompts[i].tolist(), cand_ids=cands[i].tolist(),
        p_ij=agg["p"][i].tolist(), w_ij=agg["w"][i].tolist(), order=agg["order"][i].tolist(),
        ref_logps=ref[i].tolist(), behavior_logps=behaviour[i].tolist(), split=None)
        for i in range(prompts.shape[0])]


class Clock:
    """Wall time since the start plus ``offset`` (work done before, e.g. the offline data),
    with evaluations (run through :meth:`evaluate`) left out."""

    def __init__(self, offset: float = 0.0) -> None:
        self.t0, self.paused, self.offset = time.perf_counter(), 0.0, offset

    def now(self) -> float:
        return time.perf_counter() - self.t0 - self.paused + self.offset

    def evaluate(self, fn: Any) -> Any:
        t = time.perf_counter()
        out = fn()
        self.paused += time.perf_counter() - t
        return out


# -- the group methods ------------------------------------------------------------------------
def train_groups(task: c.Task, prompts: torch.Tensor, offline: list[TokenizedGroup],
                 method: str, cfg: dict[str, Any], seed: int, start: dict[str, float],
                 offline_s: float) -> dict[str, Any]:
    """One group method (offline, offline_is, refresh_*) from the reference; its curve. Its
    wall time includes ``offline_s``, the time the offline data took (sample, judge,
    aggregate, reference log-probs)."""
    rate = cfg.get(method.removeprefix("refresh_")) if method.startswith("refresh") else None
    clip = tuple(cfg["importance_clip"]) if method != "offline" else None
    fresh_n = round(cfg["fresh_share"] * cfg["batch"]) if rate else 0
    model = copy.deepcopy(task.ref)
    for prm in model.parameters():
        prm.requires_grad_(True)
    opt = torch.optim.Adam(model.parameters(), lr=task.bed.lr)
    buffer = FreshBuffer(rate["buffer"] if rate else 1)
    rho = RhoStats(clip) if clip else None  # type: ignore[arg-type]
    gen = torch.Generator().manual_seed(50_000 + seed)  # same offline order for every method
    sampler = torch.Generator().manual_seed(60_000 + seed)
    counts = {"tokens_trained": 0, "tokens_generated": 0, "round_s": 0.0, "rounds": 0}
    kinds: list[str] = []
    clock = Clock(offline_s)
    curve = [{"step": 0, "wall_s": 0.0, "tokens_trained": 0, **start}]

    def batches() -> Any:
        nonlocal kinds
        order = c.batch_indices(len(offline), cfg["batch"] - fresh_n, cfg["steps"], gen)
        for step, idx in enumerate(order):
            if rate and step % rate["every"] == 0:
                t = time.perf_counter()
                pick = round_prompts(prompts.shape[0], rate["prompts"], step // rate["every"], seed)
                buffer.add(judged_groups(task, model, prompts[pick], cfg["k"], sampler,
                                         f"r{step}"), step // rate["every"])
                counts["tokens_generated"] += len(pick) * cfg["k"] * task.bed.resp_len
                counts["round_s"] += time.perf_counter() - t
                counts["rounds"] += 1
            drawn = buffer.draw(fresh_n, seed, 0, step, 0)
            newest = buffer.newest_round()
            kinds = ["offline"] * len(idx) + ["fresh_newest" if d.round == newest
                                              else "fresh_older" for d in drawn]
            yield mix_batch(collate_groups([offline[i] for i in idx.tolist()], 0),
                            [d.group for d in drawn], 0, fresh_only=False)

    def after(step: int, out: Any, batch: Any) -> None:
        counts["tokens_trained"] += int(batch.prompt_mask.sum() + batch.cand_mask.sum())
        if rho is not None:
            rho.add(out.logps, batch, kinds)
        if step % cfg["eval_every"] == 0 or step == cfg["steps"]:
            point = {"step": step, "wall_s": clock.now(), "tokens_trained": counts["tokens_trained"]}
            curve.append({**point, **clock.evaluate(lambda: c.evaluate(model, task))})

    run_steps(model, opt, batches(), Objective(loss="gspo", beta=task.bed.beta,
                                               importance_clip=clip), after_step=after)
    return {"curve": curve, **counts, "rho": rho.take() if rho else {}}


# -- online RL: TRL GRPO ----------------------------------------------------------------------
def synthetic_tokenizer(vocab: int) -> Any:
    """A word-level tokenizer over the testbed's tokens ``t0 .. t{V-1}`` (t0 pad/bos, t1 eos)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="t0", eos_token="t1",
                                   pad_token="t0", unk_token="t0")


def train_grpo(task: c.Task, prompts: torch.Tensor, cfg: dict[str, Any], seed: int,
               updates: int, start: dict[str, float]) -> dict[str, Any]:
    """TRL GRPOTrainer for ``updates`` updates of ``grpo_prompts`` x K completions."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    bed, k = task.bed, cfg["k"]
    counts = {"tokens_trained": 0, "tokens_generated": 0}
    clock: list[Clock] = []
    curve = [{"step": 0, "wall_s": 0.0, "tokens_trained": 0, **start}]

    def reward(prompts: list[str], completions: list[str], **kw: Any) -> list[float]:
        out = []
        for p, ids in zip(prompts, kw["completion_ids"], strict=True):
            x = torch.tensor([int(t[1:]) for t in p.split()])
            y = torch.tensor(list(ids)[:bed.resp_len])
            out.append(float(c.true_reward(task, x, y)))
            counts["tokens_generated"] += len(ids)
            counts["tokens_trained"] += len(ids) + len(x)
        return out

    class Evaluate(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            clock.append(Clock())

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None,
                        **kw: Any) -> None:
            step = state.global_step
            if step % cfg["eval_every"] == 0 or step == updates:
                point = {"step": step, "wall_s": clock[0].now(),
                         "tokens_trained": counts["tokens_trained"]}
                curve.append({**point, **clock[0].evaluate(lambda: c.evaluate(model, task))})

    model = copy.deepcopy(task.ref)
    for prm in model.parameters():
        prm.requires_grad_(True)
    text = [" ".join(f"t{t}" for t in row) for row in prompts.tolist()]
    with tempfile.TemporaryDirectory() as out_dir:
        args = GRPOConfig(
            output_dir=out_dir, use_cpu=True, bf16=False, report_to="none", seed=seed,
            learning_rate=bed.lr, max_steps=updates, per_device_train_batch_size=cfg["grpo_prompts"] * k,
            gradient_accumulation_steps=1, num_generations=k, steps_per_generation=1,
            max_completion_length=bed.resp_len, generation_kwargs={"min_new_tokens": bed.resp_len},
            temperature=1.0, logging_steps=10_000, save_strategy="no", lr_scheduler_type="constant",
            warmup_steps=0, max_grad_norm=0.0, weight_decay=0.0, disable_tqdm=True)
        trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args,
                              train_dataset=Dataset.from_list([{"prompt": t} for t in text]),
                              processing_class=synthetic_tokenizer(bed.vocab),
                              callbacks=[Evaluate()])
        trainer.train()
    return {"curve": curve, **counts}


# -- one seed ---------------------------------------------------------------------------------
def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Every method on one seed's task (shared offline data: results are paired)."""
    bed = c.Testbed(eval_prompts=job["eval_prompts"], eval_samples=job["eval_samples"])
    seed = job["seed"]
    task = c.make_task(bed, seed)
    gen = torch.Generator().manual_seed(20_000 + seed)
    prompts = torch.randint(2, bed.vocab, (job["prompts"], bed.prompt_len), generator=gen)
    t0 = time.perf_counter()
    offline = judged_groups(task, task.ref, prompts, job["k"], gen, "o")
    offline_s = time.perf_counter() - t0
    start = c.evaluate(task.ref, task)  # every curve starts at the reference
    out: dict[str, Any] = {"seed": seed, "start": start, "offline_data_s": offline_s,
                           "methods": {}}
    for method in METHODS[:-1]:
        out["methods"][method] = train_groups(task, prompts, offline, method, job, seed, start,
                                              offline_s)
        out["methods"][method]["tokens_generated_offline"] = (len(offline) * job["k"]
                                                              * bed.resp_len)
        c.log(f"seed {seed} {method}: {out['methods'][method]['curve'][-1]}")
    per_step = (bed.prompt_len + job["k"] * bed.resp_len) * job["batch"]  # offline, one step
    per_update = job["grpo_prompts"] * job["k"] * (bed.prompt_len + bed.resp_len)
    updates = max(job["steps"], int(np.ceil(job["steps"] * per_step / per_update)))
    out["methods"]["grpo"] = train_grpo(task, prompts, job, seed, updates, start)
    out["methods"]["grpo"]["tokens_generated_offline"] = 0
    c.log(f"seed {seed} grpo: {out['methods']['grpo']['curve'][-1]}")
    return out


# -- summary ----------------------------------------------------------------------------------
def at(curve: list[dict[str, Any]], axis: str, x: float, metric: str) -> float:
    """``metric`` at ``axis`` = x by linear interpolation of the curve (held past its end);
    an axis that is not monotone (KL) is read as its running maximum, i.e. where the curve
    first reaches x."""
    xs = np.maximum.accumulate([p[axis] for p in curve])
    return float(np.interp(x, xs, [p[metric] for p in curve]))


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per budget (equal trained tokens, equal wall time, equal KL to the reference: those of
    offline's whole run, the shortest run, offline's final KL) and metric: mean ± std per method and
    paired differences (95% t intervals) against offline and against grpo."""
    out: dict[str, Any] = {"budgets": {}}
    values: dict[str, dict[str, dict[str, list[float]]]] = {}
    for run in runs:
        m = run["methods"]
        tokens = m["offline"]["curve"][-1]["tokens_trained"]
        wall = min(r["curve"][-1]["wall_s"] for r in m.values())
        run["budget"] = {"tokens_trained": tokens, "wall_s": wall}
        kl = m["offline"]["curve"][-1]["kl"]
        run["budget"]["kl"] = kl
        for budget, axis, x in (("equal_tokens", "tokens_trained", tokens),
                                ("equal_wall", "wall_s", wall), ("equal_kl", "kl", kl)):
            for method in METHODS:
                for metric in METRICS:
                    values.setdefault(budget, {}).setdefault(method, {}).setdefault(
                        metric, []).append(at(m[method]["curve"], axis, x, metric))
    for budget, per in values.items():
        block: dict[str, Any] = {"methods": {}, "vs_offline": {}, "vs_grpo": {}}
        for method in METHODS:
            block["methods"][method] = {k: c.mean_std(v) for k, v in per[method].items()}
            for base in ("offline", "grpo"):
                if method != base:
                    block[f"vs_{base}"][method] = {
                        k: c.paired_ci(per[method][k], per[base][k]) for k in METRICS}
        out["budgets"][budget] = block
    out["costs"] = {method: {k: c.mean_std([r["methods"][method]["curve"][-1][k] for r in runs])
                             for k in ("wall_s", "tokens_trained")}
                    | {"tokens_generated": c.mean_std([
                        r["methods"][method]["tokens_generated"]
                        + r["methods"][method].get("tokens_generated_offline", 0) for r in runs])}
                    for method in METHODS}
    out["budget_values"] = {k: c.mean_std([r["budget"][k] for r in runs])
                            for k in ("tokens_trained", "wall_s", "kl")}
    return out


def table(summary: dict[str, Any]) -> str:
    """Markdown: per budget, each method's metrics and its difference against offline."""
    lines = []
    for budget, block in summary["budgets"].items():
        lines += [f"### {budget.replace('_', ' ')}", "",
                  "| method | true-reward gain | Δ vs offline [95% CI] | Δ vs grpo [95% CI] | "
                  "pair accuracy | KL |", "|---|---|---|---|---|---|"]
        for method in METHODS:
            ms = block["methods"][method]
            cells = []
            for base in ("offline", "grpo"):
                d = block[f"vs_{base}"].get(method, {}).get("reward_gain")
                cells.append("—" if d is None else
                             f"{d['mean']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]")
            lines.append(f"| {method} | {ms['reward_gain']['mean']:.3f} ± "
                         f"{ms['reward_gain']['std']:.3f} | {cells[0]} | {cells[1]} | "
                         f"{ms['pair_accuracy']['mean']:.3f} | {ms['kl']['mean']:.3f} |")
        lines.append("")
    lines += ["### costs of each whole run (mean ± std over seeds)", "",
              "| method | wall s | tokens trained | tokens generated |", "|---|---|---|---|"]
    for method, cost in summary["costs"].items():
        lines.append(f"| {method} | {cost['wall_s']['mean']:.1f} ± {cost['wall_s']['std']:.1f} | "
                     f"{cost['tokens_trained']['mean']:.0f} | {cost['tokens_generated']['mean']:.0f} |")
    return "\n".join(lines)


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    """True-reward gain against trained tokens and against wall time (mean over seeds of the
    interpolated curves)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, axis in zip(axes, ("tokens_trained", "wall_s"), strict=True):
        top = min(max(p[axis] for p in r["methods"][m]["curve"]) for r in runs for m in METHODS)
        xs = np.linspace(0, top, 30)
        for method in METHODS:
            ys = np.mean([[at(r["methods"][method]["curve"], axis, x, "reward_gain") for x in xs]
                          for r in runs], axis=0)
            ax.plot(xs, ys, label=method)
        ax.set_xlabel(axis.replace("_", " "))
        ax.set_ylabel("true-reward gain (ref. std)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    c.save_figure(fig, path)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = c.evidence_parser(__doc__, c.results_of(__file__), "JSON, table, plot", workers=1)
    ap.add_argument("--seeds", type=int, default=None, help="first N seeds only (default: all)")
    args = ap.parse_args(argv)
    cfg = settings(args.quick)
    if args.seeds is not None:
        cfg["seeds"] = cfg["seeds"][:args.seeds]
    shared = {k: v for k, v in cfg.items() if k != "seeds"}
    jobs = [{**shared, "seed": s} for s in cfg["seeds"]]
    t0, load_start = time.perf_counter(), os.getloadavg()
    runs = c.run_pool(run_job, jobs, args.workers, c.job_cache("refresh", args.quick))
    summary = summarise(runs)
    name = "refresh_quick" if args.quick else "refresh"
    result = {"experiment": "refresh", "quick": args.quick, "settings": cfg,
              "testbed": vars(c.Testbed()), "methods": list(METHODS),
              "environment": c.environment(), "wall_s": time.perf_counter() - t0,
              "load_average": {"start": load_start, "end": os.getloadavg()},
              "summary": summary, "runs": runs}
    c.write_json(args.out / f"{name}.json", json.loads(json.dumps(result, default=float)))
    (args.out / f"{name}_table.md").write_text(table(summary) + "\n", encoding="utf-8")
    plot(runs, args.out / f"{name}.png")
    print(table(summary))
    c.log(f"wrote {args.out / name}.json in {result['wall_s']:.0f} s")
    return result


if __name__ == "__main__":
    main()
