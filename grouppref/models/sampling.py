"""Batched sampling with one random stream per candidate, and the candidate's log-prob under the
generating model, recorded while it is generated (no second forward pass).

How this departs from a plain ``model.generate(do_sample=True)``:

- **Per-candidate seeds.** ``do_sample=True`` draws every row of a batch from one global random
  stream, so a candidate's text depends on which other candidates share its batch and on the
  order batches ran in. Here each row owns a ``torch.Generator`` seeded from
  ``(run seed, group id, model, slot, attempt)`` and is sampled with the Gumbel-max trick:
  ``argmax_v (x_v - log(-log u_v))`` with ``u_v ~ U(0, 1)`` is an exact sample from ``softmax(x)``.
  HF ``generate`` then runs greedily over scores in which only the chosen token is finite.
  A resumed run therefore reproduces an uninterrupted one exactly, and a candidate barely
  depends on its batch (only through the float rounding of padded attention).
- **Behaviour log-prob.** ``logp_t = log_softmax(z_t)[y_t]`` is taken from the model's *raw*
  logits ``z_t`` at every step (before temperature / top-p), so ``behavior_logp`` is
  ``log pi_model(y | x)``, the quantity the trainer compares with ``pi_theta``. The sampling
  distribution itself is the tempered, top-p-truncated one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)

from grouppref.errors import StageError
from grouppref.models.seeds import derive_seed

__all__ = ["Sample", "SeededSampler", "derive_seed", "gumbel_argmax", "left_pad",
           "neutral_generation_config", "sample_batch"]


def gumbel_argmax(scores: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Sample one token per row from ``softmax(scores)`` given uniform noise.

    ``y_b = argmax_v (x_bv + g_bv)`` with ``g_bv = -log(-log u_bv)``, ``u_bv ~ U(0, 1)`` i.i.d.:
    ``g`` is standard Gumbel, so ``P(y_b = v) = softmax(x_b)_v`` (the Gumbel-max trick). Entries
    of ``x`` equal to ``-inf`` (filtered by top-p) are never chosen. (Uniform draws are ~6x
    cheaper on CPU than ``exponential_``, and cheaper than softmax + multinomial.)

    Args:
        scores (torch.Tensor): logits after temperature / top-p, shape ``(B, V)``.
        uniform (torch.Tensor): draws from ``U[0, 1)``, shape ``(B, V)``.

    Returns:
        torch.Tensor: chosen token ids, shape ``(B,)``.
    """
    tiny = torch.finfo(uniform.dtype).tiny
    e = (-uniform.clamp_min(tiny).log()).clamp_min(tiny)  # Exp(1), never 0: no +inf below
    return torch.argmax(scores - e.log(), dim=-1)


class SeededSampler(LogitsProcessor):
    """Picks each row's next token with its own generator and records ``log pi(y_t)``.

    Used as the last logits processor of a greedy ``generate``: it returns scores that are
    ``-inf`` everywhere except at the sampled token.

    Args:
        seeds (Sequence[int]): one seed per batch row.
        temperature (float): softmax temperature of the sampling distribution.
        top_p (float): nucleus mass kept (1.0 keeps everything).
        device (torch.device): where the scores live.
    """

    def __init__(self, seeds: Sequence[int], temperature: float, top_p: float,
                 device: torch.device) -> None:
        self.generators = [torch.Generator(device=device).manual_seed(s) for s in seeds]
        self.warpers: list[LogitsProcessor] = []
        if temperature != 1.0:
            self.warpers.append(TemperatureLogitsWarper(temperature))
        if top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p))
        self.logps: list[torch.Tensor] = []  # one (B,) tensor per step
        self.tokens: list[torch.Tensor] = []  # one (B,) tensor per step

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.float()  # (B, V)
        logp = torch.log_softmax(scores, dim=-1)  # untempered: log pi_model(. | x, y_<t)
        warped = scores
        for warper in self.warpers:
            warped = warper(input_ids, warped)
        noise = torch.stack([
            torch.rand(scores.shape[-1], device=scores.device, generator=g)
            for g in self.generators
        ])  # (B, V)
        choice = gumbel_argmax(warped, noise)  # (B,)
        self.tokens.append(choice)
        self.logps.append(logp.gather(1, choice[:, None]).squeeze(1))
        forced = torch.full_like(scores, float("-inf"))
        return forced.scatter_(1, choice[:, None], 0.0)


@dataclass(frozen=True)
class Sample:
    """One generated continuation.

    Attributes:
        token_ids (list[int]): response tokens, including the EOS token when one ended it.
        logp (float): ``sum_t log pi_model(y_t | x, y_<t)`` over ``token_ids``.
        eos (bool): whether generation stopped at EOS (False: it hit ``max_new_tokens``).
    """

    token_ids: list[int]
    logp: float
    eos: bool


def neutral_generation_config(eos_ids: list[int], pad_id: int, bos_id: int | None) -> GenerationConfig:
    """A generation config with no processors of its own (no repetition penalty, top-k, ...).

    Installed as the model's ``generation_config`` so that model-shipped defaults cannot alter the
    raw logits that :class:`SeededSampler` sees.
    """
    return GenerationConfig(eos_token_id=eos_ids, pad_token_id=pad_id, bos_token_id=bos_id)


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int,
             device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``input_ids`` and ``attention_mask``, both ``(B, P)``."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        if prompt:
            ids[row, width - len(prompt):] = torch.tensor(list(prompt), dtype=torch.long)
            mask[row, width - len(prompt):] = 1
    return ids.to(device), mask.to(device)


def sample_batch(model: Any, prompts: Sequence[Sequence[int]], seeds: Sequence[int], *,
                 temperature: float, top_p: float, max_new_tokens: int,
                 eos_ids: Sequence[int], pad_id: int) -> list[Sample]:
    """Sample one continuation per prompt (rows of one left-padded batch).

    Args:
        model: a causal LM whose ``generation_config`` is neutral
            (see :func:`neutral_generation_config`).
        prompts (Sequence[Sequence[int]]): prompt token ids, one list per row (B rows).
        seeds (Sequence[int]): one seed per row.
        temperature (float), top_p (float), max_new_tokens (int): sampling settings.
        eos_ids (Sequence[int]): token ids that end a response.
        pad_id (int): padding token id.

    Returns:
        list[Sample]: B samples, in the order of ``prompts``.

    Raises:
        StageError: if ``generate`` did not follow the sampler (a bug, never silent).
    """
    device = next(model.parameters()).device
    input_ids, attention_mask = left_pad(prompts, pad_id, device)  # (B, P)
    sampler = SeededSampler(seeds, temperature, top_p, device)
    with torch.inference_mode():
        sequences = model.generate(
            input_ids=input_ids, attention_mask=attention_mask, do_sample=False, num_beams=1,
            max_new_tokens=max_new_tokens, logits_processor=LogitsProcessorList([sampler]),
        )
    new = sequences[:, input_ids.shape[1]:].cpu()  # (B, T)
    tokens = torch.stack(sampler.tokens, dim=1).cpu()  # (B, T)
    logps = torch.stack(sampler.logps, dim=1).cpu()  # (B, T)
    eos = torch.tensor(sorted(set(eos_ids)))
    out: list[Sample] = []
    for row in range(len(prompts)):
        hits = torch.isin(tokens[row], eos).nonzero()
        length = int(hits[0]) + 1 if len(hits) else tokens.shape[1]
        if not torch.equal(new[row, :length], tokens[row, :length]):
            raise StageError("generate did not return the sampled tokens; a logits processor "
                             "of the model's generation config interferes (please report)")
        out.append(Sample(token_ids=tokens[row, :length].tolist(),
                          logp=float(logps[row, :length].double().sum()), eos=bool(len(hits))))
    return out
