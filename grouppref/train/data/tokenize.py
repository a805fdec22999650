"""Validated groups -> token ids for the trainers and the eval stage.

A group becomes one :class:`~grouppref.train.tensors.batch.TokenizedGroup` (prompt tokens once,
K response tokens, the aggregated pair matrices, the consensus order and the listwise targets);
:func:`~grouppref.train.tensors.batch.collate_groups` pads a list of them into one
:class:`~grouppref.train.tensors.batch.GroupBatch`.

Overflow: a prompt longer than ``max_prompt_length`` rejects the group (cutting a prompt
changes the task). A response longer than ``max_response_length`` is truncated (its EOS is
then lost and its behaviour log-prob no longer applies: set to unknown) or, with
``overflow="reject"``, the candidate is dropped and reported; a group left with fewer than
two candidates is rejected. Nothing is dropped without a :class:`Reject`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from grouppref.errors import ConfigError, RowError
from grouppref.schemas import Reject, ValidatedGroup
from grouppref.train.settings.shared import DataConfig
from grouppref.train.tensors.batch import TokenizedGroup


def check_tokenizer(tokenizer: Any, config: DataConfig) -> None:
    """Fail before any row is read if the tokenizer cannot serve ``config``.

    Raises:
        ConfigError: no EOS token, or ``chat_template`` on and the tokenizer has none.
    """
    if tokenizer.eos_token_id is None:
        raise ConfigError("the tokenizer has no EOS token; responses need one to end on")
    if config.chat_template and not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "the tokenizer")
        raise ConfigError(
            f"{name} has no chat template, but chat_template is on: use an instruct model's "
            "tokenizer, or set chat_template=false to feed prompt text as is (plain-text "
            "prompts only)"
        )


def _prompt_ids(group: ValidatedGroup, tokenizer: Any, config: DataConfig) -> list[int]:
    prompt = group.prompt
    if config.chat_template:
        turns = [m.model_dump() for m in prompt.as_messages()]
        text = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if prompt.text is None:
        raise RowError("the prompt is chat messages but chat_template is off; turn "
                       "chat_template on (with a tokenizer that has one)", field="prompt",
                       group_id=group.group_id)
    return list(tokenizer(prompt.text)["input_ids"])


def pair_targets(group: ValidatedGroup, keep: list[str]
                 ) -> tuple[list[list[float]], list[list[float]], list[int]]:
    """The training targets of ``group`` restricted to the candidates ``keep`` (in that order):
    ``p_ij``, ``w_ij`` and the consensus order (see :class:`TokenizedGroup`).

    Raises:
        RowError: no pair with weight > 0 among ``keep`` (the group carries no signal).
    """
    index = {cid: i for i, cid in enumerate(keep)}
    k = len(keep)
    p = [[0.5] * k for _ in range(k)]
    w = [[0.0] * k for _ in range(k)]
    for pair in group.pairs:
        if pair.winner in index and pair.loser in index:
            i, j = index[pair.winner], index[pair.loser]
            p[i][j], p[j][i] = pair.p, 1.0 - pair.p
            w[i][j] = w[j][i] = pair.weight
    if not any(x > 0 for row in w for x in row):
        raise RowError("no preference pair with weight > 0 among the candidates kept; "
                       "the group carries no training signal", field="pairs",
                       group_id=group.group_id)
    order: list[int] = []
    for tier in group.consensus:
        members = [cid for cid in tier if cid in index]
        members.sort(key=lambda cid: (-group.strengths[cid], index[cid]))
        order.extend(index[cid] for cid in members)
    return p, w, order


def list_targets(group: ValidatedGroup, keep: list[str]) -> tuple[list[float], list[float]]:
    """The listwise targets of ``group``'s candidates ``keep`` (in that order): graded labels
    ψ, the number of consensus tiers below each candidate among those kept (the worst tier
    has 0, tied candidates share a label), and the aggregated strengths.

    Example:
        >>> g = ValidatedGroup.model_construct(consensus=[["a"], ["b", "c"], ["d"]],
        ...                                    strengths={"a": 1.0, "b": 0.0, "c": 0.0, "d": -1.0})
        >>> list_targets(g, ["d", "b", "a"])
        ([0.0, 1.0, 2.0], [-1.0, 0.0, 1.0])
    """
    kept = set(keep)
    tiers = [tier for tier in group.consensus if kept.intersection(tier)]
    below = {cid: float(len(tiers) - 1 - t) for t, tier in enumerate(tiers) for cid in tier}
    return [below[cid] for cid in keep], [float(group.strengths[cid]) for cid in keep]


def tokenize_group(group: ValidatedGroup, tokenizer: Any, config: DataConfig) -> TokenizedGroup:
    """Tokenise one group: prompt once, each response with EOS appended.

    Args:
        group (ValidatedGroup): an aggregated group.
        tokenizer (Any): a transformers tokenizer (checked with :func:`check_tokenizer`).
        config (DataConfig): lengths, overflow policy, chat template.

    Returns:
        TokenizedGroup: with ``ref_logps=None``; candidates dropped for overflow listed
        in ``dropped``.

    Raises:
        RowError: prompt too long, chat prompt without chat template, fewer than two
            candidates left, or no pair with positive weight left.
        ConfigError: the tokenizer cannot serve ``config``.
    """
    check_tokenizer(tokenizer, config)
    gid = group.group_id
    prompt_ids = _prompt_ids(group, tokenizer, config)
    if len(prompt_ids) > config.max_prompt_length:
        raise RowError(f"prompt has {len(prompt_ids)} tokens, over max_prompt_length="
                       f"{config.max_prompt_length}; raise it or shorten the prompt",
                       field="prompt", group_id=gid)
    keep, cand_ids, behavior, dropped, truncated = [], [], [], {}, 0
    for cand in group.candidates:
        ids = list(tokenizer(cand.text, add_special_tokens=False)["input_ids"])
        ids.append(tokenizer.eos_token_id)
        logp = cand.behavior_logp
        if len(ids) > config.max_response_length:
            if config.overflow == "reject":
                dropped[cand.candidate_id] = (
                    f"response has {len(ids)} tokens, over max_response_length="
                    f"{config.max_response_length} (overflow='reject')")
                continue
            ids, logp, truncated = ids[:config.max_response_length], None, truncated + 1
        keep.append(cand.candidate_id)
        cand_ids.append(ids)
        behavior.append(logp)
    if len(keep) < 2:
        raise RowError(f"only {len(keep)} candidate(s) left after dropping {len(dropped)} over "
                       f"max_response_length={config.max_response_length}; a group needs 2 "
                       "(raise max_response_length or use overflow='truncate')",
                       field="candidates", group_id=gid)
    p_ij, w_ij, order = pair_targets(group, keep)
    labels, strengths = list_targets(group, keep)
    return TokenizedGroup(
        group_id=gid, prompt_ids=prompt_ids, cand_ids=cand_ids, p_ij=p_ij, w_ij=w_ij,
        order=order, ref_logps=None, behavior_logps=behavior,
        split=group.split, candidate_ids=keep, num_truncated=truncated, dropped=dropped,
        kinds=consensus_kinds(group), labels=labels, strengths=strengths)


def consensus_kinds(group: ValidatedGroup) -> tuple[str, ...]:
    """Annotator kinds of the rankings ``group``'s consensus was fitted on: the aggregate
    stage's ``consensus_kinds``, or, for groups aggregated before it was recorded, the kinds
    of every ranking the group carries."""
    if group.consensus_kinds is not None:
        return tuple(group.consensus_kinds)
    return tuple(sorted({r.annotator.kind for r in group.rankings}))


def tokenize_groups(groups: Iterable[ValidatedGroup], tokenizer: Any, config: DataConfig,
                    stage: str = "train") -> tuple[list[TokenizedGroup], list[Reject]]:
    """Tokenise many groups; a bad group becomes a row ``Reject``, a dropped candidate a part one.

    Row numbers in the rejects are 1-based positions in ``groups``. Counts add up:
    ``len(groups) == len(tokenized) + number of row rejects``.

    Raises:
        ConfigError: the tokenizer cannot serve ``config`` (checked once, before any row).
    """
    check_tokenizer(tokenizer, config)
    return encode_each(groups, lambda g: tokenize_group(g, tokenizer, config), stage)


def encode_each(groups: Iterable[ValidatedGroup], encode: Callable[[ValidatedGroup], TokenizedGroup],
                stage: str) -> tuple[list[TokenizedGroup], list[Reject]]:
    """``encode`` every group: a ``RowError`` becomes a row reject, each candidate the
    encoding dropped (``TokenizedGroup.dropped``) a part reject. Rows are numbered from 1, so
    ``len(groups) == len(encoded) + row rejects``."""
    out: list[TokenizedGroup] = []
    rejects: list[Reject] = []
    for row, group in enumerate(groups, start=1):
        try:
            enc = encode(group)
        except RowError as e:
            rejects.append(Reject(stage=stage, reason=e.reason, row=row, group_id=group.group_id,
                                  field=e.field))
            continue
        rejects.extend(Reject(stage=stage, reason=reason, row=row, group_id=group.group_id,
                              field=f"candidates[{cid}]", scope="part")
                       for cid, reason in enc.dropped.items())
        out.append(enc)
    return out, rejects


