"""Validated groups -> reward-model inputs: one token sequence per candidate, formatted exactly as
the reward ranker formats what it scores (:func:`grouppref.pipeline.rank.rankers.format_for_reward`:
the tokenizer's chat template with the prompt turns and an assistant turn, else
``prompt + "\\n\\n" + response``), so a model trained here scores in ``rank`` what it learnt.

A group becomes a :class:`~grouppref.train.tensors.batch.TokenizedGroup` whose ``cand_ids`` hold the
*whole* sequences (prompt and response) and whose ``prompt_ids`` are empty: the reward model
reads each sequence on its own (no prefix sharing, docs/reward-model.md), and
:func:`~grouppref.train.tensors.batch.collate_groups` then pads them right with the pair matrices.

A candidate longer than ``max_length`` tokens is left out with a ``part`` reject (the ranker
could not score it either; cutting it would train on a text it never sees); a group left with
fewer than two candidates, or with no weighted pair, is a row reject.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from grouppref.errors import RowError
from grouppref.pipeline.rank.rankers import format_for_reward
from grouppref.schemas import Reject, ValidatedGroup
from grouppref.train.data.tokenize import encode_each, list_targets, pair_targets
from grouppref.train.tensors.batch import TokenizedGroup


def encode_candidate(tokenizer: Any, group: ValidatedGroup, text: str) -> list[int]:
    """The token ids the reward model reads for (group's prompt, ``text``)."""
    formatted, special = format_for_reward(tokenizer, group, text)
    return list(tokenizer(formatted, add_special_tokens=special)["input_ids"])


def encode_group(group: ValidatedGroup, tokenizer: Any, max_length: int) -> TokenizedGroup:
    """One group as reward-model sequences (module docstring).

    Raises:
        RowError: fewer than two candidates fit ``max_length``, or no pair with weight > 0.
    """
    keep, seqs, dropped = [], [], {}
    for cand in group.candidates:
        ids = encode_candidate(tokenizer, group, cand.text)
        if len(ids) > max_length:
            dropped[cand.candidate_id] = (f"prompt + response is {len(ids)} tokens, over "
                                          f"max_length={max_length}")
            continue
        keep.append(cand.candidate_id)
        seqs.append(ids)
    if len(keep) < 2:
        raise RowError(f"only {len(keep)} candidate(s) fit max_length={max_length}; a group "
                       "needs 2 (raise --max-length)", field="candidates",
                       group_id=group.group_id)
    p_ij, w_ij, order = pair_targets(group, keep)
    labels, strengths = list_targets(group, keep)
    return TokenizedGroup(
        group_id=group.group_id, prompt_ids=[], cand_ids=seqs, p_ij=p_ij, w_ij=w_ij,
        order=order, ref_logps=None,
        behavior_logps=[None] * len(keep), split=group.split, candidate_ids=keep,
        dropped=dropped, labels=labels, strengths=strengths)


def encode_groups(groups: Sequence[ValidatedGroup], tokenizer: Any, max_length: int,
                  stage: str = "train_rm") -> tuple[list[TokenizedGroup], list[Reject]]:
    """Encode every group; bad groups become row rejects, dropped candidates part rejects
    (rows numbered from 1: ``len(groups) == len(encoded) + row rejects``)."""
    return encode_each(groups, lambda g: encode_group(g, tokenizer, max_length), stage)


def held_out_prompts(groups: Sequence[ValidatedGroup], fraction: float, seed: int) -> set[str]:
    """A seeded ``fraction`` of the distinct prompt ids (at least one when ``fraction > 0`` and
    there are two or more prompts), so no prompt is in both halves."""
    prompts = sorted({g.prompt.prompt_id for g in groups})
    if fraction <= 0 or len(prompts) < 2:
        return set()
    n = min(max(1, round(fraction * len(prompts))), len(prompts) - 1)
    return set(random.Random(seed).sample(prompts, n))


def split_held_out(groups: Sequence[ValidatedGroup], fraction: float, seed: int,
                   use_test_split: bool = True) -> list[ValidatedGroup]:
    """The groups with ``split`` set to ``train`` or ``test``: the data's own test split when
    it has one (and ``use_test_split``), else a seeded share of the prompts."""
    if use_test_split and any(g.split == "test" for g in groups):
        return [g if g.split == "test" else g.model_copy(update={"split": "train"})
                for g in groups]
    held = held_out_prompts(groups, fraction, seed)
    return [g.model_copy(update={"split": "test" if g.prompt.prompt_id in held else "train"})
            for g in groups]
