"""The export formats: which rows a ``groups`` or ``trl-pairs`` export holds, as a
``datasets.DatasetDict`` per split (the targets that write it are in :mod:`.stage`).

- ``groups``: the ``ValidatedGroup`` rows as stored (one row per group). From the validate
  stage's own table it is a selection of that table per split (:func:`groups_from_table`), no
  record is built; other input goes through the records (:func:`build_dataset`).
- ``trl-pairs``: one row per consensus pair (:func:`consensus_pairs`, :func:`trl_rows`).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import datasets

from grouppref.errors import StageError
from grouppref.pipeline.export.config import SPLITS, STAGE, ExportConfig
from grouppref.schemas import PairPreference, Reject, ValidatedGroup, to_dataset
from grouppref.schemas.arrow import features_for, table_dataset

if TYPE_CHECKING:
    import pyarrow as pa

_MESSAGES = datasets.List({"role": datasets.Value("string"), "content": datasets.Value("string")})


def consensus_pairs(group: ValidatedGroup, config: ExportConfig
                    ) -> tuple[list[PairPreference], Counter[str]]:
    """The pair preferences exported for ``group`` and the reasons others were skipped."""
    tier = {cid: t for t, ids in enumerate(group.consensus) for cid in ids}
    kept: list[PairPreference] = []
    skipped: Counter[str] = Counter()
    for pair in group.pairs:
        if tier[pair.winner] == tier[pair.loser]:
            skipped["tie_in_consensus"] += 1
        elif tier[pair.winner] > tier[pair.loser]:
            skipped["against_consensus"] += 1
        elif pair.weight < config.min_weight:
            skipped["below_min_weight"] += 1
        else:
            kept.append(pair)
    if config.pairs == "best_worst":
        last = len(group.consensus) - 1
        ends = [p for p in kept if tier[p.winner] == 0 and tier[p.loser] == last]
        best = max(ends, key=lambda p: (p.p, p.weight, p.winner, p.loser), default=None)
        skipped["not_best_worst"] += len(kept) - (best is not None)
        kept = [best] if best is not None else []
    return kept, skipped


def trl_rows(groups: list[ValidatedGroup], config: ExportConfig
             ) -> tuple[list[dict[str, Any]], Counter[str], list[Reject], bool]:
    """TRL rows of ``groups``; rejects for groups left without a pair; whether rows are chat."""
    chat = config.chat == "always" or any(g.prompt.messages is not None for g in groups)
    rows: list[dict[str, Any]] = []
    skipped: Counter[str] = Counter()
    rejects: list[Reject] = []
    for number, group in enumerate(groups, start=1):
        pairs, why = consensus_pairs(group, config)
        skipped.update(why)
        if not pairs:
            rejects.append(Reject(stage=STAGE, row=number, group_id=group.group_id,
                                  field="pairs", reason="no consensus pair to export "
                                  f"(skipped: {dict(why) or 'group has no pairs'})"))
        text = {c.candidate_id: c.text for c in group.candidates}
        prompt: Any = ([m.model_dump() for m in group.prompt.as_messages()] if chat
                       else group.prompt.display_text())
        for pair in pairs:
            rows.append({
                "prompt": prompt,
                "chosen": _answer(text[pair.winner], chat),
                "rejected": _answer(text[pair.loser], chat),
                "p": pair.p, "weight": pair.weight, "group_id": group.group_id,
                "chosen_id": pair.winner, "rejected_id": pair.loser, "split": group.split,
            })
    return rows, skipped, rejects, chat


def _answer(text: str, chat: bool) -> Any:
    return [{"role": "assistant", "content": text}] if chat else text


def _trl_features(chat: bool) -> datasets.Features:
    text = _MESSAGES if chat else datasets.Value("string")
    return datasets.Features({
        "prompt": text, "chosen": text, "rejected": text, "p": datasets.Value("float64"),
        "weight": datasets.Value("float64"), "group_id": datasets.Value("string"),
        "chosen_id": datasets.Value("string"), "rejected_id": datasets.Value("string")})


def _splits(config: ExportConfig) -> tuple[str, ...]:
    return (config.split,) if config.split else SPLITS


def build_dataset(groups: list[ValidatedGroup], config: ExportConfig, key: str
                  ) -> tuple[datasets.DatasetDict, Counter[str], list[Reject]]:
    """The export as a ``DatasetDict`` (only non-empty splits), skipped pairs, rejected groups.
    ``key`` identifies the input's content (the validate stage's output fingerprint): the
    trl-pairs splits' dataset fingerprints are made from it and the export's settings."""
    import pyarrow as pa

    if config.format == "groups":
        dsd = datasets.DatasetDict({s: to_dataset([g for g in groups if g.split == s],
                                                  ValidatedGroup) for s in _splits(config)})
        skipped: Counter[str] = Counter()
        rejects: list[Reject] = []
    else:
        rows, skipped, rejects, chat = trl_rows(groups, config)
        features = _trl_features(chat)
        by_split: dict[str, list[dict[str, Any]]] = {s: [] for s in _splits(config)}
        for row in rows:
            split = row.pop("split")
            if split in by_split:
                by_split[split].append(row)
        # the rows' Arrow table made in one call (datasets' from_list encodes value by value)
        settings = f"trl-pairs {config.pairs} {config.min_weight} {config.chat}"
        dsd = datasets.DatasetDict({
            s: table_dataset(pa.Table.from_pylist(part, schema=features.arrow_schema),
                             datasets.DatasetInfo(features=features), f"{key} {settings} {s}")
            for s, part in by_split.items()})
    return non_empty(dsd), skipped, rejects


def groups_from_table(table: pa.Table, config: ExportConfig, key: str) -> datasets.DatasetDict:
    """The ``groups`` export straight from ``RUN/validate``'s own Arrow table (the schema of
    :func:`~grouppref.schemas.arrow.features_for` ``(ValidatedGroup)``): each split's rows
    selected in C, in stored order, with no record built. It equals
    ``build_dataset(records, config)`` for the records of that table (the rows were validated
    as records when validate wrote them; ``tests/integration/test_data_equivalence.py``
    compares the two paths' files). Empty splits are dropped. ``key`` identifies the table's
    content (the validate stage's output fingerprint): each split's dataset fingerprint is made
    from it (:func:`~grouppref.schemas.arrow.table_dataset`).

    Raises:
        StageError: a row has no split, or nothing is left to export.
    """
    import pyarrow.compute as pc

    split = table.column("split")
    if split.null_count:
        first = table.column("group_id")[pc.index(pc.is_null(split), True).as_py()].as_py()
        raise StageError(f"{split.null_count} validated groups have no split (first {first}); "
                         "run `grouppref validate RUN --force`")
    info = datasets.DatasetInfo(features=features_for(ValidatedGroup))
    return non_empty(datasets.DatasetDict({
        s: table_dataset(table.filter(pc.equal(split, s)), info.copy(), f"{key} {s}")
        for s in _splits(config)}))


def non_empty(dsd: datasets.DatasetDict) -> datasets.DatasetDict:
    """``dsd`` without its empty splits.

    Raises:
        StageError: every split is empty.
    """
    dsd = datasets.DatasetDict({s: ds for s, ds in dsd.items() if len(ds)})
    if not dsd:
        raise StageError("nothing to export: every split is empty (see RUN/validate/report.json"
                         " and RUN/export/rejects.jsonl)")
    return dsd


