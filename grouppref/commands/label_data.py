"""``grouppref label push / pull / status``: thin commands over :mod:`grouppref.labeling`.

The server comes from ``--api-url`` or ``ARGILLA_API_URL``, the key from ``ARGILLA_API_KEY``
or a credentials file (the embedded server's by default); the key is never an option, so it
never shows in ``ps`` or shell history.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, TypeVar

import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.table import Table

from grouppref.commands.core import report_stage
from grouppref.commands.options import help_of
from grouppref.errors import ConfigError
from grouppref.labeling.client import (
    ArgillaClient,
    ClientSettings,
    connect,
    resolve_credentials,
)
from grouppref.labeling.pull import PullConfig, label_status, pull_run
from grouppref.labeling.push import DEFAULT_WORKSPACE, PushConfig, TargetConfig, push_run
from grouppref.runs.store import RunStore

console = Console()
M = TypeVar("M", bound=BaseModel)

RunArg = Annotated[Path, typer.Argument(help="Run directory, e.g. runs/demo.")]
DatasetOpt = Annotated[str | None, typer.Option(help=help_of(TargetConfig, "dataset"))]
WorkspaceOpt = Annotated[str | None, typer.Option(help=help_of(TargetConfig, "workspace") +
                                                  " Default: the embedded server's, else "
                                                  "'grouppref'.")]
FromOpt = Annotated[str | None, typer.Option("--from", help=help_of(TargetConfig,
                                                                      "source_stage"))]
UrlOpt = Annotated[str | None, typer.Option(help="Argilla URL (default: $ARGILLA_API_URL, "
                                            "else the embedded server's).")]
StateOpt = Annotated[Path | None, typer.Option(help="State directory of the embedded server "
                                               "to use (default: $ARGILLA_API_URL/KEY, else "
                                               "the default embedded server).")]
RetriesOpt = Annotated[int, typer.Option(help=help_of(ClientSettings, "retries"))]
TimeoutOpt = Annotated[float, typer.Option(help=help_of(ClientSettings, "timeout"))]


def _config(cls: type[M], **values: object) -> M:
    """Validate settings; a bad value is one ``ConfigError`` line, not a traceback."""
    try:
        return cls(**values)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}"
                             for err in e.errors())
        raise ConfigError(f"invalid label settings: {problems}") from e


def _read_guidelines(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"--guidelines {path}: cannot read it ({e.strerror})") from e


def _client(api_url: str | None, state_dir: Path | None, retries: int, timeout: float
            ) -> tuple[ArgillaClient, str | None]:
    """A connected client and the embedded server's workspace (``None`` for other servers)."""
    creds = resolve_credentials(api_url=api_url, state_dir=state_dir)
    return connect(creds, ClientSettings(retries=retries, timeout=timeout)), creds.workspace


def push(
    run: RunArg,
    dataset: DatasetOpt = None,
    workspace: WorkspaceOpt = None,
    source_stage: FromOpt = None,
    min_submitted: Annotated[int | None, typer.Option(
        help=help_of(PushConfig, "min_submitted"))] = None,
    rationale: Annotated[bool | None, typer.Option(
        "--rationale/--no-rationale", help=help_of(PushConfig, "rationale"),
        show_default=False)] = None,
    markdown: Annotated[bool, typer.Option(help=help_of(PushConfig, "use_markdown"))] = False,
    guidelines: Annotated[Path | None, typer.Option(help="File with the annotation guidelines "
                                                    "(Markdown).")] = None,
    suggest_from: Annotated[str | None, typer.Option(help=help_of(PushConfig,
                                                                  "suggest_from"))] = None,
    batch_size: Annotated[int, typer.Option(help=help_of(PushConfig, "batch_size"))] = 100,
    api_url: UrlOpt = None,
    state_dir: StateOpt = None,
    retries: RetriesOpt = 4,
    timeout: TimeoutOpt = 60.0,
) -> None:
    """Send the run's groups to Argilla for human ranking (one record per group; re-push updates)."""
    text = _read_guidelines(guidelines)
    client, embedded_ws = _client(api_url, state_dir, retries, timeout)
    with client:
        config = _config(PushConfig, dataset=dataset, source_stage=source_stage,
                         workspace=workspace or embedded_ws or DEFAULT_WORKSPACE,
                         min_submitted=min_submitted, rationale=rationale,
                         use_markdown=markdown, guidelines=text, suggest_from=suggest_from,
                         batch_size=batch_size)
        report = push_run(RunStore(run), config, client)
    for r in report.refused:
        console.print(f"[red]refused[/] {r.one_line()}", highlight=False, soft_wrap=True)
    state = "created" if report.created_dataset else "existing"
    console.print(
        f"[green]label push[/]: {report.groups} groups from {report.source_stage} -> "
        f"{state} dataset {report.dataset!r} (workspace {report.workspace!r}, K={report.k}): "
        f"{report.created} new, {report.updated} updated, {len(report.refused)} refused"
        + (f", {report.retried} retries" if report.retried else ""), highlight=False, soft_wrap=True)


def pull(
    run: RunArg,
    dataset: DatasetOpt = None,
    workspace: WorkspaceOpt = None,
    source_stage: FromOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild RUN/label even when nothing "
                                        "changed.")] = False,
    api_url: UrlOpt = None,
    state_dir: StateOpt = None,
    retries: RetriesOpt = 4,
    timeout: TimeoutOpt = 60.0,
) -> None:
    """Read submitted rankings from Argilla into RUN/label (drafts and discards are counted only)."""
    client, embedded_ws = _client(api_url, state_dir, retries, timeout)
    with client:
        config = _config(PullConfig, dataset=dataset, source_stage=source_stage,
                         workspace=workspace or embedded_ws or DEFAULT_WORKSPACE)
        report = pull_run(RunStore(run), config, client, force=force)
    stage = report.stage
    report_stage("label", stage.cached, stage.manifest.counts.model_dump(), stage.dir,
                 [r.one_line() for r in stage.rejects()])
    s = report.stats
    console.print(f"human rankings: {s.get('human_rankings', 0)} in "
                  f"{s.get('groups_with_human_rankings', 0)} groups; this pull: {report.new} new, "
                  f"{report.changed} changed; drafts {s.get('drafts', 0)}, discarded "
                  f"{s.get('discarded', 0)} (not used)", highlight=False, soft_wrap=True)


def status(
    run: RunArg,
    dataset: DatasetOpt = None,
    workspace: WorkspaceOpt = None,
    api_url: UrlOpt = None,
    state_dir: StateOpt = None,
    retries: RetriesOpt = 4,
    timeout: TimeoutOpt = 60.0,
) -> None:
    """Show completed/pending groups and each annotator's submissions."""
    client, embedded_ws = _client(api_url, state_dir, retries, timeout)
    with client:
        config = _config(TargetConfig, dataset=dataset,
                         workspace=workspace or embedded_ws or DEFAULT_WORKSPACE)
        report = label_status(RunStore(run), config, client)
    table = Table(title=f"dataset {report.dataset}")
    for col in ("annotator", "submitted", "draft", "discarded"):
        table.add_column(col, justify="left" if col == "annotator" else "right")
    for user, counts in report.annotators.items():
        table.add_row(user, str(counts["submitted"]), str(counts["draft"]),
                      str(counts["discarded"]))
    console.print(table)
    console.print(f"records: {report.records}, completed {report.completed}, "
                  f"pending {report.pending}", highlight=False, soft_wrap=True)


def register(label_app: typer.Typer) -> None:
    """Add ``push``, ``pull`` and ``status`` to the ``label`` sub-app."""
    label_app.command()(push)
    label_app.command()(pull)
    label_app.command()(status)
