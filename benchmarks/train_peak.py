"""Training step at the hardware limit: grouppref's step in achieved FLOP/s against the machine's
matmul peak measured in the same run, and against a plain Hugging Face forward/backward.

The step is the trainer's (``grouppref.train.policy.step.run_steps``: ``group_logps`` + GSPO loss +
backward + fused AdamW). Where ``loop`` cannot be imported (it needs pydantic, e.g. on a bare
GPU box with only torch + transformers), the script runs the same GSPO step from
``grouppref.train.tensors.logps`` and ``grouppref.train.objective.losses`` (torch-only modules) and says so.

Workload: a random-init Llama-shaped model (``--shape``: SmolLM2-135M or a Llama-3.2-1B shape),
B groups of K candidates, a P-token prompt and T-token responses (no padding), random token ids.
Engines, each on a fresh model with the same seed, one after the other in this process:

* ``grouppref``: the packed shared-prefix pass (``share_prefix=True``, sdpa models);
* ``grouppref-cached``: the two-pass KV-cache fallback (prefix sharing as before the packed pass);
* ``grouppref-unshared``: ``share_prefix=False`` (N rows of prompt + response);
* ``grouppref-plain-head`` (only when named in ``--engines``): the packed pass with the model's
  own LM head and ``taken_logps`` instead of the fused head (``train/tensors/token_logps.py``), to measure it;
* ``grouppref-compiled`` (only when named): the packed pass with each decoder layer compiled as
  ``train --compile`` does (``packing.compile_layers``); its first warm-up steps include the
  compile (printed), so give it ``--warmup`` >= 3;
* ``matmul-limit`` (only when named): not a model: back-to-back square ``torch.matmul``
  products (2048³ on CPU, 8192³ on GPU) doing the FLOPs of one packed step, a step of pure
  matmul. With ``--interleave`` it runs in turns with the engines, so its rate is the limit
  measured in the same rounds and on the same time scale as the steps (the peak below is a
  burst of milliseconds taken before them); each engine's ratio to it is printed per round;
* ``hf``: the peer, a plain ``model(input_ids, labels=...).loss.backward()`` + the same AdamW on the
  same N = B·K rows of prompt + response (labels on the response tokens), what a trainer without
  prefix sharing or grouppref's log-prob code runs.

FLOPs are analytic and count useful work only: ``6 · non-embedding params`` per token run
through the model, ``6 · d · V`` per logit row that reaches the LM head, and ``12 · H · d_head``
per attended (query, key) pair per layer (causal pairs only; padding and masked entries computed
by a dense kernel are not counted). Achieved FLOP/s = FLOPs / step time; its ratio to the
measured matmul limit is the fraction of the limit reached, against two measures of the limit
(``benchmarks/matmul_limit.py``, square and model-shaped ``torch.matmul`` in the model dtype):
the peak (the fastest short burst) and the sustained rate (median over windows of back-to-back
products, measured before and after the engines and averaged: like for like with a median
step). Data tokens/s counts the distinct tokens of the groups consumed (B·(P + K·T) per step),
the same for every engine: the user-facing throughput.

Usage::

    python benchmarks/train_peak.py --device cpu --shape smollm2-135m --groups 1 \
        --prompt-len 32 --resp-len 32 --threads 2 --out /tmp/train_peak.json
    python benchmarks/train_peak.py --device cuda --dtype bf16 --shape smollm2-135m,llama-1b \
        --groups 8 --prompt-len 256 --resp-len 256 --out "$OUT/train_peak.json"
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.matmul_limit import model_peak, model_sustained  # noqa: E402
from benchmarks.train_peak_report import report  # noqa: E402
from grouppref.train.objective.losses import gspo_loss, implicit_rewards
from grouppref.train.tensors import logps as logps_mod
from grouppref.train.tensors import packing
from grouppref.train.tensors.batch import GroupBatch
from grouppref.train.tensors.logps import group_logps

SHAPES = {  # LlamaConfig fields of the public models (weights random here)
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                         tie_word_embeddings=True, rope_theta=100000.0),
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                     tie_word_embeddings=True, rope_theta=500000.0),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1000, tie_word_embeddings=True),
}
ENGINES = ("grouppref", "grouppref-cached", "grouppref-unshared", "hf")
OPTIONAL_ENGINES = ("grouppref-plain-head", "grouppref-compiled", "matmul-limit")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_batch(shape: dict, args, device: torch.device) -> GroupBatch:
    """B groups, K candidates, no padding; candidate i preferred to j for i < j (p = 1, w = 1)."""
    b, k, p, t = args.groups, args.k, args.prompt_len, args.resp_len
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, shape["vocab_size"], (b, p + k * t), generator=g)
    upper = torch.ones(k, k).triu(1)
    return GroupBatch(
        prompt_ids=ids[:, :p], prompt_mask=torch.ones(b, p, dtype=torch.long),
        cand_ids=ids[:, p:].reshape(b, k, t), cand_mask=torch.ones(b, k, t, dtype=torch.long),
        valid=torch.ones(b, k, dtype=torch.bool),
        p_ij=(upper + 0.5 * torch.eye(k)).expand(b, k, k).contiguous(),
        w_ij=(1 - torch.eye(k)).expand(b, k, k).contiguous(),
        order=torch.arange(k).expand(b, k).contiguous(), ref_logps=None,
        behavior_logps=torch.full((b, k), float("nan")), num_tokens=torch.full((b, k), t),
        group_ids=[f"g{i}" for i in range(b)]).to(device)


def gspo_step():
    """The trainer's step and its name: ``step.run_steps`` or the same GSPO step without it."""
    try:
        from grouppref.train.policy.step import Objective, run_steps
    except ImportError as e:  # pydantic missing (bare GPU box): same math from torch-only modules
        def step(model, optim, batch, share_prefix):
            logps = group_logps(model, batch, share_prefix=share_prefix)
            s = implicit_rewards(logps, batch.ref_logps, 0.1, batch.num_tokens, False)
            loss = gspo_loss(s, batch.p_ij, batch.w_ij, batch.valid)
            optim.zero_grad(set_to_none=True)
            loss.mean().backward()
            optim.step()

        return step, f"logps.group_logps + losses.gspo_loss (step.run_steps not importable: {e})"

    def step(model, optim, batch, share_prefix):
        run_steps(model, optim, [batch], Objective(), share_prefix=share_prefix)

    return step, "grouppref.train.policy.step.run_steps"


def hf_rows(batch: GroupBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The peer's input: N rows [prompt | response], labels -100 on the prompt."""
    b, k, t = batch.cand_ids.shape
    ids = torch.cat([batch.prompt_ids[:, None].expand(b, k, -1), batch.cand_ids], dim=2)
    ids = ids.reshape(b * k, -1)
    labels = ids.clone()
    labels[:, : batch.prompt_ids.shape[1]] = -100
    return ids, labels


def flops(engine: str, cfg, args) -> dict[str, float]:
    """Analytic useful FLOPs of one training step (forward + backward) and its token counts."""
    b, k, p, t = args.groups, args.k, args.prompt_len, args.resp_len
    d, v, layers = cfg.hidden_size, cfg.vocab_size, cfg.num_hidden_layers
    heads, head_dim = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    kv = cfg.num_key_value_heads
    per_layer = (d * heads * head_dim + 2 * d * kv * head_dim + heads * head_dim * d
                 + 3 * d * cfg.intermediate_size)
    dense = layers * per_layer  # non-embedding matmul params (norms are negligible)

    def causal(n: int) -> int:
        return n * (n + 1) // 2

    if engine == "matmul-limit":  # not a model: back-to-back square products (build_engine)
        square, count = limit_products(cfg, args)
        return {"flops": float(2 * square**3 * count), "model_tokens": 0, "logit_rows": 0,
                "data_tokens": 0}
    if engine.startswith("grouppref") and engine != "grouppref-unshared":  # prompt once, K on top
        tokens = b * (p + k * (t - 1))
        rows = b * (1 + k * (t - 1))  # each prompt's last position + response positions
        pairs = b * (causal(p) + k * ((t - 1) * p + causal(t - 1)))
    elif engine == "grouppref-unshared":  # N rows of prompt + response minus its last token
        tokens, rows, pairs = b * k * (p + t - 1), b * k * t, b * k * causal(p + t - 1)
    elif engine == "trl":  # DPO on the K(K-1)/2 pairs: prompt + chosen, prompt + rejected rows;
        n = b * k * (k - 1)  # its fused LM head projects the completion positions only
        tokens, rows, pairs = n * (p + t), n * t, n * causal(p + t)
    else:  # hf: N rows of prompt + response; logits on every position
        tokens, rows, pairs = b * k * (p + t), b * k * (p + t), b * k * causal(p + t)
    total = 6 * dense * tokens + 6 * d * v * rows + 12 * heads * head_dim * pairs * layers
    return {"flops": float(total), "model_tokens": tokens, "logit_rows": rows,
            "data_tokens": b * (p + k * t)}


def limit_products(cfg, args) -> tuple[int, int]:
    """The ``matmul-limit`` engine's work: (S, n), n back-to-back S x S x S products (S = 2048 on
    CPU, 8192 on GPU) doing at least the FLOPs of one packed grouppref step."""
    square = 2048 if args.device == "cpu" else 8192
    return square, max(1, math.ceil(flops("grouppref", cfg, args)["flops"] / (2 * square**3)))


def matmul_limit_engine(cfg, args, device, dtype):
    """A step of pure matmul as long as a training step: interleaved with the engines, its rate
    is the limit measured in the same rounds, on the step's time scale."""
    square, count = limit_products(cfg, args)
    a = torch.randn(square, square, device=device, dtype=dtype)
    b = torch.randn(square, square, device=device, dtype=dtype)

    def one() -> None:
        for _ in range(count):
            a @ b

    return one


def build_engine(engine: str, shape_name: str, args, device, dtype, step, ref):
    """A fresh model, optimizer and batch for ``engine``; returns its step closure, the model's
    config and the reference log-probs (computed once, by the first engine)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = SHAPES[shape_name]
    cfg = LlamaConfig(**shape, max_position_embeddings=4096, attn_implementation="sdpa")
    if engine == "matmul-limit":
        return matmul_limit_engine(cfg, args, device, dtype), cfg, ref
    torch.manual_seed(0)
    with device:
        model = LlamaForCausalLM(cfg).to(dtype).train()
    batch = make_batch(shape, args, device)
    if ref is None:
        with torch.no_grad():
            ref = group_logps(model, batch)
    batch.ref_logps = ref
    if engine == "grouppref-cached":
        logps_mod._FALLBACK[model] = "benchmark: the two-pass KV-cache path"
    if engine == "grouppref-plain-head":
        logps_mod._NO_FUSED_HEAD[model] = "benchmark: the model's own LM head + taken_logps"
    if engine == "grouppref-compiled":  # as `train --compile`: each decoder layer, inductor
        packing.compile_layers(model)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    ids, labels = hf_rows(batch)

    def one() -> None:
        if engine == "hf":
            optim.zero_grad(set_to_none=True)
            model(input_ids=ids, labels=labels, use_cache=False).loss.backward()
            optim.step()
        else:
            step(model, optim, batch, engine != "grouppref-unshared")

    return one, cfg, ref


def timed(one, device, times: list, cpu: list) -> None:
    start, start_cpu = time.perf_counter(), time.process_time()
    one()
    sync(device)
    times.append(time.perf_counter() - start)
    cpu.append(time.process_time() - start_cpu)


def run_engines(engines: list[str], shape_name: str, args, device, dtype, step, ref) -> tuple:
    """Time ``engines``: each warmed up, then their measured steps in turns (one engine: plain
    sequence) so that a shared machine's load hits them alike. Returns results by engine, ref."""
    built, times, cpu = {}, {}, {}
    for engine in engines:
        built[engine], cfg, ref = build_engine(engine, shape_name, args, device, dtype, step, ref)
        times[engine], cpu[engine] = [], []
        for _ in range(args.warmup):
            timed(built[engine], device, times[engine], cpu[engine])
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(args.steps):
        for engine in engines:
            timed(built[engine], device, times[engine], cpu[engine])
    return {e: summarise(e, shape_name, cfg, args, device, built[e], times[e], cpu[e])
            for e in engines}, ref


def summarise(engine: str, shape_name: str, cfg, args, device, one, times, cpu) -> dict:
    measured = times[args.warmup:]
    half = len(measured) // 2
    profile = profile_steps(one, args.profile, device) if args.profile else None
    out = {"engine": engine, "shape": shape_name, "step_times": times,
           "median_s": statistics.median(measured), "mean_s": statistics.fmean(measured),
           "drift": (statistics.fmean(measured[half:]) / statistics.fmean(measured[:half])
                     if half else float("nan")),
           **flops(engine, cfg, args)}
    out["achieved_flops"] = out["flops"] / out["median_s"]
    out["step_cpu_times"] = cpu
    out["flops_per_cpu_s"] = out["flops"] / statistics.median(cpu[args.warmup:])
    out["model_tokens_per_s"] = out["model_tokens"] / out["median_s"]
    out["data_tokens_per_s"] = out["data_tokens"] / out["median_s"]
    if device.type == "cuda":
        out["peak_mem_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
    if profile is not None:
        out["profile"] = profile
    return out


def profile_steps(one, steps: int, device: torch.device, top: int = 14) -> dict:
    """Self time per operator over ``steps`` more steps under ``torch.profiler``.

    Self times are what each operator spent outside its children, so they add up to the step;
    shares of that total are comparable across runs on a loaded machine, absolute times are not.
    """
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            one()
        sync(device)
    attr = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = [(e.key, getattr(e, attr), e.count) for e in prof.key_averages()]
    total = sum(t for _, t, _ in events)
    events.sort(key=lambda e: -e[1])
    return {"steps": steps, "self_ms_per_step": total / 1e3 / steps, "clock": attr,
            "ops": [{"op": k, "share": t / total, "ms_per_step": t / 1e3 / steps,
                     "calls_per_step": c / steps} for k, t, c in events[:top]]}


def bench_shape(shape_name: str, args, device, dtype, step) -> dict:
    m = args.groups * (args.prompt_len + args.k * args.resp_len)
    peaks, peak, peak_cpu = model_peak(SHAPES[shape_name], m, device, dtype, args.peak_seconds)
    before = model_sustained(SHAPES[shape_name], m, device, dtype, args.peak_seconds)
    results, failed, ref = {}, {}, None
    for group in ([args.engines] if args.interleave else [[e] for e in args.engines]):
        try:
            done, ref = run_engines(group, shape_name, args, device, dtype, step, ref)
        except Exception as e:  # one failing engine (OOM, API drift) must not lose the rest
            print(f"{shape_name} {group} FAILED: {type(e).__name__}: {e}", file=sys.stderr)
            failed.update({engine: f"{type(e).__name__}: {e}" for engine in group})
            continue
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        results.update(done)
        for engine, r in done.items():
            print(f"{shape_name} {engine}: {r['median_s']:.4f} s/step, {r['achieved_flops'] / 1e9:.1f}"
                  f" GFLOP/s; warm-up steps {', '.join(f'{t:.1f}' for t in r['step_times'][:args.warmup])} s",
                  file=sys.stderr)
    after = model_sustained(SHAPES[shape_name], m, device, dtype, args.peak_seconds)
    sustained, sustained_cpu = (before[1] + after[1]) / 2, (before[2] + after[2]) / 2
    for r in results.values():
        r["fraction_of_peak"] = r["achieved_flops"] / peak
        r["fraction_of_peak_cpu_time"] = r["flops_per_cpu_s"] / peak_cpu
        r["fraction_of_sustained"] = r["achieved_flops"] / sustained
        r["fraction_of_sustained_cpu_time"] = r["flops_per_cpu_s"] / sustained_cpu
    if (limit := results.get("matmul-limit")) and args.interleave:
        add_limit_fractions(results, limit, args.warmup)
    return {"matmul_peak_flops": peak, "matmul_peak_flops_per_cpu_s": peak_cpu,
            "matmul_flops_by_shape": peaks, "matmul_sustained_flops": sustained,
            "matmul_sustained_flops_per_cpu_s": sustained_cpu,
            "matmul_sustained_before": before[0], "matmul_sustained_after": after[0],
            "engines": results, "failed": failed}


def add_limit_fractions(results: dict, limit: dict, warmup: int) -> None:
    """Each engine's FLOP/s over the ``matmul-limit`` engine's, median over the rounds of an
    interleaved run (each round: one step of every engine, back to back) and its range."""
    limit_rates = [limit["flops"] / t for t in limit["step_times"][warmup:]]
    for name, r in results.items():
        if name == "matmul-limit":
            continue
        rounds = [r["flops"] / t / rate
                  for t, rate in zip(r["step_times"][warmup:], limit_rates, strict=True)]
        r["fraction_of_limit"] = r["achieved_flops"] / limit["achieved_flops"]
        r["fraction_of_limit_by_round"] = rounds
        r["fraction_of_limit_round_median"] = statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--shape", default="smollm2-135m", help=f"comma list of {sorted(SHAPES)}")
    parser.add_argument("--engines", default=",".join(ENGINES), help="comma list")
    parser.add_argument("--groups", type=int, default=1, help="B groups per step")
    parser.add_argument("--k", type=int, default=4, help="candidates per group")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--resp-len", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--peak-seconds", type=float, default=1.0, help="time per matmul shape")
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS",
                        help="after timing, profile this many more steps per engine (torch.profiler)")
    parser.add_argument("--interleave", action="store_true",
                        help="warm every engine up, then run their measured steps in turns (A/B "
                        "on a shared machine: the load hits all engines alike)")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    args.engines = [e for e in args.engines.split(",") if e]
    if unknown := set(args.engines) - set(ENGINES + OPTIONAL_ENGINES):
        sys.exit(f"unknown engines {sorted(unknown)}; choose from {ENGINES + OPTIONAL_ENGINES}")
    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    step, step_name = gspo_step()
    import transformers

    results = {"argv": sys.argv, "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
               "torch": torch.__version__, "transformers": transformers.__version__,
               "python": platform.python_version(), "threads": torch.get_num_threads(),
               "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                               else platform.processor() or platform.machine()),
               "load_avg": os.getloadavg(), "step": step_name,
               "thp_mem_alloc": os.environ.get("THP_MEM_ALLOC_ENABLE", ""), "shapes": {}}
    print(f"step: {step_name}", file=sys.stderr)
    for shape_name in args.shape.split(","):
        results["shapes"][shape_name] = bench_shape(shape_name, args, device, dtype, step)
        results["load_avg_after"] = os.getloadavg()
        if args.out:  # after every shape, so a run cut short keeps what it measured
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(results, indent=1))
    report(results, args)


if __name__ == "__main__":
    main()
