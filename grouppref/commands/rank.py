"""``grouppref rank``: automatic rankers (reward model, rules, reference similarity, LLM judge)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import typer

from grouppref.commands.arguments import RunArg, RunExtras
from grouppref.commands.options import Custom, Extra, config_command, help_of
from grouppref.commands.output import esc, out, print_server_usage, print_stage
from grouppref.errors import ConfigError
from grouppref.models.served.settings import NeutralSampling, ServerSettings
from grouppref.pipeline.rank.config import RankConfig
from grouppref.pipeline.rank.settings import JudgeRankerSettings, parse_ranker_spec, parse_weights
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore

RANKER_HELP = ("Ranker SPEC, repeatable: reward:PATH_OR_ID | rule:CHECK[;CHECK...] with CHECK = "
               "[WEIGHT*]length=N (chars; Nw: words) | regex=PATTERN | keywords=a,b | verify; verify | "
               "similarity[:MODEL] | judge[:MODEL] | judge:openai:NAME@URL (a judge served by an "
               "OpenAI-compatible server; URL: its base URL, e.g. http://127.0.0.1:8000/v1).")
ENSEMBLE_HELP = ("Weighted ensemble as an extra ranking: KEY=WEIGHT,... with keys the ranker "
                 "kinds (reward, rule, verify, similarity, judge; judge-2 for a second judge).")


def parse_rankers(specs: list[str]) -> list[dict[str, Any]]:
    """``--ranker SPEC`` values as ranker settings (also ``train --refresh-ranker``)."""
    return [parse_ranker_spec(spec).model_dump(mode="json") for spec in specs]


class _RankExtras(RunExtras):
    judge_mode: Literal["pointwise", "pairwise", "rubric"] | None
    api_key_env: str | None
    concurrency: int | None
    neutral_sampling: NeutralSampling | None
    batch_size: int | None


def _prepare(data: dict[str, Any], extras: _RankExtras) -> dict[str, Any]:
    """``--judge-mode`` and ``--batch-size`` apply to every ranker they fit; ``--api-key-env``,
    ``--concurrency`` and ``--neutral-sampling`` to every served judge."""
    if not data.get("rankers"):
        raise ConfigError("no ranker: add --ranker SPEC (e.g. --ranker verify) or --config FILE")
    for settings in data["rankers"]:
        if not isinstance(settings, dict):
            continue
        if extras["judge_mode"] and settings.get("kind") == "judge":
            settings["mode"] = extras["judge_mode"]
        if extras["batch_size"] and settings.get("kind") != "rule":
            settings["batch_size"] = extras["batch_size"]
        if settings.get("kind") == "judge" and settings.get("backend") == "openai":
            if extras["neutral_sampling"] is not None:
                settings["neutral_sampling"] = extras["neutral_sampling"]
            server = settings.setdefault("server", {})
            for option, value in (("api_key_env", extras["api_key_env"]),
                                  ("concurrency", extras["concurrency"])):
                if value is not None and isinstance(server, dict):
                    server[option] = value
    return data


def _run(config: RankConfig, extras: _RankExtras, force: bool) -> None:
    from grouppref.pipeline.rank.stage import run_rank

    stage = run_rank(RunStore(extras["run"]), config, StageContext(force=force))
    print_stage(stage)
    for aid, n in stage.manifest.stats.get("rankers", {}).items():
        out.print(f"  {esc(aid)}: {n['ranked']} ranked, {n['skipped']} skipped, "
                  f"{n['with_ties']} with ties")
    print_server_usage(stage.manifest.stats)


rank = config_command(
    RankConfig, _run, name="rank", section="rank", prepare=_prepare,
    doc="Rank every group of RUN/generate with automatic rankers into RUN/rank.",
    extras=[
        Extra("run", RunArg),
        Extra("judge_mode", Annotated[Literal["pointwise", "pairwise", "rubric"] | None, typer.Option(
            "--judge-mode", help=help_of(JudgeRankerSettings, "mode"), show_default=False)],
              None),
        Extra("api_key_env", Annotated[str | None, typer.Option(
            "--api-key-env", help="Served judges: " + help_of(ServerSettings, "api_key_env"),
            show_default=False)], None),
        Extra("concurrency", Annotated[int | None, typer.Option(
            "--concurrency", help="Served judges: " + help_of(ServerSettings, "concurrency"),
            show_default=False)], None),
        Extra("neutral_sampling", Annotated[NeutralSampling | None, typer.Option(
            "--neutral-sampling", help="Served judges: " + help_of(JudgeRankerSettings,
                                                                   "neutral_sampling"),
            show_default=False)], None),
        Extra("batch_size", Annotated[int | None, typer.Option(
            "--batch-size", help="Sequences per forward pass of every model ranker.",
            show_default=False)], None),
    ],
    custom={"rankers": Custom("--ranker", RANKER_HELP, parse_rankers, multiple=True, metavar="SPEC"),
            "ensemble": Custom("--ensemble", ENSEMBLE_HELP,
                               lambda spec: {"weights": parse_weights(spec)},
                               metavar="KEY=WEIGHT,...")})


def register(app: typer.Typer) -> None:
    app.command()(rank)


