"""Settings of ``generate --import``."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from grouppref.readers.mapping import ColumnMapping
from grouppref.runs.stage import StageSpec
from grouppref.schemas import MAX_K, MIN_K

STAGE = "generate"


STAGE_VERSION = "import-1"


class ImportConfig(BaseModel):
    """Settings of ``generate --import``."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field(description="File (JSONL/JSON/CSV/Parquet), saved dataset or Hub id with "
                        "the responses to import.")
    split: str = Field(default="train", description="Split to read from a dataset with splits.")
    mapping: ColumnMapping = Field(default_factory=ColumnMapping,
                                   description="Which columns hold the prompt and responses.")
    min_k: int = Field(default=MIN_K, ge=MIN_K, le=MAX_K, description="Fewest distinct "
                       "candidates a group may keep; groups with fewer go to rejects.")

IMPORT = StageSpec(
    name=STAGE, config=ImportConfig, entry="grouppref.pipeline.imports.stage:run_import",
    summary="Import candidates made elsewhere into RUN/generate.")
