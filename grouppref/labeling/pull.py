"""``label pull`` and ``label status``: read human rankings back from Argilla.

``pull`` reads the run's datasets (one per group size k, ``<name>-k<k>``) and writes the
stage ``RUN/label`` (``AnnotatedGroup``): every group of the input stage (the one ``push``
read) with its automatic rankings plus one ``Ranking`` per *submitted* Argilla response
(annotator id = Argilla username, kind ``human``, ``created_at`` = the response's last
update; ``metadata.selection`` = the record's ``selection``, why the push sent the group:
``uncertain``, ``audit``, ``random`` or ``all``, which the aggregate's reliability uses).
Drafts and discarded responses are counted, never used. Rankings pulled earlier stay
in the output even if they were since deleted in Argilla, so the stage always holds every
human ranking seen so far; a response changed in Argilla replaces the earlier version. A
response that cannot become a ranking (its username cannot be an annotator id, or the record
was pushed for other candidates) is a part reject with its reason, and the counts say what
was kept.

A pull whose input stage and set of submitted responses (ids and update times) are unchanged
is a cache hit. ``RUN/label/responses.json`` keeps the ids and update times of the responses
pulled, so the next pull reports what is new or changed; rationales (the optional text
question) go to ``RUN/label/rationales.jsonl``.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from grouppref.errors import ConfigError
from grouppref.labeling.client import ArgillaClient
from grouppref.labeling.config import LABEL_STAGE, PullConfig, TargetConfig
from grouppref.labeling.dataset import (
    MAPPING_KEY,
    RANKING,
    RATIONALE,
    dataset_name,
    ranking_from_response,
)
from grouppref.labeling.push import by_size, load_groups, pushed_groups
from grouppref.pipeline.aggregate.config import SELECTION_KEY
from grouppref.runs.hashing import canonical_json, sha256_text
from grouppref.runs.progress import stage_progress
from grouppref.runs.store import RunStore, StageRun
from grouppref.schemas import AnnotatedGroup, Ranking, Reject
from grouppref.schemas.records import Id

STAGE_VERSION = "2"
STATE_FILE = "responses.json"
RATIONALES_FILE = "rationales.jsonl"
_ANNOTATOR_ID = TypeAdapter(Id)


@dataclass
class ArgillaResponse:
    """One annotator's response to one record, as pull needs it."""

    response_id: str
    group_id: str
    username: str
    status: str  # submitted | draft | discarded
    updated_at: str
    ranking: list[dict[str, Any]] | None
    rationale: str | None
    mapping: dict[str, str]
    selection: str | None = None  # the record's metadata `selection` (why it was pushed)


@dataclass
class DatasetState:
    """The records of a run's datasets and their responses."""

    datasets: list[dict[str, Any]]
    records: list[dict[str, Any]]
    responses: list[ArgillaResponse] = field(default_factory=list)


def dataset_names(base: str, groups: list[AnnotatedGroup]) -> list[str]:
    """The run's datasets: one per group size, ``<base>-k<k>``."""
    return [dataset_name(base, k) for k in by_size(groups)]


def fetch_state(client: ArgillaClient, names: list[str], workspace: str,
                progress: bool = False) -> DatasetState:
    """Read every record of the datasets ``names`` with its responses (owner/admin key).

    Raises:
        ConfigError: a dataset does not exist (push first).
        ArgillaConnectionError: an annotator's key.
    """
    client.require_manager("reading the rankings")
    workspace_id = client.workspace_id(workspace)
    found = {name: client.find_dataset(name, workspace_id) for name in names}
    missing = [name for name, ds in found.items() if ds is None]
    if missing:
        raise ConfigError(f"Argilla dataset(s) {', '.join(map(repr, missing))} do not exist in "
                          f"workspace {workspace!r}; run `grouppref label push RUN` first")
    state = DatasetState(datasets=[ds for ds in found.values() if ds is not None], records=[])
    with stage_progress(disable=not progress) as bar:
        task = bar.add_task("label fetch", total=None, unit="records")
        for ds in state.datasets:
            for rec in client.iter_records(ds["id"], include=("responses",)):
                state.records.append(rec)
                bar.advance(task)
    user_ids = {str(r["user_id"]) for rec in state.records for r in rec.get("responses") or []}
    names_of = client.usernames(user_ids, state.datasets[0]["workspace_id"]) if user_ids else {}
    for rec in state.records:
        mapping = (rec.get("metadata") or {}).get(MAPPING_KEY) or {}
        selection = (rec.get("metadata") or {}).get(SELECTION_KEY)
        for r in rec.get("responses") or []:
            values = r.get("values") or {}
            state.responses.append(ArgillaResponse(
                response_id=str(r["id"]), group_id=rec.get("external_id") or str(rec["id"]),
                username=names_of[str(r["user_id"])], status=r["status"],
                updated_at=str(r["updated_at"]),
                ranking=(values.get(RANKING) or {}).get("value"),
                rationale=(values.get(RATIONALE) or {}).get("value"), mapping=mapping,
                selection=selection if isinstance(selection, str) else None))
    return state


@dataclass
class StatusReport:
    """Progress of a dataset: record status counts and responses per annotator."""

    dataset: str
    records: int
    completed: int
    pending: int
    annotators: dict[str, dict[str, int]]  # username -> {submitted, draft, discarded}


def summarize(name: str, state: DatasetState) -> StatusReport:
    """Counts of completed/pending records and of each annotator's responses by status."""
    status = Counter(rec.get("status", "pending") for rec in state.records)
    per_user: dict[str, dict[str, int]] = defaultdict(
        lambda: {"submitted": 0, "draft": 0, "discarded": 0})
    for r in state.responses:
        per_user[r.username][r.status] = per_user[r.username].get(r.status, 0) + 1
    return StatusReport(dataset=name, records=len(state.records),
                        completed=status.get("completed", 0), pending=status.get("pending", 0),
                        annotators=dict(sorted(per_user.items())))


def label_status(store: RunStore, config: TargetConfig, client: ArgillaClient) -> StatusReport:
    """Status of the run's datasets together (see :func:`summarize`)."""
    _, groups = load_groups(store, config.source_stage)
    name = config.dataset_name(store)
    names = dataset_names(name, pushed_groups(store, groups, name))
    return summarize(name, fetch_state(client, names, config.workspace))


def _fingerprint(state: DatasetState) -> str:
    """The remote half of the pull's input: the dataset and its submitted responses."""
    submitted = sorted((r.response_id, r.updated_at, *([r.selection] if r.selection else []))
                       for r in state.responses if r.status == "submitted")
    datasets = sorted(str(ds["id"]) for ds in state.datasets)
    return sha256_text(canonical_json({"datasets": datasets, "submitted": submitted}))


def _earlier_human(store: RunStore) -> dict[tuple[str, str], Ranking]:
    """Human rankings of the previous pull: ``(group_id, annotator) -> Ranking``."""
    if not store.is_complete(LABEL_STAGE):
        return {}
    return {(r.group_id, r.annotator.id): r
            for g in store.load_records(LABEL_STAGE, AnnotatedGroup) for r in g.rankings
            if r.annotator.kind == "human" and r.annotator.name == "argilla"}


def _merge(group: AnnotatedGroup, pulled: dict[str, Ranking], earlier: dict[str, Ranking],
           rejects: list[Reject]) -> AnnotatedGroup:
    """The group's own rankings + earlier pulled + newly pulled (newest wins per annotator)."""
    humans = {**earlier, **pulled}
    ids = group.candidate_ids()
    rankings = [r for r in group.rankings if r.annotator.id not in humans]
    for annotator, ranking in sorted(humans.items()):
        if sorted(c for t in ranking.tiers for c in t) != sorted(ids):
            rejects.append(Reject(stage=LABEL_STAGE, group_id=group.group_id, field="rankings",
                                  scope="part", reason=f"earlier ranking by {annotator!r} no "
                                  "longer matches the group's candidates; left out"))
            continue
        rankings.append(ranking)
    return group.model_copy(update={"rankings": rankings})


def _pulled_rankings(groups: dict[str, AnnotatedGroup], state: DatasetState,
                     rejects: list[Reject]
                     ) -> tuple[dict[str, dict[str, Ranking]], Counter[str], dict[str, str]]:
    """The submitted rankings by group and annotator, the response counts by status, and the
    responses kept (``response id -> update time``)."""
    pulled: dict[str, dict[str, Ranking]] = defaultdict(dict)
    counts: Counter[str] = Counter()
    kept: dict[str, str] = {}
    for r in state.responses:
        counts[r.status] += 1
        group = groups.get(r.group_id)
        if r.status != "submitted":
            continue
        if group is None:
            counts["unknown_group"] += 1
            continue
        try:
            _ANNOTATOR_ID.validate_python(r.username)
        except ValidationError as e:
            counts["rejected"] += 1
            rejects.append(Reject(
                stage=LABEL_STAGE, group_id=r.group_id, field=RANKING, scope="part",
                reason=f"response by {r.username!r}: the username cannot be an annotator id "
                       f"({e.errors()[0]['msg']}); rename that user in Argilla"))
            continue
        try:
            when = datetime.fromisoformat(r.updated_at)
            ranking = ranking_from_response(r.ranking or [], r.mapping, group, r.username, when)
            if r.selection:
                ranking = ranking.model_copy(update={"metadata": {SELECTION_KEY: r.selection}})
            pulled[r.group_id][r.username] = ranking
        except ValueError as e:
            counts["rejected"] += 1
            rejects.append(Reject(stage=LABEL_STAGE, group_id=r.group_id, field=RANKING,
                                  scope="part", reason=f"response by {r.username!r}: {e}"))
            continue
        kept[r.response_id] = r.updated_at
    return pulled, counts, kept


def _read_state(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


@dataclass
class PullReport:
    """What a pull did (``stage`` is the ``RUN/label`` stage run)."""

    stage: StageRun[AnnotatedGroup]
    new: int
    changed: int
    stats: dict[str, Any]


def pull_run(store: RunStore, config: PullConfig, client: ArgillaClient, force: bool = False,
             progress: bool = True) -> PullReport:
    """Pull submitted rankings into ``RUN/label`` (see the module docstring).

    Raises:
        StageError: no complete input stage. ConfigError: the dataset does not exist.
        ArgillaConnectionError: the server failed after the retries.
    """
    source, groups = load_groups(store, config.source_stage)
    name = config.dataset_name(store)
    state = fetch_state(client, dataset_names(name, pushed_groups(store, groups, name)),
                        config.workspace, progress=progress)
    earlier = _earlier_human(store)  # read before open_stage marks the stage as running
    stage = store.open_stage(LABEL_STAGE, config, input_fingerprint=_fingerprint(state),
                             inputs=[source], record_type=AnnotatedGroup,
                             stage_version=STAGE_VERSION, force=force)
    if stage.cached:
        return PullReport(stage=stage, new=0, changed=0, stats=stage.manifest.stats)
    rejects: list[Reject] = []
    by_id = {g.group_id: g for g in groups}
    pulled, counts, now = _pulled_rankings(by_id, state, rejects)
    out = []
    for g in groups:
        mine = {a: r for (gid, a), r in earlier.items() if gid == g.group_id}
        out.append(_merge(g, pulled.get(g.group_id, {}), mine, rejects))
    seen = _read_state(stage.dir / STATE_FILE)
    new = sum(rid not in seen for rid in now)
    changed = sum(rid in seen and seen[rid] != t for rid, t in now.items())
    for shard in stage.pending_shards(out, shard_size=max(len(out), 1)):
        stage.write_shard(shard, list(shard.items), rejects)
    humans = Counter(r.annotator.id for g in out for r in g.rankings
                     if r.annotator.kind == "human")
    stats = {"source_stage": source, "dataset": name,
             "datasets": [ds["name"] for ds in state.datasets], "records": len(state.records),
             "submitted": counts["submitted"], "drafts": counts["draft"],
             "discarded": counts["discarded"], "unknown_group_responses": counts["unknown_group"],
             "rejected_responses": counts["rejected"], "new": new, "changed": changed,
             "human_rankings": sum(humans.values()),
             "human_rankings_by_annotator": dict(sorted(humans.items())),
             "groups_with_human_rankings": sum(any(r.annotator.kind == "human"
                                                   for r in g.rankings) for g in out)}
    stage.finish(inputs=len(groups), stats=stats)
    (stage.dir / STATE_FILE).write_text(json.dumps({**seen, **now}, indent=1, sort_keys=True)
                                        + "\n", encoding="utf-8")
    _write_rationales(stage.dir / RATIONALES_FILE, state)
    return PullReport(stage=stage, new=new, changed=changed, stats=stats)


def _write_rationales(path: Path, state: DatasetState) -> None:
    rows = [{"group_id": r.group_id, "annotator": r.username, "rationale": r.rationale,
             "updated_at": r.updated_at} for r in state.responses
            if r.status == "submitted" and r.rationale]
    path.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in rows),
                    encoding="utf-8")
