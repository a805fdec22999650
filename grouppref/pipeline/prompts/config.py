"""Settings of the ``prompts`` stage."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from grouppref.readers.mapping import ColumnMapping
from grouppref.runs.stage import StageSpec

STAGE = "prompts"


STAGE_VERSION = "1"


class PromptsConfig(BaseModel):
    """Settings of the ``prompts`` stage."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field(description="Prompt file (JSONL/JSON/CSV/Parquet), saved dataset or Hub id.")
    split: str = Field(default="train", description="Split to read from a dataset with splits.")
    mapping: ColumnMapping = Field(default_factory=ColumnMapping,
                                   description="Which columns hold the prompt fields.")
    limit: int | None = Field(default=None, ge=1, description="Read only the first N rows.")

PROMPTS = StageSpec(
    name=STAGE, config=PromptsConfig,
    summary="Read and validate prompts into RUN/prompts.")
