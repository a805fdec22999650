"""Shared pieces of the real-model experiments (3 and 4): SmolLM2-135M-Instruct on arithmetic
prompts with a checkable answer and a formatting rule, scored by the package's rule ranker.

Score of a response (:class:`grouppref.pipeline.rank.rankers.RuleRanker`): 1 when its final answer
equals the sum (``verify``), plus 0.5 when the response is only the number (``regex``), so a
score is in {0, 0.5, 1, 1.5}.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

import torch

from grouppref.api import (
    Candidate,
    CandidateGroup,
    CandidateSource,
    Prompt,
    RuleRanker,
    RuleRankerSettings,
    load_causal_lm,
    load_tokenizer,
    make_candidate_id,
    make_group_id,
    neutral_generation_config,
    sample_batch,
)

FORMAT_PATTERN = r"^\s*-?\d+\s*\.?\s*$"
INSTRUCTION = "Reply with only the number."


@dataclass
class Item:
    """One arithmetic prompt."""

    text: str
    answer: str
    ids: list[int]  # chat-templated prompt tokens


def make_items(tokenizer: Any, n: int, seed: int) -> list[Item]:
    """``n`` distinct prompts ``What is a + b? Reply with only the number.`` (a, b in 1..12:
    the 135M model gets almost no two-digit sum right, which leaves nothing to rank)."""
    rng = random.Random(seed)
    seen: set[tuple[int, int]] = set()
    items = []
    while len(items) < n:
        a, b = rng.randint(1, 12), rng.randint(1, 12)
        if (a, b) in seen:
            continue
        seen.add((a, b))
        text = f"What is {a} + {b}? {INSTRUCTION}"
        chat = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                             add_generation_prompt=True, tokenize=False)
        items.append(Item(text=text, answer=str(a + b),
                          ids=list(tokenizer(chat, add_special_tokens=False)["input_ids"])))
    return items


def rule_ranker() -> RuleRanker:
    """The verifiable rule ranker: verify (weight 1) + answer-only format (weight 0.5)."""
    return RuleRanker(RuleRankerSettings(checks=[
        {"check": "verify", "weight": 1.0},
        {"check": "regex", "pattern": FORMAT_PATTERN, "weight": 0.5}]))


def score_texts(ranker: RuleRanker, item: Item, texts: list[str]) -> list[float]:
    """Rule scores of ``texts`` for ``item``. Each distinct text is scored in a CandidateGroup
    of its own with a placeholder partner (the schema forbids candidates whose normalised
    texts are equal, and samples often repeat); a blank text scores 0."""
    prompt = Prompt(prompt_id="p", text=item.text, reference=item.answer)
    gid = make_group_id(prompt)
    cache: dict[str, float] = {}
    for t in dict.fromkeys(x for x in texts if x.strip()):
        group = CandidateGroup(group_id=gid, prompt=prompt, candidates=[
            Candidate(candidate_id=make_candidate_id(gid, x), text=x, num_tokens=1,
                      source=CandidateSource(kind="model", model="smollm2-135m-instruct"))
            for x in (t, "\u2205 placeholder \u2205")])
        out = ranker.score([group])[0]
        if not isinstance(out, list):
            raise RuntimeError(f"the rule ranker skipped a group: {out.reason}")
        cache[t] = out[0]
    return [cache.get(t, 0.0) for t in texts]


def load_smol() -> tuple[Any, Any]:
    """The embedded SmolLM2-135M-Instruct (float32, CPU) and its tokenizer."""
    tok = load_tokenizer(None)
    model = load_causal_lm(None)
    eos = [tok.eos_token_id]
    model.generation_config = neutral_generation_config(eos, tok.pad_token_id, tok.bos_token_id)
    return model, tok


def generate(model: Any, tok: Any, items: list[Item], k: int, max_new_tokens: int, seed: int,
             temperature: float = 0.7, batch: int = 64) -> tuple[list[list[list[int]]], list[list[str]], int]:
    """``k`` samples per item: (token ids with EOS, texts, tokens generated)."""
    rows = [(i, j) for i in range(len(items)) for j in range(k)]
    ids: list[list[list[int]]] = [[[] for _ in range(k)] for _ in items]
    texts: list[list[str]] = [["" for _ in range(k)] for _ in items]
    total = 0
    for s in range(0, len(rows), batch):
        part = rows[s:s + batch]
        out = sample_batch(model, [items[i].ids for i, _ in part],
                           [seed * 1_000_003 + i * 97 + j for i, j in part], temperature=temperature,
                           top_p=1.0, max_new_tokens=max_new_tokens, eos_ids=[tok.eos_token_id],
                           pad_id=tok.pad_token_id)
        for (i, j), smp in zip(part, out, strict=True):
            ids[i][j] = smp.token_ids
            texts[i][j] = tok.decode(smp.token_ids, skip_special_tokens=True)
            total += len(smp.token_ids)
    return ids, texts, total


@torch.no_grad()
def greedy_scores(model: Any, tok: Any, items: list[Item], ranker: RuleRanker,
                  max_new_tokens: int, batch: int = 32) -> dict[str, float]:
    """Share of held-out prompts whose greedy answer is correct / in the required format."""
    correct = fmt = 0
    for s in range(0, len(items), batch):
        part = items[s:s + batch]
        width = max(len(it.ids) for it in part)
        ids = torch.full((len(part), width), tok.pad_token_id)
        mask = torch.zeros_like(ids)
        for r, it in enumerate(part):
            ids[r, width - len(it.ids):] = torch.tensor(it.ids)
            mask[r, width - len(it.ids):] = 1
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                             max_new_tokens=max_new_tokens, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)
        for r, it in enumerate(part):
            text = tok.decode(out[r, width:], skip_special_tokens=True)
            score = score_texts(ranker, it, [text])[0]
            correct += score >= 1.0
            fmt += score in (0.5, 1.5)
    return {"greedy_correct": correct / len(items), "greedy_format": fmt / len(items)}


class Timer:
    """``with Timer() as t: ...``; ``t.s`` is the wall time in seconds."""

    def __enter__(self) -> Timer:
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.s = time.perf_counter() - self.t0
