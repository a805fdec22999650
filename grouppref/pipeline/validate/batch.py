"""The ``schema`` check of stored rows, on Arrow batches (issue 32).

``ValidatedGroup`` (pydantic) is the schema of record and the source of every reject reason.
Parsing each row into it costs ~0.2 ms, most of a ``validate`` run. A table in the record's
own Arrow schema (:func:`~grouppref.schemas.arrow.features_for`: what a stage of the run, or
an export, wrote) already has the record's shape: only the values can still be wrong. This
module checks those values on whole columns with ``pyarrow.compute`` and numpy and says of
each row whether it is *sound*: every check of ``ValidatedGroup`` and its parts certainly holds.
The stage parses only the rows that are not sound (a wrong value, or one this check does not
decide cheaply) with pydantic, which finds and words their reject as before.

The check is conservative by construction: it may call a valid row suspect (then pydantic
accepts it, at the old cost), never an invalid row sound. What it checks, per record:

* ids (``group_id``, ``prompt_id``, candidate and annotator ids, tier and pair ids): 1-256
  printable ASCII characters without space (pydantic's ``^\\S+$`` admits more; other ids are
  suspect);
* non-blank texts (prompt text, chat contents, candidate texts): some character that
  ``str.isspace`` does not hold true (:data:`.columns.SPACE`, tested against every code point);
* literals (roles, kinds, split), ranges (``p``, ``weight``, votes, agreement, token counts,
  log-probs; NaN fails every range), nulls where the record has no ``None``;
* JSON columns (metadata, params, scores, strengths): parsed in Python, each distinct text
  once: a map of text to finite scalars (metadata, params) or numbers (scores, strengths);
* ``created_at``: each distinct text parsed as pydantic parses a ``datetime``;
* per group, on integer codes of the ids: candidate ids unique and 2-16 of them; candidate
  texts unique under :func:`~grouppref.schemas.records.normalise_text` (exactly: equal
  lower-cased lengths are compared in Python); each ranking by this group's id, its tiers
  non-empty, its ids known, each once, at least two; annotators once; the consensus every
  candidate exactly once; strengths' keys the candidate ids; pairs of two distinct known
  candidates, each pair once in either order; score keys known.

:func:`row_facts` reads what the checks after the schema need
(:class:`~grouppref.pipeline.validate.core.GroupFacts`) of the sound rows, as the record
would give it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from grouppref.pipeline.validate.columns import (
    INT64,
    Codes,
    Verdict,
    as_mask,
    between,
    distinct_texts,
    finite_number,
    flatten,
    ids_ok,
    is_datetime,
    is_in,
    json_object,
    list_lengths,
    member,
    not_null,
    null_or,
    repeats,
    scalar_map,
    text_ok,
)
from grouppref.pipeline.validate.core import GroupFacts, split_key_of
from grouppref.schemas.records import MAX_K, MIN_K, prompt_content_key
from grouppref.schemas.texts import duplicate_keys

if TYPE_CHECKING:
    import pyarrow as pa

# a text whose normal form is its lower-cased self: printable ASCII (``ascii_is_printable``)
# without two spaces in a row or a space at either end
_SPACES = r"  |^ | $"
ROLES = ("system", "user", "assistant")
SOURCE_KINDS = ("model", "human", "import")
ANNOTATOR_KINDS = ("human", "reward_model", "rule", "llm_judge", "simulated")


def _prompt(v: Verdict, prompt: pa.StructArray) -> None:
    v.rows(not_null(prompt))
    v.rows(ids_ok(prompt.field("prompt_id")))
    text, messages = prompt.field("text"), prompt.field("messages")
    has_text, has_messages = not_null(text), not_null(messages)
    v.rows(has_text ^ has_messages)
    v.rows(~has_text | as_mask(text_ok(text)))
    v.rows(~has_messages | (list_lengths(messages) >= 1))
    turns, rows = flatten(messages)
    v.items(rows, not_null(turns) & as_mask(is_in(turns.field("role"), ROLES))
            & as_mask(text_ok(turns.field("content"))))
    v.rows(distinct_texts(prompt.field("metadata"), scalar_map))


def _candidates(v: Verdict, candidates: pa.Array) -> tuple[pa.Array, np.ndarray]:
    lengths = list_lengths(candidates)
    v.rows((lengths >= MIN_K) & (lengths <= MAX_K))
    items, rows = flatten(candidates)
    source = items.field("source")
    v.items(rows, not_null(items) & as_mask(ids_ok(items.field("candidate_id")))
            & as_mask(text_ok(items.field("text"))) & not_null(source)
            & as_mask(is_in(source.field("kind"), SOURCE_KINDS))
            & distinct_texts(source.field("params"), scalar_map)
            & null_or(items.field("num_tokens"), between(items.field("num_tokens"), 0, None))
            & null_or(items.field("behavior_logp"),
                       between(items.field("behavior_logp"), None, 0.0)))
    _unique_texts(v, items.field("text"), rows)
    return items.field("candidate_id"), rows


def _unique_texts(v: Verdict, texts: pa.Array, rows: np.ndarray) -> None:
    """Candidate texts of a group distinct under ``normalise_text``. For printable-ASCII text
    with single inner spaces the normal form is the lower-cased text, of the same length: only
    texts of equal length can be equal then. The texts of a group with another text, or equal
    lengths, are compared exactly (:func:`~grouppref.schemas.texts.duplicate_keys`)."""
    import pyarrow.compute as pc

    if not len(texts):
        return
    irregular = as_mask(pc.invert(pc.ascii_is_printable(texts)))
    regular = np.flatnonzero(~irregular)  # only these are searched for spaces (a null: neither)
    if len(regular):
        irregular[regular] = as_mask(pc.match_substring_regex(texts.take(regular), _SPACES))
    lengths = np.asarray(pc.fill_null(pc.binary_length(texts), -1).to_numpy(), np.int64)
    lengths = np.where(irregular, -1, lengths)  # every irregular text is compared exactly
    keys = rows * (int(lengths.max()) + 2) + lengths + 1
    close = repeats(keys) | irregular
    suspects = np.unique(rows[close])
    if not len(suspects):
        return
    at = np.flatnonzero(np.isin(rows, suspects))
    by_row: dict[int, list[str]] = {}
    for row, value in zip(rows[at].tolist(), texts.take(at).to_pylist(), strict=True):
        by_row.setdefault(row, []).append(value or "")  # a null text fails text_ok anyway
    for row, group in by_row.items():
        alike = duplicate_keys(group)
        if alike is not None and len(set(alike)) < len(alike):
            v.ok[row] = False


def _tier_ids(tiers: pa.Array, bad: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """The ids of tier lists (one list per ranking or consensus: its *owner*) and the owner of
    each; ``bad`` (per owner) is set where the list has no tier or an empty one."""
    bad |= list_lengths(tiers) < 1
    tier_items, tier_owner = flatten(tiers)
    bad[tier_owner[list_lengths(tier_items) < 1]] = True
    ids, id_tier = flatten(tier_items)
    return ids, tier_owner[id_tier]


class _Sound:
    """The checks of one batch (see :func:`check_sound`); ``ok``: the sound rows."""

    def __init__(self, batch: pa.RecordBatch) -> None:
        import pyarrow.compute as pc

        self.n = n = batch.num_rows
        self.v = v = Verdict(n)
        self.batch = batch
        gid = batch.column("group_id")
        v.rows(ids_ok(gid))
        _prompt(v, batch.column("prompt"))
        cand_ids, self.cand_rows = _candidates(v, batch.column("candidates"))
        self.k = np.bincount(self.cand_rows, minlength=n)
        rankings = batch.column("rankings")
        v.rows(not_null(rankings))
        rk, rk_rows = flatten(rankings)
        ann = rk.field("annotator")
        v.items(rk_rows, not_null(rk) & not_null(ann) & as_mask(ids_ok(ann.field("id")))
                & as_mask(is_in(ann.field("kind"), ANNOTATOR_KINDS))
                & as_mask(pc.equal(rk.field("group_id"), gid.take(rk_rows)))
                & null_or(rk.field("metadata"),
                           distinct_texts(rk.field("metadata"), scalar_map))
                & distinct_texts(rk.field("created_at"), is_datetime))
        rk_bad = np.zeros(len(rk), dtype=bool)
        rk_ids, rk_id_owner = _tier_ids(rk.field("tiers"), rk_bad)
        v.where(rk_rows, rk_bad)
        cons_bad = np.zeros(n, dtype=bool)
        cons_ids, cons_owner = _tier_ids(batch.column("consensus"), cons_bad)
        v.rows(~cons_bad)
        pairs = batch.column("pairs")
        v.rows(not_null(pairs))
        pr, pr_rows = flatten(pairs)
        codes = Codes(cand_ids, rk_ids, cons_ids, pr.field("winner"), pr.field("loser"),
                       ann.field("id"))
        cand_keys = codes.keys(0, self.cand_rows)
        v.where(self.cand_rows, repeats(cand_keys))  # a candidate id twice
        self.codes, self.cand_keys = codes, np.sort(cand_keys)
        v.where(rk_rows, repeats(codes.keys(5, rk_rows)))  # an annotator ranks twice
        named = self._ids_of_tiers(rk_ids, rk_id_owner, rk_rows, 1)
        v.where(rk_rows, named < MIN_K)
        named = self._ids_of_tiers(cons_ids, cons_owner, np.arange(n), 2)
        v.rows(named == self.k)  # with each id known and once: every candidate
        self._pairs(pr, pr_rows)
        self._scores(rk.field("scores"), rk_rows, cand_ids)
        self._rest()

    def _ids_of_tiers(self, ids: pa.Array, id_owner: np.ndarray, owner_rows: np.ndarray,
                      which: int) -> np.ndarray:
        """Clear the rows whose tier ids are invalid, unknown or repeated in one owner;
        the number of ids each owner names."""
        id_rows = owner_rows[id_owner]
        self.v.items(id_rows, ids_ok(ids))
        self.v.where(id_rows, ~member(self.codes.keys(which, id_rows), self.cand_keys))
        self.v.where(id_rows, repeats(id_owner * self.codes.size + self.codes.codes[which]))
        return np.bincount(id_owner, minlength=len(owner_rows))

    def _pairs(self, pr: pa.StructArray, rows: np.ndarray) -> None:
        v, codes = self.v, self.codes
        v.items(rows, not_null(pr) & as_mask(ids_ok(pr.field("winner")))
                & as_mask(ids_ok(pr.field("loser"))) & between(pr.field("p"), 0.5, 1.0)
                & between(pr.field("weight"), 0.0, 1.0)
                & between(pr.field("votes_for"), 0.0, None)
                & between(pr.field("votes_against"), 0.0, None))
        winner, loser = codes.codes[3], codes.codes[4]
        v.where(rows, winner == loser)
        v.where(rows, ~member(codes.keys(3, rows), self.cand_keys))
        v.where(rows, ~member(codes.keys(4, rows), self.cand_keys))
        if self.n * codes.size**2 >= INT64:  # keys would overflow: never for a batch
            v.ok[:] = False
            return
        low, high = np.minimum(winner, loser), np.maximum(winner, loser)
        v.where(rows, repeats((rows * codes.size + low) * codes.size + high))

    def _scores(self, scores: pa.Array, rk_rows: np.ndarray, cand_ids: pa.Array) -> None:
        """Strengths (every row) and scores (rankings that have them): JSON maps of finite
        numbers; strengths name exactly the candidates, scores only candidates."""
        maps = [json_object(t) for t in self.batch.column("strengths").to_pylist()]
        sizes = self._numbers(maps, np.arange(self.n))
        self.v.rows(sizes == self.k)  # with every key a candidate (keys are unique): all
        self._keys_known(maps, np.arange(self.n), cand_ids)
        at = np.flatnonzero(not_null(scores))
        maps = [json_object(t) for t in scores.take(at).to_pylist()]
        self._numbers(maps, rk_rows[at])
        self._keys_known(maps, rk_rows[at], cand_ids)

    def _keys_known(self, maps: list[dict[str, Any] | None], rows: np.ndarray,
                    cand_ids: pa.Array) -> None:
        """Clear the rows (``rows[i]``: the row of ``maps[i]``) of maps with a key that is
        not one of the row's candidate ids (``None``: not a map, cleared)."""
        import pyarrow as pa

        self.v.where(rows, np.array([m is None for m in maps], dtype=bool))
        keys = [k for m in maps if m for k in m]
        if not keys:
            return
        sizes = np.array([len(m) if m else 0 for m in maps], dtype=np.int64)
        codes = Codes(cand_ids, pa.array(keys, pa.string()))
        key_rows = np.repeat(rows, sizes)
        known = member(codes.keys(1, key_rows), np.sort(codes.keys(0, self.cand_rows)))
        self.v.where(key_rows, ~known)

    def _numbers(self, maps: list[dict[str, Any] | None], rows: np.ndarray) -> np.ndarray:
        """Clear the rows (``rows[i]``: the row of ``maps[i]``) of maps with a value that is
        not a finite number (all floats, the usual case, are checked at once); the size of
        each map (0 for ``None``)."""
        sizes = np.array([len(m) if m else 0 for m in maps], dtype=np.int64)
        values = [x for m in maps if m for x in m.values()]
        if set(map(type, values)) <= {float}:
            finite = np.isfinite(np.array(values, dtype=float))
            self.v.where(rows, np.bincount(np.repeat(np.arange(len(maps)), sizes)[~finite],
                                           minlength=len(maps)) > 0)
            return sizes
        for row, got in zip(rows.tolist(), maps, strict=True):
            if got and not all(map(finite_number, got.values())):
                self.v.ok[row] = False
        return sizes

    def _rest(self) -> None:
        """Agreement, flags, split and consensus kinds."""
        v, batch = self.v, self.batch
        agreement = batch.column("agreement")
        v.rows(not_null(agreement) & between(agreement.field("num_annotators"), 0, None))
        for name, low in (("kendall_w", 0.0), ("mean_tau", -1.0), ("noise", 0.0)):
            field = agreement.field(name)
            v.rows(null_or(field, between(field, low, 1.0)))
        flags = batch.column("flags")
        v.rows(not_null(flags))
        items, rows = flatten(flags)
        v.items(rows, not_null(items))
        split = batch.column("split")
        v.rows(null_or(split, is_in(split, ("train", "test"))))
        kinds = batch.column("consensus_kinds")
        items, rows = flatten(kinds)
        v.items(rows, is_in(items, ANNOTATOR_KINDS))


def check_sound(batch: pa.RecordBatch) -> np.ndarray:
    """Per row of ``batch`` (columns of ``features_for(ValidatedGroup)``): ``True`` when the
    row is certainly a valid ``ValidatedGroup`` (see the module's docstring), ``False`` when it
    is suspect and must be parsed."""
    return _Sound(batch).v.ok


def row_facts(batch: pa.RecordBatch, rows: Sequence[int], split_by: str
              ) -> list[GroupFacts]:
    """The :class:`GroupFacts` of rows ``rows`` of ``batch`` (sound rows, whose group id does
    not repeat), as :meth:`GroupFacts.of` gives them of the records."""
    import pyarrow.compute as pc

    if not rows:  # (a take of no rows would need the indices' type)
        return []
    picked = batch.take(list(rows)) if len(rows) != batch.num_rows else batch
    prompt = picked.column("prompt")
    texts = prompt.field("text").to_pylist()
    messages = prompt.field("messages").to_pylist()
    agreement = picked.column("agreement")
    out = []
    for gid, text, turns_of, pairs, annotators, kendall_w, noise, flags in zip(
            picked.column("group_id").to_pylist(), texts, messages,
            pc.list_value_length(picked.column("pairs")).to_pylist(),
            agreement.field("num_annotators").to_pylist(),
            agreement.field("kendall_w").to_pylist(), agreement.field("noise").to_pylist(),
            picked.column("flags").to_pylist(), strict=True):
        turns = None if turns_of is None else [(m["role"], m["content"]) for m in turns_of]
        key = prompt_content_key(text, turns)
        out.append(GroupFacts(group_id=gid, split_key=split_key_of(text, turns, split_by, key),
                              prompt_key=key, pairs=pairs,
                              annotators=annotators, kendall_w=kendall_w, noise=noise,
                              flags=tuple(flags)))
    return out
