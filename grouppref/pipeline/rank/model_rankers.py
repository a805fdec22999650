"""The rankers that run a transformers model in process: a reward model (a sequence classifier
with one output) and an LLM judge (a causal LM read at its next-token verdict), with what they
share: tokenising with the model's context limit, chat templates, and batches padded longest
first.

A group the model cannot read (too long, a chat template that rejects the prompt) is a
:class:`~grouppref.pipeline.rank.outcomes.Skip`; models are loaded by ``load()`` only (a cached or
resumed stage loads nothing), after ``check()`` has read the config alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

import torch
from jinja2.exceptions import TemplateError

from grouppref.errors import ConfigError
from grouppref.models.loading import load_tokenizer, resolve_model
from grouppref.pipeline.rank import scoring as rs
from grouppref.pipeline.rank.judge_prompts import PAIRWISE_TEMPLATE, POINTWISE_TEMPLATE
from grouppref.pipeline.rank.outcomes import Outcome, RankerInputError, Skip, collect_outcomes, slot_outcomes
from grouppref.pipeline.rank.settings import JudgeRankerSettings, RewardRankerSettings
from grouppref.schemas import CandidateGroup

EXPECTED_ERRORS = (RankerInputError, TemplateError)


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


S = TypeVar("S", RewardRankerSettings, JudgeRankerSettings)


class _TransformersRanker(Generic[S]):
    """What the reward-model and judge rankers share: settings with a ``model`` name, a device
    and dtype, and a model/tokenizer loaded lazily by the subclass's ``load()``."""

    def __init__(self, settings: S, device: str = "cpu",
                 dtype: str = "float32"):
        self.settings: S = settings
        self.device, self.dtype = device, dtype
        self.model: Any = None
        self.tokenizer: Any = None

    def model_path(self) -> str:
        """The resolved model folder or Hub id."""
        return resolve_model(self.settings.model)


class RewardRanker(_TransformersRanker[RewardRankerSettings]):
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
        return collect_outcomes(slots, values)


def format_for_reward(tokenizer: Any, group: CandidateGroup, text: str) -> tuple[str, bool]:
    """Prompt + candidate as one string: the chat template (prompt turns + an assistant turn)
    when the tokenizer has one, else ``prompt + "\\n\\n" + candidate``. Returns the string and
    whether special tokens must still be added (not when the template wrote them).
    ``grouppref train-rm`` trains reward models on this same text (train/reward_model/encode.py)."""
    if getattr(tokenizer, "chat_template", None):
        messages = [m.model_dump() for m in group.prompt.as_messages()]
        messages.append({"role": "assistant", "content": text})
        return _chat(tokenizer, messages, generation_prompt=False), False
    return f"{group.prompt.display_text()}\n\n{text}", True


class JudgeRanker(_TransformersRanker[JudgeRankerSettings]):
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
            return collect_outcomes(slots, values)

        def pair_scores(offset: int, count: int) -> list[float]:
            k = (1 + math.isqrt(1 + 4 * count)) // 2  # count = K(K-1) verdicts, row-major i != j
            d = torch.zeros((k, k), dtype=torch.float64)
            d[~torch.eye(k, dtype=torch.bool)] = torch.tensor(values[offset : offset + count],
                                                              dtype=torch.float64)
            return rs.pairwise_scores(d).tolist()

        return slot_outcomes(slots, pair_scores)
