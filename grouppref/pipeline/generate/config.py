"""Settings of the ``generate`` stage."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from grouppref.errors import ConfigError
from grouppref.readers.mapping import ColumnMapping
from grouppref.runs.stage import StageSpec
from grouppref.schemas import MAX_K, MIN_K

STAGE = "generate"


STAGE_VERSION = "1"


DEFAULT_K = 4


class ModelShare(BaseModel):
    """One model of a group's mix and how many candidates of each group it writes."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="embedded", description="Hub id or local path of a causal LM; "
                      "'embedded' is the bundled SmolLM2-135M-Instruct.")
    count: int | None = Field(default=None, ge=1, le=MAX_K, description="Candidates per group "
                              "from this model (left out: K is split evenly between models).")

    @classmethod
    def parse(cls, spec: str) -> ModelShare:
        """``NAME`` or ``NAME:COUNT`` (e.g. ``HuggingFaceTB/SmolLM2-360M-Instruct:2``).

        Raises:
            ConfigError: an empty name or a count that is not a positive integer.
        """
        name, sep, tail = spec.rpartition(":")
        if not sep or not tail.strip().lstrip("-").isdigit():
            name, count = spec, None
        else:
            count = int(tail)
            if count < 1:
                raise ConfigError(f"--model {spec!r}: the count after ':' must be >= 1")
        if not name.strip():
            raise ConfigError(f"--model {spec!r}: give a model name or path before ':'")
        return cls(name=name.strip(), count=count)


class GenerateConfig(BaseModel):
    """Settings of the ``generate`` stage (every field is part of the cache key)."""

    model_config = ConfigDict(extra="forbid")

    source: str | None = Field(default=None, description="Prompt file (JSONL/JSON/CSV/Parquet), "
                               "saved dataset or Hub id; left out: the run's prompts stage.")
    split: str = Field(default="train", description="Split to read from a dataset with splits.")
    mapping: ColumnMapping = Field(default_factory=ColumnMapping,
                                   description="Which columns hold the prompt fields.")
    models: list[ModelShare] = Field(default_factory=lambda: [ModelShare()], min_length=1,
                                     description="Models to sample from, NAME or NAME:COUNT; "
                                     "repeat to mix models in one group.")
    k: int | None = Field(default=None, ge=MIN_K, le=MAX_K, description="Candidates per prompt "
                          f"(default {DEFAULT_K}, or the sum of the models' counts).")
    min_k: int = Field(default=MIN_K, ge=MIN_K, le=MAX_K, description="Fewest distinct "
                       "candidates a group may keep; groups with fewer go to rejects.")
    max_resample: int = Field(default=3, ge=0, le=20, description="Rounds of re-sampling for "
                              "empty or duplicate candidates before giving up on them.")
    temperature: float = Field(default=1.0, gt=0.0, le=10.0,
                               description="Sampling temperature.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling: keep the "
                         "smallest set of tokens with this much probability (1.0 keeps all).")
    max_new_tokens: int = Field(default=256, ge=1, description="Most tokens per candidate.")
    seed: int = Field(default=0, ge=0, description="Run seed; each candidate's seed is derived "
                      "from it, the group id, the model, its slot and its attempt.")
    batch_size: int = Field(default=16, ge=1, description="Sequences per generate call.")
    shard_size: int = Field(default=32, ge=1, description="Prompts per shard (the unit of "
                            "resuming a killed run).")
    chat_template: bool = Field(default=True, description="Format prompts with the tokenizer's "
                                "chat template (plain-text prompts become one user turn).")
    truncate_prompts: bool = Field(default=False, description="Keep the last tokens of a prompt "
                                   "too long for the model's context instead of rejecting it.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(default="float32",
                                                             description="Model weights dtype.")
    device: str = Field(default="cpu", description="Torch device, e.g. 'cpu' or 'cuda:0'.")

    @model_validator(mode="after")
    def _resolve_counts(self) -> GenerateConfig:
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"models {names}: name each model once (use NAME:COUNT)")
        counts = [m.count for m in self.models]
        if all(c is not None for c in counts):
            total = sum(c for c in counts if c is not None)
            if self.k is not None and self.k != total:
                raise ValueError(f"k={self.k} but the model counts {counts} add up to {total}; "
                                 "leave k out or make them agree")
            self.k = total
        elif any(c is not None for c in counts):
            raise ValueError(f"models {names}: give a count to every model or to none")
        else:
            k = self.k or DEFAULT_K
            if k < len(self.models):
                raise ValueError(f"k={k} is fewer than the {len(self.models)} models")
            self.k = k
            self.models = [ModelShare(name=m.name, count=k // len(self.models)
                                      + (i < k % len(self.models)))
                           for i, m in enumerate(self.models)]
        if not MIN_K <= self.k <= MAX_K:
            raise ValueError(f"k={self.k}: a group holds {MIN_K} to {MAX_K} candidates")
        if self.min_k > self.k:
            raise ValueError(f"min_k={self.min_k} is more than k={self.k}")
        return self


def _reads(config: GenerateConfig) -> tuple[str, ...]:
    return ("prompts",) if config.source is None else ()


GENERATE = StageSpec(
    name=STAGE, config=GenerateConfig, entry="grouppref.pipeline.generate.stage:run_generate",
    summary="Sample K candidates per prompt into RUN/generate.", reads=_reads)
