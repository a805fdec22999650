"""``label push``: send a run's groups to Argilla, one record per group, for human ranking.

Reads the latest complete ``RUN/rank`` or ``RUN/generate`` (or the stage named by
``source_stage``). Creates the dataset when it does not exist; when it does, its schema must
match the run (a dataset with more response slots than needed is fine) or the push is refused
with the list of differences: an existing dataset is never changed. Records are upserted in
batches by ``external_id = group_id``, so a second push (or the rerun of an interrupted one)
updates records instead of adding copies. A group whose record already holds responses and
was pushed with other candidates is refused (its rankings would point at the wrong texts).

Writes ``RUN/label/push.json`` (dataset, counts, refused groups); never the API key.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
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
    dataset_payload,
    existing_k,
    expected_summary,
    fields_payload,
    metadata_payload,
    questions_payload,
    record_payload,
    schema_diff,
    schema_summary,
)
from grouppref.runs.progress import stage_progress
from grouppref.runs.store import RunStore
from grouppref.schemas import RECORD_TYPES, AnnotatedGroup, Reject

PUSH_LOG = "push.json"


class SchemaMismatchError(GroupPrefError):
    """An Argilla dataset with the run's name exists but its schema differs from the run's."""


@dataclass
class PushReport:
    """What a push did."""

    dataset: str
    dataset_id: str
    workspace: str
    source_stage: str
    k: int
    groups: int
    created: int = 0
    updated: int = 0
    created_dataset: bool = False
    refused: list[Reject] = field(default_factory=list)
    retried: int = 0


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


def dataset_schema(client: ArgillaClient, dataset: dict[str, Any]) -> tuple[dict, list, list, list]:
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


def ensure_dataset(client: ArgillaClient, name: str, workspace: str, config: PushConfig,
                   k_needed: int) -> tuple[dict[str, Any], int, bool]:
    """The run's dataset, created if missing; returns ``(dataset, k, created)``.

    A draft (unpublished) dataset left by an interrupted create of ours holds no records and is
    made again. A published one is checked, never changed.

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
        return _create_dataset(client, name, workspace_id, config.spec(k_needed)), k_needed, True
    dataset, fields, questions, metadata = dataset_schema(client, ds)
    k = max(k_needed, existing_k(fields))
    actual = schema_summary(dataset, fields, questions, metadata)
    diff = schema_diff(expected_summary(config.spec(k, actual)), actual)
    if diff:
        raise SchemaMismatchError(
            f"Argilla dataset {name!r} (workspace {workspace!r}) does not match the run, and "
            f"grouppref never changes an existing dataset: {'; '.join(diff)}. Push to another "
            "--dataset, or delete that dataset in Argilla first")
    return dataset, k, False


def _existing_records(client: ArgillaClient, dataset_id: str) -> dict[str, tuple[dict, bool]]:
    """``external_id -> (candidate map, has responses)`` of the records already there."""
    found = {}
    for rec in client.iter_records(dataset_id, include=("responses",)):
        if rec.get("external_id"):
            mapping = (rec.get("metadata") or {}).get(MAPPING_KEY) or {}
            found[rec["external_id"]] = (mapping, bool(rec.get("responses")))
    return found


def _refuse_changed(groups: Sequence[AnnotatedGroup], existing: dict[str, tuple[dict, bool]]
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


def push_run(store: RunStore, config: PushConfig, client: ArgillaClient, progress: bool = True,
             on_batch: Callable[[int, int], None] | None = None) -> PushReport:
    """Push the run's groups to Argilla (create or check the dataset, then upsert records).

    Args:
        store (RunStore): the run.
        config (PushConfig): dataset, workspace, spec and batching settings.
        client (ArgillaClient): a connected client with an owner or admin key.
        progress (bool): show a progress bar.
        on_batch (Callable | None): called as ``on_batch(done, total)`` after each batch.

    Raises:
        StageError: no complete source stage. SchemaMismatchError: see :func:`ensure_dataset`.
        ArgillaConnectionError: the server failed after the retries.
    """
    source, groups = load_groups(store, config.source_stage)
    name = config.dataset_name(store)
    dataset, k, created = ensure_dataset(client, name, config.workspace, config,
                                         max(g.k for g in groups))
    did = dataset["id"]
    questions = client.request("GET", f"/api/v1/datasets/{did}/questions")["items"]
    question_ids = {q["name"]: q["id"] for q in questions}
    existing = {} if created else _existing_records(client, did)
    todo, refused = _refuse_changed(groups, existing)
    report = PushReport(dataset=name, dataset_id=did, workspace=config.workspace,
                        source_stage=source, k=k, groups=len(groups), created_dataset=created,
                        refused=refused)
    with stage_progress(disable=not progress) as bar:
        task = bar.add_task("label push", total=len(todo), unit="groups")
        for start in range(0, len(todo), config.batch_size):
            batch = todo[start : start + config.batch_size]
            items = [record_payload(g, question_ids, k, config.suggest_from) for g in batch]
            client.request("PUT", f"/api/v1/datasets/{did}/records/bulk",
                           json_body={"items": items})
            updated = sum(g.group_id in existing for g in batch)  # the server does not say
            report.updated += updated
            report.created += len(batch) - updated
            bar.advance(task, len(batch))
            if on_batch is not None:
                on_batch(start + len(batch), len(todo))
    report.retried = client.retried
    _write_log(store, report, client.credentials.api_url)
    return report


def _write_log(store: RunStore, report: PushReport, api_url: str) -> None:
    path = store.stage_dir(LABEL_STAGE) / PUSH_LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    log = {"api_url": api_url, "dataset": report.dataset, "dataset_id": report.dataset_id,
           "workspace": report.workspace, "source_stage": report.source_stage, "k": report.k,
           "groups": report.groups, "created": report.created, "updated": report.updated,
           "refused": [r.model_dump(mode="json") for r in report.refused],
           "pushed_at": datetime.now(timezone.utc).isoformat()}
    path.write_text(json.dumps(log, indent=2) + "\n", encoding="utf-8")
