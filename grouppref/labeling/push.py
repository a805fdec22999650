"""``label push``: send a run's groups to Argilla, one record per group, for human ranking.

Reads the latest complete ``RUN/rank`` or ``RUN/generate`` (or the stage named by
``source_stage``). The groups go to one dataset per group size k, ``<name>-k<k>``
(:mod:`grouppref.labeling.dataset` says why). Each dataset is created when it does not exist;
when it does, its schema must match the run or the push is refused with the list of
differences: an existing dataset is never changed. Records are upserted in batches by
``external_id = group_id``, so a second push (or the rerun of an interrupted one) updates
records instead of adding copies. A group whose record already holds responses and was
pushed with other candidates is refused (its rankings would point at the wrong texts).

With ``select`` ``uncertain`` or ``random`` only ``budget`` groups are sent
(:mod:`grouppref.labeling.select`); the choice, with each group's uncertainty and role, goes
to ``RUN/label/selection.json`` and into ``push.json``, and each record's metadata says why
its group was sent (``selection``: ``uncertain``, ``audit``, ``random`` or ``all``; extra
metadata, so datasets made before keep their schema). Pull copies it onto the human rankings,
and the aggregate measures reliability accordingly.

Writes ``RUN/label/push.json`` (datasets, counts, refused groups, selection); never the API
key.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from grouppref.errors import GroupPrefError, StageError
from grouppref.labeling.client import ArgillaClient
from grouppref.labeling.config import LABEL_STAGE, SOURCE_STAGES, PushConfig
from grouppref.labeling.dataset import (
    MAPPING_KEY,
    DatasetSpec,
    candidate_map,
    dataset_name,
    dataset_payload,
    expected_summary,
    fields_payload,
    metadata_payload,
    questions_payload,
    record_payload,
    schema_diff,
    schema_summary,
)
from grouppref.pipeline.aggregate.config import SELECTION_KEY
from grouppref.pipeline.report.selection import read_selection, selection_path
from grouppref.runs.progress import stage_progress
from grouppref.runs.store import RunStore
from grouppref.schemas import RECORD_TYPES, AnnotatedGroup, Reject
from grouppref.schemas.label_reports import LabelSelection

PUSH_LOG = "push.json"


class SchemaMismatchError(GroupPrefError):
    """An Argilla dataset with the run's name exists but its schema differs from the run's."""


@dataclass
class DatasetPush:
    """What a push did to one dataset (the groups of one size k)."""

    name: str
    dataset_id: str
    k: int
    groups: int
    created: int = 0
    updated: int = 0
    created_dataset: bool = False
    refused: list[Reject] = field(default_factory=list)


@dataclass
class PushReport:
    """What a push did: ``dataset`` is the base name, ``datasets`` one entry per size k."""

    dataset: str
    workspace: str
    source_stage: str
    datasets: list[DatasetPush] = field(default_factory=list)
    retried: int = 0
    selection: LabelSelection | None = None

    @property
    def groups(self) -> int:
        return sum(d.groups for d in self.datasets)

    @property
    def created(self) -> int:
        return sum(d.created for d in self.datasets)

    @property
    def updated(self) -> int:
        return sum(d.updated for d in self.datasets)

    @property
    def refused(self) -> list[Reject]:
        return [r for d in self.datasets for r in d.refused]

    def by_k(self, k: int) -> DatasetPush:
        """The dataset of the groups of size ``k``."""
        return next(d for d in self.datasets if d.k == k)


def load_groups(store: RunStore, source_stage: str | None) -> tuple[str, list[AnnotatedGroup]]:
    """The groups of ``source_stage`` (or the latest of rank/generate) as annotated groups."""
    manifest = store.require(source_stage) if source_stage else store.latest(SOURCE_STAGES)
    record_type = RECORD_TYPES.get(manifest.record_type or "")
    if record_type is None or not issubclass(record_type, RECORD_TYPES["CandidateGroup"]):
        raise StageError(f"{store.root}/{manifest.stage} holds {manifest.record_type} records, "
                         "not groups; label a generate or rank stage")
    records = store.load_records(manifest.stage, record_type)
    groups = [r if isinstance(r, AnnotatedGroup) else AnnotatedGroup(**r.model_dump())
              for r in records]
    if not groups:
        raise StageError(f"{store.root}/{manifest.stage} holds no groups; nothing to label")
    return manifest.stage, groups


def dataset_schema(client: ArgillaClient, dataset: dict[str, Any]
                   ) -> tuple[dict[str, Any], list[Any], list[Any], list[Any]]:
    """The dataset with its fields, questions and metadata properties as the server has them."""
    did = dataset["id"]
    fields = client.request("GET", f"/api/v1/datasets/{did}/fields")["items"]
    questions = client.request("GET", f"/api/v1/datasets/{did}/questions")["items"]
    metadata = client.request("GET", f"/api/v1/me/datasets/{did}/metadata-properties")["items"]
    return dataset, fields, questions, metadata


def _create_dataset(client: ArgillaClient, name: str, workspace_id: str, spec: DatasetSpec
                    ) -> dict[str, Any]:
    ds = client.request("POST", "/api/v1/datasets",
                        json_body=dataset_payload(name, workspace_id, spec))
    did = ds["id"]
    for body in fields_payload(spec):
        client.request("POST", f"/api/v1/datasets/{did}/fields", json_body=body)
    for body in questions_payload(spec):
        client.request("POST", f"/api/v1/datasets/{did}/questions", json_body=body)
    for body in metadata_payload():
        client.request("POST", f"/api/v1/datasets/{did}/metadata-properties", json_body=body)
    return client.request("PUT", f"/api/v1/datasets/{did}/publish")


def by_size(groups: Sequence[AnnotatedGroup]) -> dict[int, list[AnnotatedGroup]]:
    """The groups by their number of candidates, smallest k first (input order within)."""
    sizes: dict[int, list[AnnotatedGroup]] = {}
    for g in groups:
        sizes.setdefault(g.k, []).append(g)
    return dict(sorted(sizes.items()))


def ensure_dataset(client: ArgillaClient, name: str, workspace: str, config: PushConfig,
                   k: int, chat: bool) -> tuple[dict[str, Any], DatasetSpec, bool]:
    """The size-``k`` dataset, created if missing; returns ``(dataset, spec, created)``.

    A draft (unpublished) dataset left by an interrupted create of ours holds no records and is
    made again. A published one is checked, never changed; its ChatField prompt is kept even
    when this push has plain prompts only (they show as one user turn).

    Raises:
        SchemaMismatchError: the existing dataset's schema differs from the run's.
    """
    workspace_id = client.workspace_id(workspace, create=client.me.get("role") == "owner")
    ds = client.find_dataset(name, workspace_id)
    if ds is not None and ds["status"] == "draft" and \
            (ds.get("metadata") or {}).get("grouppref_schema"):
        client.request("DELETE", f"/api/v1/datasets/{ds['id']}")
        ds = None
    if ds is None:
        spec = config.spec(k, chat)
        return _create_dataset(client, name, workspace_id, spec), spec, True
    dataset, fields, questions, metadata = dataset_schema(client, ds)
    actual = schema_summary(dataset, fields, questions, metadata)
    spec = config.spec(k, chat, actual, fields)
    diff = schema_diff(expected_summary(spec), actual)
    if diff:
        raise SchemaMismatchError(
            f"Argilla dataset {name!r} (workspace {workspace!r}) does not match the run, and "
            f"grouppref never changes an existing dataset: {'; '.join(diff)}. Push under "
            "another --dataset name (or delete that dataset in Argilla if none of its "
            "responses are needed)")
    return dataset, spec, False


def _existing_records(client: ArgillaClient, dataset_id: str) -> dict[str, tuple[dict[str, Any], bool]]:
    """``external_id -> (candidate map, has responses)`` of the records already there."""
    found = {}
    for rec in client.iter_records(dataset_id, include=("responses",)):
        if rec.get("external_id"):
            mapping = (rec.get("metadata") or {}).get(MAPPING_KEY) or {}
            found[rec["external_id"]] = (mapping, bool(rec.get("responses")))
    return found


def _refuse_changed(groups: Sequence[AnnotatedGroup], existing: dict[str, tuple[dict[str, Any], bool]]
                    ) -> tuple[list[AnnotatedGroup], list[Reject]]:
    keep, refused = [], []
    for g in groups:
        mapping, answered = existing.get(g.group_id, ({}, False))
        if answered and mapping != candidate_map(g):
            refused.append(Reject(
                stage="label push", group_id=g.group_id, field="candidates",
                reason="the Argilla record already has responses for other candidates; "
                       "pushing would attach them to the wrong texts (label this group under a "
                       "new --dataset)"))
        else:
            keep.append(g)
    return keep, refused


def plan_selection(store: RunStore, config: PushConfig) -> LabelSelection:
    """The groups a push of ``config`` sends (:func:`grouppref.labeling.select.select_groups`);
    needs no server, so bad input fails before any connection.

    Raises:
        StageError: no complete source stage. ConfigError: see ``select_groups``.
    """
    from grouppref.labeling.select import select_groups  # torch: not at --help time

    source, groups = load_groups(store, config.source_stage)
    return select_groups(groups, config, source)


def push_run(store: RunStore, config: PushConfig, client: ArgillaClient, progress: bool = True,
             on_batch: Callable[[int, int], None] | None = None,
             selection: LabelSelection | None = None) -> PushReport:
    """Push the run's groups to Argilla (see the module docstring) and log it in
    ``RUN/label/push.json``.

    Args:
        store (RunStore): the run.
        config (PushConfig): dataset, workspace, spec and batching settings.
        client (ArgillaClient): a connected client with an owner or admin key.
        progress (bool): show a progress bar.
        on_batch (Callable | None): called as ``on_batch(done, total)`` after each batch.
        selection (LabelSelection | None): the groups to send, from :func:`plan_selection`
            (made here when not given).

    Raises:
        StageError: no complete source stage. SchemaMismatchError: see :func:`ensure_dataset`.
        ConfigError: a bad selection (see :func:`plan_selection`).
        ArgillaConnectionError: an annotator's key, or the server failed after the retries.
    """
    if selection is None:
        selection = plan_selection(store, config)
    client.require_manager("push")
    source, groups = load_groups(store, config.source_stage)
    chosen = set(selection.ids)
    roles = {g.group_id: g.role for g in selection.selected if g.role is not None}
    report = push_groups(client, config, config.dataset_name(store),
                         [g for g in groups if g.group_id in chosen], progress=progress,
                         on_batch=on_batch, roles=roles)
    report.source_stage = source
    report.selection = selection = selection.model_copy(update={"dataset": report.dataset})
    _write_log(store, report, client.credentials.api_url)
    write_selection(store, selection)
    return report


def push_groups(client: ArgillaClient, config: PushConfig, base: str,
                groups: Sequence[AnnotatedGroup], progress: bool = True,
                on_batch: Callable[[int, int], None] | None = None,
                roles: Mapping[str, str] | None = None) -> PushReport:
    """Upsert ``groups`` into the datasets ``<base>-k<k>`` (created or checked first);
    ``roles`` (group id -> why it was selected) go into the records' metadata ``selection``."""
    report = PushReport(dataset=base, workspace=config.workspace, source_stage="")
    roles = roles or {}
    chat = any(g.prompt.messages is not None for g in groups)
    done = 0
    with stage_progress(disable=not progress) as bar:
        task = bar.add_task("label push", total=len(groups), unit="groups")
        for k, members in by_size(groups).items():
            name = dataset_name(base, k)
            dataset, spec, created = ensure_dataset(client, name, config.workspace, config, k,
                                                    chat)
            did = dataset["id"]
            questions = client.request("GET", f"/api/v1/datasets/{did}/questions")["items"]
            question_ids = {q["name"]: q["id"] for q in questions}
            existing = {} if created else _existing_records(client, did)
            todo, refused = _refuse_changed(members, existing)
            pushed = DatasetPush(name=name, dataset_id=did, k=k, groups=len(members),
                                 created_dataset=created, refused=refused)
            report.datasets.append(pushed)
            bar.advance(task, len(refused))
            for start in range(0, len(todo), config.batch_size):
                batch = todo[start : start + config.batch_size]
                items = [with_role(record_payload(g, question_ids, spec.chat, config.suggest_from),
                                   roles.get(g.group_id)) for g in batch]
                client.request("PUT", f"/api/v1/datasets/{did}/records/bulk",
                               json_body={"items": items})
                updated = sum(g.group_id in existing for g in batch)  # the server does not say
                pushed.updated += updated
                pushed.created += len(batch) - updated
                bar.advance(task, len(batch))
                done += len(batch)
                if on_batch is not None:
                    on_batch(done, len(groups))
    report.retried = client.retried
    return report


def with_role(item: dict[str, Any], role: str | None) -> dict[str, Any]:
    """A record payload with the group's selection role in its metadata (unchanged: none)."""
    if role is not None:
        item["metadata"][SELECTION_KEY] = role
    return item


def _write_log(store: RunStore, report: PushReport, api_url: str) -> None:
    path = store.stage_dir(LABEL_STAGE) / PUSH_LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    datasets = [{"name": d.name, "dataset_id": d.dataset_id, "k": d.k, "groups": d.groups,
                 "created": d.created, "updated": d.updated,
                 "created_dataset": d.created_dataset} for d in report.datasets]
    log = {"api_url": api_url, "dataset": report.dataset, "workspace": report.workspace,
           "source_stage": report.source_stage, "datasets": datasets, "groups": report.groups,
           "created": report.created, "updated": report.updated,
           "refused": [r.model_dump(mode="json") for r in report.refused],
           "selection": report.selection.model_dump(mode="json") if report.selection else None,
           "pushed_at": datetime.now(timezone.utc).isoformat()}
    path.write_text(json.dumps(log, indent=2) + "\n", encoding="utf-8")


def write_selection(store: RunStore, selection: LabelSelection) -> None:
    """``RUN/label/selection.json``: the groups the last push sent, and why."""
    path = selection_path(store)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(selection.model_dump_json(indent=1) + "\n", encoding="utf-8")


def pushed_groups(store: RunStore, groups: list[AnnotatedGroup], dataset: str
                  ) -> list[AnnotatedGroup]:
    """The groups the run's last push to ``dataset`` sent: its selection's when the last push
    of the run went to ``dataset`` with one (the datasets of a selection hold only the group
    sizes it chose), else all of them."""
    selection = read_selection(store)
    if selection is None or selection.select == "all" or selection.dataset != dataset:
        return groups
    chosen = set(selection.ids)
    return [g for g in groups if g.group_id in chosen] or groups
