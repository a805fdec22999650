"""What every layout shares: the raw group a layout fills, the settings it reads with
(:class:`Context`), grouping rows by prompt (:class:`Grouper`) and the row driver
(:func:`collect_rows`). Building records from raw groups is :mod:`.build`.

A layout reads rows into :class:`RawGroup` s: a prompt, its responses (text, model, where each
came from) and :class:`Vote` s (one annotator's scores of some of the responses, higher is
better).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from grouppref.errors import RowError
from grouppref.pipeline.imports.config import ImportConfig
from grouppref.readers.mapping import ColumnMapping
from grouppref.readers.prompts import PromptIds, derived_prompt, prompt_from_row
from grouppref.readers.rows import BlankLine, Row, maybe_json, to_reject
from grouppref.schemas import (
    AnnotatedGroup,
    Prompt,
    Reject,
)
from grouppref.schemas.arrow import from_stored_row, table_rows
from grouppref.schemas.records import AnnotatorKind

if TYPE_CHECKING:
    import pyarrow as pa


class Seen(NamedTuple):
    """A row as the grouper saw it: its number, group key, prompt id and content key."""

    row: int
    key: str
    prompt_id: str
    content: str


@dataclass
class SeenRows:
    """Rows as a grouper saw them (:class:`Seen`), column by column: what a process sends back
    of its rows, seven times faster to pickle and unpickle than the tuples (13 MB of 25,000
    Nectar rows: 0.02 s against 0.15 s)."""

    rows: list[int]
    keys: list[str]
    prompt_ids: list[str]
    contents: list[str]

    @classmethod
    def of(cls, seen: Iterable[Seen]) -> SeenRows:
        out = cls([], [], [], [])
        for row, key, prompt_id, content in seen:
            out.rows.append(row)
            out.keys.append(key)
            out.prompt_ids.append(prompt_id)
            out.contents.append(content)
        return out

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[Seen]:
        return map(Seen._make, self.tuples())

    def tuples(self) -> Iterator[tuple[int, str, str, str]]:
        """The rows as plain tuples (what :meth:`Grouper.replay` reads), made faster."""
        return zip(self.rows, self.keys, self.prompt_ids, self.contents, strict=True)


# what stops a new group (Grouper.replay): None (nothing), ("prompt", r): the prompt of row r
# again where rows do not merge; ("id", r): its prompt id taken by row r's other prompt
Stop = tuple[Literal["prompt", "id"], int] | None


@dataclass(slots=True)
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
    (``None``: not kept); ``notes`` what the annotator said beyond the scores (the ranking's
    ``metadata``: a HelpSteer3 reasoning, an Arena verdict)."""

    annotator: str
    scores: dict[int, float] = field(default_factory=dict)
    shown: dict[int, float] | None = None
    row: int = 0
    notes: dict[str, str | int | float | bool] | None = None  # the ranking's metadata


@dataclass
class RawGroup:
    """A group as a layout assembled it, before duplicates, ties and sizes are handled."""

    prompt: Prompt
    row: int
    kind: AnnotatorKind
    responses: list[Response] = field(default_factory=list)
    votes: list[Vote] = field(default_factory=list)
    repeats_expected: bool = False  # pairs: a response recurs across rows; no note for that
    content: str | None = None  # the prompt's content_key, when the grouper made it

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
    # the mapping with extra metadata columns, made once per set of columns (see prompt)
    extended: dict[tuple[str, ...], ColumnMapping] = field(default_factory=dict, repr=False)
    # the last prompt made from a derived prompt, with its content key (see content_key)
    made: tuple[Prompt, str] | None = field(default=None, repr=False)
    # when a list: every row that reaches the grouper, noted there (Grouper.replay)
    seen: list[Seen] | None = field(default=None, repr=False)
    # rows of a layout of one row per group taken as read, each at its place among the rows
    # read (their prompts and ids taken; Grouper.replay): what decides the rows read again
    read_before: list[Seen] = field(default_factory=list, repr=False)

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
        if type(value) is float:  # most ratings: float() would give the value itself
            return value if math.isfinite(value) else None
        if value is None or (isinstance(value, str) and value.strip() in self.config.missing):
            return None
        try:
            x = float(value)
        except (TypeError, ValueError):
            hint = (f" (if it means 'not rated': --missing {value.strip()!r})"
                    if isinstance(value, str) and value.strip() else "")
            rejects.append(self.reject(f"score {value!r} is not a number; that candidate is left "
                                       f"out of this ranking{hint}", number, where))
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
        ``extra`` columns the row has with a scalar value join its metadata. A derived prompt
        is made with its content key once (:mod:`.derived`), kept for :meth:`content_key`."""
        mapping = self.mapping
        present = [c for c in extra if isinstance(row.get(c), str | int | float | bool)
                   and c not in mapping.metadata_columns]
        if present:
            key = tuple(present)
            if key not in self.extended:
                self.extended[key] = mapping.model_copy(update={"metadata_columns": [
                    *mapping.metadata_columns, *present]})
            mapping = self.extended[key]
        made = None if text is None and messages is None else derived_prompt(
            row, mapping, self.source, number, text=text, messages=messages)
        if made is None:
            return prompt_from_row(row, mapping, self.source, number, text=text,
                                   messages=messages)
        self.made = made
        return made[0]

    def content_key(self, prompt: Prompt) -> str:
        """``prompt.content_key()``, not computed again for the prompt just made."""
        made = self.made
        return made[1] if made is not None and made[0] is prompt else prompt.content_key()

    def response(self, value: Any, number: int, where: str) -> tuple[Any, str | None]:
        """``(text, model)`` of a response given as a string or an object holding the text
        under ``text_key`` (and the model under ``model_key``).

        Raises:
            RowError: neither.
        """
        if not isinstance(value, dict):  # a dict is as it is; text may hold a JSON object
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

    def absent(self, names: list[str], found: set[str], keys: set[str], number: int,
               where: str, option: str, rejects: list[Reject]) -> None:
        """A part-reject for the score fields that no response of the row holds at all (a
        misspelt ``option``, or data without them), which would otherwise leave the row
        without their rankings and say nothing."""
        missing = [n for n in names if n not in found]
        if missing and keys:
            rejects.append(self.reject(
                f"no response has {', '.join(map(repr, missing))} (their fields: {sorted(keys)}; "
                f"see {option}): no ranking by {'it' if len(missing) == 1 else 'them'} here",
                number, where))

    def keep_language(self, row: dict[str, Any], number: int, column: str) -> None:
        """Nothing when ``langs`` is empty or names the row's ``column`` (case ignored).

        Raises:
            RowError: the row's language is not one of ``langs``.
        """
        langs = self.config.langs
        value = row.get(column)
        if langs and (not isinstance(value, str)
                      or value.casefold() not in {x.casefold() for x in langs}):
            raise self.fail(f"language {value!r} not kept (--lang {' '.join(langs)})", number,
                            column)

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
class Counts:
    """What the stats count of the groups a layout built."""

    candidates: int = 0
    annotators: Counter[str] = field(default_factory=Counter)  # rankings per annotator
    partial: int = 0  # rankings that leave some candidates out
    split: int = 0  # raw groups split into several
    models: set[str] = field(default_factory=set)

    def add(self, other: Counts) -> None:
        """Count ``other``'s groups too."""
        self.candidates += other.candidates
        self.annotators.update(other.annotators)
        self.partial += other.partial
        self.split += other.split
        self.models |= other.models

    def remove(self, other: Counts) -> None:
        """Stop counting ``other``'s groups (counted here before); the models are not
        removed (another group may name them)."""
        self.candidates -= other.candidates
        self.annotators -= other.annotators
        self.partial -= other.partial
        self.split -= other.split

    def stats(self, ctx: Context, rows: int, blank: int, groups: int) -> dict[str, Any]:
        """The stage's stats: these counts, the rows read and the groups made."""
        return {"source": ctx.source, "layout": ctx.layout, "rows": rows, "blank_lines": blank,
                "groups": groups, "candidates": self.candidates,
                "rankings": sum(self.annotators.values()), "partial_rankings": self.partial,
                "groups_split": self.split, "annotators": dict(sorted(self.annotators.items())),
                "models": sorted(self.models)}


@dataclass
class Imported:
    """The result of a layout: the groups (their stored rows, as the stage writes them, in one
    Arrow table of ``AnnotatedGroup``'s schema: no group is held as Python objects), every
    reject, and the counts the stage reports."""

    table: pa.Table  # each group's row as to_row gives it, in order
    group_rows: list[int]  # the (first) row each group was read from
    rejects: list[Reject]  # the rejects of reading (in row order), then of building
    rows: int
    blank: int
    stats: dict[str, Any]
    counts: Counts = field(default_factory=Counts)
    reading: int = 0  # how many of the rejects are reading's

    @cached_property
    def groups(self) -> list[AnnotatedGroup]:
        """The groups as records (read back from their stored form and validated)."""
        return [from_stored_row(AnnotatedGroup, row) for row in table_rows(self.table)]

    @property
    def units(self) -> int:
        """Stage inputs: groups as assembled plus rows rejected on their own."""
        return self.table.num_rows + sum(r.scope == "row" for r in self.rejects)


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
        # one row per group, and no later row can retract an earlier group (duplicate_ids is
        # not reject_all): a group is final once its row is read (see release)
        self.streams = not merge and ctx.mapping.duplicate_ids != "reject_all"
        self.released: dict[str, int] = {}  # key -> row of a group handed on by release
        self.fresh: list[tuple[str, RawGroup]] = []  # made since the last release, by key
        # rows taken as read before (Context.read_before), each taken at its place
        self.earlier = sorted(ctx.read_before) if self.streams else []

    def group(self, prompt: Prompt, number: int, key: str | None = None,
              merge: bool | None = None) -> RawGroup:
        """The group of ``prompt`` (made on its first row).

        Raises:
            RowError: the prompt id names another prompt; a repeated prompt where rows do not
                merge; a ``group_by`` value seen with another prompt.
        """
        content = self.ctx.content_key(prompt)
        key = content if key is None else f"key:{key}"
        if self.earlier and self.earlier[0].row < number:
            self.replay(self._taken_before(number))
        if self.ctx.seen is not None:
            self.ctx.seen.append(Seen(number, key, prompt.prompt_id, content))
        found = self.groups.get(key)
        if self.streams and merge:
            raise AssertionError("rows cannot merge into a group already handed on (release)")
        if found is None and key in self.released:  # only where rows never merge
            raise self.ctx.fail(f"same prompt as row {self.released[key]} (this layout has one "
                                "row per prompt)", number, self.ctx.mapping.text)
        if found is None:
            self.ids.check(prompt, number, content)
            self.groups[key] = RawGroup(prompt=prompt, row=number, kind=self.ctx.kind,
                                        content=content)
            if self.streams:
                self.fresh.append((key, self.groups[key]))
            return self.groups[key]
        if not (self.merge if merge is None else merge):
            raise self.ctx.fail(f"same prompt as row {found.row} (this layout has one row per "
                                "prompt)", number, self.ctx.mapping.text)
        if (found.content if found.content is not None else found.prompt.content_key()
                ) != content:
            raise self.ctx.fail(f"group {key[4:]!r} already has a different prompt (row "
                                f"{found.row})", number, self.ctx.config.group_by)
        return found

    def _taken_before(self, number: int) -> list[Seen]:
        """The rows of :attr:`earlier` before row ``number``, no longer pending."""
        cut = next((i for i, s in enumerate(self.earlier) if s.row >= number),
                   len(self.earlier))
        taken, self.earlier = self.earlier[:cut], self.earlier[cut:]
        return taken

    def replay(self, seen: Iterable[tuple[int, str, str, str]]) -> list[Stop]:
        """What :meth:`group` decides for these rows of a layout of one row per group, read in
        this order and no others: for each, ``None`` (its group is made) or what stops it
        (:data:`Stop`). The grouper keeps the prompts and ids of the groups made."""
        out: list[Stop] = []
        for row, key, prompt_id, content in seen:
            if key in self.released:
                out.append(("prompt", self.released[key]))
                continue
            first = self.ids.taken(prompt_id, content)
            if first is not None:
                out.append(("id", first))
                continue
            self.ids.check_id(prompt_id, row, content)  # notes the id: it is free
            self.released[key] = row
            out.append(None)
        return out

    def claim(self, seen: Seen) -> bool:
        """Make the group of a row of a layout of one row per group that is read without a
        :class:`RawGroup` (its group built elsewhere, in its place), after every group made
        before it was released: ``True`` where :meth:`group` would make it (it is noted as
        made, and in ``ctx.seen``); ``False`` where :meth:`group` would stop it (nothing is
        noted: read the row through :meth:`group` for its reject)."""
        if not self.streams or self.fresh or self.earlier:
            raise AssertionError("claim is for rows of one row per group, after a release")
        if seen.key in self.released or self.ids.taken(seen.prompt_id, seen.content) is not None:
            return False
        if self.ctx.seen is not None:
            self.ctx.seen.append(seen)
        self.ids.check_id(seen.prompt_id, seen.row, seen.content)
        self.released[seen.key] = seen.row
        return True

    def release(self) -> list[RawGroup]:
        """Where groups are final once their row is read (:attr:`streams`): the groups made
        since the last call, in order, handed on and no longer held (their keys are kept, to
        reject a repeated prompt); elsewhere nothing."""
        fresh, self.fresh = self.fresh, []
        for key, _ in fresh:
            self.released[key] = self.groups.pop(key).row
        return [group for _, group in fresh]

    def collected(self, out: Collected) -> Collected:
        retracted = self.ids.retracted()
        out.raw = [g for g in self.groups.values() if g.row not in retracted]
        out.rejects.extend(retracted.values())
        return out


RELEASE_EVERY = 1000  # groups handed on together (build them in runs, not one per row)
RowFn = Callable[[dict[str, Any], int, Context, Grouper, list[Reject]], None]


class RowReader:
    """The row driver every layout shares (:func:`collect_rows`), a row at a time: each row
    goes to ``add`` (which fills the grouper) or becomes a reject with its file, row and
    reason. With ``final``, groups that no later row can change (one row per group,
    :meth:`Grouper.release`) go to ``final`` instead of into ``Collected.raw``, in runs of
    :data:`RELEASE_EVERY` (handing each on alone, between two rows, cost 13 % more user CPU on
    50,000 Nectar rows and 22 % on 200,000; in runs, none at 50,000 and 8 % at 200,000)."""

    def __init__(self, ctx: Context, add: RowFn, *, merge: bool,
                 final: Callable[[RawGroup], None] | None = None) -> None:
        self.ctx, self.add, self.final = ctx, add, final
        self.out = Collected()
        self.grouper = Grouper(ctx, merge)

    def take(self, number: int, row: Row) -> None:
        """Read one row (its number in the file)."""
        ctx, out = self.ctx, self.out
        if self.final is not None and len(self.grouper.fresh) >= RELEASE_EVERY:
            self.release()
        out.rows += 1
        try:
            if isinstance(row, RowError):
                out.blank += isinstance(row, BlankLine)
                raise row
            self.add(row, number, ctx, self.grouper, out.rejects)
        except RowError as err:
            err.source, err.row = err.source or ctx.source, err.row or number
            out.rejects.append(to_reject(ctx.stage, err))
        except (TypeError, AttributeError, KeyError, IndexError, ValueError) as e:
            # a shape no layout check foresaw: this row is a reject, never a traceback
            out.rejects.append(ctx.reject(
                f"unexpected shape for layout {ctx.layout!r} ({type(e).__name__}: {e}); see "
                "docs/import.md for its schema", number, scope="row"))

    def release(self) -> None:
        """With ``final``: the groups made since the last release handed on to it."""
        if self.final is not None:
            for group in self.grouper.release():
                self.final(group)

    def collected(self) -> Collected:
        """What the rows made (after the last release)."""
        self.release()
        return self.grouper.collected(self.out)


def collect_rows(rows: Iterable[tuple[int, Row]], ctx: Context, add: RowFn, *,
                 merge: bool, final: Callable[[RawGroup], None] | None = None) -> Collected:
    """Every row read by a :class:`RowReader`: what they made."""
    reader = RowReader(ctx, add, merge=merge, final=final)
    for number, row in rows:
        reader.take(number, row)
    return reader.collected()
