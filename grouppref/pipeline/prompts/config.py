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
    workers: int = Field(default=0, ge=0, le=64, exclude=True, description="Processes that "
                         "read a large JSONL file (32 MB or more), a part each (0: one per CPU "
                         "core, at most 8; 1: one process). The result is the same for any "
                         "number.")

PROMPTS = StageSpec(
    name=STAGE, config=PromptsConfig,
    summary="Read and validate prompts into RUN/prompts.")
