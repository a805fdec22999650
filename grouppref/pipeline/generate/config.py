"""Settings of the ``generate`` stage."""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from grouppref.config import redact_credentials, validate
from grouppref.errors import ConfigError
from grouppref.models.served.settings import NeutralSampling, ServerSettings, check_base_url
from grouppref.readers.mapping import ColumnMapping
from grouppref.runs.stage import StageSpec
from grouppref.schemas import MAX_K, MIN_K

STAGE = "generate"


STAGE_VERSION = "1"


DEFAULT_K = 4


Backend = Literal["transformers", "openai"]
BACKENDS: tuple[str, ...] = ("transformers", "openai")


class ModelShare(BaseModel):
    """One model of a group's mix and how many candidates of each group it writes."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="embedded", description="transformers: Hub id or local path of a "
                      "causal LM ('embedded' is the bundled SmolLM2-135M-Instruct); openai: the "
                      "model name the server serves.")
    count: int | None = Field(default=None, ge=1, le=MAX_K, description="Candidates per group "
                              "from this model (left out: K is split evenly between models).")
    backend: Backend | None = Field(default=None, description="Where it runs: 'transformers' "
                                    "(in process) or 'openai' (an OpenAI-compatible server); "
                                    "left out: the stage's backend.")
    base_url: str | None = Field(default=None, description="openai: this model's server, when "
                                 "it is not the stage's base_url.")

    @field_validator("base_url")
    @classmethod
    def _url(cls, url: str | None) -> str | None:
        return None if url is None else check_base_url(url)

    @classmethod
    def parse(cls, spec: str) -> ModelShare:
        """A ``--model`` spec: ``NAME[:COUNT]``, ``openai:NAME[@URL][:COUNT]`` or
        ``transformers:NAME[:COUNT]`` (e.g. ``openai:Qwen/Qwen2.5-7B-Instruct@http://gpu:8000/v1:2``).

        A served name may hold ':' (Ollama's ``llama3:8b``): only a final ``:DIGITS`` is a count.
        After ``@URL``, a final ``:DIGITS`` is the count when the URL already has a path or a
        port (``http://h:8000:2``), else it is the port (``http://h:8000``).

        Raises:
            ConfigError: an empty name, a count that is not a positive integer, a bad URL.
        """
        backend, body = None, spec.strip()
        for prefix in BACKENDS:
            if body.startswith(prefix + ":"):
                backend, body = prefix, body[len(prefix) + 1:]
        name, at, url = body.partition("@")
        base_url, count = None, None
        if at:
            if backend != "openai":
                raise ConfigError(f"--model {spec!r}: NAME@URL is for served models; write "
                                  "openai:NAME@URL")
            base_url, count = _split_url_count(spec, url)
        else:
            name, count = _split_count(spec, name)
        if not name.strip():
            raise ConfigError(f"--model {spec!r}: give a model name or path")
        values = {"name": name.strip(), "count": count, "backend": backend, "base_url": base_url}
        return validate(cls, values, redact_credentials(f"--model {spec!r}"))

    def key(self) -> tuple[str | None, str | None, str]:
        """What tells two models of a mix apart: backend, server and name."""
        return self.backend, self.base_url, self.name


def _split_count(spec: str, text: str) -> tuple[str, int | None]:
    name, sep, tail = text.rpartition(":")
    if not sep or not tail.strip().lstrip("-").isdigit():
        return text, None
    count = int(tail)
    if count < 1:
        raise ConfigError(f"--model {spec!r}: the count after ':' must be >= 1")
    return name, count


def _split_url_count(spec: str, url: str) -> tuple[str, int | None]:
    m = re.fullmatch(r"(.+?):(-?\d+)", url.strip())
    if m:
        head = urlsplit(m.group(1))
        if head.port is not None or head.path not in ("", "/"):
            _, count = _split_count(spec, url)
            return m.group(1), count
    return url.strip(), None


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
    backend: Backend = Field(default="transformers", description="Backend of the models given "
                             "without one: 'transformers' (in process) or 'openai' (an "
                             "OpenAI-compatible server at base_url); openai:NAME or "
                             "transformers:NAME choose per model.")
    server: ServerSettings = Field(default_factory=ServerSettings, description="The server of "
                                   "'openai' models: base_url, api_key_env, concurrency, "
                                   "request_timeout, max_retries, server_params.")
    logprobs: bool = Field(default=True, description="openai models: ask for token log-probs "
                           "(behavior_logp is their sum) and stop with an error when the server "
                           "returns none; off: do not ask, behavior_logp stays empty.")
    stop: list[str] = Field(default_factory=list, description="openai models: strings that end "
                            "a candidate (left out of its text); repeatable.")
    neutral_sampling: NeutralSampling = Field(
        default="auto", description="openai models: switch off the samplers a server applies "
        "beyond temperature and top_p (llama.cpp: top_k 0, min_p 0, repeat_penalty 1; vLLM, "
        "SGLang: top_k -1, min_p 0, repetition_penalty 1) so that behavior_logp describes the "
        "sampling: 'auto' for the servers GET /models names (llama.cpp, vLLM, SGLang), a kind "
        "to force it, 'off' to send temperature and top_p only; server_params override it.")

    @model_validator(mode="after")
    def _resolve_counts(self) -> GenerateConfig:
        self.models = [self._resolve_backend(m) for m in self.models]
        keys = [m.key() for m in self.models]
        names = [m.name for m in self.models]
        if len(set(keys)) != len(keys):
            raise ValueError(f"models {names}: name each model once (use NAME:COUNT)")
        if self.stop and any(m.backend == "transformers" for m in self.models):
            raise ValueError("stop strings apply to openai models only; leave stop out or serve "
                             "every model")
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
            self.models = [m.model_copy(update={"count": k // len(self.models)
                                                 + (i < k % len(self.models))})
                           for i, m in enumerate(self.models)]
        if not MIN_K <= self.k <= MAX_K:
            raise ValueError(f"k={self.k}: a group holds {MIN_K} to {MAX_K} candidates")
        if self.min_k > self.k:
            raise ValueError(f"min_k={self.min_k} is more than k={self.k}")
        return self

    def _resolve_backend(self, share: ModelShare) -> ModelShare:
        """The share with its backend, and for a served model its server, filled in."""
        backend = share.backend or self.backend
        if backend == "transformers":
            if share.base_url is not None:
                raise ValueError(f"model {share.name!r} runs in process (transformers); a base "
                                 "URL is for openai models (openai:NAME@URL)")
            return share.model_copy(update={"backend": backend})
        url = share.base_url or self.server.base_url
        if url is None:
            raise ValueError(f"model {share.name!r} is served (openai) but no server is given: "
                             "pass --base-url URL, or write openai:NAME@URL")
        return share.model_copy(update={"backend": backend, "base_url": url})

    def served(self) -> list[ModelShare]:
        """The models sampled through a server."""
        return [m for m in self.models if m.backend == "openai"]


def _reads(config: GenerateConfig) -> tuple[str, ...]:
    return ("prompts",) if config.source is None else ()


GENERATE = StageSpec(
    name=STAGE, config=GenerateConfig,
    summary="Sample K candidates per prompt into RUN/generate.", reads=_reads)
