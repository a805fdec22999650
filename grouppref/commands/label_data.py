"""``grouppref label push / pull / status``: thin commands over :mod:`grouppref.labeling`.

The server comes from ``--api-url`` or ``ARGILLA_API_URL``, the key from ``ARGILLA_API_KEY``
or a credentials file (the embedded server's by default); the key is never an option, so it
never shows in ``ps`` or shell history.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, TypedDict, TypeVar

import typer
from pydantic import BaseModel
from rich.table import Table

from grouppref.commands.options import Custom, Extra, config_command, help_of
from grouppref.commands.output import err, esc, out, print_stage
from grouppref.errors import ConfigError
from grouppref.labeling.client import (
    ArgillaClient,
    ClientSettings,
    connect,
    resolve_credentials,
)
from grouppref.labeling.config import PullConfig, PushConfig, TargetConfig
from grouppref.labeling.pull import label_status, pull_run
from grouppref.labeling.push import plan_selection, push_run
from grouppref.pipeline.report.selection import audit_note, selection_path
from grouppref.runs.store import RunStore

M = TypeVar("M", bound=BaseModel)
ClientOpts = [
    Extra("run", Annotated[Path, typer.Argument(help="Run directory, e.g. runs/demo.", metavar="RUN",
                                                show_default=False)]),
    Extra("api_url", Annotated[str | None, typer.Option(
        help="Argilla URL, its key from $ARGILLA_API_KEY (default: $ARGILLA_API_URL, else the "
        "embedded server's). Not together with --state-dir.", show_default=False)], None),
    Extra("state_dir", Annotated[Path | None, typer.Option(
        help="Use the embedded server started on this state directory (its URL and owner "
        "key; overrides $ARGILLA_API_URL/KEY). Not together with --api-url.",
        show_default=False)], None),
    Extra("retries", Annotated[int, typer.Option(help=help_of(ClientSettings, "retries"))], 4),
    Extra("timeout", Annotated[float, typer.Option(help=help_of(ClientSettings, "timeout"))],
          60.0),
]
RENAME = {"source_stage": "--from"}


class ClientExtras(TypedDict):  # ClientOpts
    run: Path
    api_url: str | None
    state_dir: Path | None
    retries: int
    timeout: float


def _read_guidelines(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"--guidelines {path}: cannot read it ({e.strerror})") from e


def _client(extras: ClientExtras) -> tuple[ArgillaClient, str | None]:
    """A connected client and the embedded server's workspace (``None`` for other servers)."""
    creds = resolve_credentials(api_url=extras["api_url"], state_dir=extras["state_dir"])
    settings = ClientSettings(retries=extras["retries"], timeout=extras["timeout"])
    return connect(creds, settings), creds.workspace


def _with_workspace(config: M, embedded: str | None) -> M:
    """The embedded server's workspace, unless one was given."""
    if "workspace" in config.model_fields_set or embedded is None:
        return config
    return config.model_copy(update={"workspace": embedded})


def _push(config: PushConfig, extras: ClientExtras, force: bool) -> None:
    store = RunStore(extras["run"])
    selection = plan_selection(store, config)  # bad input fails before any connection
    client, embedded_ws = _client(extras)
    with client:
        report = push_run(store, _with_workspace(config, embedded_ws), client,
                          selection=selection)
    for r in report.refused:
        err.print(f"[red]refused[/] {esc(r.one_line())}")
    for d in report.datasets:
        state = "created" if d.created_dataset else "existing"
        out.print(f"  {state} dataset {esc(repr(d.name))} (K={d.k}): {d.groups} groups, {d.created} new, "
                  f"{d.updated} updated, {len(d.refused)} refused", highlight=False)
    out.print(f"[green]label push[/]: {report.groups} groups from {report.source_stage} -> "
              f"{len(report.datasets)} dataset(s) in workspace {report.workspace!r}: "
              f"{report.created} new, {report.updated} updated, {len(report.refused)} refused"
              + (f", {report.retried} retries" if report.retried else ""))
    if selection.select != "all":
        how = (f"the most uncertain by {selection.uncertainty} (sent: >= "
               f"{selection.threshold:.3g}, the rest: mean {selection.rest_mean:.3g})"
               if selection.select == "uncertain" and selection.rest_mean is not None
               and selection.threshold is not None
               else f"{selection.select} (seed {selection.seed})")
        audit = sum(g.role == "audit" for g in selection.selected)
        if audit:
            how += (f", {audit} of them audit group{'s' if audit != 1 else ''} drawn at "
                    "random (--audit-share "
                    f"{selection.audit_share:g}, seed {selection.seed})")
        out.print(f"  selected {len(selection.selected)} of {selection.groups} groups: "
                  f"{esc(how)}; list in {selection_path(store)}",
                  highlight=False)
        note = audit_note(selection)
        if note:
            err.print(f"note: {esc(note)}", highlight=False)


push = config_command(
    PushConfig, _push, name="push", section="push", extras=ClientOpts, rename=RENAME, force_help=None,
    doc="Send the run's groups to Argilla for human ranking: one dataset per group size "
    "(<dataset>-k<K>), one record per group; a re-push updates. --select uncertain --budget N "
    "sends only the N groups whose automatic rankings are least certain.",
    custom={"guidelines": Custom("--guidelines", "File with the annotation guidelines "
                                 "(Markdown).", _read_guidelines, metavar="FILE")})


def _pull(config: PullConfig, extras: ClientExtras, force: bool) -> None:
    client, embedded_ws = _client(extras)
    with client:
        report = pull_run(RunStore(extras["run"]), _with_workspace(config, embedded_ws), client,
                          force=force)
    print_stage(report.stage, name="label")
    s = report.stats
    rejected = s.get("rejected_responses", 0)
    out.print(f"human rankings: {s.get('human_rankings', 0)} in "
              f"{s.get('groups_with_human_rankings', 0)} groups; this pull kept {report.new} "
              f"new, {report.changed} changed"
              + (f", rejected {rejected} (reasons in {report.stage.dir / 'rejects.jsonl'})"
                 if rejected else "")
              + f"; drafts {s.get('drafts', 0)}, discarded {s.get('discarded', 0)} (not used)")


pull = config_command(
    PullConfig, _pull, name="pull", section="pull", extras=ClientOpts, rename=RENAME,
    doc="Read submitted rankings from Argilla into RUN/label (drafts and discards are counted "
    "only).", force_help="Rebuild RUN/label even when nothing changed.")


def _status(config: TargetConfig, extras: ClientExtras, force: bool) -> None:
    client, embedded_ws = _client(extras)
    with client:
        report = label_status(RunStore(extras["run"]), _with_workspace(config, embedded_ws),
                              client)
    table = Table(title=f"datasets {report.dataset}-k*")
    for col in ("annotator", "submitted", "draft", "discarded"):
        table.add_column(col, justify="left" if col == "annotator" else "right", overflow="fold")
    for user, counts in report.annotators.items():
        table.add_row(esc(user), str(counts["submitted"]), str(counts["draft"]),
                      str(counts["discarded"]))
    out.print(table)
    out.print(f"records: {report.records}, completed {report.completed}, "
              f"pending {report.pending}")


status = config_command(
    TargetConfig, _status, name="status", extras=ClientOpts, rename=RENAME, force_help=None,
    doc="Show completed/pending groups and each annotator's submissions.")


def register(label_app: typer.Typer) -> None:
    """Add ``push``, ``pull`` and ``status`` to the ``label`` sub-app."""
    label_app.command()(push)
    label_app.command()(pull)
    label_app.command()(status)
