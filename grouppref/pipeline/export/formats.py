"""The export formats: which rows a ``groups`` or ``trl-pairs`` export holds, as a
``datasets.DatasetDict`` per split (the targets that write it are in :mod:`.stage`).

- ``groups``: the ``ValidatedGroup`` rows as stored (one row per group). From the validate
  stage's own table it is a selection of that table per split (:func:`groups_from_table`), no
  record is built; other input goes through the records (:func:`build_dataset`).
- ``trl-pairs``: one row per consensus pair (:func:`select_pairs`, :class:`TrlRows`), from the
  validate stage's own table (:func:`pairs_from_table`) or from records (:func:`build_dataset`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import datasets

from grouppref.errors import StageError
from grouppref.pipeline.export.config import SPLITS, STAGE, ExportConfig
from grouppref.schemas import (
    ChatMessage,
    Prompt,
    Reject,
    ValidatedGroup,
    to_dataset,
)
from grouppref.schemas.arrow import features_for, table_dataset, table_rows

if TYPE_CHECKING:
    import pyarrow as pa

_MESSAGES = datasets.List({"role": datasets.Value("string"), "content": datasets.Value("string")})


class PairValues(NamedTuple):
    """What the export reads of one pair preference."""

    winner: str
    loser: str
    p: float
    weight: float


def select_pairs(consensus: Sequence[Sequence[str]], pairs: Sequence[PairValues],
                 config: ExportConfig) -> tuple[list[int], Counter[str]]:
    """Which of a group's ``pairs`` are exported (their indices, in order) and the reasons
    the others were skipped: ties and pairs against the ``consensus`` tiers are left out, as
    are pairs lighter than ``min_weight``; ``pairs: best_worst`` keeps the strongest pair of
    the first tier over the last."""
    tier = {cid: t for t, ids in enumerate(consensus) for cid in ids}
    kept: list[int] = []
    skipped: Counter[str] = Counter()
    for i, pair in enumerate(pairs):
        if tier[pair.winner] == tier[pair.loser]:
            skipped["tie_in_consensus"] += 1
        elif tier[pair.winner] > tier[pair.loser]:
            skipped["against_consensus"] += 1
        elif pair.weight < config.min_weight:
            skipped["below_min_weight"] += 1
        else:
            kept.append(i)
    if config.pairs == "best_worst":
        last = len(consensus) - 1
        ends = [i for i in kept if tier[pairs[i].winner] == 0 and tier[pairs[i].loser] == last]
        best = max(ends, key=lambda i: (pairs[i].p, pairs[i].weight, pairs[i].winner,
                                        pairs[i].loser), default=None)
        skipped["not_best_worst"] += len(kept) - (best is not None)
        kept = [best] if best is not None else []
    return kept, skipped


class TrlRows:
    """The trl-pairs rows of the groups added one at a time (``number`` from 1 in export
    order), with the skipped pairs, a reject for each group left without a pair, and each
    split's rows."""

    def __init__(self, config: ExportConfig, chat: bool) -> None:
        self.config, self.chat = config, chat
        self.rows: dict[str, list[dict[str, Any]]] = {s: [] for s in _splits(config)}
        self.skipped: Counter[str] = Counter()
        self.rejects: list[Reject] = []

    def add(self, number: int, group_id: str, split: str | None, prompt: Prompt,
            texts: dict[str, str], consensus: Sequence[Sequence[str]],
            pairs: Sequence[PairValues]) -> None:
        kept, why = select_pairs(consensus, pairs, self.config)
        self.skipped.update(why)
        if not kept:
            self.rejects.append(Reject(stage=STAGE, row=number, group_id=group_id,
                                       field="pairs", reason="no consensus pair to export "
                                       f"(skipped: {dict(why) or 'group has no pairs'})"))
        out = self.rows.get(split or "")
        if out is None:
            return
        shown: Any = ([m.model_dump() for m in prompt.as_messages()] if self.chat
                      else prompt.display_text())
        for i in kept:
            pair = pairs[i]
            out.append({"prompt": shown, "chosen": _answer(texts[pair.winner], self.chat),
                        "rejected": _answer(texts[pair.loser], self.chat), "p": pair.p,
                        "weight": pair.weight, "group_id": group_id, "chosen_id": pair.winner,
                        "rejected_id": pair.loser})

    def dataset(self, key: str) -> datasets.DatasetDict:
        """Each split's rows as one Arrow table (made in one call: datasets' ``from_list``
        encodes value by value), its fingerprint from ``key`` (the input's content) and the
        export's settings; empty splits dropped."""
        import pyarrow as pa

        features = _trl_features(self.chat)
        c = self.config
        settings = f"trl-pairs {c.pairs} {c.min_weight} {c.chat}"
        return non_empty(datasets.DatasetDict({
            s: table_dataset(pa.Table.from_pylist(part, schema=features.arrow_schema),
                             datasets.DatasetInfo(features=features), f"{key} {settings} {s}")
            for s, part in self.rows.items()}))


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
    """The export of ``groups`` (records) as a ``DatasetDict`` (only non-empty splits),
    skipped pairs, rejected groups. ``key`` identifies the input's content (the validate
    stage's output fingerprint) for the trl-pairs datasets' fingerprints."""
    if config.format == "groups":
        dsd = datasets.DatasetDict({s: to_dataset([g for g in groups if g.split == s],
                                                  ValidatedGroup) for s in _splits(config)})
        return non_empty(dsd), Counter(), []
    out = TrlRows(config, config.chat == "always" or any(g.prompt.messages is not None
                                                         for g in groups))
    for number, group in enumerate(groups, start=1):
        out.add(number, group.group_id, group.split, group.prompt,
                {c.candidate_id: c.text for c in group.candidates}, group.consensus,
                [PairValues(p.winner, p.loser, p.p, p.weight) for p in group.pairs])
    return out.dataset(key), out.skipped, out.rejects


def _stored_prompt(value: dict[str, Any]) -> Prompt:
    """A stored prompt as the record the exported text is made from (its rows were validated
    when validate wrote them; only the turns and text are read)."""
    messages = value["messages"]
    return Prompt.model_construct(
        prompt_id=value["prompt_id"], text=value["text"], reference=value["reference"],
        messages=None if messages is None else [ChatMessage.model_construct(**m)
                                                for m in messages])


def pairs_from_table(table: pa.Table, config: ExportConfig, key: str
                     ) -> tuple[datasets.DatasetDict, Counter[str], list[Reject]]:
    """The trl-pairs export straight from ``RUN/validate``'s own Arrow table (as
    :func:`groups_from_table`): only the columns a pair row needs become Python values, and no
    group record is validated again; the same rows, skipped pairs and rejects as
    :func:`build_dataset` of that table's records (``tests/integration/test_export.py``).

    Raises:
        StageError: a row has no split, or nothing is left to export.
    """
    import pyarrow.compute as pc

    _require_splits(table)
    if config.split:
        table = table.filter(pc.equal(table.column("split"), config.split))
    # chat when any prompt has turns (read per chunk: no copy of the prompts)
    chat = config.chat == "always" or any(
        chunk.field("messages").null_count < len(chunk) for chunk in table.column("prompt").chunks)
    out = TrlRows(config, chat)
    columns = ["group_id", "split", "prompt", "candidates", "consensus", "pairs"]
    for number, row in enumerate(table_rows(table.select(columns)), start=1):
        out.add(number, row["group_id"], row["split"], _stored_prompt(row["prompt"]),
                {c["candidate_id"]: c["text"] for c in row["candidates"]}, row["consensus"],
                [PairValues(p["winner"], p["loser"], p["p"], p["weight"])
                 for p in row["pairs"]])
    return out.dataset(key), out.skipped, out.rejects


def _require_splits(table: pa.Table) -> None:
    import pyarrow.compute as pc

    split = table.column("split")
    if split.null_count:
        first = table.column("group_id")[pc.index(pc.is_null(split), True).as_py()].as_py()
        raise StageError(f"{split.null_count} validated groups have no split (first {first}); "
                         "run `grouppref validate RUN --force`")


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

    _require_splits(table)
    split = table.column("split")
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


