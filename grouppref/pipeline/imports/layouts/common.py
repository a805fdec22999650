"""What every layout shares: the rows -> groups driver, the raw group a layout fills, and the
one builder from a raw group to :class:`~grouppref.schemas.AnnotatedGroup` records.

A layout reads rows into :class:`RawGroup` s: a prompt, its responses (text, model, where each
came from) and :class:`Vote` s (one annotator's scores of some of the responses, higher is
better). :func:`build` then, for every layout alike:

* leaves out empty responses and merges duplicates (same text after case and whitespace
  folding) into one candidate whose score in a vote is the mean of its copies' (part-rejects
  say so; a pair whose two sides merge is dropped);
* turns each vote into a ranking: candidates ordered by score, equal scores one tier (a tie);
  unrated candidates left out (a partial ranking); a vote rating fewer than two candidates is
  dropped with the reason;
* splits a group of more than 16 candidates into balanced groups of at most 16 (rankings
  restricted to each part) or rejects it, by ``oversize``; rejects groups under ``min_k``.

Counting: a stage input is a group as assembled (each part of a split group counts) or a row
rejected on its own, so ``inputs == outputs + rejected``; the rows read are in the stats.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from grouppref.errors import RowError
from grouppref.pipeline.imports.config import ImportConfig
from grouppref.readers.mapping import ColumnMapping
from grouppref.readers.prompts import PromptIds, prompt_from_row
from grouppref.readers.rows import BlankLine, Row, maybe_json, to_reject
from grouppref.schemas import (
    MAX_K,
    AnnotatedGroup,
    Annotator,
    Candidate,
    CandidateSource,
    Prompt,
    Ranking,
    Reject,
    make_candidate_id,
    make_group_id,
    normalise_text,
)
from grouppref.schemas.records import AnnotatorKind


@dataclass
class Response:
    """One response as read: its text, the model that wrote it, and where it was."""

    text: Any
    model: str | None
    row: int
    where: str  # e.g. "completions[2]"


@dataclass
class Vote:
    """One annotator's judgement of some responses of a group: ``scores`` maps a response
    index to its score (higher is better); ``shown`` are the values kept with the ranking
    (``None``: not kept)."""

    annotator: str
    scores: dict[int, float] = field(default_factory=dict)
    shown: dict[int, float] | None = None
    row: int = 0


@dataclass
class RawGroup:
    """A group as a layout assembled it, before duplicates, ties and sizes are handled."""

    prompt: Prompt
    row: int
    kind: AnnotatorKind
    responses: list[Response] = field(default_factory=list)
    votes: list[Vote] = field(default_factory=list)
    repeats_expected: bool = False  # pairs: a response recurs across rows; no note for that

    def vote(self, annotator: str, row: int) -> Vote:
        """The vote of ``annotator`` (made on first use)."""
        for v in self.votes:
            if v.annotator == annotator:
                return v
        self.votes.append(Vote(annotator=annotator, row=row))
        return self.votes[-1]

    def next_annotator(self, base: str) -> str:
        """``base`` for the group's first pair, then ``base#2``, ``base#3``, ..."""
        taken = {v.annotator for v in self.votes}
        n, name = 1, base
        while name in taken:
            n += 1
            name = f"{base}#{n}"
        return name


@dataclass
class Context:
    """What a layout reads with: the settings (layout defaults applied), where from, and the
    annotator id / kind of its rankings."""

    config: ImportConfig
    mapping: ColumnMapping
    source: str
    stage: str
    layout: str
    annotator: str
    kind: AnnotatorKind
    text_key: str
    scores: list[str]

    def fail(self, reason: str, number: int, field_name: str | None = None) -> RowError:
        return RowError(reason, field=field_name, source=self.source, row=number)

    def reject(self, reason: str, number: int, field_name: str | None = None, *,
               group_id: str | None = None, scope: str = "part") -> Reject:
        return Reject(stage=self.stage, reason=reason, source=self.source, row=number,
                      field=field_name, group_id=group_id, scope=scope)  # type: ignore[arg-type]

    def number(self, value: Any, number: int, where: str, rejects: list[Reject]) -> float | None:
        """A rating as a float, ``None`` when not rated (one of ``missing``, null, NaN) or not
        a number (a part-reject says so): either way that candidate is left out of that
        ranking."""
        if value is None or (isinstance(value, str) and value.strip() in self.config.missing):
            return None
        try:
            x = float(value)
        except (TypeError, ValueError):
            rejects.append(self.reject(f"score {value!r} is not a number; that candidate is left "
                                       "out of this ranking", number, where))
            return None
        return x if math.isfinite(x) else None

    def add_score(self, group: RawGroup, annotator: str, response: int, value: Any,
                  number: int, where: str, rejects: list[Reject]) -> None:
        """Record ``value`` as ``annotator``'s score of ``response`` (left out when not rated);
        the value itself is kept with the ranking unless lower is better."""
        x = self.number(value, number, where, rejects)
        if x is None:
            return
        vote = group.vote(annotator, number)
        vote.scores[response] = -x if self.config.lower_is_better else x
        if not self.config.lower_is_better:
            vote.shown = vote.shown if vote.shown is not None else {}
            vote.shown[response] = x

    def prompt(self, row: dict[str, Any], number: int, *, text: str | None = None,
               messages: list[Any] | None = None, extra: tuple[str, ...] = ()) -> Prompt:
        """The row's prompt (``text`` / ``messages`` when the layout derived it); the
        ``extra`` columns the row has with a scalar value join its metadata."""
        mapping = self.mapping
        present = [c for c in extra if isinstance(row.get(c), str | int | float | bool)
                   and c not in mapping.metadata_columns]
        if present:
            mapping = mapping.model_copy(update={"metadata_columns": [
                *mapping.metadata_columns, *present]})
        return prompt_from_row(row, mapping, self.source, number, text=text, messages=messages)

    def response(self, value: Any, number: int, where: str) -> tuple[Any, str | None]:
        """``(text, model)`` of a response given as a string or an object holding the text
        under ``text_key`` (and the model under ``model_key``).

        Raises:
            RowError: neither.
        """
        value = maybe_json(value)
        if isinstance(value, str):
            return value, None
        if isinstance(value, dict) and self.text_key in value:
            model = value.get(self.config.model_key)
            return value[self.text_key], str(model) if model is not None else None
        raise self.fail(f"a response must be a string or an object with {self.text_key!r} "
                        f"(see --text-key); got {_shape(value)}", number, where)


    def objects(self, row: dict[str, Any], number: int, what: str,
                rejects: list[Reject]) -> list[tuple[str, dict[str, Any]]]:
        """``(where, object)`` for each item of the row's list of responses (the
        ``responses`` column: UltraFeedback's completions, Nectar's answers); an item that is
        not an object is a part-reject.

        Raises:
            RowError: the column holds no list.
        """
        column = self.mapping.responses
        items = maybe_json(row.get(column))
        if not isinstance(items, list):
            raise self.fail(f"expected a list of {what}s in {column!r}, got "
                            f"{type(items).__name__} (its columns: {sorted(row)})", number, column)
        out = []
        for i, item in enumerate(items):
            if isinstance(item, dict):
                out.append((f"{column}[{i}]", item))
            else:
                rejects.append(self.reject(f"a {what} must be an object, got "
                                           f"{type(item).__name__}; left out", number,
                                           f"{column}[{i}]"))
        return out

    def add_response(self, group: RawGroup, value: Any, number: int, where: str) -> int:
        """Append the response in ``value`` (see :meth:`response`) to ``group``; its index."""
        text, model = self.response(value, number, where)
        group.responses.append(Response(text, model, number, where))
        return len(group.responses) - 1


def _shape(value: Any) -> str:
    if isinstance(value, dict):
        return f"an object with keys {sorted(value)[:8]}"
    return f"a {type(value).__name__}"


@dataclass
class Collected:
    """What a layout read: raw groups (or, for ``groups``, finished ones), rejects, counts."""

    raw: list[RawGroup] = field(default_factory=list)
    built: list[AnnotatedGroup] = field(default_factory=list)
    built_rows: list[int] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)
    rows: int = 0
    blank: int = 0


@dataclass
class Imported:
    """The result of a layout: the groups, every reject, and the counts the stage reports."""

    groups: list[AnnotatedGroup]
    group_rows: list[int]  # the (first) row each group was read from
    rejects: list[Reject]
    rows: int
    blank: int
    stats: dict[str, Any]

    @property
    def units(self) -> int:
        """Stage inputs: groups as assembled plus rows rejected on their own."""
        return len(self.groups) + sum(r.scope == "row" for r in self.rejects)


class Grouper:
    """Raw groups by key (the prompt, or a ``group_by`` value), in first-row order.

    ``merge=True`` (one row per response or per pair): rows with the same key join one
    group. ``merge=False`` (one row per group): a repeated prompt is rejected. Either way one
    prompt id names one prompt (:class:`~grouppref.readers.prompts.PromptIds`).
    """

    def __init__(self, ctx: Context, merge: bool):
        self.ctx, self.merge = ctx, merge
        self.groups: dict[str, RawGroup] = {}
        self.ids = PromptIds(ctx.mapping.duplicate_ids, ctx.source, ctx.stage,
                             ctx.mapping.prompt_id)

    def group(self, prompt: Prompt, number: int, key: str | None = None,
              merge: bool | None = None) -> RawGroup:
        """The group of ``prompt`` (made on its first row).

        Raises:
            RowError: the prompt id names another prompt; a repeated prompt where rows do not
                merge; a ``group_by`` value seen with another prompt.
        """
        key = prompt.content_key() if key is None else f"key:{key}"
        found = self.groups.get(key)
        if found is None:
            self.ids.check(prompt, number)
            self.groups[key] = RawGroup(prompt=prompt, row=number, kind=self.ctx.kind)
            return self.groups[key]
        if not (self.merge if merge is None else merge):
            raise self.ctx.fail(f"same prompt as row {found.row} (this layout has one row per "
                                "prompt)", number, self.ctx.mapping.text)
        if found.prompt.content_key() != prompt.content_key():
            raise self.ctx.fail(f"group {key[4:]!r} already has a different prompt (row "
                                f"{found.row})", number, self.ctx.config.group_by)
        return found

    def collected(self, out: Collected) -> Collected:
        retracted = self.ids.retracted()
        out.raw = [g for g in self.groups.values() if g.row not in retracted]
        out.rejects.extend(retracted.values())
        return out


# Imported data carries no time for its rankings; a fixed one keeps an import's output (and so
# the cache keys of every stage after it) the same when the same file is imported again.
UNKNOWN_TIME = datetime(1970, 1, 1, tzinfo=timezone.utc)


RowFn = Callable[[dict[str, Any], int, Context, Grouper, list[Reject]], None]


def collect_rows(rows: Iterable[tuple[int, Row]], ctx: Context, add: RowFn, *,
                 merge: bool) -> Collected:
    """The driver every layout shares: each row goes to ``add`` (which fills the grouper) or
    becomes a reject with its file, row and reason."""
    out = Collected()
    grouper = Grouper(ctx, merge)
    for number, row in rows:
        out.rows += 1
        try:
            if isinstance(row, RowError):
                out.blank += isinstance(row, BlankLine)
                raise row
            add(row, number, ctx, grouper, out.rejects)
        except RowError as err:
            err.source, err.row = err.source or ctx.source, err.row or number
            out.rejects.append(to_reject(ctx.stage, err))
    return grouper.collected(out)


# -- building the records --------------------------------------------------------------------
def _merge_responses(raw: RawGroup, ctx: Context, gid: str, rejects: list[Reject]
                     ) -> tuple[list[Response], dict[int, int]]:
    """Distinct non-empty responses, and response index -> candidate index."""
    kept: list[Response] = []
    index: dict[int, int] = {}
    seen: dict[str, int] = {}
    for i, resp in enumerate(raw.responses):
        if not isinstance(resp.text, str):
            what = "no text" if resp.text is None else f"a {type(resp.text).__name__}, not text"
            rejects.append(ctx.reject(f"response has {what}; left out", resp.row, resp.where,
                                      group_id=gid))
            continue
        norm = normalise_text(resp.text)
        if not norm:
            rejects.append(ctx.reject("empty response left out", resp.row, resp.where,
                                      group_id=gid))
        elif norm in seen:
            first = kept[seen[norm]]
            if not (raw.repeats_expected and first.row != resp.row):
                rejects.append(ctx.reject(f"same response as {first.where} (row {first.row}): "
                                          "merged into one candidate, its votes kept", resp.row,
                                          resp.where, group_id=gid))
            index[i] = seen[norm]
        else:
            seen[norm] = index[i] = len(kept)
            kept.append(resp)
    return kept, index


def tiers_from_scores(scores: dict[int, float]) -> list[list[int]]:
    """Indices ordered by score, best first; equal scores share a tier (a tie)."""
    order = sorted(scores, key=lambda i: (-scores[i], i))
    tiers: list[list[int]] = []
    for i in order:
        if tiers and math.isclose(scores[tiers[-1][0]], scores[i], rel_tol=0, abs_tol=1e-9):
            tiers[-1].append(i)
        else:
            tiers.append([i])
    return tiers


Scored = tuple[Vote, dict[int, float], dict[int, float] | None]


def _candidate_votes(raw: RawGroup, index: dict[int, int], ctx: Context, gid: str,
                     rejects: list[Reject]) -> list[Scored]:
    """Each vote on candidates: scores (copies' averaged) and the kept values (the first
    copy's); votes on fewer than 2 candidates dropped with the reason."""
    out: list[Scored] = []
    for vote in raw.votes:
        by_candidate: dict[int, list[float]] = {}
        shown: dict[int, float] = {}
        for i, s in vote.scores.items():
            if i in index:
                by_candidate.setdefault(index[i], []).append(s)
                if vote.shown is not None and i in vote.shown:
                    shown.setdefault(index[i], vote.shown[i])
        if len(by_candidate) < 2:
            merged = len(vote.scores) >= 2 and len({index.get(i) for i in vote.scores}) == 1
            why = ("its responses are one and the same text" if merged else
                   f"it rates {len(by_candidate)} usable candidate(s); a ranking needs 2")
            rejects.append(ctx.reject(f"ranking by {vote.annotator!r} left out: {why}",
                                      vote.row, f"rankings[{vote.annotator}]", group_id=gid))
            continue
        out.append((vote, {c: sum(v) / len(v) for c, v in by_candidate.items()},
                    shown if vote.shown is not None else None))
    return out


def _parts(n: int, oversize: str) -> list[range] | None:
    """Candidate index ranges of a group of ``n``: one, or balanced parts of at most 16."""
    if n <= MAX_K:
        return [range(n)]
    if oversize == "reject":
        return None
    count = -(-n // MAX_K)
    bounds = [round(j * n / count) for j in range(count + 1)]
    return [range(bounds[j], bounds[j + 1]) for j in range(count)]


def build(raw: RawGroup, ctx: Context) -> tuple[list[AnnotatedGroup], list[Reject]]:
    """The records of one raw group (several when split) and its rejects."""
    rejects: list[Reject] = []
    gid = make_group_id(raw.prompt)
    kept, index = _merge_responses(raw, ctx, gid, rejects)
    votes = _candidate_votes(raw, index, ctx, gid, rejects)
    parts = _parts(len(kept), ctx.config.oversize)
    if parts is None or len(kept) < ctx.config.min_k:
        why = (f"{len(kept)} distinct responses; a group holds at most {MAX_K} (oversize: "
               "reject; 'split' would split it)" if parts is None else
               f"{len(kept)} distinct non-empty response(s); a group needs at least "
               f"{ctx.config.min_k} (min_k)")
        rejects.append(ctx.reject(why, raw.row, ctx.mapping.responses, group_id=gid,
                                  scope="row"))
        return [], rejects
    groups = []
    for j, part in enumerate(parts):
        part_gid = gid if len(parts) == 1 else f"{gid}-{j + 1}of{len(parts)}"
        groups.append(_record(raw, part_gid, [kept[c] for c in part], part, votes, ctx,
                              rejects))
    if len(parts) > 1:
        rejects.append(ctx.reject(f"{len(kept)} distinct responses split into {len(parts)} "
                                  f"groups of at most {MAX_K} ({', '.join(g.group_id for g in groups)})",
                                  raw.row, ctx.mapping.responses, group_id=gid))
    return groups, rejects


def _record(raw: RawGroup, gid: str, responses: list[Response], part: range,
            votes: list[Scored], ctx: Context, rejects: list[Reject]) -> AnnotatedGroup:
    candidates = [Candidate(candidate_id=make_candidate_id(gid, r.text), text=r.text,
                            source=CandidateSource(kind="import", model=r.model))
                  for r in responses]
    ids = {c: candidates[c - part.start].candidate_id for c in part}
    rankings = []
    for vote, scores, shown in votes:
        mine = {c: s for c, s in scores.items() if c in ids}
        if len(mine) == 1:  # a split left this vote one candidate here: that comparison is lost
            rejects.append(ctx.reject(f"ranking by {vote.annotator!r} names 1 candidate of group "
                                      f"{gid}; left out of it", vote.row,
                                      f"rankings[{vote.annotator}]", group_id=gid))
        if len(mine) < 2:
            continue
        kept = {ids[c]: v for c, v in (shown or {}).items() if c in ids}
        rankings.append(Ranking(
            annotator=Annotator(id=vote.annotator, kind=raw.kind), group_id=gid,
            tiers=[[ids[c] for c in tier] for tier in tiers_from_scores(mine)],
            scores=kept or None, created_at=UNKNOWN_TIME))
    return AnnotatedGroup(group_id=gid, prompt=raw.prompt, candidates=candidates,
                          rankings=rankings)


def finish(collected: Collected, ctx: Context) -> Imported:
    """Every raw group built; the stats the stage reports."""
    groups, group_rows = list(collected.built), list(collected.built_rows)
    rejects = list(collected.rejects)
    split = 0
    for raw in collected.raw:
        built, more = build(raw, ctx)
        groups.extend(built)
        group_rows.extend([raw.row] * len(built))
        rejects.extend(more)
        split += len(built) > 1
    annotators = Counter(r.annotator.id for g in groups for r in g.rankings)
    partial = sum(len({c for t in r.tiers for c in t}) < g.k for g in groups for r in g.rankings)
    stats = {"source": ctx.source, "layout": ctx.layout, "rows": collected.rows,
             "blank_lines": collected.blank, "groups": len(groups),
             "candidates": sum(g.k for g in groups), "rankings": sum(annotators.values()),
             "partial_rankings": partial, "groups_split": split,
             "annotators": dict(sorted(annotators.items())),
             "models": sorted({c.source.model for g in groups for c in g.candidates
                               if c.source.model})}
    return Imported(groups=groups, group_rows=group_rows, rejects=rejects, rows=collected.rows,
                    blank=collected.blank, stats=stats)
