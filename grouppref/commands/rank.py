"""``grouppref rank``: automatic rankers (reward model, rules, reference similarity, LLM judge)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
import yaml
from rich.console import Console

from grouppref.commands.core import ForceOpt, RunArg, report_stage
from grouppref.commands.options import help_of
from grouppref.errors import ConfigError
from grouppref.pipeline.rank.settings import (
    JudgeRankerSettings,
    parse_ranker_spec,
    parse_weights,
)
from grouppref.pipeline.rank.stage import RankConfig, load_rank_config, run_rank
from grouppref.runs.store import RunStore

console = Console()

RANKER_HELP = ("Ranker SPEC, repeatable: reward:PATH_OR_ID | rule:CHECK[;CHECK...] with CHECK = "
               "[WEIGHT*]length=N (chars; Nw: words) | regex=PATTERN | keywords=a,b | verify; verify | "
               "similarity[:MODEL] | judge[:MODEL].")
ENSEMBLE_HELP = ("Weighted ensemble as an extra ranking: KEY=WEIGHT,... with keys the ranker "
                 "kinds (reward, rule, verify, similarity, judge; judge-2 for a second judge).")


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the rank config ({e.strerror})") from e
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'} "
                          f"({e})") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of rank settings")
    return data.get("rank", data) if isinstance(data.get("rank"), dict) else data


def build_config(ranker: list[str], ensemble: str | None, config: Path | None,
                 overrides: dict[str, Any], judge_mode: str | None,
                 batch_size: int | None) -> RankConfig:
    """The ``RankConfig`` from ``--config`` or ``--ranker`` specs plus CLI overrides."""
    if config is not None and ranker:
        raise ConfigError("give the rankers either with --config or with --ranker, not both")
    if config is None and not ranker:
        raise ConfigError("no ranker: add --ranker SPEC (e.g. --ranker verify) or --config FILE")
    data = _read_file(config) if config else {"rankers": []}
    for spec in ranker:
        data["rankers"].append(parse_ranker_spec(spec).model_dump(mode="json"))
    for settings in data.get("rankers") or []:
        if isinstance(settings, dict) and judge_mode and settings.get("kind") == "judge":
            settings["mode"] = judge_mode
        if isinstance(settings, dict) and batch_size and settings.get("kind") != "rule":
            settings["batch_size"] = batch_size
    if ensemble:
        data["ensemble"] = {"weights": parse_weights(ensemble)}
    data.update({k: v for k, v in overrides.items() if v is not None})
    return load_rank_config(data, str(config) if config else "--ranker")


def rank(
    run: RunArg,
    ranker: Annotated[list[str] | None, typer.Option("--ranker", help=RANKER_HELP)] = None,
    ensemble: Annotated[str | None, typer.Option("--ensemble", help=ENSEMBLE_HELP)] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", help="YAML/JSON file of rank settings (rankers, ensemble, ...).")] = None,
    judge_mode: Annotated[Literal["pointwise", "pairwise"] | None, typer.Option(
        "--judge-mode", help=help_of(JudgeRankerSettings, "mode"))] = None,
    batch_size: Annotated[int | None, typer.Option(
        "--batch-size", help="Sequences per forward pass of every model ranker.")] = None,
    tie_tolerance: Annotated[float | None, typer.Option(
        "--tie-tolerance", help=help_of(RankConfig, "tie_tolerance"))] = None,
    input_stage: Annotated[str | None, typer.Option(
        "--input-stage", help=help_of(RankConfig, "input_stage"))] = None,
    shard_size: Annotated[int | None, typer.Option(
        "--shard-size", help=help_of(RankConfig, "shard_size"))] = None,
    device: Annotated[str | None, typer.Option("--device", help=help_of(RankConfig, "device"))
                      ] = None,
    dtype: Annotated[Literal["float32", "bfloat16", "float16"] | None, typer.Option(
        "--dtype", help=help_of(RankConfig, "dtype"))] = None,
    force: ForceOpt = False,
) -> None:
    """Rank every group of RUN/generate with automatic rankers into RUN/rank."""
    overrides = {"tie_tolerance": tie_tolerance, "input_stage": input_stage,
                 "shard_size": shard_size, "device": device, "dtype": dtype}
    cfg = build_config(ranker or [], ensemble, config, overrides, judge_mode, batch_size)
    stage = run_rank(RunStore(run), cfg, force=force)
    report_stage(stage.manifest.stage, stage.cached, stage.manifest.counts.model_dump(),
                 stage.dir, [r.one_line() for r in stage.rejects()])
    for aid, n in stage.manifest.stats.get("rankers", {}).items():
        console.print(f"  {aid}: {n['ranked']} ranked, {n['skipped']} skipped, "
                      f"{n['with_ties']} with ties", highlight=False)


def register(app: typer.Typer) -> None:
    app.command()(rank)
