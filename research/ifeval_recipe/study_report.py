"""Tables of the recipe study's ``results.json`` (:mod:`research.ifeval_recipe.study`).

* **Learning-rate screen** (val split, seed 0, greedy): each method at each rate of the grid,
  at the curve steps and at the end; the chosen rate (best final val rate, ties: the smaller)
  is starred.
* **Test, at the chosen rate**: per method, mean over seeds of the greedy and sampled
  constraint rates and all-met rates, a t-interval over seeds and a normal interval over
  prompts, the change against the untrained model paired by prompt, KL to the start, greedy
  answer length, and a **length-controlled** rate: the share met of the constraints that a
  shorter answer does not make easier (everything but "at most N words", "one sentence" and
  "no commas").
* **Paired differences** against each peer (TRL's DPOTrainer on best-vs-worst pairs at its
  chosen rate, and at 1e-5) and against the default (``gspo_soft``), greedy, length-controlled
  and (where measured) sampled: per prompt, averaged over seeds (± 95% over prompts), and per
  seed (seed i against the peer's seed i, the seeds both have, ± a t-interval over seeds).
* **Equal trained tokens**: each method's test greedy rate at the curve point whose tokens
  trained come closest to the peer's final count (seed 0).

    python -m research.ifeval_recipe.study_report /work/study/results.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from research.common.intervals import T975, half_width, mean
from research.ifeval_cpu.report import fmt_ci, method_stats

BREVITY = {"max_words", "one_sentence", "no_comma"}
PEERS = ("trl_dpo", "trl_dpo_1e5")  # TRL's DPOTrainer at its chosen rate and at 1e-5
DEFAULT = "gspo_soft"


def lr_tag(lr: float) -> str:
    return f"{lr:.0e}".replace("e-0", "e-")


def task(results: dict[str, Any], key: str) -> dict[str, Any] | None:
    return results["tasks"].get(key)


def greedy(record: dict[str, Any]) -> list[float]:
    return [mean(p["g"]) for p in record["per_prompt"]]


def screen_table(results: dict[str, Any]) -> list[str]:
    s = results["scale_settings"]
    points = [*s["curve"], s["steps"]]
    lines = ["| method | lr | " + " | ".join(f"val @ {n}" for n in points) + " | tokens @ end |",
             "|---" * (len(points) + 3) + "|"]
    base = task(results, "eval:val:greedy:base")
    if base:
        rate = greedy(base)
        lines.append(f"| base | - | {mean(rate):.3f} ± {half_width(rate, 1.96):.3f}"
                     + " | -" * len(points) + " |")
    chosen = results.get("chosen_lr", {})
    for method in results["methods"]:
        for lr in s["lrs"]:
            name = f"{method}-lr{lr_tag(lr)}-seed0"
            train = task(results, f"train:{name}")
            if train is None:
                continue
            cells = []
            for n in points:
                key = f"eval:val:greedy:{name}" + ("" if n == s["steps"] else f"@{n}")
                got = task(results, key)
                cells.append("-" if got is None else f"{mean(greedy(got)):.3f}")
            star = "*" if chosen.get(method) == lr else ""
            lines.append(f"| {method} | {lr:g}{star} | " + " | ".join(cells)
                         + f" | {train.get('tokens_trained')} |")
    return lines


def seeds_of(results: dict[str, Any], method: str, lr: float) -> list[int]:
    """The seeds with a test evaluation at ``lr`` (a study may have grown by ``--seeds``)."""
    prefix = f"eval:test:full:{method}-lr{lr_tag(lr)}-seed"
    return sorted(int(k[len(prefix):]) for k in results["tasks"]
                  if k.startswith(prefix) and k[len(prefix):].isdigit())


def test_runs(results: dict[str, Any], kind: str = "full") -> dict[str, list[dict[str, Any]]]:
    """Per method, its test runs at the chosen rate (as report.method_stats reads them):
    ``full`` the greedy evaluations, ``sampled`` the ``--samples`` ones (fewer seeds where an
    earlier run's models were gone)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for method, lr in results.get("chosen_lr", {}).items():
        for seed in seeds_of(results, method, lr):
            name = f"{method}-lr{lr_tag(lr)}-seed{seed}"
            got, train = task(results, f"eval:test:{kind}:{name}"), task(results, f"train:{name}")
            if got is not None and train is not None:
                out.setdefault(method, []).append({**got, "tokens_trained": train["tokens_trained"],
                                                   "seed": seed})
    return out


def length_controlled(results: dict[str, Any], record: dict[str, Any]) -> float:
    """Greedy share met of the constraints brevity does not help (see the module docstring)."""
    met = []
    for prompt, p in zip(results["prompts"]["test"], record["per_prompt"], strict=True):
        met += [m for kind, m in zip(prompt["kinds"], p["g"], strict=True) if kind not in BREVITY]
    return mean([float(m) for m in met])


def main_table(results: dict[str, Any]) -> list[str]:
    base = task(results, "eval:test:full:base")
    lines = ["| method | lr | seeds | greedy (± seeds) | ± prompts | Δ vs untrained (± prompts) | "
             "sampled (± seeds; seeds) | greedy all-met | sampled all-met | KL to start | "
             "greedy length | length-controlled | tokens trained |", "|---" * 13 + "|"]
    rows = {"base": [base]} if base else {}
    rows.update(test_runs(results))
    sampled_rows = test_runs(results, "sampled")
    if (base_sampled := task(results, "eval:test:sampled:base")) is not None:
        sampled_rows["base"] = [base_sampled]
    for method, runs in rows.items():
        s = method_stats([{**r, "tokens_trained": r.get("tokens_trained", 0)} for r in runs],
                         None if method == "base" else base)
        if method in sampled_rows:  # the sampled rates from the --samples evaluations
            sampled = method_stats([{**r, "tokens_trained": r.get("tokens_trained", 0)}
                                    for r in sampled_rows[method]], None)
            s["sampled"], s["sampled_all"] = sampled["sampled"], sampled["sampled_all"]
            s["sampled"]["n"] = sampled["seeds"]
        g = s["greedy"]
        delta = f"{g['delta']:+.3f} ± {g['delta_ci']:.3f}" if "delta" in g else "-"
        length = mean([mean([p["len_g"] for p in r["per_prompt"]]) for r in runs])
        lc = [length_controlled(results, r) for r in runs]
        lc_ci = half_width(lc, T975.get(len(lc) - 1, 1.96))
        lc_cell = f"{mean(lc):.3f}" + ("" if math.isnan(lc_ci) else f" ± {lc_ci:.3f}")
        lr = results.get("chosen_lr", {}).get(method, "-")
        lines.append(f"| {method} | {lr} | {s['seeds']} | {fmt_ci(g)} | {g['prompt_ci']:.3f} | "
                     f"{delta} | {fmt_ci(s['sampled'])}"
                     + (f" ({s['sampled']['n']})" if "n" in s["sampled"] else "")
                     + f" | {fmt_ci(s['greedy_all'])} | "
                     f"{fmt_ci(s['sampled_all'])} | {fmt_ci(s['kl'])} | {length:.1f} | {lc_cell} | "
                     f"{s['tokens_trained']:.0f} |")
    return lines


def _seed_interval(values: list[float]) -> str:
    if not values:
        return "no seed in common"
    half = half_width(values, T975.get(len(values) - 1, 1.96))
    return (f"{mean(values):+.3f}" + ("" if math.isnan(half) else f" ± {half:.3f}")
            + f" ({len(values)} seeds)")


def paired(results: dict[str, Any], peer: str, kind: str = "full",
           measure: str = "greedy") -> list[str]:
    """Every method against ``peer`` on test: per prompt (each averaged over the method's
    seeds, ± 95% normal over prompts) and per seed (seed i against the peer's seed i, the
    seeds both have, ± a t-interval). ``measure``: ``greedy``, ``length_controlled`` (greedy,
    the constraints brevity does not help) or ``sampled`` (with ``kind="sampled"``)."""
    runs = test_runs(results, kind)
    if peer not in runs:
        return [f"(no {peer} {kind} test runs yet)"]

    def per_prompt(run: dict[str, Any]) -> list[float]:
        if measure == "sampled":
            return [mean([mean(x) for x in p["s"]]) for p in run["per_prompt"]]
        if measure == "length_controlled":
            return [mean([float(m) for k, m in zip(q["kinds"], p["g"], strict=True)
                           if k not in BREVITY])
                    for q, p in zip(results["prompts"]["test"], run["per_prompt"], strict=True)]
        return greedy(run)

    def rate(run: dict[str, Any]) -> float:
        return mean([x for x in per_prompt(run) if not math.isnan(x)])

    theirs = {r["seed"]: r for r in runs[peer]}
    lines = [f"| method − {peer} ({measure}) | over prompts (mean of seeds) | "
             "over seeds (seed i vs i) |", "|---|---|---|"]
    for method, mine in runs.items():
        if method == peer:
            continue
        n = len(mine[0]["per_prompt"])
        a = [mean([per_prompt(r)[i] for r in mine]) for i in range(n)]
        b = [mean([per_prompt(r)[i] for r in runs[peer]]) for i in range(n)]
        diff = [x - y for x, y in zip(a, b, strict=True) if not (math.isnan(x) or math.isnan(y))]
        by_seed = [rate(r) - rate(theirs[r["seed"]]) for r in mine if r["seed"] in theirs]
        lines.append(f"| {method} | {mean(diff):+.3f} ± {half_width(diff, 1.96):.3f} | "
                     f"{_seed_interval(by_seed)} |")
    return lines


def paired_vs_peer(results: dict[str, Any]) -> list[str]:
    """The paired tables: greedy and length-controlled against each peer (TRL's DPO at its
    chosen rate and at 1e-5) and against the default (``gspo_soft``); sampled where measured."""
    out: list[str] = []
    for peer in (*PEERS, DEFAULT):
        for measure in ("greedy", "length_controlled"):
            out += [*paired(results, peer, measure=measure), ""]
        if test_runs(results, "sampled").get(peer):
            out += [*paired(results, peer, "sampled", "sampled"), ""]
    return out[:-1]


def curve_rows(results: dict[str, Any]) -> list[str]:
    """Seed 0 at the chosen rate on test (greedy): steps, tokens and rate per curve point."""
    s = results["scale_settings"]
    lines = ["| method | " + " | ".join(f"@ {n} steps (tokens)" for n in [*s["curve"], s["steps"]])
             + " |", "|---" * (len(s["curve"]) + 2) + "|"]
    for method, lr in results.get("chosen_lr", {}).items():
        name = f"{method}-lr{lr_tag(lr)}-seed0"
        train = task(results, f"train:{name}")
        if train is None:
            continue
        cells = []
        for n in [*s["curve"], s["steps"]]:
            full = n == s["steps"]
            got = task(results, f"eval:test:{'full' if full else 'greedy'}:{name}"
                                + ("" if full else f"@{n}"))
            tokens = train.get("tokens_at", {}).get(str(n), "?")
            cells.append("-" if got is None else f"{mean(greedy(got)):.3f} ({tokens})")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def markdown(results: dict[str, Any]) -> str:
    counts = {k: len(v) for k, v in results["prompts"].items()}
    out = [f"Recipe study: prompts {counts}, scale {results['scale']}, settings "
           f"{results['scale_settings']}", "", "Learning-rate screen (val, seed 0, greedy; * the "
           "chosen rate):", "", *screen_table(results), "", "Test split at the chosen rate:", "",
           *main_table(results), "", "Paired differences on test:", "",
           *paired_vs_peer(results), "", "Learning curve on test (seed 0, greedy; tokens trained "
           "in brackets):", "", *curve_rows(results)]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path)
    args = ap.parse_args()
    print(markdown(json.loads(args.results.read_text())))


if __name__ == "__main__":
    main()
