"""Held-out constraint satisfaction of a model: for every held-out prompt,
one greedy answer and S samples (temperature T), each checked with the package's constraint
checks (:mod:`grouppref.pipeline.rank.constraints`, the same checks the rule ranker used to rank
the training groups), and the KL divergence to the reference model along each answer.

Why not ``grouppref generate`` for this: it re-samples duplicate candidates (a mean over
de-duplicated samples is biased towards diversity), it has no greedy decoding, and it computes
no KL. The decoding here shares what the package's sampler does (chat template through
:func:`~grouppref.pipeline.generate.core.prompt_encoder`,
:func:`~grouppref.models.sampling.gumbel_argmax`) and is batched for speed: each prompt is
prefilled once for its 1 + S answers (the KV cache is repeated per row), and every step is one
batched forward on the device with no per-row host work (finished rows are padded and masked).
The noise is one seeded stream per chunk of prompts on the device (not one per row): the same
answers for the same model, seed and chunking.

KL: ``KL_t = Σ_v π(v|h_t) (log π(v|h_t) − log π_ref(v|h_t))`` with the untempered next-token
distributions of the policy and the reference, summed over the answer's tokens (EOS included),
the reference run in lockstep with its own cache. Along samples drawn from π at T = 1 the mean
is the sequence-level KL(π‖π_ref); at T < 1 it is that sum along the tempered paths (stated with
the results).

    .venv/bin/python -m research.ifeval_cpu.evaluate --model DIR --prompts test.jsonl --out e.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grouppref.api import (
    GenerateConfig,
    ModelShare,
    Prompt,
    constraint_met,
    derive_seed,
    gumbel_argmax,
    left_pad,
    load_causal_lm,
    load_tokenizer,
    parse_constraints,
    prompt_encoder,
    resolve_model,
)


@dataclass
class Decoded:
    """What :func:`decode_chunk` produced for each row: tokens (EOS included), EOS flag, KL."""

    tokens: list[list[int]]
    eos: list[bool]
    kl: list[float]


def _step(models: list[Any], caches: list[Any], ids: torch.Tensor, mask: torch.Tensor,
          pos: torch.Tensor) -> list[torch.Tensor]:
    """Last-position logits ``(R, V)`` of every model for one forward over ``ids``."""
    return [m(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=c,
              use_cache=True).logits[:, -1].float() for m, c in zip(models, caches, strict=True)]


@torch.inference_mode()
def decode_chunk(models: list[Any], prompts: list[list[int]], *, per_prompt: int, seed: int,
                 temperature: float, max_new_tokens: int, eos_ids: list[int], pad_id: int,
                 device: str = "cpu") -> Decoded:
    """Decode ``per_prompt`` rows per prompt: the first greedy, the others sampled at
    ``temperature`` (Gumbel-max with one ``seed``-ed stream for the chunk, on ``device``).

    ``models[0]`` is the policy; ``models[1]``, when given, the reference for the KL. Finished
    rows stay in the batch (padded), so every step is one batched forward with no host sync
    but the all-finished check.
    """
    from transformers import DynamicCache

    dev = torch.device(device)
    ids, mask = left_pad(prompts, pad_id, dev)  # (P, L)
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    caches = [DynamicCache() for _ in models]
    logits = [x.repeat_interleave(per_prompt, 0) for x in _step(models, caches, ids, mask, pos)]
    for cache in caches:
        cache.batch_repeat_interleave(per_prompt)
    mask = mask.repeat_interleave(per_prompt, 0)  # (R, L)
    last = pos[:, -1].repeat_interleave(per_prompt)  # (R,)
    rows = mask.shape[0]
    greedy = torch.arange(rows, device=dev) % per_prompt == 0
    gen = torch.Generator(device=dev).manual_seed(seed)
    eos = torch.tensor(eos_ids, device=dev)
    finished = torch.zeros(rows, dtype=torch.bool, device=dev)
    length = torch.zeros(rows, dtype=torch.long, device=dev)
    kl = torch.zeros(rows, device=dev)
    steps = []
    for _ in range(max_new_tokens):
        logp = torch.log_softmax(logits[0], dim=-1)  # (R, V), untempered
        noise = torch.rand(logp.shape, generator=gen, device=dev)
        choice = torch.where(greedy, logp.argmax(-1),
                             gumbel_argmax(logits[0] / temperature, noise))
        choice = torch.where(finished, torch.full_like(choice, pad_id), choice)
        live = ~finished
        if len(models) > 1:
            step_kl = (logp.exp() * (logp - torch.log_softmax(logits[1], dim=-1))).sum(-1)
            kl += torch.where(live, step_kl, torch.zeros_like(step_kl))
        length += live.long()
        finished = finished | (live & torch.isin(choice, eos))
        steps.append(choice)
        if bool(finished.all()):
            break
        mask = torch.cat([mask, live.to(mask.dtype)[:, None]], dim=1)
        last = last + 1
        logits = _step(models, caches, choice[:, None], mask, last[:, None])
    tokens = torch.stack(steps, 1).tolist()
    lengths = length.tolist()
    return Decoded(tokens=[t[:n] for t, n in zip(tokens, lengths, strict=True)],
                   eos=finished.tolist(), kl=kl.tolist())


def answer_text(tokenizer: Any, tokens: list[int], ended: bool) -> str:
    """The answer the constraint checks see: the decoded tokens less the EOS that ended them
    and less special tokens (as the generate stage decodes the candidates the rank stage
    checked), nothing else: no whitespace stripped, no tokenization clean-up. An answer that is
    only EOS is ``""``, which meets no constraint."""
    body = tokens[:-1] if ended else tokens
    return tokenizer.decode(body, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def read_prompts(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def eos_ids(tokenizer: Any, model: Any) -> list[int]:
    """The tokenizer's EOS and the model's generation-config EOS ids."""
    extra = model.generation_config.eos_token_id
    extra = [extra] if isinstance(extra, int) else list(extra or [])
    return sorted({tokenizer.eos_token_id, *extra})


def load_models(model: str | None, reference: str | None = "embedded", device: str = "cpu"
                ) -> tuple[Any, list[Any]]:
    """Tokenizer and ``[policy]`` or ``[policy, reference]``, in eval mode on ``device``."""
    tokenizer = load_tokenizer(resolve_model(model), padding_side="left")
    models = [load_causal_lm(model, device=device)]
    if reference is not None:
        models.append(load_causal_lm(reference, device=device))
    return tokenizer, models


def evaluate(models: list[Any], tokenizer: Any, prompts: list[dict[str, Any]], *,
             samples: int = 4, temperature: float = 0.7, max_new_tokens: int = 48,
             seed: int = 0, chunk: int = 16, device: str = "cpu") -> list[dict[str, Any]]:
    """Greedy + ``samples`` answers per prompt, each checked; one result dict per prompt.

    ``models``: ``[policy]`` or ``[policy, reference]`` (then every answer has its KL).
    """
    # the generate stage's prompt encoding: chat template, no truncation, no context limit
    encoder = prompt_encoder(GenerateConfig(models=[ModelShare(name="policy")],
                                            max_new_tokens=max_new_tokens, chat_template=True,
                                            truncate_prompts=False), tokenizer, None)
    stop = eos_ids(tokenizer, models[0])
    per, out = 1 + samples, []
    for start in range(0, len(prompts), chunk):
        part = prompts[start:start + chunk]
        encoded = [encoder.encode(Prompt(prompt_id=p["prompt_id"], text=p["prompt"]))[0]
                   for p in part]
        got = decode_chunk(models, encoded, per_prompt=per, seed=derive_seed(seed, start),
                           temperature=temperature, max_new_tokens=max_new_tokens,
                           eos_ids=stop, pad_id=tokenizer.pad_token_id, device=device)
        for n, p in enumerate(part):
            constraints = parse_constraints(p["metadata"]["constraints"])
            answers = []
            for r in range(n * per, (n + 1) * per):
                tokens, ended = got.tokens[r], got.eos[r]
                text = answer_text(tokenizer, tokens, ended)
                answers.append({"text": text, "tokens": len(tokens), "eos": ended,
                                "met": [constraint_met(c, text) for c in constraints],
                                "kl": got.kl[r] if len(models) > 1 else None})
            out.append({"prompt_id": p["prompt_id"], "kinds": p["metadata"]["kinds"].split("+"),
                        "greedy": answers[0], "samples": answers[1:]})
    return out


def summary(results: list[dict[str, Any]]) -> dict[str, float]:
    """Instruction-level (share of constraints met) and prompt-level (all met) rates."""
    def inst(a: dict[str, Any]) -> float:
        return sum(a["met"]) / len(a["met"])

    n = len(results)
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    out = {"greedy": mean([inst(r["greedy"]) for r in results]),
           "greedy_all": mean([float(all(r["greedy"]["met"])) for r in results]),
           "sampled": mean([mean([inst(a) for a in r["samples"]]) for r in results]),
           "sampled_all": mean([mean([float(all(a["met"])) for a in r["samples"]]) for r in results]),
           "prompts": n}
    if results and results[0]["samples"] and results[0]["samples"][0]["kl"] is not None:
        out["kl_sampled"] = mean([mean([a["kl"] for a in r["samples"]]) for r in results])
        out["kl_greedy"] = mean([r["greedy"]["kl"] for r in results])
    out["tokens_greedy"] = mean([r["greedy"]["tokens"] for r in results])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="Model folder (default: the embedded SmolLM2).")
    ap.add_argument("--prompts", type=Path, required=True, help="Held-out prompts (JSONL).")
    ap.add_argument("--out", type=Path, required=True, help="Results JSONL (+ .summary.json).")
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--limit", type=int, default=None, help="Only the first N prompts.")
    ap.add_argument("--no-kl", action="store_true", help="Skip the reference (no KL).")
    ap.add_argument("--chunk", type=int, default=16, help="Prompts decoded together.")
    ap.add_argument("--device", default="cpu", help="Torch device, e.g. cpu or cuda.")
    args = ap.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    prompts = read_prompts(args.prompts)[:args.limit]
    t0, c0 = time.time(), resource.getrusage(resource.RUSAGE_SELF)
    tokenizer, models = load_models(args.model, None if args.no_kl else "embedded", args.device)
    results = evaluate(models, tokenizer, prompts, samples=args.samples,
                       temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                       chunk=args.chunk, device=args.device)
    c1 = resource.getrusage(resource.RUSAGE_SELF)
    stats = summary(results) | {"wall_s": round(time.time() - t0, 1),
                                "cpu_s": round(c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime, 1),
                                "load": os.getloadavg()[0], "model": args.model or "embedded"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in results))
    tmp.replace(args.out)
    args.out.with_suffix(".summary.json").write_text(json.dumps(stats, indent=1) + "\n")
    print(json.dumps(stats))


if __name__ == "__main__":
    main()
