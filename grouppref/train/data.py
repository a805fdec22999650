"""Validated groups -> token ids -> padded tensor batches for the GSPO trainer.

A group becomes one :class:`TokenizedGroup` (prompt tokens once, K response tokens, the
aggregated pair matrices and the consensus order) and a list of them one :class:`GroupBatch`.

Padding: prompts are LEFT-padded, so every prompt ends at column P − 1 and the logit that
predicts a group's first response token sits in the same column for all groups; responses
are RIGHT-padded. :func:`grouppref.train.logps.group_logps` relies on both.

Overflow: a prompt longer than ``max_prompt_length`` rejects the group (cutting a prompt
changes the task). A response longer than ``max_response_length`` is truncated (its EOS is
then lost and its behaviour log-prob no longer applies: set to unknown) or, with
``overflow="reject"``, the candidate is dropped and reported; a group left with fewer than
two candidates is rejected. Nothing is dropped without a :class:`Reject`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from grouppref.errors import ConfigError, RowError
from grouppref.schemas import Reject, ValidatedGroup
from grouppref.train.batch import GroupBatch
from grouppref.train.config import DataConfig

Tensor = torch.Tensor


@dataclass
class TokenizedGroup:
    """One :class:`ValidatedGroup` tokenised. Lists are indexed by candidate (K of them).

    ``p_ij[i][j]`` is P(i ≻ j) (0.5 on the diagonal and for pairs without a preference),
    ``w_ij`` the symmetric confidence (0 where no pair), ``order`` the consensus best first
    (ties broken by strength), ``labels`` and ``strengths`` the listwise losses' targets
    (:func:`list_targets`; empty when not built from a :class:`ValidatedGroup`).
    ``ref_logps`` is filled by the trainer after a reference pass.
    """

    group_id: str
    prompt_ids: list[int]
    cand_ids: list[list[int]]
    p_ij: list[list[float]]
    w_ij: list[list[float]]
    order: list[int]
    ref_logps: list[float] | None
    behavior_logps: list[float | None]
    split: str | None
    candidate_ids: list[str] = field(default_factory=list)
    num_truncated: int = 0  # responses cut to max_response_length
    dropped: dict[str, str] = field(default_factory=dict)  # candidate id -> reason (overflow)
    kinds: tuple[str, ...] = ()  # annotator kinds of the consensus (label source, train/mix.py)
    labels: list[float] = field(default_factory=list)  # ψ: consensus tiers below (LiPO)
    strengths: list[float] = field(default_factory=list)  # aggregated log-strengths (NCA)


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


def _pad(rows: list[list[int]], width: int, value: int, left: bool) -> list[list[int]]:
    return [[value] * (width - len(r)) + r if left else r + [value] * (width - len(r)) for r in rows]


def _ref_logps(groups: list[TokenizedGroup], k: int) -> Tensor | None:
    missing = [g.group_id for g in groups if g.ref_logps is None]
    if len(missing) == len(groups):
        return None
    if missing:
        raise ConfigError(f"reference log-probs missing for groups {missing[:5]} "
                          f"({len(missing)} of {len(groups)}); compute them for every group")
    return torch.tensor([list(g.ref_logps or []) + [0.0] * (k - len(g.cand_ids)) for g in groups])


def _per_candidate(groups: list[TokenizedGroup], name: str, k: int) -> Tensor | None:
    """A (B, K) tensor of one per-candidate list (0 in padding), None unless every group has it."""
    rows = [getattr(g, name) for g in groups]
    if any(len(r) != len(g.cand_ids) for r, g in zip(rows, groups, strict=True)):
        return None
    return torch.tensor([list(r) + [0.0] * (k - len(r)) for r in rows], dtype=torch.float32)


def collate_groups(groups: list[TokenizedGroup], pad_token_id: int) -> GroupBatch:
    """Pad a list of tokenised groups into one :class:`GroupBatch`.

    Args:
        groups (list[TokenizedGroup]): at least one group.
        pad_token_id (int): id written into padding (masked out everywhere).

    Returns:
        GroupBatch: prompts left-padded, responses right-padded, candidate slots padded to
        the largest K (``valid`` false, ``p_ij`` 0.5, ``w_ij`` 0, ``behavior_logps`` NaN,
        ``labels`` and ``strengths`` 0; each None unless every group carries it).

    Raises:
        ValueError: ``groups`` is empty. ConfigError: only some groups carry ``ref_logps``.
    """
    if not groups:
        raise ValueError("collate_groups needs at least one group")
    b = len(groups)
    k = max(len(g.cand_ids) for g in groups)
    p_len = max(len(g.prompt_ids) for g in groups)
    t_len = max(len(c) for g in groups for c in g.cand_ids)
    prompts = [g.prompt_ids for g in groups]
    cands = [_pad(list(g.cand_ids) + [[]] * (k - len(g.cand_ids)), t_len, pad_token_id, False)
             for g in groups]
    cand_mask = [[[1] * len(c) + [0] * (t_len - len(c)) for c in list(g.cand_ids)
                  + [[]] * (k - len(g.cand_ids))] for g in groups]
    p_ij = torch.full((b, k, k), 0.5)
    w_ij = torch.zeros(b, k, k)
    valid = torch.zeros(b, k, dtype=torch.bool)
    behavior = torch.full((b, k), float("nan"))
    order = torch.zeros(b, k, dtype=torch.long)
    for i, g in enumerate(groups):
        n = len(g.cand_ids)
        p_ij[i, :n, :n] = torch.tensor(g.p_ij)
        w_ij[i, :n, :n] = torch.tensor(g.w_ij)
        valid[i, :n] = True
        behavior[i, :n] = torch.tensor([float("nan") if x is None else x for x in g.behavior_logps])
        order[i] = torch.tensor(list(g.order) + list(range(n, k)))
    return GroupBatch(
        prompt_ids=torch.tensor(_pad(prompts, p_len, pad_token_id, True)),
        prompt_mask=torch.tensor(_pad([[1] * len(p) for p in prompts], p_len, 0, True)),
        cand_ids=torch.tensor(cands), cand_mask=torch.tensor(cand_mask), valid=valid,
        p_ij=p_ij, w_ij=w_ij, order=order, ref_logps=_ref_logps(groups, k),
        behavior_logps=behavior,
        num_tokens=torch.tensor([[len(c) for c in g.cand_ids] + [0] * (k - len(g.cand_ids))
                                 for g in groups]),
        group_ids=[g.group_id for g in groups],
        candidate_ids=[list(g.candidate_ids) for g in groups],
        labels=_per_candidate(groups, "labels", k), strengths=_per_candidate(groups, "strengths", k))
