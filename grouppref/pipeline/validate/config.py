"""Settings of the ``validate`` stage."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from grouppref.runs.stage import StageSpec

STAGE = "validate"


INPUT_STAGE = "aggregate"


STAGE_VERSION = "1"


class ValidateConfig(BaseModel):
    """Settings of the ``validate`` stage."""

    model_config = ConfigDict(extra="forbid")

    source: str | None = Field(default=None, description="Validate this dataset instead of "
                               "RUN/aggregate: anything `grouppref export` writes (groups, or "
                               "TRL pairs read as groups of 2) in any container (save_to_disk "
                               "folder, Parquet files, Hub-layout folder, JSON Lines), or a Hub "
                               "dataset id; its groups are checked and split again.")
    test_fraction: float = Field(default=0.1, ge=0.0, lt=1.0,
                                 description="Expected share of prompts put in the test split.")
    seed: int = Field(default=0, description="Seed of the prompt hash that assigns the split.")
    split_by: Literal["prompt", "prompt_text"] = Field(
        default="prompt", description="What decides the split: 'prompt' (exact prompt content) "
        "or 'prompt_text' (case- and whitespace-normalised text, so near-identical prompts share "
        "a split).")
    min_pairs: int = Field(default=1, ge=0,
                           description="Reject groups with fewer pair preferences than this.")
    reject_flags: list[str] = Field(default_factory=list,
                                    description="Reject groups carrying any of these flags.")
    shard_size: int = Field(default=1000, ge=1, description="Groups per resumable shard.")
    workers: int = Field(default=0, ge=0, le=64, exclude=True, description="Processes that "
                         "check a large run's groups (20,000 or more), a part each (0: one per "
                         "CPU core, at most 8; 1: one process). The result is the same for any "
                         "number.")


def _reads(config: ValidateConfig) -> tuple[str, ...]:
    return () if config.source else (INPUT_STAGE,)


VALIDATE = StageSpec(
    name=STAGE, config=ValidateConfig,
    summary="Check and split the aggregated groups (or a published dataset) into RUN/validate.",
    reads=_reads)
