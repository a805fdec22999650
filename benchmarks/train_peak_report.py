"""The tables ``benchmarks/train_peak.py`` prints: engines against the matmul peak, their
profiles, and grouppref's ratios to the other engines (markdown, for docs/benchmarks.md)."""

from __future__ import annotations

OTHERS = ("hf", "grouppref-cached", "grouppref-unshared", "grouppref-plain-head",
          "grouppref-compiled")


def _best(by_shape: dict[str, float]) -> str:
    return f"{max(v for k, v in by_shape.items() if not k.endswith('CPU-s')) / 1e9:.1f}"


def report(all_results: dict, args) -> None:
    for shape_name, res in all_results["shapes"].items():
        peak = res["matmul_peak_flops"]
        print(f"\n{shape_name}, {args.device} {args.dtype}, B={args.groups} groups of K={args.k}, "
              f"prompt {args.prompt_len} + responses {args.resp_len} tokens; median of "
              f"{args.steps} steps after {args.warmup} warm-up; matmul peak "
              f"{peak / 1e9:.1f} GFLOP/s ({res['matmul_peak_flops_per_cpu_s'] / 1e9:.1f} GFLOP "
              f"per CPU-s); sustained matmul rate {res['matmul_sustained_flops'] / 1e9:.1f} GFLOP/s "
              f"({res['matmul_sustained_flops_per_cpu_s'] / 1e9:.1f} GFLOP per CPU-s; before "
              f"{_best(res['matmul_sustained_before'])} and after {_best(res['matmul_sustained_after'])}"
              " GFLOP/s)\n")
        cpu = args.device == "cpu"
        print("| engine | s/step | data tokens/s | model tokens/s | GFLOP/step | GFLOP/s "
              "| of matmul peak | of sustained rate |"
              + (" GFLOP per CPU-s | of peak per CPU-s | of sustained per CPU-s |" if cpu else "")
              + " drift |")
        print("|---|---|---|---|---|---|---|---|" + ("---|---|---|" if cpu else "") + "---|")
        engines = res["engines"]
        for name, r in engines.items():
            per_cpu = (f" {r['flops_per_cpu_s'] / 1e9:.1f} | {r['fraction_of_peak_cpu_time']:.0%} |"
                       f" {r['fraction_of_sustained_cpu_time']:.0%} |" if cpu else "")
            print(f"| {name} | {r['median_s']:.4f} | {r['data_tokens_per_s']:.0f} | "
                  f"{r['model_tokens_per_s']:.0f} | {r['flops'] / 1e9:.1f} | "
                  f"{r['achieved_flops'] / 1e9:.1f} | {r['fraction_of_peak']:.0%} | "
                  f"{r['fraction_of_sustained']:.0%} |{per_cpu} {r['drift']:.2f} |")
        for name, r in engines.items():
            if "profile" in r:
                print_profile(name, r["profile"])
        for name, error in res["failed"].items():
            print(f"| {name} | failed: {error[:200]} |")
        print_limit_fractions(engines)
        g = engines.get("grouppref")
        for other in OTHERS:
            if g and other in engines:
                o = engines[other]
                cpu_step = {n: e["flops"] / e["flops_per_cpu_s"] for n, e in (("g", g), ("o", o))}
                print(f"grouppref / {other}: {g['data_tokens_per_s'] / o['data_tokens_per_s']:.2f}x "
                      f"data tokens/s, {g['achieved_flops'] / o['achieved_flops']:.2f}x achieved "
                      "FLOP/s" + (f"; {cpu_step['o'] / cpu_step['g']:.2f}x data tokens per CPU-s"
                                  if cpu else ""))


def print_profile(engine: str, prof: dict) -> None:
    print(f"\n{engine} profile: {prof['steps']} steps, {prof['self_ms_per_step']:.0f} ms self time "
          f"per step ({prof['clock']})\n")
    print("| op | share of self time | ms/step | calls/step |")
    print("|---|---|---|---|")
    for op in prof["ops"]:
        print(f"| {op['op']} | {op['share']:.1%} | {op['ms_per_step']:.1f} | "
              f"{op['calls_per_step']:.0f} |")


def print_limit_fractions(engines: dict) -> None:
    """Each engine against the ``matmul-limit`` engine run in the same rounds (``--interleave``)."""
    limit = engines.get("matmul-limit")
    if not limit or not any("fraction_of_limit" in r for r in engines.values()):
        return
    print(f"\nmatmul-limit: back-to-back square products, {limit['achieved_flops'] / 1e9:.1f} "
          "GFLOP/s (median step), in turns with the engines\n")
    print("| engine | of the matmul-limit rate (medians) | per round: median | min | max |")
    print("|---|---|---|---|---|")
    for name, r in engines.items():
        if "fraction_of_limit" in r:
            rounds = r["fraction_of_limit_by_round"]
            print(f"| {name} | {r['fraction_of_limit']:.0%} | "
                  f"{r['fraction_of_limit_round_median']:.0%} | {min(rounds):.0%} | "
                  f"{max(rounds):.0%} |")
