"""The ``validate`` stage: check every aggregated group, split train/test by prompt, report.

Reads ``RUN/aggregate`` (``ValidatedGroup`` rows, ``split`` unset), or with ``source`` a
published dataset (:mod:`grouppref.readers.published`: an export in any format or container, a
Hub id; TRL pairs become groups of K=2), row by row and writes
``RUN/validate`` (the rows that pass, ``split`` set), ``RUN/validate/rejects.jsonl`` (each row
that failed, with its 1-based row number, group id, field and reason) and
``RUN/validate/report.json`` (:class:`ValidationReport`).

Checks, in order (the first that fails names the row's reject; the stage parses each row,
``schema``, and :class:`~grouppref.pipeline.validate.core.Checks` makes the others):

==========================  ====================================================================
check                        a row fails when
==========================  ====================================================================
``schema``                   it is not a valid ``ValidatedGroup``: unknown or missing columns,
                             rankings naming unknown candidates, an annotator ranking twice,
                             ``p`` outside [0.5, 1], ``weight`` outside [0, 1], non-finite numbers
``conflicting_contents``     another row has the same group id but a different prompt or
                             candidates (every row of that group id is rejected: we cannot tell
                             which one is right)
``duplicate_group_id``       an earlier row has the same group id and the same contents
``duplicate_prompt``         an earlier row (another group id) has the same prompt content
                             (not for groups read from TRL pairs, flagged ``from_pair``: one
                             prompt has one such group per pair)
``too_few_pairs``            it has fewer than ``min_pairs`` pair preferences
``flagged``                  it carries one of ``reject_flags``
==========================  ====================================================================

The split is a pure function of (seed, prompt): ``u = sha256(seed, key)[:8] / 2**64`` and the
row goes to ``test`` when ``u < test_fraction``. The same prompt therefore always lands in the
same split, and adding rows never moves an existing row to the other split. A published
dataset is split again by the same rule (its own split is not kept): re-validating an export
with the seed and test fraction it was made with gives back its splits.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any, TypeAlias

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from grouppref.errors import StageError
from grouppref.pipeline.validate.batches import Checked, checked_batches
from grouppref.pipeline.validate.config import INPUT_STAGE, STAGE, STAGE_VERSION, ValidateConfig
from grouppref.pipeline.validate.core import CHECKS, Checks
from grouppref.readers.published import open_published, validated_rows
from grouppref.runs.collector import cycle_collection_paused
from grouppref.runs.progress import stage_progress
from grouppref.runs.stage import StageContext
from grouppref.runs.store import DATA, RunStore, StageRun
from grouppref.schemas import Reject, ValidatedGroup, check_tiers, from_row
from grouppref.schemas.arrow import (
    arrow_schema_for,
    from_stored_row,
    stored_as,
    table_rows,
    take_rows,
)

REPORT = "report.json"
MAX_FAILURES_IN_REPORT = 1000
Rows: TypeAlias = Sequence[dict[str, Any]] | pa.Table  # raw Arrow rows of RUN/aggregate


class Failure(BaseModel):
    """One failed row in the report."""

    model_config = ConfigDict(extra="forbid")

    check: str
    row: int
    group_id: str | None = None
    field: str | None = None
    reason: str


class ValidationReport(BaseModel):
    """What ``validate`` found; written to ``RUN/validate/report.json``."""

    model_config = ConfigDict(extra="forbid")

    run: str
    input_stage: str = INPUT_STAGE
    config: dict[str, Any]
    inputs: int
    outputs: int
    rejected: int
    splits: dict[str, dict[str, int]] = Field(description="groups and pairs per split")
    prompt_overlap: int = Field(description="prompts found in both splits (always 0)")
    checks: dict[str, int] = Field(description="failed rows per check")
    failures: list[Failure] = Field(description=f"first {MAX_FAILURES_IN_REPORT} failures")
    agreement: dict[str, float | None]
    flags: dict[str, int] = Field(description="flags of the groups kept, with counts")

    @property
    def passed(self) -> bool:
        return self.rejected == 0


def _loc(loc: tuple[Any, ...]) -> str | None:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


def _locate(group: dict[str, Any]) -> tuple[str, str] | None:
    """Field and reason of a whole-group problem: pydantic reports those at the whole field
    (``rankings``) or the whole row; this finds the ranking or pair at fault."""
    ids = [c["candidate_id"] for c in group.get("candidates", [])]
    annotators: dict[str, int] = {}
    for i, ranking in enumerate(group.get("rankings") or []):
        who = ranking["annotator"]["id"]
        if ranking["group_id"] != group["group_id"]:
            return f"rankings[{i}].group_id", (
                f"ranking by {who!r} is for group {ranking['group_id']!r}, "
                f"not {group['group_id']!r}")
        try:
            check_tiers(ranking["tiers"], ids, complete=False)  # partial rankings are valid
        except ValueError as e:
            return f"rankings[{i}].tiers", f"ranking by {who!r}: {e}"
        if who in annotators:
            return f"rankings[{i}].annotator.id", (f"annotator {who!r} ranks this group twice "
                                                   f"(first at rankings[{annotators[who]}])")
        annotators[who] = i
    return _locate_aggregate(group, ids)


def _locate_raw(row: dict[str, Any]) -> tuple[str, str] | None:
    """:func:`_locate` on a raw Arrow row; ``None`` when the row is too malformed to say more
    (pydantic's own message is used then)."""
    try:
        strengths = row.get("strengths")
        group = {**row, "strengths": json.loads(strengths) if isinstance(strengths, str) else {}}
        return _locate(group)
    except (KeyError, TypeError, ValueError):
        return None


def _locate_aggregate(group: dict[str, Any], ids: list[str]) -> tuple[str, str] | None:
    try:
        check_tiers(group.get("consensus") or [], ids)
    except ValueError as e:
        return "consensus", f"consensus: {e}"
    if set(group.get("strengths") or {}) != set(ids):
        return "strengths", "strengths must name every candidate exactly once"
    seen: dict[frozenset[str], int] = {}
    for i, pair in enumerate(group.get("pairs") or []):
        unknown = sorted({pair["winner"], pair["loser"]} - set(ids))
        if unknown:
            return f"pairs[{i}]", f"pair names unknown candidates {unknown}"
        key = frozenset((pair["winner"], pair["loser"]))
        if key in seen:
            return f"pairs[{i}]", f"pair {pair['winner']!r} / {pair['loser']!r} appears twice " \
                f"(first at pairs[{seen[key]}])"
        seen[key] = i
    return None


def parse_row(row: dict[str, Any], number: int, source: str, *, stored: bool = False
              ) -> ValidatedGroup | Reject:
    """A raw row as a ``ValidatedGroup``, or a ``Reject`` naming the field and the reason
    (``stored``: a row of a table with the record's own schema, :func:`from_stored_row`)."""
    group_id = row.get("group_id") if isinstance(row.get("group_id"), str) else None
    try:
        return (from_stored_row if stored else from_row)(ValidatedGroup, row)
    except ValidationError as e:
        first = e.errors()[0]
        field, reason = _loc(first["loc"]), first["msg"].removeprefix("Value error, ")
        if len(first["loc"]) <= 1:  # a whole-group check: find the exact place ourselves
            field, reason = _locate_raw(row) or (field, reason)
        more = f" (and {e.error_count() - 1} more errors)" if e.error_count() > 1 else ""
        return Reject(stage=STAGE, reason=f"schema: {reason}{more}", source=source, row=number,
                      group_id=group_id, field=field)
    except (ValueError, TypeError) as e:  # a JSON column that does not parse
        return Reject(stage=STAGE, reason=f"schema: {e}", source=source, row=number,
                      group_id=group_id)


def _repeated_ids(ds: Rows) -> set[str]:
    """The group ids that occur in more than one row (only their rows' contents are
    compared; ids that are not text fail the schema check)."""
    if isinstance(ds, pa.Table):
        if "group_id" not in ds.column_names:
            return set()
        import pyarrow.compute as pc

        counts = pc.value_counts(ds.column("group_id")).to_pylist()
        return {c["values"] for c in counts if c["counts"] > 1 and isinstance(c["values"], str)}
    seen = Counter(row.get("group_id") for row in ds)
    return {gid for gid, n in seen.items() if n > 1 and isinstance(gid, str)}


def check_rows(ds: Rows, config: ValidateConfig, source: str, *, batch_check: bool = True
               ) -> Checks:
    """Pass 1: the schema check of every row, then :class:`Checks`. Rows of a table in the
    record's own schema are checked on Arrow batches first (:mod:`.batch`); only the rows that
    check does not prove sound, and every row without ``batch_check``, are parsed."""
    plan = Checks(config, source, _repeated_ids(ds))
    stored = isinstance(ds, pa.Table) and stored_as(ds.schema, ValidatedGroup)
    if stored and batch_check:
        assert isinstance(ds, pa.Table)
        # the batches' processes start before the progress display's thread
        with checked_batches(ds, plan.repeated, config.split_by, config.workers) as checked, \
                stage_progress() as bar:
            task = bar.add_task(f"{STAGE}: check", total=len(ds), unit="groups")
            for done in _add_checked(checked, plan):
                bar.advance(task, done)
        plan.finish_groups()
        return plan
    with stage_progress() as bar:
        task = bar.add_task(f"{STAGE}: check", total=len(ds), unit="groups")
        rows = table_rows(ds) if isinstance(ds, pa.Table) else ds
        for number, row in enumerate(rows, start=1):
            _parse_and_add(plan, row, number, stored)
            bar.advance(task)
    plan.finish_groups()
    return plan


def _parse_and_add(plan: Checks, row: dict[str, Any], number: int, stored: bool) -> None:
    parsed = parse_row(row, number, plan.source, stored=stored)
    if isinstance(parsed, Reject):
        plan.add_schema_failure(number, parsed)
    else:
        plan.add(number, parsed)


def _add_checked(checked: Iterator[tuple[pa.RecordBatch, Checked]], plan: Checks
                 ) -> Iterator[int]:
    """Each batch's rows added to ``plan``: the sound rows by their facts, the others parsed;
    yields the rows done after each batch."""
    number = 0
    for batch, got in checked:
        facts = iter(got.facts)
        for i, ok in enumerate(got.sound.tolist()):
            number += 1
            if ok:
                plan.add_facts(number, next(facts))
            else:
                _parse_and_add(plan, batch.slice(i, 1).to_pylist()[0], number, stored=True)
        yield batch.num_rows


def _accepted_table(ds: Rows, numbers: Sequence[int], splits: Sequence[str]
                    ) -> pa.Table:
    """The rows ``numbers`` (1-based) of ``ds`` as they are, with ``split`` set: pass 1 proved
    each of them a valid ``ValidatedGroup`` (on Arrow columns, or by parsing it), and a valid
    row is what :func:`to_row` gives of its record (stored rows, and rows of a published
    dataset, are written by it), so the Arrow row is the record: taking it saves building it."""
    if isinstance(ds, pa.Table):
        table = take_rows(ds, [n - 1 for n in numbers])
    else:
        table = pa.Table.from_pylist([dict(ds[n - 1]) for n in numbers],
                                     schema=arrow_schema_for(ValidatedGroup))
    return table.set_column(table.schema.get_field_index("split"), "split",
                            pa.array(splits, pa.string()))


def _write(stage: StageRun[ValidatedGroup], ds: Rows, plan: Checks,
           shard_size: int) -> None:
    """Pass 2: write the accepted rows with the split pass 1 gave them (resumable)."""
    accepted = plan.accepted()
    with stage_progress() as bar:
        task = bar.add_task(f"{STAGE}: write", total=len(accepted), unit="groups",
                            completed=stage.done_items(accepted, shard_size))
        for shard in stage.pending_shards(accepted, shard_size=shard_size):
            splits = [plan.info[n].split for n in shard.items]
            stage.write_table(shard, _accepted_table(ds, shard.items, splits), [])
            bar.advance(task, len(shard.items))


def _input(store: RunStore, config: ValidateConfig
           ) -> tuple[Rows, list[Reject], str, str, list[str]]:
    """Rows to check, rejects made while reading them, where they came from (for rejects), the
    external input fingerprint and the stages of the run read."""
    if config.source:
        published = open_published(config.source, STAGE)
        rows, rejects = validated_rows(published, STAGE)
        return rows, rejects, published.source, published.fingerprint, []
    manifest = store.require(INPUT_STAGE)
    # nothing to check when nothing passed (a run of an older version saved no file for it)
    ds = store.load_table(INPUT_STAGE) if manifest.counts.outputs else []
    return ds, [], str(store.stage_dir(INPUT_STAGE) / DATA), "", [INPUT_STAGE]


def run_validate(store: RunStore, config: ValidateConfig,
                 context: StageContext = StageContext()) -> StageRun[ValidatedGroup]:
    """Check ``RUN/aggregate`` (or ``config.source``) row by row; write the rows that pass,
    split, to ``RUN/validate``.

    Args:
        store (RunStore): the run.
        config (ValidateConfig): source, split and check settings.
        context (StageContext): ``force``: re-run even when the cached result is valid.

    Returns:
        StageRun[ValidatedGroup]: the stage; ``RUN/validate/report.json`` holds the report.

    Raises:
        StageError: if ``aggregate`` has not completed (and no source is given), or (a bug) a
            prompt ends up in both splits.
        InputFileError: ``source`` cannot be read, holds no rows or rows of no known format.
    """
    ds, read_rejects, source, fingerprint, reads = _input(store, config)
    stage = store.open_stage(STAGE, config, input_fingerprint=fingerprint, inputs=reads,
                             record_type=ValidatedGroup, stage_version=STAGE_VERSION, force=context.force)
    if stage.cached:
        return stage
    with cycle_collection_paused():  # every row's facts stay alive until the checks end
        plan = check_rows(ds, config, source)
    summary = plan.summary()
    if summary["prompt_overlap"]:
        raise StageError(f"{summary['prompt_overlap']} prompts landed in both splits; "
                         "this is a bug in validate, please report it")
    # rows of a published dataset that are no group at all fail the schema check
    rejects = [("schema", r) for r in read_rejects] + [plan.rejects[n] for n in sorted(plan.rejects)]
    stage.add_rejects("checks", [r for _, r in rejects])
    _write(stage, ds, plan, config.shard_size)
    checks = Counter(check for check, _ in rejects)
    inputs = plan.rows + len(read_rejects)
    report = ValidationReport(
        run=store.name, config=config.model_dump(mode="json"), inputs=inputs,
        outputs=len(plan.accepted()), rejected=len(rejects),
        checks={c: checks.get(c, 0) for c in CHECKS},
        failures=[Failure(check=check, row=r.row or 0, group_id=r.group_id, field=r.field,
                          reason=r.reason) for check, r in rejects[:MAX_FAILURES_IN_REPORT]],
        **summary)
    stats = report.model_dump(mode="json", include={"splits", "prompt_overlap", "checks",
                                                    "agreement", "flags"})
    (stage.dir / REPORT).write_text(report.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return stage.finish(inputs=inputs, stats=stats)


def load_report(store: RunStore) -> ValidationReport:
    """The report of the last ``validate`` run of ``store``."""
    store.require(STAGE)
    path = store.stage_dir(STAGE) / REPORT
    if not path.exists():
        raise StageError(f"{path} is missing; run `grouppref validate {store.root} --force`")
    return ValidationReport.model_validate(json.loads(path.read_text(encoding="utf-8")))
