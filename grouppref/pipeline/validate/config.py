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


def _reads(config: ValidateConfig) -> tuple[str, ...]:
    return (INPUT_STAGE,)


VALIDATE = StageSpec(
    name=STAGE, config=ValidateConfig, entry="grouppref.pipeline.validate.stage:run_validate",
    summary="Check and split the aggregated groups into RUN/validate.", reads=_reads)
