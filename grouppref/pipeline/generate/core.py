"""The generate stage's core for a model already in memory: seeded candidates of typed prompts,
no run store.

:func:`sample_groups` samples ``config.k`` candidates per :class:`~grouppref.schemas.Prompt`
from a causal LM loaded in this process (e.g. the policy being trained) with the stage's own
seeded sampler (:class:`~grouppref.pipeline.generate.shard.ShardGenerator`: each slot's seed
derived from the run seed, group id, model and slot; empty or repeated candidates re-sampled up
to ``max_resample`` times) and returns a :class:`Sampled` (``CandidateGroup`` records, rejects,
tokens generated). The ``generate`` stage (:mod:`grouppref.pipeline.generate.stage`) drives the
same sampler shard by shard over the models it loads or serves; the trainer's refresh rounds
call :func:`sample_groups`, and check a policy first with :func:`prompt_encoder` and
:func:`context_length`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grouppref.pipeline.generate.config import GenerateConfig
from grouppref.pipeline.generate.shard import (
    ModelSlot,
    PromptEncoder,
    ShardGenerator,
    context_length,
)
from grouppref.schemas import CandidateGroup, Prompt, Reject

__all__ = ["Sampled", "context_length", "prompt_encoder", "sample_groups"]


@dataclass(frozen=True)
class Sampled:
    """What :func:`sample_groups` makes: a group per prompt that got at least ``min_k``
    distinct candidates (in prompt order), the rejects (prompts without a group, slots left
    out) and the number of tokens generated (re-samples included)."""

    groups: list[CandidateGroup]
    rejects: list[Reject]
    tokens: int


def prompt_encoder(config: GenerateConfig, tokenizer: Any, context: int | None) -> PromptEncoder:
    """The encoder of prompts for the first model of ``config`` (its name in messages).

    Raises:
        ConfigError: ``max_new_tokens`` leaves no room for a prompt in ``context`` tokens.
    """
    return PromptEncoder(config.models[0].name, tokenizer, context, config.max_new_tokens,
                         config.chat_template, config.truncate_prompts)


def sample_groups(prompts: Sequence[Prompt], model: Any, tokenizer: Any,
                  config: GenerateConfig, *, context: int | None,
                  eos_ids: Sequence[int]) -> Sampled:
    """``config.k`` candidates per prompt from ``model``, which fills every slot as the first
    (only) model of ``config.models``; its candidates' source model is that model's name.

    Args:
        prompts (Sequence[Prompt]): the prompts, one group each.
        model (Any): a transformers causal LM, loaded, in eval mode, with a neutral generation
            config (:func:`~grouppref.models.sampling.neutral_generation_config`).
        tokenizer (Any): its tokenizer.
        config (GenerateConfig): K, sampling settings, seed, batch size, chat template.
        context (int | None): the model's context length in tokens (:func:`context_length`).
        eos_ids (Sequence[int]): the tokens that end a candidate.

    Raises:
        ConfigError: ``max_new_tokens`` leaves no room for a prompt in ``context`` tokens.
    """
    share = config.models[0]
    slot = ModelSlot(share, share.name, range(config.k or 0))
    generator = ShardGenerator([slot], {slot.key: prompt_encoder(config, tokenizer, context)},
                               config)
    generator.attach(slot.key, model, eos_ids, tokenizer.pad_token_id)
    groups, rejects = generator.run(list(prompts))
    return Sampled(groups=groups, rejects=rejects, tokens=generator.generated_tokens)
