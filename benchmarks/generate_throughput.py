"""Throughput of ``grouppref generate`` against a bare ``model.generate`` loop.

Both sides sample K candidates for the same prompts with the same model, chat template,
temperature, top-p, max_new_tokens and batch size (left padding, KV cache). The bare loop is
what a user would write by hand: repeat each prompt K times, batch, ``model.generate(
do_sample=True)``. grouppref's time is the whole ``run_generate`` call (prompt encoding, per-
candidate seeds, behaviour log-probs, duplicate checks, shards, the final dataset) minus its model
loading; the bare loop's time excludes loading too. Runs alternate (bare, grouppref, bare, ...)
so that load from other processes hits both alike; the best run of each side is compared.

Prints tokens/s of each side and the ratio grouppref / bare (target: >= 0.9).

Example:
    .venv/bin/python benchmarks/generate_throughput.py --n-prompts 8 --k 4 --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from grouppref.models.loading import load_causal_lm, load_tokenizer
from grouppref.pipeline.generate.config import GenerateConfig, ModelShare
from grouppref.pipeline.generate.stage import run_generate
from grouppref.readers.prompts import read_prompts
from grouppref.runs.store import RunStore
from grouppref.schemas import Prompt

DEMO = Path(__file__).resolve().parents[1] / "data" / "demo_prompts.jsonl"


def bare_loop(model, tokenizer, prompts: list[Prompt], args: argparse.Namespace) -> tuple[float, int]:
    """Seconds and generated tokens (up to and including EOS) of a plain generate loop."""
    texts = [tokenizer.apply_chat_template([m.model_dump() for m in p.as_messages()],
                                           add_generation_prompt=True, tokenize=False)
             for p in prompts for _ in range(args.k)]
    eos = tokenizer.eos_token_id
    tokens = 0
    t0 = time.perf_counter()
    for start in range(0, len(texts), args.batch_size):
        batch = tokenizer(texts[start:start + args.batch_size], return_tensors="pt",
                          padding=True, add_special_tokens=False)
        with torch.inference_mode():
            out = model.generate(**batch, do_sample=True, temperature=args.temperature,
                                 top_p=args.top_p, max_new_tokens=args.max_new_tokens,
                                 pad_token_id=tokenizer.pad_token_id)
        new = out[:, batch["input_ids"].shape[1]:]
        for row in new.tolist():
            tokens += row.index(eos) + 1 if eos in row else len(row)
    return time.perf_counter() - t0, tokens


def grouppref_run(prompts: list[Prompt], args: argparse.Namespace,
                  seed: int) -> tuple[float, int, float]:
    """Seconds (without model loading), generated tokens, and seconds inside ``generate`` calls
    of ``run_generate``."""
    config = GenerateConfig(models=[ModelShare(name=args.model)], k=args.k, seed=seed,
                            temperature=args.temperature, top_p=args.top_p,
                            max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                            shard_size=args.shard_size)
    with tempfile.TemporaryDirectory() as run:
        t0 = time.perf_counter()
        stage = run_generate(RunStore(run), config, prompts=prompts, show_progress=False)
        seconds = time.perf_counter() - t0
    stats = stage.manifest.stats
    return (seconds - stats["model_load_seconds"], stats["generated_tokens"],
            stats["generate_seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--prompts", default=str(DEMO))
    parser.add_argument("--n-prompts", type=int, default=8)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--shard-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    prompts = read_prompts(args.prompts).items[:args.n_prompts]
    model, tokenizer = load_causal_lm(args.model), load_tokenizer(args.model)
    bare_loop(model, tokenizer, prompts[:1], argparse.Namespace(**{**vars(args), "k": 1}))  # warm
    bare, ours = [], []
    for r in range(args.repeats):
        torch.manual_seed(r)
        s, n = bare_loop(model, tokenizer, prompts, args)
        bare.append(n / s)
        s, n, in_generate = grouppref_run(prompts, args, seed=r)
        ours.append(n / s)
        print(f"repeat {r}: bare {bare[-1]:8.1f} tokens/s   grouppref {ours[-1]:8.1f} tokens/s "
              f"({s:.1f} s, of which {s - in_generate:.1f} s outside generate calls)")
    ratios = [o / b for o, b in zip(ours, bare, strict=True)]
    print(f"settings: model={args.model} prompts={len(prompts)} k={args.k} "
          f"max_new_tokens={args.max_new_tokens} batch_size={args.batch_size} "
          f"threads={torch.get_num_threads()}")
    print(f"best tokens/s: bare {max(bare):.1f}, grouppref {max(ours):.1f}; "
          f"ratio grouppref/bare = {max(ours) / max(bare):.3f} "
          f"(median of paired ratios {statistics.median(ratios):.3f}; target >= 0.9)")


if __name__ == "__main__":
    main()
