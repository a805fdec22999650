"""``grouppref run CONFIG``: the stages of one run, chained, cached and resumable.

The runner is a loop over the registry of the stages, :data:`grouppref.stages.STAGES`, in its
order: prompts -> generate or import -> rank -> simulate -> label -> aggregate -> validate ->
export (one stage per target) -> train_rm -> sweep -> train -> eval -> report, each called the
same way, ``run(store, section, context)``. A section left out of the config skips its stage.
Each stage's own cache decides whether it re-computes (same settings + same input => *cached*:
its manifest and output stay untouched); ``force`` re-runs named stages.

The ``label`` stage is human work (:mod:`grouppref.labeling.stage`): it pushes the groups to
Argilla and counts the groups with enough submitted rankings. Too few: the run stops with
"waiting for N more submitted ranking(s)" (exit code 0; ``--wait`` polls instead); run it
again later and it pulls the rankings into RUN/label and goes on.

When the config does not name ``aggregate.input_stage``, aggregate reads the last annotating
stage the config has, in the order of aggregate's own default
(:data:`~grouppref.pipeline.aggregate.config.INPUT_STAGES`: label, else simulate, else rank,
else import). With an ``import`` section
(``RUN/import``, groups with their rankings), ``rank`` reads ``import`` unless its
``input_stage`` says otherwise.

The run writes ``RUN/run.json`` as it goes (:class:`~grouppref.runs.freshness.RunRecord`): the
config, its hash, and every stage this run produced, reused or read. Stages already in the
directory that this config does not produce (made by another config) are thereby marked as not
part of this run: ``grouppref inspect`` says so and the report leaves them out.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from rich.console import Console
from rich.markup import escape

from grouppref.config import apply_set, read_config_file, validate
from grouppref.errors import ConfigError
from grouppref.labeling.config import LABEL, LabelRunConfig
from grouppref.pipeline.aggregate.config import INPUT_STAGES, AggregateConfig
from grouppref.pipeline.export.config import ExportConfig
from grouppref.pipeline.generate.config import GenerateConfig
from grouppref.pipeline.imports.config import IMPORT, ImportConfig
from grouppref.pipeline.prompts.config import PromptsConfig
from grouppref.pipeline.rank.config import RankConfig
from grouppref.pipeline.report.config import REPORT, ReportConfig
from grouppref.pipeline.simulate.config import SimulateConfig
from grouppref.pipeline.validate.config import ValidateConfig
from grouppref.runs.freshness import add_stages, finish_run_record, start_run_record
from grouppref.runs.hashing import config_hash
from grouppref.runs.rejects import all_rejected
from grouppref.runs.stage import StageContext, Waiting
from grouppref.runs.store import RunStore, StageRun
from grouppref.stages import NAMES, STAGES, Stage
from grouppref.sweep.config import SweepConfig
from grouppref.train.settings.evaluation import EvalConfig
from grouppref.train.settings.policy import TrainConfig
from grouppref.train.settings.reward_model import RewardModelConfig

__all__ = ["LabelRunConfig", "RunConfig", "RunOutcome", "check_stages", "load_run_config",
           "run_pipeline", "stage_sections", "with_run_defaults"]


class RunConfig(BaseModel):
    """A whole run; each section is the settings of one stage (left out: stage skipped)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    run_dir: str = Field(description="Run directory (created when missing); --run-dir "
                         "overrides it.")
    prompts: PromptsConfig | None = Field(default=None, description="Read prompts into the run.")
    generate: GenerateConfig | None = Field(default=None, description="Sample candidates.")
    import_: ImportConfig | None = Field(default=None, alias="import", description="Import "
                                         "groups (with their rankings, or candidates only) "
                                         "made elsewhere into RUN/import (instead of "
                                         "generate; docs/import.md).")
    rank: RankConfig | None = Field(default=None, description="Automatic rankers.")
    simulate: SimulateConfig | None = Field(default=None, description="Simulated annotators.")
    label: LabelRunConfig | None = Field(default=None, description="Human rankings in Argilla.")
    aggregate: AggregateConfig | None = Field(default_factory=AggregateConfig,
                                              description="Bradley-Terry fit of the rankings "
                                              "(on by default; null skips it).")
    validation: ValidateConfig | None = Field(default_factory=ValidateConfig, alias="validate",
                                              description="Checks and the train/test split "
                                              "(on by default; null skips it).")
    export: list[ExportConfig] = Field(default_factory=list, description="Exports, any number "
                                     "(each a target: to_dir, parquet or hub).")
    train_rm: RewardModelConfig | None = Field(default=None, description="A scalar reward "
                                               "model trained on RUN/validate "
                                               "(docs/reward-model.md).")
    sweep: SweepConfig | None = Field(default=None, description="Group-size and recipe "
                                      "ablation on RUN/validate before training "
                                      "(docs/sweep.md).")
    train: TrainConfig | None = Field(default=None, description="GSPO training.")
    eval: EvalConfig | None = Field(default=None, description="Before/after evaluation.")
    report: ReportConfig | None = Field(default_factory=ReportConfig,
                                        description="The HTML report (on by default; "
                                        "null skips it).")

    @model_validator(mode="after")
    def _one_source(self) -> RunConfig:
        if self.generate is not None and self.import_ is not None:
            raise ValueError("give either 'generate' or 'import', not both")
        sources = [f"{name}.source" for name, section in (("aggregate", self.aggregate),
                                                          ("validate", self.validation))
                   if section is not None and section.source]
        if len(sources) > 1:
            raise ValueError("give either aggregate.source (re-aggregate the rankings of a "
                             "published dataset) or validate.source (use its aggregate as "
                             "it is), not both")
        published = bool(sources)
        if self.generate is None and self.import_ is None and not published:
            raise ValueError("give a 'generate' or an 'import' section, or start from a "
                             "published dataset (validate.source or aggregate.source): a run "
                             "needs candidates")
        return self


@dataclass
class RunOutcome:
    """How a run ended: ``done``, or ``waiting`` for human rankings (with the message).

    ``ran`` lists the stages that computed, ``cached`` those whose output was reused,
    ``skipped`` those the config leaves out.
    """

    status: Literal["done", "waiting"]
    ran: list[str] = field(default_factory=list)
    cached: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    message: str = ""
    report: Path | None = None


# -- config --------------------------------------------------------------------------------
def load_run_config(path: str | Path, sets: list[str] | None = None,
                    run_dir: str | None = None) -> RunConfig:
    """Read and validate a run config; ``sets`` are ``KEY.PATH=VALUE`` overrides.

    Raises:
        InputFileError: the file cannot be read.
        ConfigError: a bad override, an unknown key or a value that is not allowed (every
            problem on its own line, naming the dotted key and what is allowed).
    """
    data = read_config_file(path)
    for assignment in sets or []:
        apply_set(data, assignment)
    if run_dir:
        data["run_dir"] = run_dir
    return validate(RunConfig, data, str(path))


def check_stages(start: str | None = None, until: str | None = None,
                 force: list[str] | None = None) -> list[str]:
    """The stages from ``start`` to ``until``; every name is checked (``force`` may say all).

    Raises:
        ConfigError: an unknown stage name, or ``start`` after ``until``.
    """
    for option, name in [("--from", start), ("--until", until),
                         *(("--force", f) for f in force or [])]:
        if name is not None and name not in NAMES and not (option == "--force" and name == "all"):
            allowed = ", ".join(NAMES) + (", all" if option == "--force" else "")
            raise ConfigError(f"{option} {name!r}: unknown stage; allowed: {allowed}")
    first = NAMES.index(start) if start else 0
    last = NAMES.index(until) if until else len(NAMES) - 1
    if first > last:
        raise ConfigError(f"--from {start} comes after --until {until} in the stage order "
                          f"({', '.join(NAMES)})")
    return list(NAMES[first:last + 1])


# -- the loop ---------------------------------------------------------------------------------
def stage_sections(config: RunConfig, stage: Stage) -> list[BaseModel]:
    """The sections of ``config`` that configure ``stage``: none (skipped), one, or one per
    export target."""
    section = getattr(config, stage.section)
    if isinstance(section, list):
        return list(section)
    return [] if section is None else [section]


def with_run_defaults(config: RunConfig) -> RunConfig:
    """``config`` with what its stages read from each other filled in (module docstring): rank
    reads the imported groups; aggregate the last annotating stage the config has (none when
    validate reads a published dataset: nothing to aggregate); sweep's trials start from the
    train section. A setting the config gives itself is kept."""
    update: dict[str, Any] = {}
    rank, agg, sweep = config.rank, config.aggregate, config.sweep
    if rank is not None and config.import_ is not None and "input_stage" not in rank.model_fields_set:
        update["rank"] = rank.model_copy(update={"input_stage": IMPORT.name})
    if agg is not None and agg.source is None:
        if config.validation is not None and config.validation.source is not None:
            update["aggregate"] = None
        elif agg.input_stage is None:
            configured = {stage.name for stage in STAGES if stage_sections(config, stage)}
            last = next((name for name in INPUT_STAGES if name in configured), None)
            if last is not None:
                update["aggregate"] = agg.model_copy(update={"input_stage": last})
    if sweep is not None and config.train is not None and "train" not in sweep.model_fields_set:
        update["sweep"] = sweep.model_copy(update={"train": config.train})
    return config.model_copy(update=update)


def describe(stage: StageRun[Any]) -> str:
    """One line for a finished stage: counts, non-record outputs, where it is."""
    c = stage.counts
    partial = f", {c.partial} partly rejected" if c.partial else ""
    line = f"{c.inputs} in, {c.outputs} out, {c.rejected} rejected{partial}"
    if stage.name == LABEL.name:
        from grouppref.labeling.stage import label_summary

        line += f"; {label_summary(stage)}"
    for name, where in stage.outputs.items():
        line += f"; {name} -> {where}"
    return f"{line} ({stage.dir})"


def run_pipeline(config: RunConfig, *, start: str | None = None, until: str | None = None,
                 force: list[str] | None = None, wait: bool = False,
                 console: Console | None = None, allow_stale: bool = False,
                 source: str = "") -> RunOutcome:
    """Run the configured stages from ``start`` to ``until`` in order (see the module docstring).

    Args:
        config (RunConfig): the validated run config.
        start (str | None): first stage to run (default: the first).
        until (str | None): last stage to run (default: the last).
        force (list[str] | None): stages to re-run even when cached ("all": every stage).
        wait (bool): poll Argilla until enough human rankings are in instead of stopping.
        console (Console | None): where progress lines go (default: stderr).
        allow_stale (bool): let export, train, eval and report use stale input (they say so).
        source (str): the config file, recorded in ``RUN/run.json``.

    Returns:
        RunOutcome: ``done``, or ``waiting`` with the message of the label stage.

    Raises:
        ConfigError: an unknown stage name in ``start``/``until``/``force``.
        GroupPrefError: whatever a stage raises (bad input, missing model, ...).
        StageError: a stage rejected every input row (the most common reason named).
    """
    console = console or Console(stderr=True)
    selected = check_stages(start, until, force)
    forced = set(NAMES) if "all" in (force or []) else set(force or [])
    store = RunStore(config.run_dir)
    store.root.mkdir(parents=True, exist_ok=True)
    outcome = RunOutcome(status="done")
    record = start_run_record(store, source, config_hash(config, "run"))
    context = StageContext(allow_stale=allow_stale, wait=wait, console=console)
    resolved = with_run_defaults(config)
    for stage in STAGES:
        if stage.name not in selected:
            continue
        for section in stage_sections(resolved, stage):
            try:
                done_stage = stage.load()(store, section,
                                          replace(context, force=stage.name in forced))
            except Waiting as waiting:
                outcome.status, outcome.message = "waiting", str(waiting)
                finish_run_record(store, record, "waiting")
                return outcome
            record = add_stages(store, record, [done_stage.name])
            done = outcome.cached if done_stage.cached else outcome.ran
            if stage.name not in done:
                done.append(stage.name)
            if stage.spec is REPORT:
                outcome.report = Path(done_stage.outputs["html"])
            state = "[yellow]cached[/]" if done_stage.cached else "[green]done[/]"
            console.print(f"{stage.name:>9}: {state} {escape(describe(done_stage))}",
                          highlight=False, soft_wrap=True)
            if (problem := all_rejected(done_stage)) is not None:  # nothing for the next stage
                raise problem
    outcome.skipped = [s for s in selected if s not in outcome.ran + outcome.cached]
    finish_run_record(store, record, "done")
    return outcome
