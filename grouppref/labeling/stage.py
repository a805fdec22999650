"""The ``label`` stage inside ``grouppref run``: push to Argilla, wait for rankings, pull.

1. Push the run's groups (the latest of rank/generate, or ``push.source_stage``) to Argilla:
   all of them, or the ``push.budget`` chosen by ``push.select`` (uncertain or random, see
   :mod:`grouppref.labeling.select`); only the groups sent count in step 2. The push is
   skipped when the source stage's output, the push settings and the server are the same as
   at the last push (the ``RUN/label/push`` stage): records are upserted by group
   id, so a skipped push changes nothing.
2. Count the groups with at least ``min_rankings`` *submitted* rankings. Fewer than
   ``min_groups`` of them: raise :class:`WaitingForLabels` with how many submissions are
   missing (the run stops with exit code 0); with ``wait`` poll every ``poll_seconds``.
3. Pull every submitted ranking into ``RUN/label`` (cached when nothing changed).

Credentials: ``api_url`` with ``$ARGILLA_API_KEY``, else ``$ARGILLA_API_URL`` /
``$ARGILLA_API_KEY``, else the embedded server (``grouppref label serve``) on ``state_dir``.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from grouppref.errors import ConfigError
from grouppref.labeling.client import (
    ENV_KEY,
    ArgillaClient,
    ArgillaCredentials,
    ClientSettings,
    connect,
    resolve_credentials,
)
from grouppref.labeling.config import LABEL_STAGE, SOURCE_STAGES, LabelRunConfig, PullConfig, PushConfig
from grouppref.labeling.pull import DatasetState, dataset_names, fetch_state, pull_run
from grouppref.labeling.push import load_groups, plan_selection, push_run, write_selection
from grouppref.pipeline.report.selection import audit_note
from grouppref.runs.stage import StageContext, Waiting
from grouppref.runs.store import RunStore, StageRun
from grouppref.schemas import AnnotatedGroup
from grouppref.schemas.label_reports import LabelSelection


class WaitingForLabels(Waiting):
    """Too few rankings are in; the run stops cleanly (exit code 0) with this message."""


@dataclass(frozen=True)
class LabelProgress:
    """How far the human rankings of the run's groups are."""

    groups: int  # groups of the source stage
    ready: int  # groups with >= min_rankings submitted rankings
    needed: int  # groups that must be ready before the run goes on
    missing: int  # fewest further submissions that would make `needed` groups ready
    submitted: int  # submitted rankings of the run's groups
    drafts: int
    by_annotator: dict[str, int]  # username -> submitted rankings

    @property
    def done(self) -> bool:
        return self.ready >= self.needed


def label_progress(state: DatasetState, group_ids: list[str], min_rankings: int,
                   min_groups: float) -> LabelProgress:
    """Count the submitted rankings per group (only the run's groups count).

    ``missing`` fills the groups closest to ``min_rankings`` first: the sum of the ``needed``
    smallest deficits ``max(0, min_rankings - submitted)``.
    """
    ids = set(group_ids)
    mine = [r for r in state.responses if r.group_id in ids]
    per_group = Counter(r.group_id for r in mine if r.status == "submitted")
    deficits = sorted(max(0, min_rankings - per_group[g]) for g in ids)
    needed = max(1, math.ceil(min_groups * len(ids) - 1e-9))
    return LabelProgress(
        groups=len(ids), ready=sum(d == 0 for d in deficits), needed=needed,
        missing=sum(deficits[:needed]), submitted=sum(per_group.values()),
        drafts=sum(r.status == "draft" for r in mine),
        by_annotator=dict(sorted(Counter(r.username for r in mine
                                         if r.status == "submitted").items())))


def describe(p: LabelProgress) -> str:
    """One progress line: submissions, drafts, per annotator."""
    who = ", ".join(f"{name} {n}" for name, n in p.by_annotator.items()) or "none yet"
    return (f"{p.submitted} submitted ranking(s) ({who}), {p.drafts} draft(s); {p.ready}/"
            f"{p.groups} groups ready")


def credentials(config: LabelRunConfig) -> ArgillaCredentials:
    """The server and key to use (see the module docstring).

    Raises:
        ConfigError: ``api_url`` without ``$ARGILLA_API_KEY``, or no server at all.
    """
    if config.api_url and not os.environ.get(ENV_KEY):
        raise ConfigError(f"label.api_url is {config.api_url!r} but ${ENV_KEY} is not set; "
                          f"export the API key of an owner or admin of that Argilla as {ENV_KEY}")
    return resolve_credentials(api_url=config.api_url,
                               state_dir=Path(config.state_dir) if config.state_dir else None)


PUSH_STAGE = f"{LABEL_STAGE}/push"


def _push(store: RunStore, push: PushConfig, client: ArgillaClient, creds: ArgillaCredentials,
          console: Console, force: bool, selection: LabelSelection) -> None:
    """Push unless ``RUN/label/push`` records the same push (settings, server, input)."""
    source = push.source_stage or store.latest(SOURCE_STAGES).stage
    settings = {"push": push.model_dump(mode="json", exclude={"batch_size"}),
                "server": creds.api_url, "source": source}
    stage: StageRun[Any] = store.open_stage(PUSH_STAGE, settings, inputs=[source],
                                            record_type=None, force=force)
    if stage.cached:  # the run's selection is the one pull and the report read
        write_selection(store, selection.model_copy(update={"dataset": push.dataset_name(store)}))
        return
    report = push_run(store, push, client, progress=False, selection=selection)
    names = ", ".join(repr(d.name) for d in report.datasets)
    console.print(f"{'label':>9}: pushed {report.groups} groups to {creds.api_url} (datasets "
                  f"{names}: {report.created} new, {report.updated} updated, "
                  f"{len(report.refused)} refused)", highlight=False)
    note = audit_note(report.selection) if report.selection else None
    if note:  # the same note as `label push`: too few audit groups to judge annotators
        console.print(f"{'label':>9}: note: {escape(note)}", highlight=False)
    where = f"argilla:{creds.api_url}#{report.workspace}/"
    stage.finish(inputs=report.groups, kept=report.groups,
                 stats={"dataset_ids": {d.name: d.dataset_id for d in report.datasets},
                        "created": report.created, "updated": report.updated,
                        "refused": len(report.refused),
                        "selection": report.selection.model_dump(mode="json")
                        if report.selection else None},
                 outputs={"dataset": where + report.dataset,
                          **{f"dataset_k{d.k}": where + d.name for d in report.datasets}})


def _state(store: RunStore, push: PushConfig, client: ArgillaClient, creds: ArgillaCredentials,
           console: Console, names: list[str], selection: LabelSelection) -> DatasetState:
    try:
        return fetch_state(client, names, push.workspace)
    except ConfigError:  # a dataset was deleted since the last push: push again
        _push(store, push, client, creds, console, force=True, selection=selection)
        return fetch_state(client, names, push.workspace)


def run_label(store: RunStore, config: LabelRunConfig,
              context: StageContext = StageContext()) -> StageRun[AnnotatedGroup]:
    """Push, check progress and pull (see the module docstring).

    Raises:
        WaitingForLabels: too few submitted rankings and ``wait`` is False.
        ConfigError: no Argilla server, or the dataset's schema differs from the run's.
        ArgillaConnectionError: the server failed after the retries.
    """
    console = context.console or Console()
    creds = credentials(config)
    workspace = creds.workspace or config.push.workspace
    push = config.push.model_copy(update={
        "workspace": workspace, "min_submitted": config.push.min_submitted or config.min_rankings})
    _, groups = load_groups(store, push.source_stage)
    selection = plan_selection(store, push)  # before connecting: bad input fails first
    ids, chosen = selection.ids, set(selection.ids)
    names = dataset_names(push.dataset_name(store), [g for g in groups if g.group_id in chosen])
    with connect(creds, ClientSettings()) as client:
        _push(store, push, client, creds, console, context.force, selection)
        last = ""
        while True:
            state = _state(store, push, client, creds, console, names, selection)
            progress = label_progress(state, ids, config.min_rankings, config.min_groups)
            line = describe(progress)
            if line != last:
                console.print(f"{'label':>9}: {line}", highlight=False)
                last = line
            if progress.done:
                break
            message = (f"waiting for {progress.missing} more submitted ranking(s): "
                       f"{progress.ready}/{progress.groups} groups have {config.min_rankings} "
                       f"each, the run needs {progress.needed}; rank them in Argilla at "
                       f"{creds.api_url} (datasets {', '.join(names)}, workspace "
                       f"{workspace!r})")
            if not context.wait:
                raise WaitingForLabels(message + ", then run again")
            time.sleep(config.poll_seconds)
        pull = PullConfig(dataset=push.dataset, workspace=workspace,
                          source_stage=push.source_stage)
        return pull_run(store, pull, client, force=context.force, progress=False).stage


def label_summary(stage: StageRun[Any]) -> str:
    """Human rankings in the pulled stage, for the run's closing line of the label stage."""
    s = stage.manifest.stats
    return (f"{s.get('human_rankings', 0)} human rankings over "
            f"{s.get('groups_with_human_rankings', 0)} groups")
