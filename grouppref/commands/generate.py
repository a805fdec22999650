"""``grouppref generate``: sample K candidates per prompt, or import candidates made elsewhere."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel, ValidationError

from grouppref.commands.core import report_stage
from grouppref.commands.options import help_of
from grouppref.errors import ConfigError
from grouppref.pipeline.generate.stage import GenerateConfig, ModelShare, run_generate
from grouppref.pipeline.imports.stage import ImportConfig, run_import
from grouppref.readers.rows import ColumnMapping
from grouppref.runs.store import RunStore

G = GenerateConfig
M = ColumnMapping


def _default(model: type[BaseModel], field: str) -> Any:
    return model.model_fields[field].default


def _build(model: type[BaseModel], **values: Any) -> Any:
    """Validate settings; a pydantic error becomes one ``ConfigError`` line naming the option."""
    try:
        return model(**{k: v for k, v in values.items() if v is not None})
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        option = f"--{where.replace('_', '-')}: " if where else ""
        raise ConfigError(f"generate: {option}{first['msg']}") from e


def generate(
    out: Annotated[Path, typer.Option("--out", help="Run directory to write RUN/generate into.")],
    prompts: Annotated[str | None, typer.Option("--prompts", help=help_of(G, "source"))] = None,
    model: Annotated[list[str] | None, typer.Option(
        "--model", help=help_of(G, "models") + " Default: the embedded SmolLM2.")] = None,
    k: Annotated[int | None, typer.Option("--k", help=help_of(G, "k"))] = None,
    min_k: Annotated[int, typer.Option(help=help_of(G, "min_k"))] = _default(G, "min_k"),
    max_resample: Annotated[int, typer.Option(help=help_of(G, "max_resample"))] = _default(
        G, "max_resample"),
    temperature: Annotated[float, typer.Option(help=help_of(G, "temperature"))] = _default(
        G, "temperature"),
    top_p: Annotated[float, typer.Option(help=help_of(G, "top_p"))] = _default(G, "top_p"),
    max_new_tokens: Annotated[int, typer.Option(help=help_of(G, "max_new_tokens"))] = _default(
        G, "max_new_tokens"),
    seed: Annotated[int, typer.Option(help=help_of(G, "seed"))] = _default(G, "seed"),
    batch_size: Annotated[int, typer.Option(help=help_of(G, "batch_size"))] = _default(
        G, "batch_size"),
    shard_size: Annotated[int, typer.Option(help=help_of(G, "shard_size"))] = _default(
        G, "shard_size"),
    chat_template: Annotated[bool, typer.Option(
        "--chat-template/--no-chat-template", help=help_of(G, "chat_template"))] = True,
    truncate_prompts: Annotated[bool, typer.Option(help=help_of(G, "truncate_prompts"))] = False,
    dtype: Annotated[str, typer.Option(help=help_of(G, "dtype"))] = _default(G, "dtype"),
    device: Annotated[str, typer.Option(help=help_of(G, "device"))] = _default(G, "device"),
    import_file: Annotated[str | None, typer.Option(
        "--import", help="Import candidates made elsewhere instead of sampling: "
        + help_of(ImportConfig, "source"))] = None,
    split: Annotated[str, typer.Option(help=help_of(G, "split"))] = "train",
    text_column: Annotated[str, typer.Option(help=help_of(M, "text"))] = "prompt",
    messages_column: Annotated[str, typer.Option(help=help_of(M, "messages"))] = "messages",
    id_column: Annotated[str, typer.Option(help=help_of(M, "prompt_id"))] = "prompt_id",
    reference_column: Annotated[str, typer.Option(help=help_of(M, "reference"))] = "reference",
    metadata_column: Annotated[list[str] | None, typer.Option(
        help=help_of(M, "metadata_columns"))] = None,
    responses_column: Annotated[str, typer.Option(help=help_of(M, "responses"))] = "responses",
    response_column: Annotated[str, typer.Option(help=help_of(M, "response"))] = "response",
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Re-run even when the cache is valid.")]
    = False,
) -> None:
    """Sample K candidates per prompt into RUN/generate (or --import them from a file)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own bar reports the stage
    mapping = ColumnMapping(text=text_column, messages=messages_column, prompt_id=id_column,
                            reference=reference_column, metadata_columns=metadata_column or [],
                            responses=responses_column, response=response_column)
    store = RunStore(out)
    if import_file is not None:
        if prompts is not None or model:
            raise ConfigError("generate: --import builds groups from a file of responses; "
                              "leave out --prompts and --model")
        stage = run_import(store, _build(ImportConfig, source=import_file, split=split,
                                         mapping=mapping, min_k=min_k), force=force)
    else:
        shares = [ModelShare.parse(spec) for spec in model] if model else None
        config = _build(G, source=prompts, split=split, mapping=mapping, models=shares, k=k,
                        min_k=min_k, max_resample=max_resample, temperature=temperature,
                        top_p=top_p, max_new_tokens=max_new_tokens, seed=seed,
                        batch_size=batch_size, shard_size=shard_size, chat_template=chat_template,
                        truncate_prompts=truncate_prompts, dtype=dtype, device=device)
        stage = run_generate(store, config, force=force, show_progress=not quiet)
    report_stage(stage.manifest.stage, stage.cached, stage.manifest.counts.model_dump(),
                 stage.dir, [r.one_line() for r in stage.rejects()])


def register(app: typer.Typer) -> None:
    app.command()(generate)
