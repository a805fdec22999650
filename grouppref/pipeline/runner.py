"""``grouppref run CONFIG``: the stages of one run, chained, cached and resumable.

Order: prompts -> generate (or import) -> rank -> simulate -> label -> aggregate -> validate
-> export -> train -> eval -> report. A section left out of the config skips its stage.
Each stage's own cache decides whether it re-computes (same settings + same input => skipped).

The ``label`` stage is human work: it pushes the groups to Argilla, then checks how many have
enough submitted rankings. Too few: it prints "waiting for N submissions", saves nothing new
and the run stops with exit code 0 (``--wait`` polls instead). Once enough are in, it pulls
them into RUN/label and the run goes on.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from rich.console import Console

from grouppref.errors import ConfigError
from grouppref.labeling.client import ClientSettings, connect, resolve_credentials
from grouppref.labeling.pull import DatasetState, PullConfig, fetch_state, pull_run
from grouppref.labeling.push import PushConfig, push_run
from grouppref.pipeline.aggregate import AggregateConfig, run_aggregate
from grouppref.pipeline.export import ExportConfig, run_export
from grouppref.pipeline.generate import GenerateConfig, run_generate
from grouppref.pipeline.import_groups import ImportConfig, run_import
from grouppref.pipeline.prompts import PromptsConfig, run_prompts
from grouppref.pipeline.rank import RankConfig, run_rank
from grouppref.pipeline.report import ReportConfig, run_report
from grouppref.pipeline.simulate import SimulateConfig, run_simulate
from grouppref.pipeline.store import RunStore, StageRun
from grouppref.pipeline.validate import ValidateConfig, run_validate
from grouppref.train.config import EvalConfig, TrainConfig
from grouppref.train.eval import run_eval
from grouppref.train.stage import TrainOutcome, run_train

STAGES = ("prompts", "generate", "rank", "simulate", "label", "aggregate", "validate", "export",
          "train", "eval", "report")
StageName = Literal["prompts", "generate", "rank", "simulate", "label", "aggregate", "validate",
                    "export", "train", "eval", "report"]


class LabelRunConfig(BaseModel):
    """Human labeling inside a run: push, wait for enough rankings, pull."""

    model_config = ConfigDict(extra="forbid")

    push: PushConfig = Field(default_factory=PushConfig, description="Settings of the push.")
    pull: PullConfig = Field(default_factory=PullConfig, description="Settings of the pull.")
    min_rankings: int = Field(default=1, ge=1, description="Submitted human rankings a group "
                              "needs before the run goes on.")
    min_groups: float = Field(default=1.0, gt=0.0, le=1.0, description="Share of the groups "
                              "that must have min_rankings before the run goes on.")
    api_url: str | None = Field(default=None, description="Argilla URL (default: "
                                "$ARGILLA_API_URL, else the embedded server's).")
    state_dir: str | None = Field(default=None, description="State dir of the embedded server "
                                  "to use (default: its default).")
    poll_seconds: float = Field(default=30.0, gt=0, description="With --wait: seconds between "
                                "progress checks.")


class RunConfig(BaseModel):
    """A whole run; each section is the settings of one stage (left out: stage skipped)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    run_dir: str = Field(description="Run directory (created when missing).")
    prompts: PromptsConfig | None = Field(default=None, description="Read prompts into the run.")
    generate: GenerateConfig | None = Field(default=None, description="Sample candidates.")
    import_: ImportConfig | None = Field(default=None, alias="import", description="Import "
                                         "candidates made elsewhere (instead of generate).")
    rank: RankConfig | None = Field(default=None, description="Automatic rankers.")
    simulate: SimulateConfig | None = Field(default=None, description="Simulated annotators.")
    label: LabelRunConfig | None = Field(default=None, description="Human rankings in Argilla.")
    aggregate: AggregateConfig | None = Field(default_factory=AggregateConfig,
                                              description="Bradley-Terry / Plackett-Luce fit.")
    validation: ValidateConfig | None = Field(default_factory=ValidateConfig, alias="validate",
                                              description="Checks and the train/test split.")
    export: list[ExportConfig] = Field(default_factory=list, description="Exports (any number).")
    train: TrainConfig | None = Field(default=None, description="GSPO training.")
    eval: EvalConfig | None = Field(default=None, description="Before/after evaluation.")
    report: ReportConfig | None = Field(default_factory=ReportConfig,
                                        description="The HTML report.")

    @model_validator(mode="after")
    def _one_source(self) -> RunConfig:
        if self.generate is not None and self.import_ is not None:
            raise ValueError("give either 'generate' or 'import', not both")
        if self.generate is None and self.import_ is None:
            raise ValueError("give a 'generate' or an 'import' section: a run needs candidates")
        return self


@dataclass
class RunOutcome:
    """How a run ended: ``done``, or ``waiting`` for human rankings (with the message)."""

    status: Literal["done", "waiting"]
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    message: str = ""
    report: Path | None = None


class WaitingForLabels(Exception):  # noqa: N818 - a state, not an error
    """Raised inside the label stage when too few rankings are in; the run stops cleanly."""


def _selected(start: str | None, until: str | None) -> list[str]:
    for name in (start, until):
        if name is not None and name not in STAGES:
            raise ConfigError(f"unknown stage {name!r}; stages are: {', '.join(STAGES)}")
    first = STAGES.index(start) if start else 0
    last = STAGES.index(until) if until else len(STAGES) - 1
    if first > last:
        raise ConfigError(f"--from {start} comes after --until {until}")
    return list(STAGES[first:last + 1])


def _say_stage(console: Console, stage: StageRun[Any]) -> None:
    c = stage.manifest.counts
    state = "[yellow]cached[/]" if stage.cached else "[green]done[/]"
    console.print(f"{stage.manifest.stage:>9}: {state} {c.inputs} in, {c.outputs} out, "
                  f"{c.rejected} rejected ({stage.dir})", highlight=False)


def _label(store: RunStore, config: LabelRunConfig, force: bool, wait: bool,
           console: Console) -> StageRun[Any]:
    creds = resolve_credentials(api_url=config.api_url,
                                state_dir=Path(config.state_dir) if config.state_dir else None)
    workspace = creds.workspace or config.push.workspace
    push_cfg = config.push.model_copy(update={"workspace": workspace})
    pull_cfg = config.pull.model_copy(update={"workspace": workspace,
                                              "dataset": config.pull.dataset or push_cfg.dataset})
    with connect(creds, ClientSettings()) as client:
        pushed = push_run(store, push_cfg, client, progress=False)
        console.print(f"{'label':>9}: pushed {pushed.groups} groups to {creds.api_url} "
                      f"(dataset {pushed.dataset!r}, {pushed.created} new)", highlight=False)
        name = pull_cfg.dataset_name(store)
        while True:
            state = fetch_state(client, name, workspace)
            have = _groups_with(state, config.min_rankings)
            need = max(1, round(config.min_groups * len(state.records)))
            if have >= need:
                break
            message = (f"waiting for {need - have} more group(s) with {config.min_rankings} "
                       f"submitted ranking(s) each ({have}/{len(state.records)} ready); rank "
                       f"them at {creds.api_url}, then run again")
            if not wait:
                raise WaitingForLabels(message)
            console.print(f"{'label':>9}: {message}", highlight=False)
            time.sleep(config.poll_seconds)
        return pull_run(store, pull_cfg, client, force=force, progress=False).stage


def _groups_with(state: DatasetState, min_rankings: int) -> int:
    """Records with at least ``min_rankings`` submitted responses."""
    submitted = Counter(r.group_id for r in state.responses if r.status == "submitted")
    return sum(n >= min_rankings for n in submitted.values())


def _stage_calls(config: RunConfig, store: RunStore, force: set[str], wait: bool,
                 console: Console) -> dict[str, Callable[[], Any]]:
    def export_all() -> bool:
        for exp in config.export:
            result = run_export(store, exp)
            console.print(f"{'export':>9}: {sum(result.rows.values())} rows ({exp.format}) -> "
                          f"{result.location}", highlight=False)
        return True

    calls: dict[str, Callable[[], Any]] = {
        "prompts": lambda: config.prompts and run_prompts(store, config.prompts, "prompts" in force),
        "generate": lambda: (run_generate(store, config.generate, force="generate" in force)
                             if config.generate else
                             run_import(store, config.import_, force="generate" in force)
                             if config.import_ else None),
        "rank": lambda: config.rank and run_rank(store, config.rank, "rank" in force),
        "simulate": lambda: config.simulate and run_simulate(store, config.simulate,
                                                             "simulate" in force),
        "label": lambda: config.label and _label(store, config.label, "label" in force, wait,
                                                 console),
        "aggregate": lambda: config.aggregate and run_aggregate(store, config.aggregate,
                                                                "aggregate" in force),
        "validate": lambda: config.validation and run_validate(store, config.validation,
                                                               "validate" in force),
        "export": lambda: config.export and export_all(),
        "train": lambda: config.train and run_train(store.root, config.train,
                                                    force="train" in force),
        "eval": lambda: config.eval and run_eval(store, config.eval, "eval" in force),
        "report": lambda: config.report and run_report(store, config.report),
    }
    return calls


def run_pipeline(config: RunConfig, *, start: str | None = None, until: str | None = None,
                 force: list[str] | None = None, wait: bool = False,
                 console: Console | None = None) -> RunOutcome:
    """Run the configured stages in order (see the module docstring).

    Raises:
        ConfigError: an unknown stage name in ``start``/``until``/``force``.
    """
    console = console or Console()
    forced = set(force or [])
    if "all" in forced:
        forced = set(STAGES)
    for name in forced:
        _selected(name, name)
    store = RunStore(config.run_dir)
    store.root.mkdir(parents=True, exist_ok=True)
    calls = _stage_calls(config, store, forced, wait, console)
    outcome = RunOutcome(status="done")
    for name in _selected(start, until):
        try:
            result = calls[name]()
        except WaitingForLabels as waiting:
            outcome.status, outcome.message = "waiting", str(waiting)
            return outcome
        if not result:
            outcome.skipped.append(name)
            continue
        outcome.ran.append(name)
        if isinstance(result, StageRun):
            _say_stage(console, result)
        elif isinstance(result, TrainOutcome):
            state = "[yellow]cached[/]" if result.cached else "[green]done[/]"
            console.print(f"{'train':>9}: {state} model -> {result.out_dir}", highlight=False)
        elif isinstance(result, Path):
            outcome.report = result
            console.print(f"{'report':>9}: {result}", highlight=False)
    return outcome
