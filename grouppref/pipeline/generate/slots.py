"""What a ``generate`` shard is made of: the models of the mix with their group slots, one
sampled slot (:class:`Draw`), and the work of a shard in progress. Shared by the in-process
sampler (:mod:`~grouppref.pipeline.generate.shard`) and the served one
(:mod:`~grouppref.pipeline.generate.served`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from grouppref.models.loading import model_label
from grouppref.schemas import Prompt, normalise_text

if TYPE_CHECKING:
    from grouppref.pipeline.generate.config import ModelShare


@dataclass(frozen=True)
class ModelSlot:
    """A model of the mix: its share of the config, the resolved path (None for a served
    model), and its group slots."""

    share: ModelShare
    path: str | None
    slots: range

    @property
    def name(self) -> str:
        return self.share.name

    @property
    def served(self) -> bool:
        return self.share.backend == "openai"

    @property
    def key(self) -> str:
        """Unique within a config: backend, server and name."""
        return "|".join(str(part) for part in self.share.key())

    @property
    def label(self) -> str:
        """The model as records name it (the served name, or the path / Hub id)."""
        return self.name if self.served else model_label(self.name)


@dataclass(frozen=True)
class Draw:
    """A sampled slot: its text, tokens and log-prob (as :class:`~grouppref.schemas.Candidate`
    records them), how it ended, its seed and attempt number."""

    text: str
    num_tokens: int | None
    logp: float | None
    eos: bool
    seed: int
    attempt: int
    finish_reason: str | None = None  # served models: the server's finish_reason


@dataclass
class ShardWork:
    """One shard in progress: prompts, group ids, token ids (in-process models, by slot key),
    the draws so far and the prompts a server refused (index -> reason)."""

    prompts: Sequence[Prompt]
    gids: list[str]
    encoded: dict[int, dict[str, list[int]]]
    draws: dict[int, dict[int, Draw]]
    refused: dict[int, str]


def bad_slots(draws: dict[int, Draw]) -> list[int]:
    """Slots whose text is empty or repeats an earlier slot's normalised text (slot order)."""
    seen: set[str] = set()
    bad = []
    for s in sorted(draws):
        norm = normalise_text(draws[s].text)
        if not norm or norm in seen:
            bad.append(s)
        else:
            seen.add(norm)
    return bad
