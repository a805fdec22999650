"""The aggregate of many groups as Arrow columns (issue 32): what :func:`.outcome.group_aggregate`
and :func:`.outcome.group_flags` give for each group, and ``to_row`` would store, built for a
whole shard at once from the fit's numpy arrays.

``n`` groups (rows ``rows`` of the fit, group ``g`` with ``k[g]`` candidates whose ids are
``ids[starts[g] : starts[g + 1]]``) give one value per group in each column of a
``ValidatedGroup`` beyond its ``AnnotatedGroup``: ``consensus`` (``list<list<string>>``),
``strengths`` (canonical JSON text, byte for byte :func:`~grouppref.schemas.arrow.json_text`),
``pairs`` (``list<struct>``, pairs ``i < j`` in row-major order), ``agreement`` (a struct),
``flags``, ``split`` (null) and ``consensus_kinds``; and ``holds`` (``(n,)`` bool), what
:meth:`.outcome.GroupAggregate.holds` says of each group (a group where it is ``False`` is left
to the records' validation by the caller). Every value is what the per-group code computes:
the same float operations in the same order (means over the same compacted values), Python's
``max``/``min`` where they treat NaN and ``-0.0`` unlike numpy's.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from grouppref.pipeline.aggregate.config import AggregateConfig
from grouppref.pipeline.aggregate.fit import BTFit
from grouppref.pipeline.aggregate.outcome import RULES, Decisions
from grouppref.schemas import ValidatedGroup
from grouppref.schemas.arrow import arrow_schema_for, json_text

AGGREGATE_FIELDS = ("consensus", "strengths", "pairs", "agreement", "flags", "split",
                    "consensus_kinds")
_ESCAPED = r'[\x00-\x1f"\\]'  # what JSON escapes in a string (ensure_ascii=False)


@cache
def _type(name: str) -> pa.DataType:
    """The Arrow type of ``ValidatedGroup``'s column ``name``."""
    return arrow_schema_for(ValidatedGroup).field(name).type


@dataclass(frozen=True)
class Layout:
    """Where ``n`` groups are: ``rows`` ``(n,)`` their index in the fit, ``k`` ``(n,)`` their
    number of candidates, ``starts`` ``(n + 1,)`` offsets of their candidates in ``ids``
    (``(sum k,)`` candidate ids, in each group's order)."""

    rows: np.ndarray
    k: np.ndarray
    starts: np.ndarray
    ids: pa.Array

    def entries(self) -> tuple[np.ndarray, np.ndarray]:
        """``(G, I)``, each ``(sum k,)``: the group and the position of every candidate."""
        g = np.repeat(np.arange(len(self.k)), self.k)
        return g, np.arange(len(g)) - self.starts[g]


def layout(rows: np.ndarray, candidates: pa.ListArray) -> Layout:
    """The layout of groups ``rows`` of the fit whose candidate ids (``(n,)``
    ``list<string>``, no nulls: :func:`~.encode.candidate_ids`) are given."""
    k = pc.list_value_length(candidates).to_numpy(zero_copy_only=False).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(k)]).astype(np.int64)
    ids = candidates.flatten()
    return Layout(rows=np.asarray(rows, dtype=np.int64), k=k, starts=starts, ids=ids)


def _offsets(sizes: np.ndarray) -> pa.Array:
    return pa.array(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32), pa.int32())


def _ok_groups(g: np.ndarray, ok: np.ndarray, n: int) -> np.ndarray:
    """``(n,)``: groups none of whose entries (group ``g``, ``ok``) fails."""
    return np.bincount(g[~ok], minlength=n) == 0


def consensus(lay: Layout, tiers: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """``consensus`` (``(n,)`` ``list<list<string>>``: tiers ``0..max`` of each group, its
    ids in candidate order) from ``tiers`` ``(B, K)``; and whether every tier is non-empty."""
    g, i = lay.entries()
    t = tiers[lay.rows[g], i]
    n = len(lay.k)
    count = np.full(n, -1, dtype=np.int64)
    np.maximum.at(count, g, t)
    count += 1  # tiers per group: max + 1
    first = np.concatenate([[0], np.cumsum(count)])[:-1]
    on = t >= 0
    key = first[g[on]] + t[on]
    sizes = np.bincount(key, minlength=int(count.sum()))
    order = np.argsort(key, kind="stable")
    values = lay.ids.take(pa.array((lay.starts[g] + i)[on][order]))
    inner = pa.ListArray.from_arrays(_offsets(sizes), values, type=_type("consensus").value_type)
    column = pa.ListArray.from_arrays(_offsets(count), inner, type=_type("consensus"))
    return column, _ok_groups(np.repeat(np.arange(n), count), sizes > 0, n)


def strengths(lay: Layout, theta: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """``strengths`` (``(n,)`` JSON text ``{"id": theta, ...}``, keys sorted, floats as
    ``repr``, as ``json_text`` writes them) from ``theta`` ``(B, K)``; and whether every
    strength is finite."""
    g, i = lay.entries()
    values = theta[lay.rows[g], i].astype(np.float64)
    order = pc.sort_indices(pa.table({"g": g, "id": lay.ids}),  # UTF-8 bytes: code points
                            sort_keys=[("g", "ascending"), ("id", "ascending")])
    ids = lay.ids.take(order)
    reprs = pa.array(list(map(float.__repr__, values[order.to_numpy()].tolist())), pa.string())
    items = pc.binary_join_element_wise('"', ids, '": ', reprs, "")
    listed = pa.ListArray.from_arrays(_offsets(lay.k), items)
    text = pc.binary_join_element_wise("{", pc.binary_join(listed, ", "), "}", "")
    escape = pc.match_substring_regex(lay.ids, _ESCAPED).to_numpy(zero_copy_only=False)
    if escape.any():  # an id JSON escapes: those groups' text from the encoder itself
        texts = text.to_pylist()
        for gi in np.unique(g[escape]).tolist():
            lo, hi = lay.starts[gi], lay.starts[gi + 1]
            texts[gi] = json_text(dict(zip(lay.ids[lo:hi].to_pylist(), values[lo:hi].tolist(),
                                           strict=True)))
        text = pa.array(texts, pa.string())
    return text, _ok_groups(g, np.isfinite(values), len(lay.k))


def _pair_entries(lay: Layout) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(G, I, J)``, each ``(sum k (k - 1) / 2,)``: every pair ``i < j`` of every group, in
    group order and row-major order within a group (what ``pair_fields`` loops over)."""
    n, kmax = len(lay.k), int(lay.k.max(initial=0))
    ti, tj = np.triu_indices(kmax, 1)
    g = np.repeat(np.arange(n), len(ti))
    i, j = np.tile(ti, n), np.tile(tj, n)
    keep = j < lay.k[g]
    return g[keep], i[keep], j[keep]


def pairs(lay: Layout, fit: BTFit) -> tuple[pa.Array, np.ndarray]:
    """``pairs`` (``(n,)`` ``list<struct<winner, loser, p, weight, votes_for,
    votes_against>>``) from the fit's ``(B, K, K)`` ``p``, ``w``, ``wins`` and ``(B, K)``
    ``labels``, as :func:`.outcome.pair_fields` gives them; and whether every pair's values
    are in their ranges."""
    g, i, j = _pair_entries(lay)
    b = lay.rows[g]
    same = fit.labels[b, i] == fit.labels[b, j]
    first = fit.p[b, i, j] >= 0.5  # NaN: the second candidate wins, as in pair_fields
    win, lose = np.where(first, i, j), np.where(first, j, i)
    p = fit.p[b, win, lose].astype(np.float64)
    p = np.where(same, np.where(0.5 > p, 0.5, p), 0.5)  # Python's max(p, 0.5)
    weight = np.where(same, fit.w[b, win, lose], 0.0).astype(np.float64)
    votes_for = np.where(same, fit.wins[b, win, lose], 0.0).astype(np.float64)
    votes_against = np.where(same, fit.wins[b, lose, win], 0.0).astype(np.float64)
    win, lose = np.where(same, win, i), np.where(same, lose, j)
    names = [lay.ids.take(pa.array(lay.starts[g] + x)) for x in (win, lose)]
    item = _type("pairs").value_type
    values = pa.StructArray.from_arrays(
        [*names, *map(pa.array, (p, weight, votes_for, votes_against))],
        fields=list(item))
    column = pa.ListArray.from_arrays(_offsets(lay.k * (lay.k - 1) // 2), values,
                                      type=_type("pairs"))
    ok = ((p >= 0.5) & (p <= 1.0) & (weight >= 0.0) & (weight <= 1.0)
          & np.isfinite(votes_for) & (votes_for >= 0) & np.isfinite(votes_against)
          & (votes_against >= 0))
    return column, _ok_groups(g, ok, len(lay.k))


def _masked_means(values: np.ndarray, mask: np.ndarray, mean: bool) -> np.ndarray:
    """``(n,)``: ``values[r][mask[r]].sum()`` (or ``.mean()``, NaN where nothing is selected)
    of each row ``r`` of ``(n, A)`` arrays, summed as numpy sums each row's own array (rows
    with the same number of values summed together, each row along its own axis)."""
    out = np.full(len(values), np.nan if mean else 0.0)
    m = mask.sum(1)
    for size in np.unique(m[m > 0]).tolist():
        rows = np.nonzero(m == size)[0]
        picked = values[rows][mask[rows]].reshape(len(rows), size)
        out[rows] = picked.mean(axis=1) if mean else picked.sum(axis=1)
    return out


def _floats(x: np.ndarray, null: np.ndarray) -> pa.Array:
    return pa.array(np.where(null, 0.0, x), pa.float64(), mask=null)


def agreement(lay: Layout, fit: BTFit, used: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """``agreement`` (``(n,)`` ``struct<num_annotators, kendall_w, mean_tau, noise>``) from the
    fit's ``(B,)`` ``kendall_w``, ``(B, A)`` ``tau``, ``conc``, ``disc`` and ``used`` ``(B, A)``;
    and whether mean_tau and noise are in their ranges."""
    u = used[lay.rows]
    kw = fit.kendall_w[lay.rows].astype(np.float64)
    kw_null = np.isnan(kw)
    kw = np.where(0.0 > kw, 0.0, kw)  # Python's max(kw, 0.0), then min(., 1.0)
    kw = np.where(1.0 < kw, 1.0, kw)
    tau = fit.tau[lay.rows].astype(np.float64)
    mean_tau = _masked_means(tau, u & ~np.isnan(tau), mean=True)
    tau_null = (u & ~np.isnan(tau)).sum(1) == 0
    c = _masked_means(fit.conc[lay.rows], u, mean=False)
    d = _masked_means(fit.disc[lay.rows], u, mean=False)
    noise_null = ~(c + d > 0)
    noise = d / np.where(noise_null, 1.0, c + d)
    column = pa.StructArray.from_arrays(
        [pa.array(u.sum(1).astype(np.int64), pa.int64()), _floats(kw, kw_null),
         _floats(mean_tau, tau_null), _floats(noise, noise_null)],
        fields=list(_type("agreement")))
    ok = ((tau_null | ((mean_tau >= -1.0) & (mean_tau <= 1.0)))
          & (noise_null | ((noise >= 0.0) & (noise <= 1.0))))
    return column, ok


def _names(present: np.ndarray, names: list[str], kind: str) -> pa.Array:
    """``(n,)`` ``list<string>``: the ``names`` each row of ``present`` ``(n, len(names))``
    marks, in the order of ``names``."""
    picked = np.asarray(names, dtype=object)[np.nonzero(present)[1]]
    values = pa.array(picked.tolist(), pa.string())
    return pa.ListArray.from_arrays(_offsets(present.sum(1)), values, type=_type(kind))


def flags(lay: Layout, dec: Decisions, config: AggregateConfig) -> pa.Array:
    """``flags`` (``(n,)`` ``list<string>``), what :func:`.outcome.group_flags` gives."""
    names = ["no_rankings", *RULES, "unreliable_annotator_dropped"]
    marks = [dec.matches["no_rankings"]]
    marks += [dec.matches[r] & (getattr(config, r) == "flag") for r in RULES]
    marks.append(dec.had_dropped)
    return _names(np.stack([np.asarray(m, dtype=bool)[lay.rows] for m in marks], 1), names,
                  "flags")


def consensus_kinds(lay: Layout, rankings: pa.Array | None, used: np.ndarray) -> pa.Array:
    """``consensus_kinds`` (``(n,)`` ``list<string>``): the sorted distinct annotator kinds
    of each group's used rankings (``rankings``: ``(n,)`` ``list<struct<annotator, ...>>``,
    ``None``: no group has any; ``used``: ``(B, A)``)."""
    n = len(lay.k)
    if rankings is None or len(rankings.flatten()) == 0:
        return _names(np.zeros((n, 0), dtype=bool), [], "consensus_kinds")
    kinds = pc.struct_field(rankings.flatten(), ["annotator", "kind"])
    counts = pc.list_value_length(rankings).fill_null(0).to_numpy().astype(np.int64)
    parent = np.repeat(np.arange(n), counts)
    slot = np.arange(len(parent)) - np.concatenate([[0], np.cumsum(counts)])[parent]
    coded = pc.dictionary_encode(kinds).combine_chunks() if isinstance(
        kinds, pa.ChunkedArray) else pc.dictionary_encode(kinds)
    names = coded.dictionary.to_pylist()
    rank = np.argsort(np.argsort(np.asarray(names, dtype=object), kind="stable"))
    on = slot < used.shape[1]
    on[on] = used[lay.rows[parent[on]], slot[on]]
    present = np.zeros((n, len(names)), dtype=bool)
    present[parent[on], rank[coded.indices.to_numpy()[on]]] = True
    return _names(present, sorted(names), "consensus_kinds")


def aggregate_columns(lay: Layout, fit: BTFit, dec: Decisions, config: AggregateConfig,
                      rankings: pa.Array | None) -> tuple[dict[str, pa.Array], np.ndarray]:
    """Every column of :data:`AGGREGATE_FIELDS` (each ``(n,)``) of the groups of ``lay``
    (their ``rankings`` column, ``None`` when the table has none), and ``holds`` ``(n,)``:
    whether each group's aggregate passes every check of ``GroupAggregate.holds``."""
    made = {"consensus": consensus(lay, fit.tiers), "strengths": strengths(lay, fit.theta),
            "pairs": pairs(lay, fit), "agreement": agreement(lay, fit, dec.used)}
    holds = np.logical_and.reduce([ok for _, ok in made.values()]
                                  + [np.ones(len(lay.k), dtype=bool)])
    columns = {name: column for name, (column, _) in made.items()}
    columns["flags"] = flags(lay, dec, config)
    columns["split"] = pa.nulls(len(lay.k), pa.string())
    columns["consensus_kinds"] = consensus_kinds(lay, rankings, dec.used)
    return columns, holds
