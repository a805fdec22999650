"""Training throughput: grouppref's GSPO step vs TRL's DPOTrainer, measured in the same run.

Workload: SmolLM2-135M (the embedded model), CPU, fp32; groups of K = 4 candidates with a
64-token prompt and 64-token responses (EOS included), a strict consensus per group. grouppref
trains on the groups (all 6 pairs inside one group loss, the prompt computed once); TRL trains
on the same preferences expanded to all 6 (chosen, rejected) pairs per group. Both see the same
token ids, the same number of pairs per optimizer step, AdamW (fused), reference log-probs
precomputed before timing (TRL: ``precompute_ref_log_probs=True``; its defaults ``bf16=True``
and gradient checkpointing are turned off explicitly: fp32 is the workload, and checkpointing
only trades speed for memory).

Each engine runs in its own subprocess, one after the other, so peak RSS is per engine:

* ``grouppref``: ``group_logps(share_prefix=True)`` + ``gspo_loss``;
* ``grouppref-unshared``: the same with ``share_prefix=False`` (prefix sharing's own gain);
* ``trl``: ``DPOTrainer.train()``, timed per optimizer step by a callback.

pairs/s counts preference pairs trained per second (a group of 4 carries 6); model tokens/s
counts tokens run through the model; data tokens/s counts the distinct tokens of the groups
consumed per second (prompt + 4 responses = 320 per group). The grouppref engines run the
trainer's own step (``grouppref.train.policy.step.run_steps``).

Steady state: ``--warmup`` unmeasured steps (default 3), then ``--steps`` measured ones (default
10). The parent process also measures the machine's fp32 matmul peak with the same number of
threads (``benchmarks/train_peak.py``: square and model-shaped products) and prints each engine's
analytic FLOPs per step (useful work only, as in train_peak.py) as GFLOP/s and as a fraction of
that peak, beside the ratio to TRL.

Usage::

    .venv/bin/python benchmarks/train_throughput.py                  # all engines, table + ratios
    .venv/bin/python benchmarks/train_throughput.py --engine trl     # one engine, JSON line
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

K = 4
PAIRS_PER_GROUP = K * (K - 1) // 2
ENGINES = ("grouppref", "grouppref-unshared", "trl")


def make_texts(n_groups: int, prompt_len: int, resp_len: int, tokenizer) -> list[tuple[str, list[str]]]:
    """Prompts of ``prompt_len`` tokens and K responses of ``resp_len - 1`` tokens (+ EOS).

    Texts are runs of space-led lowercase words that are single tokens, so each word is one
    token and the lengths are exact (checked after tokenising).
    """
    words = [w for w in (tokenizer.decode([i]) for i in range(len(tokenizer)))
             if w.startswith(" ") and w[1:].isalpha() and w[1:].islower() and len(w) > 3]
    rng = random.Random(0)

    def text(n: int) -> str:
        return "".join(rng.choice(words) for _ in range(n))

    return [(text(prompt_len), [text(resp_len - 1) for _ in range(K)]) for _ in range(n_groups)]


def tokenized_groups(texts, tokenizer, prompt_len: int, resp_len: int):
    """TokenizedGroups (candidate 0 best, 3 worst; all 6 pairs with p = 1, w = 1)."""
    from grouppref.train.tensors.batch import TokenizedGroup

    groups = []
    p = [[0.5 if i == j else float(i < j) for j in range(K)] for i in range(K)]
    w = [[0.0 if i == j else 1.0 for j in range(K)] for i in range(K)]
    for n, (prompt, resps) in enumerate(texts):
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        cand_ids = [tokenizer(r, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                    for r in resps]
        if len(prompt_ids) != prompt_len or any(len(c) != resp_len for c in cand_ids):
            raise RuntimeError("synthetic texts did not tokenise to the intended lengths")
        groups.append(TokenizedGroup(group_id=f"g{n}", prompt_ids=prompt_ids, cand_ids=cand_ids,
                                     p_ij=p, w_ij=w, order=list(range(K)), ref_logps=None,
                                     behavior_logps=[None] * K, split="train"))
    return groups


def run_grouppref(args, share_prefix: bool) -> dict:
    import dataclasses

    import torch

    from grouppref.models.loading import load_causal_lm, load_tokenizer
    from grouppref.train.policy.step import Objective, run_steps
    from grouppref.train.tensors.batch import collate_groups
    from grouppref.train.tensors.logps import group_logps

    tokenizer = load_tokenizer(None)
    model = load_causal_lm(None)
    steps = args.warmup + args.steps
    groups = tokenized_groups(make_texts(steps * args.groups_per_step, args.prompt_len,
                                         args.resp_len, tokenizer), tokenizer, args.prompt_len,
                              args.resp_len)
    batches = [groups[i:i + args.groups_per_step] for i in range(0, len(groups), args.groups_per_step)]
    with torch.no_grad():  # the reference pass, once, before training (not timed)
        batches = [collate_groups([dataclasses.replace(g, ref_logps=lp[:K]) for g, lp in zip(
            b, group_logps(model, collate_groups(b, tokenizer.pad_token_id)).tolist(), strict=True)],
            tokenizer.pad_token_id) for b in batches]
    model.train()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    times, cpu = [], []
    objective = Objective(loss="gspo", beta=0.1)
    for batch in batches:
        start, start_cpu = time.perf_counter(), time.process_time()
        run_steps(model, optim, [batch], objective, share_prefix=share_prefix)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    n_groups = args.steps * args.groups_per_step
    run_tokens = (args.prompt_len + K * args.resp_len if share_prefix
                  else K * (args.prompt_len + args.resp_len))
    return {"groups": n_groups, "pairs": n_groups * PAIRS_PER_GROUP,
            "model_tokens": n_groups * run_tokens, "step_times": times, "step_cpu_times": cpu,
            "config": model.config}


def run_trl(args) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import DPOConfig, DPOTrainer

    from grouppref.models.loading import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer(None)
    model = load_causal_lm(None).train()
    steps = args.warmup + args.steps
    texts = make_texts(steps * args.groups_per_step, args.prompt_len, args.resp_len, tokenizer)
    rows = {"prompt": [], "chosen": [], "rejected": []}
    for prompt, resps in texts:  # candidate i beats j for i < j: all 6 pairs per group
        for i, j in itertools.combinations(range(K), 2):
            rows["prompt"].append(prompt)
            rows["chosen"].append(resps[i])
            rows["rejected"].append(resps[j])
    times: list[float] = []
    cpu: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a, **kw):
            self.start, self.start_cpu = time.perf_counter(), time.process_time()

        def on_step_end(self, *a, **kw):
            times.append(time.perf_counter() - self.start)
            cpu.append(time.process_time() - self.start_cpu)

    config = DPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-bench-"), use_cpu=True, bf16=False, fp16=False,
        gradient_checkpointing=False, precompute_ref_log_probs=True, beta=0.1,
        loss_type=["sigmoid"], learning_rate=1e-6,
        per_device_train_batch_size=args.groups_per_step * PAIRS_PER_GROUP,
        precompute_ref_batch_size=args.groups_per_step * PAIRS_PER_GROUP, max_steps=steps,
        logging_steps=10_000, save_strategy="no", report_to=[], disable_tqdm=True,
        dataloader_num_workers=0, seed=0)
    trainer = DPOTrainer(model=model, args=config, train_dataset=Dataset.from_dict(rows),
                         processing_class=tokenizer, callbacks=[StepTimer()])
    first = trainer.train_dataset[0]
    if len(first["prompt_ids"]) != args.prompt_len or len(first["chosen_ids"]) != args.resp_len:
        raise RuntimeError("TRL tokenised the texts to other lengths than grouppref")
    trainer.train()
    n_groups = args.steps * args.groups_per_step
    return {"groups": n_groups, "pairs": n_groups * PAIRS_PER_GROUP,
            "model_tokens": n_groups * PAIRS_PER_GROUP * 2 * (args.prompt_len + args.resp_len),
            "step_times": times, "step_cpu_times": cpu, "config": model.config}


def step_flops(engine: str, config, args) -> float:
    """Analytic useful FLOPs of one optimizer step of ``engine`` (train_peak.py's count)."""
    from train_peak import flops

    shape = argparse.Namespace(groups=args.groups_per_step, k=K, prompt_len=args.prompt_len,
                               resp_len=args.resp_len)
    return flops(engine, config, shape)["flops"]


def run_engine(args) -> dict:
    import torch

    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.engine == "trl":
        out = run_trl(args)
    else:
        out = run_grouppref(args, share_prefix=args.engine == "grouppref")
    data_tokens = out["groups"] * (args.prompt_len + K * args.resp_len)
    seconds = sum(out["step_times"][args.warmup:])
    cpu_seconds = sum(out["step_cpu_times"][args.warmup:])
    flops = step_flops(args.engine, out.pop("config"), args) * args.steps
    out.update(engine=args.engine, threads=torch.get_num_threads(), seconds=seconds,
               flops_per_step=flops / args.steps, flops_per_s=flops / seconds,
               flops_per_cpu_s=flops / cpu_seconds,
               cpu_seconds=cpu_seconds, pairs_per_s=out["pairs"] / seconds,
               pairs_per_cpu_s=out["pairs"] / cpu_seconds,
               pairs_per_s_best=out["pairs"] / args.steps / min(out["step_times"][args.warmup:]),
               model_tokens_per_s=out["model_tokens"] / seconds,
               data_tokens_per_s=data_tokens / seconds,
               peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return out


def machine_peak(args) -> tuple[float, float]:
    """fp32 matmul peak (FLOP/s wall, FLOP per CPU-s) with the engines' thread count."""
    import torch
    from matmul_limit import model_peak
    from train_peak import SHAPES

    if args.threads:
        torch.set_num_threads(args.threads)
    tokens = args.groups_per_step * (args.prompt_len + K * args.resp_len)
    _, peak, peak_cpu = model_peak(SHAPES["smollm2-135m"], tokens, torch.device("cpu"),
                                   torch.float32, args.peak_seconds)
    return peak, peak_cpu


def compare(args) -> None:
    peak, peak_cpu = machine_peak(args)
    print(f"fp32 matmul peak: {peak / 1e9:.1f} GFLOP/s ({peak_cpu / 1e9:.1f} GFLOP per CPU-s)",
          file=sys.stderr)
    results = {}
    for engine in ENGINES:
        cmd = [sys.executable, __file__, "--engine", engine, "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--groups-per-step", str(args.groups_per_step),
               "--threads", str(args.threads), "--prompt-len", str(args.prompt_len),
               "--resp-len", str(args.resp_len)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            sys.exit(f"{engine} failed:\n{proc.stderr[-4000:]}")
        results[engine] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{engine}: done in {results[engine]['seconds']:.1f} s measured", file=sys.stderr)
    print(f"\nSmolLM2-135M, CPU fp32, {torch_threads(results)} threads; groups of K={K}, prompt "
          f"{args.prompt_len} + responses {args.resp_len} tokens; {args.groups_per_step} groups "
          f"({args.groups_per_step * PAIRS_PER_GROUP} pairs) per step; {args.steps} measured steps "
          f"after {args.warmup} warm-up; fp32 matmul peak {peak / 1e9:.1f} GFLOP/s "
          f"({peak_cpu / 1e9:.1f} GFLOP per CPU-s)\n")
    print("| engine | s/step | pairs/s | pairs/s (fastest step) | pairs per CPU-s | "
          "model tokens/s | data tokens/s | GFLOP/step | of matmul peak | of peak per CPU-s "
          "| peak RSS (MB) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['seconds'] / args.steps:.2f} | {r['pairs_per_s']:.3f} | "
              f"{r['pairs_per_s_best']:.3f} | {r['pairs_per_cpu_s']:.3f} | "
              f"{r['model_tokens_per_s']:.0f} | {r['data_tokens_per_s']:.0f} | "
              f"{r['flops_per_step'] / 1e9:.0f} | {r['flops_per_s'] / peak:.0%} | "
              f"{r['flops_per_cpu_s'] / peak_cpu:.0%} | {r['peak_rss_mb']:.0f} |")
    print("\nstep times (s), warm-up first:")
    for name, r in results.items():
        print(f"  {name}: " + " ".join(f"{t:.2f}" for t in r["step_times"]))
    g, u, t = results["grouppref"], results["grouppref-unshared"], results["trl"]
    for label, key in (("wall clock", "pairs_per_s"), ("fastest step", "pairs_per_s_best"),
                       ("CPU time", "pairs_per_cpu_s")):
        print(f"\n{label}: grouppref / TRL pairs/s {g[key] / t[key]:.2f}x (target >= 6x); "
              f"prefix sharing alone (shared / unshared) {g[key] / u[key]:.2f}x (target >= 1.3x); "
              f"unshared grouppref / TRL {u[key] / t[key]:.2f}x")
    print(f"grouppref step vs the matmul peak: {g['flops_per_s'] / peak:.0%} wall, "
          f"{g['flops_per_cpu_s'] / peak_cpu:.0%} per CPU-s (target >= 70%)")
    print(f"peak RSS grouppref / TRL: {g['peak_rss_mb'] / t['peak_rss_mb']:.2f} (target <= 1)")
    print("\nraw:", json.dumps({"matmul_peak_flops": peak, "matmul_peak_flops_per_cpu_s": peak_cpu,
                                "load_avg": os.getloadavg(), **results}))


def torch_threads(results: dict) -> int:
    return next(iter(results.values()))["threads"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=ENGINES, help="run one engine and print a JSON line")
    parser.add_argument("--steps", type=int, default=10, help="measured optimizer steps")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured first steps")
    parser.add_argument("--groups-per-step", type=int, default=2, help="groups per step (x6 pairs)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--prompt-len", type=int, default=64, help="prompt tokens")
    parser.add_argument("--resp-len", type=int, default=64, help="response tokens, EOS included")
    parser.add_argument("--peak-seconds", type=float, default=1.0,
                        help="time per matmul shape when measuring the peak")
    args = parser.parse_args()
    if args.engine:
        print(json.dumps(run_engine(args)))
    else:
        compare(args)


if __name__ == "__main__":
    main()
