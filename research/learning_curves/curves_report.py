"""Summaries, tables and plots of :mod:`research.learning_curves.curves`.

Every interval is a paired Student-t 95% CI over seeds (same task, candidates and panel per
seed). *Equal steps* compares each method with ``dpo_consensus`` after the same number of
updates; *equal tokens* compares it with ``dpo_consensus`` after as many forwarded tokens
(DPO evaluated at ``round(step · tokens ratio)``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from research import common as c
from research.learning_curves import curves_plots as plots
from research.learning_curves.curves_spec import BASE, METHODS, has_group_size_runs

METRICS = ("pair_accuracy", "reward_gain", "kl")
Row = dict[str, Any]


def training_seconds(rows: list[Row]) -> float:
    """Sum of the measured training wall time of every (job, method) run."""
    seen = {(r["experiment"], r["setting"], r["k"], r["prompts"], r["condition"], r["seed"],
             r["method"]): r["wall_s"] for r in rows}
    return float(sum(seen.values()))


def _select(rows: list[Row], **keys: Any) -> list[Row]:
    return [r for r in rows if all(r[k] == v for k, v in keys.items())]


def _by_seed(rows: list[Row], method: str, step: int) -> dict[int, Row]:
    return {r["seed"]: r for r in rows if r["method"] == method and r["step"] == step}


def _paired(a: dict[int, Row], b: dict[int, Row], metric: str) -> dict[str, float]:
    seeds = sorted(set(a) & set(b))
    return c.paired_ci([a[s][metric] for s in seeds], [b[s][metric] for s in seeds])


def base_step(rows: list[Row], step: int, k: int) -> int:
    """The DPO step with the tokens of ``step`` group-loss steps (the closest evaluated one)."""
    steps = sorted({r["step"] for r in rows if r["method"] == BASE})
    tok = next(r["tokens"] / r["step"] for r in rows if r["method"] != BASE
               and not r["method"].startswith("dpo"))
    per = next(r["tokens"] / r["step"] for r in rows if r["method"] == BASE)
    target = step * tok / per
    return min(steps, key=lambda s: abs(s - target)) if k > 2 else step


def summarise_cell(rows: list[Row], steps: list[int], k: int) -> dict[str, Any]:
    """One (setting, K, condition): per step and method mean ± std, Δ vs DPO at equal steps and
    at equal tokens, and each method minus the prompt-independent ceiling."""
    methods = sorted({r["method"] for r in rows}, key=lambda m: list(METHODS).index(m))
    first = [r for r in rows if r["method"] == methods[0] and r["step"] == steps[0]]
    out: dict[str, Any] = {
        "seeds": sorted(r["seed"] for r in first), "prompts": first[0]["prompts"],
        "ceiling": c.mean_std([r["independent_ceiling"] for r in first]),
        "noise_estimate": c.mean_std([r["noise_estimate"] for r in first
                                      if r["noise_estimate"] is not None]),
        "realised_flip_rate": c.mean_std([sum(r["realised_flip_rates"]) / len(r["realised_flip_rates"])
                                          for r in first]),
        "targets": {name: {x: c.mean_std([r["targets"][name][x] for r in first])
                           for x in first[0]["targets"][name]} for name in first[0]["targets"]},
        "tokens_per_step": {m: next(r["tokens"] // r["step"] for r in rows if r["method"] == m)
                            for m in methods},
        "steps": {}}
    ceiling = {r["seed"]: {"pair_accuracy": r["independent_ceiling"]} for r in first}
    for step in steps:
        block: dict[str, Any] = {"methods": {}, "equal_steps": {}, "equal_tokens": {},
                                 "minus_ceiling": {}}
        base_eq = _by_seed(rows, BASE, step)
        base_tok = _by_seed(rows, BASE, base_step(rows, step, k)) if BASE in methods else {}
        block["dpo_step_at_equal_tokens"] = base_step(rows, step, k) if BASE in methods else None
        for m in methods:
            at = _by_seed(rows, m, step)
            if not at:
                continue
            block["methods"][m] = {x: c.mean_std([r[x] for r in at.values()]) for x in METRICS}
            block["minus_ceiling"][m] = _paired(at, ceiling, "pair_accuracy")
            if m != BASE and base_eq:
                block["equal_steps"][m] = {x: _paired(at, base_eq, x) for x in METRICS}
                if not m.startswith("dpo"):
                    block["equal_tokens"][m] = {x: _paired(at, base_tok, x) for x in METRICS}
        out["steps"][str(step)] = block
    out["best"] = best_along_curve(rows, methods)
    if BASE in methods:  # the extended DPO curve, for plots against tokens
        out["dpo_curve"] = {str(s): {x: c.mean_std([r[x] for r in _by_seed(rows, BASE, s).values()])
                                     for x in METRICS} | {"tokens": _by_seed(rows, BASE, s)[
                                         min(_by_seed(rows, BASE, s))]["tokens"]}
                            for s in sorted({r["step"] for r in rows if r["method"] == BASE})}
    return out


def best_along_curve(rows: list[Row], methods: list[str]) -> dict[str, Any]:
    """Each method's best value over all its evaluations (DPO's extended steps included),
    per seed; mean ± std and the paired difference against DPO's best. The same held-out set
    picks and scores the best point, so these are optimistic for every method alike (an
    oracle early stop), not estimates of what a user would get."""
    out: dict[str, Any] = {}
    best = {m: {x: {} for x in METRICS[:2]} for m in methods}
    for r in rows:
        for x in METRICS[:2]:
            cur = best[r["method"]][x].get(r["seed"])
            if cur is None or r[x] > cur[x]:
                best[r["method"]][x][r["seed"]] = r
    for m in methods:
        out[m] = {x: {**c.mean_std([r[x] for r in best[m][x].values()]),
                      "step": c.mean_std([r["step"] for r in best[m][x].values()])}
                  for x in METRICS[:2]}
        if m != BASE and BASE in methods:
            for x in METRICS[:2]:
                out[m][x]["vs_dpo"] = _paired(best[m][x], best[BASE][x], x)
    return out


def best_table(summary: dict[str, Any], metric: str) -> str:
    """Per K and condition: each method's best along its curve, Δ vs DPO's best."""
    lines = ["| K | condition | " + " | ".join(METHODS) + " |", "|" + "---|" * (2 + len(METHODS))]
    for k, per in summary["noise"].items():
        for cond, cell in per.items():
            cells = []
            for m in METHODS:
                b = cell["best"].get(m)
                if b is None:
                    cells.append("—")
                    continue
                d = b[metric]
                txt = f"{d['mean']:.3f} (step {d['step']['mean']:.0f})"
                cells.append(txt + (f"<br>Δ {_ci(d['vs_dpo'])}" if "vs_dpo" in d else ""))
            lines.append(f"| {k} | {cond} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summarise(result: dict[str, Any]) -> dict[str, Any]:
    """Experiment 1 per K and condition; experiment 2 per setting and K (noise 0.1)."""
    rows, cfg = result["runs"], result["settings"]
    steps = cfg["steps"]
    out: dict[str, Any] = {"noise": {}, "group_size": {"equal_prompts": {}, "equal_budget": {}}}
    for k, spec in cfg["noise"].items():
        out["noise"][k] = {cond: summarise_cell(_select(rows, experiment="noise", k=int(k),
                                                        condition=cond), steps, int(k))
                           for cond in spec["conditions"]
                           if _select(rows, experiment="noise", k=int(k), condition=cond)}
    seeds = cfg["group_size"]["seeds"]
    for setting in ("equal_prompts", "equal_budget"):
        for k in sorted({*cfg["group_size"][setting], *(int(x) for x in cfg["noise"])}):
            sel = _select(rows, experiment="group_size", setting=setting, k=k)
            if not sel:  # K = 4 and 8 at 2,000 prompts come from experiment 1 (noise 0.1)
                n_ok = cfg["prompts"] if setting == "equal_prompts" else cfg["budget"] // k
                sel = [r for r in _select(rows, experiment="noise", k=k, condition="noise=0.1")
                       if r["prompts"] == n_ok and r["seed"] in seeds
                       and r["method"] in ("dpo_consensus", "gspo_soft", "gspo_cal")]
            if sel:
                out["group_size"][setting][str(k)] = summarise_cell(sel, steps, k)
    return out


def _ci(d: dict[str, float], digits: int = 3) -> str:
    return f"{d['mean']:+.{digits}f} [{d['lo']:+.{digits}f}, {d['hi']:+.{digits}f}]"


def _ms(d: dict[str, float]) -> str:
    return f"{d['mean']:.3f} ± {d['std']:.3f}"


def noise_table(summary: dict[str, Any], k: str, metric: str, steps: list[int]) -> str:
    """Rows condition x method; per step: mean ± std, Δ vs DPO at equal steps, at equal tokens."""
    cols = [f"{h} @ {s}" for s in steps for h in (metric, "Δ equal steps", "Δ equal tokens")]
    lines = ["| condition | method | " + " | ".join(cols) + " |", "|" + "---|" * (2 + len(cols))]
    for cond, cell in summary["noise"][k].items():
        for m in METHODS:
            if m not in cell["steps"][str(steps[0])]["methods"]:
                continue
            cells = []
            for s in steps:
                b = cell["steps"][str(s)]
                cells.append(_ms(b["methods"][m][metric]))
                cells.append(_ci(b["equal_steps"][m][metric]) if m in b["equal_steps"] else "—")
                cells.append(_ci(b["equal_tokens"][m][metric]) if m in b["equal_tokens"]
                             else (f"(DPO @ {b['dpo_step_at_equal_tokens']} steps: "
                                   f"{_ms(cell['dpo_curve'][str(b['dpo_step_at_equal_tokens'])][metric])})"
                                   if m == BASE else "—"))
            lines.append(f"| {cond} | {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ceiling_table(summary: dict[str, Any], step: int) -> str:
    """Per K and condition: the ceiling and each method's pair accuracy minus it."""
    lines = ["| K | condition | ceiling | " + " | ".join(f"{m} − ceiling" for m in METHODS) + " |",
             "|" + "---|" * (3 + len(METHODS))]
    for k, per in summary["noise"].items():
        for cond, cell in per.items():
            mc = cell["steps"][str(step)]["minus_ceiling"]
            lines.append(f"| {k} | {cond} | {_ms(cell['ceiling'])} | " + " | ".join(
                _ci(mc[m]) if m in mc else "—" for m in METHODS) + " |")
    return "\n".join(lines)


def targets_table(summary: dict[str, Any]) -> str:
    """Per K and condition: noise, and how well each kind of target matches the truth."""
    lines = ["| K | condition | realised flip | estimated noise | p(best≻worst) soft / cal | "
             "log loss soft / cal / hard | Brier soft / cal / hard |", "|---|---|---|---|---|---|---|"]
    for k, per in summary["noise"].items():
        for cond, cell in per.items():
            t = cell["targets"]
            lines.append(
                f"| {k} | {cond} | {cell['realised_flip_rate']['mean']:.3f} | "
                f"{cell['noise_estimate']['mean']:.3f} | {t['soft']['p_best_worst']['mean']:.3f} / "
                f"{t['cal']['p_best_worst']['mean']:.3f} | "
                + " / ".join(f"{t[n]['log_loss']['mean']:.3f}" for n in ("soft", "cal", "hard"))
                + " | " + " / ".join(f"{t[n]['brier']['mean']:.3f}" for n in ("soft", "cal", "hard"))
                + " |")
    return "\n".join(lines)


def targets_effect_table(summary: dict[str, Any], step: int, metric: str) -> str:
    """Finding 1: calibrated and hard targets minus the soft (BT) targets, paired by seed."""
    lines = [f"| K | condition | gspo_soft {metric} | gspo_cal − gspo_soft | gspo_hard − gspo_soft |"
             " gspo_soft − DPO | gspo_cal − DPO |", "|---|---|---|---|---|---|---|"]
    for k, per in summary["noise"].items():
        for cond, cell in per.items():
            b = cell["steps"][str(step)]
            es = b["equal_steps"]
            lines.append(f"| {k} | {cond} | {_ms(b['methods']['gspo_soft'][metric])} | "
                         f"{_ci(b['cal_minus_soft'][metric])} | "
                         f"{_ci(b['hard_minus_soft'][metric])} | {_ci(es['gspo_soft'][metric])} | "
                         f"{_ci(es['gspo_cal'][metric])} |")
    return "\n".join(lines)


def add_target_contrasts(result: dict[str, Any], summary: dict[str, Any]) -> None:
    """Paired ``gspo_cal − gspo_soft`` and ``gspo_hard − gspo_soft`` per K, condition, step."""
    rows = result["runs"]
    for k, per in summary["noise"].items():
        for cond, cell in per.items():
            sel = _select(rows, experiment="noise", k=int(k), condition=cond)
            for step, b in cell["steps"].items():
                soft = _by_seed(sel, "gspo_soft", int(step))
                b["cal_minus_soft"] = {x: _paired(_by_seed(sel, "gspo_cal", int(step)), soft, x)
                                       for x in METRICS}
                b["hard_minus_soft"] = {x: _paired(_by_seed(sel, "gspo_hard", int(step)), soft, x)
                                        for x in METRICS}


def group_size_table(summary: dict[str, Any], metric: str, step: int) -> str:
    lines = ["| setting | K | prompts | dpo_consensus | gspo_soft | gspo_cal | soft − DPO (steps) | "
             "cal − DPO (steps) | soft − DPO (tokens) | cal − DPO (tokens) |",
             "|" + "---|" * 10]
    for setting, per_k in summary["group_size"].items():
        for k, cell in sorted(per_k.items(), key=lambda kv: int(kv[0])):
            b = cell["steps"][str(step)]
            tok = [(_ci(b["equal_tokens"][m][metric]) if setting == "equal_prompts"
                    and m in b["equal_tokens"] else "—") for m in ("gspo_soft", "gspo_cal")]
            lines.append(f"| {setting} | {k} | {cell['prompts']} | "
                         + " | ".join(_ms(b["methods"][m][metric]) for m in
                                      ("dpo_consensus", "gspo_soft", "gspo_cal"))
                         + f" | {_ci(b['equal_steps']['gspo_soft'][metric])} | "
                         f"{_ci(b['equal_steps']['gspo_cal'][metric])} | " + " | ".join(tok) + " |")
    return "\n".join(lines)


def robustness(rows: list[Row], k: int, step: int, clean: str = "noise=0.0") -> dict[str, Any]:
    """Per noisy condition and method: the paired change against the method's own noise-free
    run (same seed: same task and candidates, only the panel differs), in % of the clean mean."""
    sel = _select(rows, experiment="noise", k=k, step=step)
    at = {(r["condition"], r["seed"], r["method"]): r for r in sel}
    out: dict[str, Any] = {}
    for cond in dict.fromkeys(r["condition"] for r in sel):
        if cond == clean:
            continue
        for m in dict.fromkeys(r["method"] for r in sel):
            seeds = sorted(s for (cc, s, mm) in at if cc == cond and mm == m and (clean, s, m) in at)
            for x in METRICS[:2]:
                a = [at[(cond, s, m)][x] for s in seeds]
                b = [at[(clean, s, m)][x] for s in seeds]
                ci, base = c.paired_ci(a, b), sum(b) / len(b)
                out.setdefault(cond, {}).setdefault(m, {})[x] = {
                    key: 100 * ci[key] / base for key in ("mean", "lo", "hi")}
    return out


def robustness_table(result: dict[str, Any], step: int) -> str:
    lines = ["| K | condition | method | pair accuracy change | reward gain change |",
             "|---|---|---|---|---|"]
    for k in result["settings"]["noise"]:
        rob = robustness(result["runs"], int(k), step)
        for cond, per in rob.items():
            for m in METHODS:
                if m in per:
                    cells = [f"{per[m][x]['mean']:+.1f}% [{per[m][x]['lo']:+.1f}, {per[m][x]['hi']:+.1f}]"
                             for x in METRICS[:2]]
                    lines.append(f"| {k} | {cond} | {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def relative_table(summary: dict[str, Any], step: int, metric: str) -> str:
    """Verdict (a): each group loss minus DPO, in points and in % of DPO's mean: at equal
    steps, at equal tokens, and best along the curve."""
    lines = ["| K | condition | method | equal steps | equal tokens | best along the curve |",
             "|---|---|---|---|---|---|"]
    for k, per in summary["noise"].items():
        for cond, cell in per.items():
            b = cell["steps"][str(step)]
            base = b["methods"][BASE][metric]["mean"]
            tok = cell["dpo_curve"][str(b["dpo_step_at_equal_tokens"])][metric]["mean"]
            best = cell["best"][BASE][metric]["mean"]
            for m in ("gspo_hard", "gspo_soft", "plackett_luce"):
                d = (b["equal_steps"][m][metric], b["equal_tokens"][m][metric],
                     cell["best"][m][metric]["vs_dpo"])
                cells = [f"{_ci(x)} ({100 * x['mean'] / ref:+.1f}%)"
                         for x, ref in zip(d, (base, tok, best), strict=True)]
                lines.append(f"| {k} | {cond} | {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


JOB_FIELDS = ("experiment", "setting", "k", "prompts", "condition", "seed", "noise_estimate",
              "annotator_weights", "realised_flip_rates", "independent_ceiling", "targets")


def _rounded(obj: Any) -> Any:
    """Floats to 5 significant digits (the JSON is committed; the tables show 3)."""
    if isinstance(obj, float):
        return float(f"{obj:.5g}")
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rounded(v) for v in obj]
    return obj


def pack(result: dict[str, Any]) -> dict[str, Any]:
    """The result as written: the fields shared by one job's rows once per job (``jobs``),
    each row keeping its method, step and metrics plus the index of its job."""
    jobs: list[dict[str, Any]] = []
    index: dict[str, int] = {}
    runs = []
    for row in result["runs"]:
        job = {f: row[f] for f in JOB_FIELDS}
        key = repr([job[f] for f in JOB_FIELDS[:6]])
        if key not in index:
            index[key] = len(jobs)
            jobs.append(job)
        runs.append({"job": index[key], **{f: v for f, v in row.items() if f not in JOB_FIELDS}})
    return _rounded({**result, "jobs": jobs, "runs": runs})


def unpack(result: dict[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`pack` (a result written before packing is returned as it is)."""
    if "jobs" not in result:
        return result
    jobs = result.pop("jobs")
    result["runs"] = [{**jobs[r["job"]], **{f: v for f, v in r.items() if f != "job"}}
                      for r in result["runs"]]
    return result


def write_outputs(result: dict[str, Any], out: Path, name: str) -> str:
    """JSON (with the summary, packed), markdown tables and plots; returns the tables."""
    result = unpack(result)
    result["runs"] = _rounded(result["runs"])  # as written, so --replot gives the same tables
    cfg = result["settings"]
    summary = summarise(result)
    add_target_contrasts(result, summary)
    result["summary"] = summary
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(pack(result), separators=(",", ":")) + "\n",
                                      encoding="utf-8")
    last = cfg["steps"][-1]
    early = cfg["steps"][1] if len(cfg["steps"]) > 2 else cfg["steps"][0]
    parts = ["## Prompt-independent ceiling: pair accuracy minus ceiling @ "
             f"{last} steps\n\n" + ceiling_table(summary, last),
             "## Targets against the truth (training groups)\n\n" + targets_table(summary)]
    for k in summary["noise"]:
        for metric in METRICS[:2]:
            parts.append(f"## K = {k}: {metric}\n\n" + noise_table(summary, k, metric, [early, last]))
    for metric in METRICS[:2]:
        parts.append(f"## Best along the curve (oracle early stop): {metric}\n\n"
                     + best_table(summary, metric))
    for metric in METRICS[:2]:
        parts.append(f"## Group losses minus DPO, points and % of DPO, @ {last} steps: {metric}\n\n"
                     + relative_table(summary, last, metric))
    if all("noise=0.0" in spec["conditions"] for spec in cfg["noise"].values()):
        for step in (early, last):
            parts.append(f"## Change against the method's own noise-free run @ {step} steps "
                         "(paired by seed, % of the clean mean, 95% CI)\n\n"
                         + robustness_table(result, step))
    for metric in METRICS[:2]:
        parts.append(f"## Targets: calibrated / hard minus soft, {metric} @ {last} steps\n\n"
                     + targets_effect_table(summary, last, metric))
    if has_group_size_runs(result):
        for metric in METRICS[:2]:
            parts.append(f"## Group size (noise 0.1): {metric} @ {last} steps\n\n"
                         + group_size_table(summary, metric, last))
    tables = "\n\n".join(parts)
    (out / f"{name}_tables.md").write_text(tables + "\n", encoding="utf-8")
    plots.plot_all(result, out, name)
    return tables
