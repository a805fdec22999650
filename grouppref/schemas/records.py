"""The records every stage reads and writes (docs/data-format.md; the layers: docs/architecture.md).

All are pydantic v2 models with ``extra="forbid"``; every float must be finite. Stage outputs
are ``datasets.Dataset`` with one row per group (see :mod:`grouppref.schemas.arrow`).

Ids are stable hashes so that re-running a stage on the same prompts gives the same ids:
``group_id = g-<sha256(prompt content)[:16]>`` and ``candidate_id = c-<sha256(group_id, text)[:16]>``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from datetime import datetime, timezone
from json.encoder import encode_basestring as _json_string  # json.dumps's, not ASCII-only
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from grouppref.schemas.texts import duplicate_keys, normalise_text

MIN_K = 2
MAX_K = 16

Scalar = str | int | float | bool
AnnotatorKind = Literal["human", "reward_model", "rule", "llm_judge", "simulated"]
Split = Literal["train", "test"]


def _non_blank(s: str) -> str:
    if not s.strip():
        raise ValueError("must not be empty or whitespace only")
    return s


def _finite_scalars(d: dict[str, Scalar]) -> dict[str, Scalar]:
    for key, value in d.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"value of {key!r} must be finite, got {value!r}")
    return d


# finite in pydantic's own float check (a Python validator per number cost more than the rest)
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
NonBlank = Annotated[str, AfterValidator(_non_blank)]
Id = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^\S+$")]
Metadata = Annotated[dict[str, Scalar], AfterValidator(_finite_scalars)]


class Record(BaseModel):
    """Base of all records: unknown keys are errors, and assignments are validated too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def _short_hash(*parts: str) -> str:
    digest = hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()
    return digest[:16]


class ChatMessage(Record):
    """One chat turn."""

    role: Literal["system", "user", "assistant"]
    content: NonBlank


class Prompt(Record):
    """A prompt: chat ``messages`` or plain ``text`` (exactly one of them)."""

    prompt_id: Id
    messages: list[ChatMessage] | None = Field(
        default=None, description="Chat turns; the last one is usually from the user."
    )
    text: NonBlank | None = Field(default=None, description="A plain-text prompt.")
    reference: str | None = Field(
        default=None, description="Reference answer for rule / verifiable / similarity rankers."
    )
    metadata: Metadata = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_form(self) -> Prompt:
        if (self.messages is None) == (self.text is None):
            raise ValueError("give exactly one of 'messages' or 'text'")
        if self.messages is not None and not self.messages:
            raise ValueError("'messages' must hold at least one chat turn")
        return self

    def as_messages(self) -> list[ChatMessage]:
        """The prompt as chat turns (plain text becomes one user turn)."""
        if self.messages is not None:
            return list(self.messages)
        return [ChatMessage(role="user", content=self.text or "")]

    def turns(self) -> list[tuple[str, str]] | None:
        """The chat turns as ``(role, content)``, ``None`` for a plain-text prompt."""
        return None if self.messages is None else [(m.role, m.content) for m in self.messages]

    def display_text(self) -> str:
        """A human-readable rendering (for annotators and reports)."""
        return prompt_display_text(self.text, self.turns())

    def content_key(self) -> str:
        """Canonical JSON of what the prompt says (not its id): the basis of ``group_id``."""
        return prompt_content_key(self.text, self.turns())


def prompt_display_text(text: str | None, turns: Sequence[tuple[str, str]] | None) -> str:
    """:meth:`Prompt.display_text` of a prompt's ``text`` or chat ``turns`` (role, content),
    for a caller that holds them without the record."""
    if text is not None:
        return text
    return "\n\n".join(f"[{role}] {content}" for role, content in turns or [])


def prompt_content_key(text: str | None, turns: Sequence[tuple[str, str]] | None) -> str:
    """:meth:`Prompt.content_key` of a prompt's ``text`` or chat ``turns`` (role, content):
    ``json.dumps({"text": text}, ensure_ascii=False)`` or ``json.dumps({"messages": [[role,
    content], ...]}, ensure_ascii=False)``, written with ``json``'s own string encoder
    (``tests/unit/schemas/test_content_key.py`` holds them equal), at a third of the time."""
    if text is not None:
        return '{"text": ' + _json_string(text) + "}"
    return '{"messages": [' + ", ".join(
        "[" + _json_string(role) + ", " + _json_string(content) + "]"
        for role, content in turns or []) + "]}"


def make_group_id(prompt: Prompt) -> str:
    """Stable id of the group built on ``prompt``: a hash of the prompt's content."""
    return group_id_of(prompt.content_key())


def group_id_of(content_key: str) -> str:
    """:func:`make_group_id` of the prompt whose :meth:`Prompt.content_key` is ``content_key``
    (for a caller that has the key already)."""
    return "g-" + _short_hash(content_key)


def make_candidate_id(group_id: str, text: str) -> str:
    """Stable id of a candidate: a hash of its group id and its text."""
    return "c-" + _short_hash(group_id, text)


class CandidateSource(Record):
    """Where a candidate came from."""

    kind: Literal["model", "human", "import"]
    model: str | None = Field(default=None, description="Model id or path that generated it.")
    params: Metadata = Field(
        default_factory=dict, description="Sampling parameters (temperature, top_p, ...)."
    )
    seed: int | None = None


class Candidate(Record):
    """One candidate answer to a group's prompt."""

    candidate_id: Id
    text: NonBlank
    source: CandidateSource
    num_tokens: int | None = Field(default=None, ge=0)
    behavior_logp: FiniteFloat | None = Field(
        default=None, le=0.0, description="Sum of token log-probs under the generating model."
    )


class CandidateGroup(Record):
    """A prompt with its K candidates (2 <= K <= 16)."""

    group_id: Id
    prompt: Prompt
    candidates: list[Candidate] = Field(min_length=MIN_K, max_length=MAX_K)

    @model_validator(mode="after")
    def _unique_candidates(self) -> CandidateGroup:
        seen_ids: set[str] = set()
        if duplicate_keys([c.text for c in self.candidates]) is None:  # no texts alike
            for c in self.candidates:
                if c.candidate_id in seen_ids:
                    raise ValueError(f"duplicate candidate id {c.candidate_id!r}")
                seen_ids.add(c.candidate_id)
            return self
        seen_texts: dict[str, str] = {}
        for c in self.candidates:
            if c.candidate_id in seen_ids:
                raise ValueError(f"duplicate candidate id {c.candidate_id!r}")
            seen_ids.add(c.candidate_id)
            norm = normalise_text(c.text)
            if norm in seen_texts:
                raise ValueError(
                    f"candidates {seen_texts[norm]!r} and {c.candidate_id!r} have the same "
                    "normalised text"
                )
            seen_texts[norm] = c.candidate_id
        return self

    @property
    def k(self) -> int:
        return len(self.candidates)

    def candidate_ids(self) -> list[str]:
        return [c.candidate_id for c in self.candidates]


def check_tiers(tiers: list[list[str]], candidate_ids: list[str], *, complete: bool = True) -> None:
    """Raise ``ValueError`` unless ``tiers`` are well formed for a group of ``candidate_ids``.

    Always: no empty tier, no id twice, no unknown id. ``complete=True`` (a consensus, a
    ranking that must cover its group): every candidate exactly once. ``complete=False`` (a
    *partial* ranking, e.g. an annotator who rated only some candidates, or one pairwise
    comparison): at least two of the group's candidates.
    """
    seen: set[str] = set()
    for tier in tiers:
        if not tier:
            raise ValueError("empty tier in ranking")
        for cid in tier:
            if cid in seen:
                raise ValueError(f"candidate {cid!r} appears twice in the ranking")
            seen.add(cid)
    want = set(candidate_ids)
    if seen - want:
        raise ValueError(f"ranking names unknown candidates {sorted(seen - want)}")
    if complete and want - seen:
        raise ValueError(f"ranking leaves out candidates {sorted(want - seen)}")
    if not complete and len(seen) < MIN_K and len(want) >= MIN_K:
        raise ValueError(f"a ranking must compare at least {MIN_K} candidates; this one names "
                         f"{len(seen)}")


class Annotator(Record):
    """Who produced a ranking."""

    id: Id
    kind: AnnotatorKind
    name: str | None = None
    version: str | None = None


class Ranking(Record):
    """One annotator's ranking of one group: ``tiers`` best first, ties share a tier.

    A ranking may be *partial*: it covers at least two of the group's candidates, and says
    nothing about the others (an "N/A" rating, one pairwise comparison)."""

    annotator: Annotator
    group_id: Id
    tiers: list[list[Id]] = Field(min_length=1, description="Candidate ids, best tier first; "
                                  "ties share a tier. A partial ranking names only some (at "
                                  "least 2) of the group's candidates.")
    scores: dict[str, FiniteFloat] | None = Field(
        default=None, description="Per-candidate scores behind the ranking, if any."
    )
    metadata: Metadata | None = Field(
        default=None, description="What the annotator said beyond the scores, e.g. an LLM "
        "judge's rating and rationale per candidate (rating:<candidate_id>, rationale:<...>); "
        "for a human ranking pulled from Argilla, selection: why `label push` sent the group "
        "(uncertain, audit, random, all), which the aggregate's reliability uses."
    )
    created_at: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))

    @model_validator(mode="after")
    def _well_formed(self) -> Ranking:
        ids = [cid for tier in self.tiers for cid in tier]
        check_tiers(self.tiers, ids, complete=False)  # no empty tier, no id twice
        if self.created_at.tzinfo is None:
            # Naive datetimes are taken as UTC so that the Arrow round trip is lossless.
            object.__setattr__(self, "created_at", self.created_at.replace(tzinfo=timezone.utc))
        return self


class AnnotatedGroup(CandidateGroup):
    """A group plus every ranking of it (at most one per annotator)."""

    rankings: list[Ranking] = Field(default_factory=list)

    @field_validator("rankings")
    @classmethod
    def _rankings_match(cls, rankings: list[Ranking], info: ValidationInfo) -> list[Ranking]:
        candidates = info.data.get("candidates")
        if candidates is None:  # the candidates failed validation; that error is reported
            return rankings
        ids = [c.candidate_id for c in candidates]
        annotators: set[str] = set()
        for r in rankings:
            if r.group_id != info.data.get("group_id"):
                raise ValueError(
                    f"ranking by {r.annotator.id!r} is for group {r.group_id!r}, "
                    f"not {info.data.get('group_id')!r}"
                )
            check_tiers(r.tiers, ids, complete=False)  # partial rankings are valid
            if r.scores is not None and set(r.scores) - set(ids):
                unknown = sorted(set(r.scores) - set(ids))
                raise ValueError(f"scores name unknown candidates {unknown}")
            if r.annotator.id in annotators:
                raise ValueError(f"annotator {r.annotator.id!r} ranks this group twice")
            annotators.add(r.annotator.id)
        return rankings


class PairPreference(Record):
    """Aggregated preference for one pair: ``p = P(winner > loser)`` and its confidence."""

    winner: Id
    loser: Id
    p: FiniteFloat = Field(ge=0.5, le=1.0)
    weight: FiniteFloat = Field(ge=0.0, le=1.0)
    votes_for: FiniteFloat = Field(default=0.0, ge=0.0)
    votes_against: FiniteFloat = Field(default=0.0, ge=0.0)

    @model_validator(mode="after")
    def _distinct(self) -> PairPreference:
        if self.winner == self.loser:
            raise ValueError(f"pair compares {self.winner!r} with itself")
        return self


class Agreement(Record):
    """How much the rankings of one group agree."""

    num_annotators: int = Field(ge=0)
    kendall_w: FiniteFloat | None = Field(default=None, ge=0.0, le=1.0)
    mean_tau: FiniteFloat | None = Field(default=None, ge=-1.0, le=1.0)
    noise: FiniteFloat | None = Field(
        default=None, ge=0.0, le=1.0, description="Share of pairwise votes against the consensus."
    )


class ValidatedGroup(AnnotatedGroup):
    """An annotated group with its aggregate: consensus, strengths, pair preferences."""

    consensus: list[list[Id]] = Field(min_length=1)
    strengths: dict[str, FiniteFloat]
    pairs: list[PairPreference] = Field(default_factory=list)
    agreement: Agreement
    flags: list[str] = Field(default_factory=list)
    split: Split | None = None
    consensus_kinds: list[AnnotatorKind] | None = Field(
        default=None, description="Annotator kinds of the rankings the consensus was fitted "
        "on (after kind weights and dropped annotators), sorted; None in groups aggregated "
        "before this was recorded (then every ranking's kind counts).")

    @staticmethod
    def _ids(info: ValidationInfo) -> list[str] | None:
        candidates = info.data.get("candidates")
        return None if candidates is None else [c.candidate_id for c in candidates]

    @field_validator("consensus")
    @classmethod
    def _consensus_covers(cls, consensus: list[list[str]], info: ValidationInfo) -> list[list[str]]:
        if (ids := cls._ids(info)) is not None:
            check_tiers(consensus, ids)
        return consensus

    @field_validator("strengths")
    @classmethod
    def _strengths_cover(cls, strengths: dict[str, float], info: ValidationInfo) -> dict[str, float]:
        if (ids := cls._ids(info)) is not None and set(strengths) != set(ids):
            raise ValueError("strengths must name every candidate exactly once")
        return strengths

    @field_validator("pairs")
    @classmethod
    def _pairs_known(cls, pairs: list[PairPreference], info: ValidationInfo) -> list[PairPreference]:
        if (ids := cls._ids(info)) is None:
            return pairs
        known = set(ids)
        seen: set[tuple[str, str]] = set()
        for pair in pairs:
            winner, loser = pair.winner, pair.loser
            if winner not in known or loser not in known:
                raise ValueError(f"pair names unknown candidates {sorted({winner, loser} - known)}")
            key = (winner, loser) if winner < loser else (loser, winner)  # either order
            if key in seen:
                raise ValueError(f"pair {pair.winner!r} / {pair.loser!r} appears twice")
            seen.add(key)
        return pairs


class Reject(Record):
    """A row (or part of a row) a stage could not use, with the reason. Written to rejects.jsonl."""

    stage: str
    reason: str
    source: str | None = None
    row: int | None = None
    group_id: str | None = None
    field: str | None = None
    scope: Literal["row", "part"] = Field(
        default="row", description="'row': the whole row was left out; 'part': one piece of it."
    )

    def one_line(self) -> str:
        where = ", ".join(
            x for x in (self.source, f"row {self.row}" if self.row is not None else None,
                        f"group {self.group_id}" if self.group_id else None,
                        f"field {self.field!r}" if self.field else None) if x
        )
        return f"[{self.stage}] {where}: {self.reason}" if where else f"[{self.stage}] {self.reason}"


RECORD_TYPES: dict[str, type[Record]] = {
    cls.__name__: cls
    for cls in (
        ChatMessage, Prompt, CandidateSource, Candidate, CandidateGroup, Annotator, Ranking,
        AnnotatedGroup, PairPreference, Agreement, ValidatedGroup, Reject,
    )
}
