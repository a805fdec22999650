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
  ``str.isspace`` does not hold true (:data:`SPACE`, tested against every code point);
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

import json
import math
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING, Any

import numpy as np

from grouppref.pipeline.validate.core import GroupFacts, split_key_of
from grouppref.schemas.records import MAX_K, MIN_K, normalise_text, prompt_content_key

if TYPE_CHECKING:
    import pyarrow as pa

# the characters str.isspace() holds true (Py_UNICODE_ISSPACE): a text made only of these is
# blank to NonBlank's ``s.strip()``; tests/unit/test_validate_batch.py checks every code point
SPACE = ("\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
         "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
_NOT_SPACE = "[^" + "".join(f"\\x{{{ord(c):x}}}" for c in SPACE) + "]"
_ID = r"^[!-~]{1,256}$"
# a text whose normal form is its lower-cased self: printable ASCII, single inner spaces
_IRREGULAR = r"[^ -~]|  |^ | $"
ROLES = ("system", "user", "assistant")
SOURCE_KINDS = ("model", "human", "import")
ANNOTATOR_KINDS = ("human", "reward_model", "rule", "llm_judge", "simulated")
_INT64 = 2**63


def _mask(values: Any) -> np.ndarray:
    """A boolean Arrow array (or numpy array) as numpy, null read as ``False``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(values, np.ndarray):
        return values.astype(bool, copy=False)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    return np.asarray(pc.fill_null(values, False).to_numpy(zero_copy_only=False), dtype=bool)


class _Verdict:
    """Which of ``n`` rows are still sound; checks on rows or on items (values of a list
    column, each with its row) clear the rows they fail."""

    def __init__(self, n: int) -> None:
        self.ok = np.ones(n, dtype=bool)

    def rows(self, good: Any) -> None:
        self.ok &= _mask(good)

    def items(self, parents: np.ndarray, good: Any) -> None:
        self.ok[parents[~_mask(good)]] = False

    def where(self, parents: np.ndarray, bad: np.ndarray) -> None:
        self.ok[parents[bad]] = False


def _valid(arr: pa.Array) -> np.ndarray:
    return _mask(arr.is_valid())


def _null_or(arr: pa.Array, good: Any) -> np.ndarray:
    return ~_valid(arr) | _mask(good)


def _ids_ok(arr: pa.Array) -> Any:
    import pyarrow.compute as pc

    return pc.match_substring_regex(arr, _ID)


def _text_ok(arr: pa.Array) -> Any:
    import pyarrow.compute as pc

    return pc.match_substring_regex(arr, _NOT_SPACE)


def _in(arr: pa.Array, allowed: Sequence[str]) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.is_in(arr, value_set=pa.array(allowed, pa.string()))


def _between(arr: pa.Array, low: float | None, high: float | None) -> np.ndarray:
    values = arr.to_numpy(zero_copy_only=False).astype(float)
    with np.errstate(invalid="ignore"):
        good = np.isfinite(values)
        if low is not None:
            good &= values >= low
        if high is not None:
            good &= values <= high
    return good & _valid(arr)


def _flat(arr: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """The values of a list array and the row (index into ``arr``) of each."""
    import pyarrow.compute as pc

    return pc.list_flatten(arr), np.asarray(pc.list_parent_indices(arr).to_numpy(), np.int64)


def _lengths(arr: pa.Array) -> np.ndarray:
    import pyarrow.compute as pc

    return np.asarray(pc.fill_null(pc.list_value_length(arr), -1).to_numpy(), np.int64)


def _distinct_texts(arr: pa.Array, good: Callable[[str], bool]) -> np.ndarray:
    """``good`` of each value of a string array, called once per distinct text (nulls:
    ``False``)."""
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(arr)
    verdicts = np.array([good(t) for t in encoded.dictionary.to_pylist()] + [False], bool)
    codes = pc.fill_null(encoded.indices, len(encoded.dictionary)).to_numpy()
    return verdicts[codes]


def _scalar(value: object) -> bool:
    if isinstance(value, bool | str):
        return True
    if isinstance(value, int):
        return -_INT64 <= value < _INT64
    return isinstance(value, float) and math.isfinite(value)


def _number(value: object) -> bool:
    return (not isinstance(value, bool) and isinstance(value, int | float)
            and math.isfinite(value) and abs(value) < _INT64)


def _json_object(text: object) -> dict[str, Any] | None:
    """The JSON object ``text`` holds, ``None`` for anything else."""
    if not isinstance(text, str):
        return None
    try:
        value = {} if text == "{}" else json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _scalar_map(text: str) -> bool:
    value = _json_object(text)
    return value is not None and all(map(_scalar, value.values()))


@cache
def _datetime_adapter() -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(datetime)


def _datetime(text: str) -> bool:
    from pydantic import ValidationError

    try:
        _datetime_adapter().validate_python(text)
    except ValidationError:
        return False
    return True


class _Codes:
    """Integer codes of id strings (equal text, equal code) across several arrays, so that
    ids of one group are compared as ``row * M + code`` keys in numpy."""

    def __init__(self, *arrays: pa.Array) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        encoded = pc.dictionary_encode(pa.concat_arrays([a.cast(pa.string()) for a in arrays]))
        self.size = len(encoded.dictionary) + 1  # the last code: null
        codes = pc.fill_null(encoded.indices, self.size - 1).to_numpy().astype(np.int64)
        bounds = np.cumsum([0] + [len(a) for a in arrays])
        self.codes = [codes[s:e] for s, e in zip(bounds[:-1], bounds[1:], strict=True)]

    def keys(self, which: int, rows: np.ndarray) -> np.ndarray:
        return rows * self.size + self.codes[which]


def _repeats(keys: np.ndarray) -> np.ndarray:
    """``True`` for each key that occurs more than once (one sort when none does)."""
    ordered = np.sort(keys)
    if not (ordered[1:] == ordered[:-1]).any():
        return np.zeros(len(keys), dtype=bool)
    _, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    return np.asarray(counts[inverse] > 1)


def _member(keys: np.ndarray, ordered: np.ndarray) -> np.ndarray:
    """``np.isin(keys, ordered)`` for a sorted ``ordered``, by binary search."""
    if not len(ordered):
        return np.zeros(len(keys), dtype=bool)
    at = np.minimum(np.searchsorted(ordered, keys), len(ordered) - 1)
    return np.asarray(ordered[at] == keys)


def _prompt(v: _Verdict, prompt: pa.StructArray) -> None:
    v.rows(_valid(prompt))
    v.rows(_ids_ok(prompt.field("prompt_id")))
    text, messages = prompt.field("text"), prompt.field("messages")
    has_text, has_messages = _valid(text), _valid(messages)
    v.rows(has_text ^ has_messages)
    v.rows(~has_text | _mask(_text_ok(text)))
    v.rows(~has_messages | (_lengths(messages) >= 1))
    turns, rows = _flat(messages)
    v.items(rows, _valid(turns) & _mask(_in(turns.field("role"), ROLES))
            & _mask(_text_ok(turns.field("content"))))
    v.rows(_distinct_texts(prompt.field("metadata"), _scalar_map))


def _candidates(v: _Verdict, candidates: pa.Array) -> tuple[pa.Array, np.ndarray]:
    lengths = _lengths(candidates)
    v.rows((lengths >= MIN_K) & (lengths <= MAX_K))
    items, rows = _flat(candidates)
    source = items.field("source")
    v.items(rows, _valid(items) & _mask(_ids_ok(items.field("candidate_id")))
            & _mask(_text_ok(items.field("text"))) & _valid(source)
            & _mask(_in(source.field("kind"), SOURCE_KINDS))
            & _distinct_texts(source.field("params"), _scalar_map)
            & _null_or(items.field("num_tokens"), _between(items.field("num_tokens"), 0, None))
            & _null_or(items.field("behavior_logp"),
                       _between(items.field("behavior_logp"), None, 0.0)))
    _unique_texts(v, items.field("text"), rows)
    return items.field("candidate_id"), rows


def _unique_texts(v: _Verdict, texts: pa.Array, rows: np.ndarray) -> None:
    """Candidate texts of a group distinct under ``normalise_text``. For printable-ASCII text
    with single inner spaces the normal form is the lower-cased text, of the same length: only
    texts of equal length can be equal then. Other texts, and equal lengths, are compared in
    Python, exactly."""
    import pyarrow.compute as pc

    if not len(texts):
        return
    irregular = _mask(pc.match_substring_regex(texts, _IRREGULAR))
    lengths = np.asarray(pc.fill_null(pc.binary_length(texts), -1).to_numpy(), np.int64)
    lengths = np.where(irregular, -1, lengths)  # every irregular text is compared exactly
    keys = rows * (int(lengths.max()) + 2) + lengths + 1
    close = _repeats(keys) | irregular
    suspects = np.unique(rows[close])
    if not len(suspects):
        return
    at = np.flatnonzero(np.isin(rows, suspects))
    values = texts.take(at).to_pylist()
    seen: dict[tuple[int, str], int] = {}
    for row, value in zip(rows[at].tolist(), values, strict=True):
        key = (row, normalise_text(value) if value is not None else "")
        if key in seen:
            v.ok[row] = False
        seen[key] = row


def _tier_ids(tiers: pa.Array, bad: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """The ids of tier lists (one list per ranking or consensus: its *owner*) and the owner of
    each; ``bad`` (per owner) is set where the list has no tier or an empty one."""
    bad |= _lengths(tiers) < 1
    tier_items, tier_owner = _flat(tiers)
    bad[tier_owner[_lengths(tier_items) < 1]] = True
    ids, id_tier = _flat(tier_items)
    return ids, tier_owner[id_tier]


class _Sound:
    """The checks of one batch (see :func:`check_sound`); ``ok``: the sound rows."""

    def __init__(self, batch: pa.RecordBatch) -> None:
        import pyarrow.compute as pc

        self.n = n = batch.num_rows
        self.v = v = _Verdict(n)
        self.batch = batch
        gid = batch.column("group_id")
        v.rows(_ids_ok(gid))
        _prompt(v, batch.column("prompt"))
        cand_ids, self.cand_rows = _candidates(v, batch.column("candidates"))
        self.k = np.bincount(self.cand_rows, minlength=n)
        rankings = batch.column("rankings")
        v.rows(_valid(rankings))
        rk, rk_rows = _flat(rankings)
        ann = rk.field("annotator")
        v.items(rk_rows, _valid(rk) & _valid(ann) & _mask(_ids_ok(ann.field("id")))
                & _mask(_in(ann.field("kind"), ANNOTATOR_KINDS))
                & _mask(pc.equal(rk.field("group_id"), gid.take(rk_rows)))
                & _null_or(rk.field("metadata"),
                           _distinct_texts(rk.field("metadata"), _scalar_map))
                & _distinct_texts(rk.field("created_at"), _datetime))
        rk_bad = np.zeros(len(rk), dtype=bool)
        rk_ids, rk_id_owner = _tier_ids(rk.field("tiers"), rk_bad)
        v.where(rk_rows, rk_bad)
        cons_bad = np.zeros(n, dtype=bool)
        cons_ids, cons_owner = _tier_ids(batch.column("consensus"), cons_bad)
        v.rows(~cons_bad)
        pairs = batch.column("pairs")
        v.rows(_valid(pairs))
        pr, pr_rows = _flat(pairs)
        codes = _Codes(cand_ids, rk_ids, cons_ids, pr.field("winner"), pr.field("loser"),
                       ann.field("id"))
        cand_keys = codes.keys(0, self.cand_rows)
        v.where(self.cand_rows, _repeats(cand_keys))  # a candidate id twice
        self.codes, self.cand_keys = codes, np.sort(cand_keys)
        v.where(rk_rows, _repeats(codes.keys(5, rk_rows)))  # an annotator ranks twice
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
        self.v.items(id_rows, _ids_ok(ids))
        self.v.where(id_rows, ~_member(self.codes.keys(which, id_rows), self.cand_keys))
        self.v.where(id_rows, _repeats(id_owner * self.codes.size + self.codes.codes[which]))
        return np.bincount(id_owner, minlength=len(owner_rows))

    def _pairs(self, pr: pa.StructArray, rows: np.ndarray) -> None:
        v, codes = self.v, self.codes
        v.items(rows, _valid(pr) & _mask(_ids_ok(pr.field("winner")))
                & _mask(_ids_ok(pr.field("loser"))) & _between(pr.field("p"), 0.5, 1.0)
                & _between(pr.field("weight"), 0.0, 1.0)
                & _between(pr.field("votes_for"), 0.0, None)
                & _between(pr.field("votes_against"), 0.0, None))
        winner, loser = codes.codes[3], codes.codes[4]
        v.where(rows, winner == loser)
        v.where(rows, ~_member(codes.keys(3, rows), self.cand_keys))
        v.where(rows, ~_member(codes.keys(4, rows), self.cand_keys))
        if self.n * codes.size**2 >= _INT64:  # keys would overflow: never for a batch
            v.ok[:] = False
            return
        low, high = np.minimum(winner, loser), np.maximum(winner, loser)
        v.where(rows, _repeats((rows * codes.size + low) * codes.size + high))

    def _scores(self, scores: pa.Array, rk_rows: np.ndarray, cand_ids: pa.Array) -> None:
        """Strengths (every row) and scores (rankings that have them): JSON maps of finite
        numbers; strengths name exactly the candidates, scores only candidates."""
        maps = [_json_object(t) for t in self.batch.column("strengths").to_pylist()]
        sizes = self._numbers(maps, np.arange(self.n))
        self.v.rows(sizes == self.k)  # with every key a candidate (keys are unique): all
        self._keys_known(maps, np.arange(self.n), cand_ids)
        at = np.flatnonzero(_valid(scores))
        maps = [_json_object(t) for t in scores.take(at).to_pylist()]
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
        codes = _Codes(cand_ids, pa.array(keys, pa.string()))
        key_rows = np.repeat(rows, sizes)
        known = _member(codes.keys(1, key_rows), np.sort(codes.keys(0, self.cand_rows)))
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
            if got and not all(map(_number, got.values())):
                self.v.ok[row] = False
        return sizes

    def _rest(self) -> None:
        """Agreement, flags, split and consensus kinds."""
        v, batch = self.v, self.batch
        agreement = batch.column("agreement")
        v.rows(_valid(agreement) & _between(agreement.field("num_annotators"), 0, None))
        for name, low in (("kendall_w", 0.0), ("mean_tau", -1.0), ("noise", 0.0)):
            field = agreement.field(name)
            v.rows(_null_or(field, _between(field, low, 1.0)))
        flags = batch.column("flags")
        v.rows(_valid(flags))
        items, rows = _flat(flags)
        v.items(rows, _valid(items))
        split = batch.column("split")
        v.rows(_null_or(split, _in(split, ("train", "test"))))
        kinds = batch.column("consensus_kinds")
        items, rows = _flat(kinds)
        v.items(rows, _in(items, ANNOTATOR_KINDS))


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
