"""``grouppref run CONFIG``: the stages of one run, chained, cached and resumable.

Order: prompts -> generate (or import) -> rank -> simulate -> label -> aggregate -> validate
-> export -> train -> eval -> report. A section left out of the config skips its stage.
Each stage's own cache decides whether it re-computes (same settings + same input => the
stage is *cached*: its manifest and output stay untouched); ``force`` re-runs named stages.
Exports are cached by the runner (``RUN/export/run-exports.json``: settings, the validate
output they were made from, and where they went); the report is re-rendered every time.

The ``label`` stage is human work (:mod:`grouppref.labeling.stage`): it pushes the groups
to Argilla and counts the groups with enough submitted rankings. Too few: the run stops with
"waiting for N more submitted ranking(s)" (exit code 0; ``--wait`` polls instead); run it
again later and it pulls the rankings into RUN/label and goes on.

When the config does not name ``aggregate.input_stage``, aggregate reads the last annotating
stage the config has: label, else simulate, else rank.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from rich.console import Console

from grouppref.config import format_validation_error, read_config_file
from grouppref.errors import ConfigError
from grouppref.labeling.stage import LabelRunConfig, WaitingForLabels, label_summary, run_label
from grouppref.pipeline.aggregate.stage import AggregateConfig, run_aggregate
from grouppref.pipeline.export.stage import ExportConfig, run_export
from grouppref.pipeline.generate.stage import GenerateConfig, run_generate
from grouppref.pipeline.imports.stage import ImportConfig, run_import
from grouppref.pipeline.prompts.stage import PromptsConfig, run_prompts
from grouppref.pipeline.rank.stage import RankConfig, run_rank
from grouppref.pipeline.report.stage import ReportConfig, run_report
from grouppref.pipeline.simulate.stage import SimulateConfig, run_simulate
from grouppref.pipeline.validate.stage import ValidateConfig, run_validate
from grouppref.runs.store import RunStore, StageRun, config_hash
from grouppref.train.config import EvalConfig, TrainConfig
from grouppref.train.eval import run_eval
from grouppref.train.stage import run_train

STAGES = ("prompts", "generate", "rank", "simulate", "label", "aggregate", "validate", "export",
          "train", "eval", "report")
EXPORT_STATE = "run-exports.json"

__all__ = ["STAGES", "LabelRunConfig", "RunConfig", "RunOutcome", "WaitingForLabels",
           "check_stages", "load_run_config", "run_pipeline"]


class RunConfig(BaseModel):
    """A whole run; each section is the settings of one stage (left out: stage skipped)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    run_dir: str = Field(description="Run directory (created when missing); --run-dir "
                         "overrides it.")
    prompts: PromptsConfig | None = Field(default=None, description="Read prompts into the run.")
    generate: GenerateConfig | None = Field(default=None, description="Sample candidates.")
    import_: ImportConfig | None = Field(default=None, alias="import", description="Import "
                                         "candidates made elsewhere (instead of generate).")
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
    train: TrainConfig | None = Field(default=None, description="GSPO training.")
    eval: EvalConfig | None = Field(default=None, description="Before/after evaluation.")
    report: ReportConfig | None = Field(default_factory=ReportConfig,
                                        description="The HTML report (on by default; "
                                        "null skips it).")

    @model_validator(mode="after")
    def _one_source(self) -> RunConfig:
        if self.generate is not None and self.import_ is not None:
            raise ValueError("give either 'generate' or 'import', not both")
        if self.generate is None and self.import_ is None:
            raise ValueError("give a 'generate' or an 'import' section: a run needs candidates")
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


@dataclass
class _Done:
    """One stage's result as the runner reports it."""

    cached: bool
    line: str
    report: Path | None = None


# -- config --------------------------------------------------------------------------------
def _set_path(data: dict[str, Any], assignment: str) -> None:
    """Apply ``a.b.0.c=VALUE`` (VALUE parsed as YAML) to ``data`` in place."""
    key, eq, raw = assignment.partition("=")
    parts = [p for p in key.strip().split(".") if p]
    if not eq or not parts:
        raise ConfigError(f"--set {assignment!r}: expected KEY=VALUE, e.g. "
                          "--set rank.rankers.0.model=path/to/model")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {assignment!r}: cannot parse the value as YAML") from e
    node: Any = data
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"--set {assignment!r}: {'.'.join(parts[:i]) or 'the top'} is "
                                  f"a list of {len(node)}; {part!r} is not an index in it")
            index: int | str = int(part)
        elif isinstance(node, dict):
            index = part
            if not last and not isinstance(node.get(part), dict | list):
                node[part] = {}
        else:
            raise ConfigError(f"--set {assignment!r}: {'.'.join(parts[:i])} is a value, not a "
                              "section")
        if last:
            node[index] = value
        else:
            node = node[index]


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
        _set_path(data, assignment)
    if run_dir:
        data["run_dir"] = run_dir
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, str(path), data)) from e


def check_stages(start: str | None = None, until: str | None = None,
                 force: list[str] | None = None) -> list[str]:
    """The stages from ``start`` to ``until``; every name is checked (``force`` may say all).

    Raises:
        ConfigError: an unknown stage name, or ``start`` after ``until``.
    """
    for option, name in [("--from", start), ("--until", until),
                         *(("--force", f) for f in force or [])]:
        if name is not None and name not in STAGES and not (option == "--force" and name == "all"):
            allowed = ", ".join(STAGES) + (", all" if option == "--force" else "")
            raise ConfigError(f"{option} {name!r}: unknown stage; allowed: {allowed}")
    first = STAGES.index(start) if start else 0
    last = STAGES.index(until) if until else len(STAGES) - 1
    if first > last:
        raise ConfigError(f"--from {start} comes after --until {until} in the stage order "
                          f"({', '.join(STAGES)})")
    return list(STAGES[first:last + 1])


# -- stages --------------------------------------------------------------------------------
def _stage_done(stage: StageRun[Any], extra: str = "") -> _Done:
    c = stage.manifest.counts
    partial = f", {c.partial} partly rejected" if c.partial else ""
    return _Done(stage.cached, f"{c.inputs} in, {c.outputs} out, {c.rejected} rejected{partial}"
                 f"{extra} ({stage.dir})")


def _aggregate_config(config: RunConfig) -> AggregateConfig | None:
    agg = config.aggregate
    if agg is None or agg.input_stage is not None:
        return agg
    last = "label" if config.label else "simulate" if config.simulate else (
        "rank" if config.rank else None)
    return agg.model_copy(update={"input_stage": last}) if last else agg


def _export_all(store: RunStore, exports: list[ExportConfig], force: bool) -> _Done:
    """Every export, each skipped when it was made from the same validate output."""
    path = store.stage_dir("export") / EXPORT_STATE
    done: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    validated = store.require("validate").output_fingerprint
    lines, all_cached = [], True
    for exp in exports:
        key = config_hash(exp, "run-export-1")
        last = done.get(key)
        local = exp.hub is None or exp.dry_run
        if (not force and last and last["input"] == validated
                and (not local or Path(last["location"]).exists())):
            lines.append(str(last["location"]))
            continue
        all_cached = False
        result = run_export(store, exp)
        done[key] = {"input": validated, "location": result.location, "rows": result.rows}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(done, indent=1) + "\n")
        lines.append(f"{sum(result.rows.values())} rows ({exp.format}) -> {result.location}")
    return _Done(all_cached, "; ".join(lines))


def _stage_calls(config: RunConfig, store: RunStore, forced: set[str], wait: bool,
                 console: Console) -> dict[str, Callable[[], _Done | None]]:
    """Per stage: a call that runs it (or reuses it) and says what it did; None: not configured."""
    def when(section: Any, call: Callable[[], _Done]) -> Callable[[], _Done | None]:
        return lambda: call() if section else None

    def generate() -> _Done:
        if config.generate:
            return _stage_done(run_generate(store, config.generate, force="generate" in forced))
        assert config.import_ is not None  # the config validator guarantees one source
        return _stage_done(run_import(store, config.import_, force="generate" in forced))

    def label() -> _Done:
        assert config.label is not None
        stage = run_label(store, config.label, force="label" in forced, wait=wait,
                          console=console)
        return _stage_done(stage, f"; {label_summary(stage)}")

    def train() -> _Done:
        assert config.train is not None
        out = run_train(store.root, config.train, force="train" in forced)
        return _Done(out.cached, f"{out.counts.get('outputs')} groups used (training and "
                     f"held out); model -> {out.out_dir}")

    def report() -> _Done:
        path = run_report(store, config.report)
        return _Done(False, str(path), report=path)

    aggregate = _aggregate_config(config)
    return {
        "prompts": when(config.prompts, lambda: _stage_done(
            run_prompts(store, config.prompts, "prompts" in forced))),
        "generate": generate,
        "rank": when(config.rank, lambda: _stage_done(
            run_rank(store, config.rank, "rank" in forced))),
        "simulate": when(config.simulate, lambda: _stage_done(
            run_simulate(store, config.simulate, "simulate" in forced))),
        "label": when(config.label, label),
        "aggregate": when(aggregate, lambda: _stage_done(
            run_aggregate(store, aggregate, "aggregate" in forced))),
        "validate": when(config.validation, lambda: _stage_done(
            run_validate(store, config.validation, "validate" in forced))),
        "export": when(config.export, lambda: _export_all(store, config.export,
                                                          "export" in forced)),
        "train": when(config.train, train),
        "eval": when(config.eval, lambda: _stage_done(
            run_eval(store, config.eval, "eval" in forced))),
        "report": when(config.report, report),
    }


def run_pipeline(config: RunConfig, *, start: str | None = None, until: str | None = None,
                 force: list[str] | None = None, wait: bool = False,
                 console: Console | None = None) -> RunOutcome:
    """Run the configured stages from ``start`` to ``until`` in order (see the module docstring).

    Args:
        config (RunConfig): the validated run config.
        start (str | None): first stage to run (default: the first).
        until (str | None): last stage to run (default: the last).
        force (list[str] | None): stages to re-run even when cached ("all": every stage).
        wait (bool): poll Argilla until enough human rankings are in instead of stopping.
        console (Console | None): where progress lines go.

    Returns:
        RunOutcome: ``done``, or ``waiting`` with the message of the label stage.

    Raises:
        ConfigError: an unknown stage name in ``start``/``until``/``force``.
        GroupPrefError: whatever a stage raises (bad input, missing model, ...).
    """
    console = console or Console()
    selected = check_stages(start, until, force)
    forced = set(STAGES) if "all" in (force or []) else set(force or [])
    store = RunStore(config.run_dir)
    store.root.mkdir(parents=True, exist_ok=True)
    calls = _stage_calls(config, store, forced, wait, console)
    outcome = RunOutcome(status="done")
    for name in selected:
        try:
            done = calls[name]()
        except WaitingForLabels as waiting:
            outcome.status, outcome.message = "waiting", str(waiting)
            return outcome
        if done is None:
            outcome.skipped.append(name)
            continue
        (outcome.cached if done.cached else outcome.ran).append(name)
        outcome.report = done.report or outcome.report
        state = "[yellow]cached[/]" if done.cached else "[green]done[/]"
        console.print(f"{name:>9}: {state} {done.line}", highlight=False, soft_wrap=True)
    return outcome
