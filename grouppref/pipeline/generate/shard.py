"""The work of one ``generate`` shard: encode prompts per model, sample every candidate slot,
re-sample empty or duplicate candidates, and build the groups (or rejects, with reasons).

A group's K slots are split between models (``ModelSlot.slots``). Each slot is sampled with the
seed ``derive_seed(run seed, group id, model, slot, attempt)``; a slot whose text is empty or
repeats an earlier slot's (normalised) text is sampled again with the next attempt number, at
most ``max_resample`` times. Models in process (transformers) are sampled in batches here;
served models (an OpenAI-compatible server) through :mod:`grouppref.pipeline.generate.served`,
every request of the shard in flight up to each server's ``concurrency``; when the whole mix is
served, a prompt's re-samples start as soon as its own answers are in (no round barrier); in a
mix with models in process, a round's served requests are in flight (from a background thread)
while the in-process batches of the round run.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from grouppref.errors import ConfigError, RowError
from grouppref.models.loading import load_causal_lm, load_tokenizer
from grouppref.models.seeds import derive_seed
from grouppref.pipeline.generate.slots import Draw, ModelSlot, ShardWork
from grouppref.pipeline.generate.slots import bad_slots as _bad_slots
from grouppref.schemas import (
    Candidate,
    CandidateGroup,
    CandidateSource,
    Prompt,
    Reject,
    make_candidate_id,
    make_group_id,
    normalise_text,
)

if TYPE_CHECKING:
    from grouppref.pipeline.generate.config import GenerateConfig
    from grouppref.pipeline.generate.served import ServedSampler

STAGE = "generate"
__all__ = ["Draw", "ModelSlot", "PromptEncoder", "ShardGenerator", "load_encoders"]
_UNBOUNDED = 1_000_000  # tokenizers without a limit report ~1e30 as model_max_length


def context_length(path: str, tokenizer: Any) -> int | None:
    """The model's context in tokens (``max_position_embeddings`` or its aliases), if known."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    limits = [getattr(config, key) for key in ("max_position_embeddings", "n_positions",
                                               "max_sequence_length", "seq_length")
              if isinstance(getattr(config, key, None), int)]
    tok_limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok_limit, int) and tok_limit < _UNBOUNDED:
        limits.append(tok_limit)
    return min(limits) if limits else None


class PromptEncoder:
    """Turns prompts into token ids for one model, checking they fit its context.

    Args:
        name (str): the model as configured (for messages).
        tokenizer: its tokenizer (left padding).
        context (int | None): its context length in tokens.
        max_new_tokens (int), chat_template (bool), truncate (bool): stage settings.
    """

    def __init__(self, name: str, tokenizer: Any, context: int | None, max_new_tokens: int,
                 chat_template: bool, truncate: bool) -> None:
        self.name, self.tokenizer, self.truncate = name, tokenizer, truncate
        self.use_template = chat_template and bool(getattr(tokenizer, "chat_template", None))
        self.limit = None if context is None else context - max_new_tokens
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt in "
                              f"the {context}-token context of model {name!r}; lower it")

    def _ids(self, prompt: Prompt) -> list[int]:
        from jinja2 import TemplateError

        if self.use_template:
            messages = [m.model_dump() for m in prompt.as_messages()]
            try:
                text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                          tokenize=False)
            except TemplateError as e:
                raise RowError(f"the chat template of model {self.name!r} refuses this prompt "
                               f"({e}); pass --no-chat-template or change the prompt",
                               field="messages") from e
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        turns = prompt.as_messages()
        if len(turns) > 1 or turns[0].role != "user":
            raise RowError(f"a chat prompt with several turns needs a chat template, and model "
                           f"{self.name!r} has none here (or --no-chat-template was given)",
                           field="messages")
        return list(self.tokenizer(turns[0].content)["input_ids"])

    def encode(self, prompt: Prompt) -> tuple[list[int], int | None]:
        """Token ids of ``prompt`` and, when it was cut, its length before truncation.

        Raises:
            RowError: the prompt does not fit the context (and truncation is off), or the chat
                template refuses it.
        """
        ids = self._ids(prompt)
        if self.limit is None or len(ids) <= self.limit:
            return ids, None
        if self.truncate:
            return ids[-self.limit:], len(ids)
        raise RowError(f"prompt is {len(ids)} tokens for model {self.name!r}; with "
                       f"max_new_tokens it must be at most {self.limit} (pass --truncate-prompts "
                       "to keep its last tokens, or lower --max-new-tokens)", field="prompt")


def load_encoders(slots: Sequence[ModelSlot], config: GenerateConfig) -> dict[str, PromptEncoder]:
    """One :class:`PromptEncoder` per model in process, by slot key (tokenizer and config only,
    no weights); served models encode their prompts on the server."""
    encoders = {}
    for slot in slots:
        if slot.served:
            continue
        assert slot.path is not None  # resolved for every model run in process
        tokenizer = load_tokenizer(slot.path, padding_side="left")
        encoders[slot.key] = PromptEncoder(
            slot.name, tokenizer, context_length(slot.path, tokenizer), config.max_new_tokens,
            config.chat_template, config.truncate_prompts)
    return encoders


@dataclass
class _Loaded:
    model: Any
    eos_ids: list[int]
    pad_id: int


class ShardGenerator:
    """Generates the groups of a shard of prompts; holds the loaded models between shards.

    Args:
        slots (Sequence[ModelSlot]): the models of the mix and their group slots.
        encoders (dict[str, PromptEncoder]): by slot key, for the models in process.
        config (GenerateConfig): the stage's settings.
        served (ServedSampler | None): samples the served models (None: there are none).
    """

    def __init__(self, slots: Sequence[ModelSlot], encoders: dict[str, PromptEncoder],
                 config: GenerateConfig, served: ServedSampler | None = None) -> None:
        self.slots, self.encoders, self.config = list(slots), encoders, config
        self.served = served
        self.slot_model = {s: m for m in self.slots for s in m.slots}
        self.on_batch: Callable[[float, float], None] | None = None  # (tokens/s, shard share)
        self._first_round = (0, 1)  # (slots sampled, slots to sample) in attempt 0
        self._loaded: dict[str, _Loaded] = {}
        self._tokens = self._sampled = self._resampled = self._prompts = 0
        self._seconds = self._load_seconds = 0.0
        self._started: tuple[float, float] | None = None  # (start, model load s) of sampling
        self._lock = threading.Lock()  # counts come from the served requests' thread too

    # -- models -----------------------------------------------------------------------------
    def _model(self, slot: ModelSlot) -> _Loaded:
        from grouppref.models.sampling import neutral_generation_config  # torch: only when needed

        if slot.key not in self._loaded:
            t0 = time.perf_counter()
            model = load_causal_lm(slot.path, dtype=self.config.dtype, device=self.config.device)
            tokenizer = self.encoders[slot.key].tokenizer
            eos = model.generation_config.eos_token_id
            eos_ids = sorted({*(eos if isinstance(eos, list) else [eos] if eos is not None else []),
                              *([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None
                                else [])})
            if not eos_ids:
                raise ConfigError(f"model {slot.name!r} defines no EOS token; cannot tell where a "
                                  "candidate ends")
            model.generation_config = neutral_generation_config(
                eos_ids, tokenizer.pad_token_id, tokenizer.bos_token_id)
            self._loaded[slot.key] = _Loaded(model, eos_ids, tokenizer.pad_token_id)
            self._load_seconds += time.perf_counter() - t0
        return self._loaded[slot.key]

    def attach(self, key: str, model: Any, eos_ids: Sequence[int], pad_id: int) -> None:
        """Sample the slots of the model with slot key ``key`` (:attr:`ModelSlot.key`) from
        ``model``, already loaded (e.g. a policy being trained), instead of loading it. Its
        generation config must be neutral
        (:func:`~grouppref.models.sampling.neutral_generation_config`): the caller owns it."""
        self._loaded[key] = _Loaded(model, list(eos_ids), pad_id)

    # -- one shard --------------------------------------------------------------------------
    def run(self, prompts: Sequence[Prompt]) -> tuple[list[CandidateGroup], list[Reject]]:
        """The groups of ``prompts`` and the rejects (whole prompts or left-out slots)."""
        rejects: list[Reject] = []
        gids = [make_group_id(p) for p in prompts]
        encoded: dict[int, dict[str, list[int]]] = {}
        for i, prompt in enumerate(prompts):
            try:
                encoded[i] = self._encode(prompt, gids[i], rejects)
            except RowError as err:
                rejects.append(Reject(stage=STAGE, reason=f"prompt {prompt.prompt_id!r}: "
                                      f"{err.reason}", group_id=gids[i], field=err.field))
        work = ShardWork(prompts, gids, encoded, {i: {} for i in encoded}, {})
        pending = [(i, s) for i in encoded for s in range(self.config.k or 0)]
        self._first_round = (0, max(len(pending), 1))
        if self.served is not None and all(m.served for m in self.slots):
            # every slot served: re-samples pipelined per prompt, no round barrier
            jobs = [(self.slot_model[s], i, s) for i, s in pending]
            with self._clock():
                self.served.sample_groups(jobs, work, self._answered)
            pending = []
        for attempt in range(self.config.max_resample + 1):
            if not pending:
                break
            self._fill(pending, attempt, work)
            pending = [(i, s) for i in encoded if i not in work.refused
                       for s in _bad_slots(work.draws[i])]
        self._prompts += len(prompts)
        groups = []
        for i in encoded:
            if i in work.refused:
                rejects.append(Reject(stage=STAGE, group_id=gids[i], field="prompt",
                                      reason=f"prompt {prompts[i].prompt_id!r}: {work.refused[i]}"))
                continue
            group = self._build(prompts[i], gids[i], work.draws[i], rejects)
            if group is not None:
                groups.append(group)
        return groups, rejects

    def _encode(self, prompt: Prompt, gid: str, rejects: list[Reject]) -> dict[str, list[int]]:
        out = {}
        for key, encoder in self.encoders.items():
            ids, before = encoder.encode(prompt)
            if before is not None:
                rejects.append(Reject(stage=STAGE, scope="part", group_id=gid, field="prompt",
                                      reason=f"prompt {prompt.prompt_id!r} truncated from {before} "
                                      f"to its last {len(ids)} tokens for model {encoder.name!r}"))
            out[key] = ids
        return out

    def _fill(self, pending: list[tuple[int, int]], attempt: int, work: ShardWork) -> None:
        """Sample every pending ``(prompt index, slot)`` of one round: every served slot at
        once (all served models and servers together, in a background thread) while the models
        in process sample theirs, in batches, in this thread."""
        served, local = [], []
        for model in self.slots:
            jobs = [(i, s) for i, s in pending if self.slot_model[s] is model]
            if jobs and model.served:
                served += [(model, i, s) for i, s in jobs]
            elif jobs:
                local.append((model, jobs))
        with self._clock():
            requests = None
            if served:
                sampler = self._sampler()
                requests = sampler.pool.start(sampler.sample_round(served, attempt, work,
                                                                   self._answered))
            try:
                for model, jobs in local:
                    self._fill_local(model, jobs, attempt, work)
                if requests is not None:
                    requests.result()
            except BaseException:  # Ctrl-C or a failed batch: drop the requests in flight
                if requests is not None:
                    requests.cancel()
                    with contextlib.suppress(BaseException):
                        requests.result()
                raise

    def _sampler(self) -> ServedSampler:
        if self.served is None:
            raise RuntimeError("the mix has served models; give a ServedSampler")
        return self.served

    def _answered(self, attempt: int, tokens: int) -> None:
        """A served answer is in: count it (``on_answer`` of the served sampler)."""
        self._count(attempt, 1, tokens)

    @contextlib.contextmanager
    def _clock(self) -> Iterator[None]:
        """Count the wall time of the block as sampling time (model loading left out)."""
        t0, load0 = time.perf_counter(), self._load_seconds
        self._started = (t0, load0)
        try:
            yield
        finally:
            self._started = None
            self._seconds += time.perf_counter() - t0 - (self._load_seconds - load0)

    def _fill_local(self, model: ModelSlot, jobs: list[tuple[int, int]], attempt: int,
                    work: ShardWork) -> None:
        from grouppref.models.sampling import sample_batch

        cfg = self.config
        jobs.sort(key=lambda job: -len(work.encoded[job[0]][model.key]))  # stable: less padding
        loaded = self._model(model)
        tokenizer = self.encoders[model.key].tokenizer
        for start in range(0, len(jobs), cfg.batch_size):
            batch = jobs[start:start + cfg.batch_size]
            seeds = [derive_seed(cfg.seed, work.gids[i], model.name, s, attempt) for i, s in batch]
            samples = sample_batch(
                loaded.model, [work.encoded[i][model.key] for i, _ in batch], seeds,
                temperature=cfg.temperature, top_p=cfg.top_p,
                max_new_tokens=cfg.max_new_tokens, eos_ids=loaded.eos_ids,
                pad_id=loaded.pad_id)
            tokens = 0
            for (i, s), seed, sample in zip(batch, seeds, samples, strict=True):
                body = sample.token_ids[:-1] if sample.eos else sample.token_ids
                text = tokenizer.decode(body, skip_special_tokens=True)
                work.draws[i][s] = Draw(text, len(sample.token_ids), sample.logp, sample.eos,
                                        seed, attempt)
                tokens += len(sample.token_ids)
            self._count(attempt, len(batch), tokens)

    def _count(self, attempt: int, sampled: int, tokens: int) -> None:
        """Count ``sampled`` draws of ``tokens`` tokens and report progress (from this thread
        or the served requests' one: under a lock)."""
        with self._lock:
            self._tokens += tokens
            self._sampled += sampled
            self._resampled += sampled if attempt else 0
            if not attempt:
                self._first_round = (self._first_round[0] + sampled, self._first_round[1])
            elapsed = self._seconds
            if self._started is not None:  # the sampling still in progress
                t0, load0 = self._started
                elapsed += time.perf_counter() - t0 - (self._load_seconds - load0)
            if self.on_batch is not None and elapsed > 0:
                done, total = self._first_round
                self.on_batch(self._tokens / elapsed, done / total)

    def _build(self, prompt: Prompt, gid: str, draws: dict[int, Draw],
               rejects: list[Reject]) -> CandidateGroup | None:
        """The group from its good slots; a reject when fewer than ``min_k`` remain."""
        cfg = self.config
        bad = set(_bad_slots(draws))
        good = [s for s in sorted(draws) if s not in bad]
        if len(good) < cfg.min_k:
            rejects.append(Reject(
                stage=STAGE, group_id=gid, field="candidates",
                reason=f"prompt {prompt.prompt_id!r}: only {len(good)} distinct non-empty "
                       f"candidates after {cfg.max_resample} re-samples; --min-k is {cfg.min_k}"))
            return None
        for s in sorted(bad):  # the group is kept without these slots
            what = "empty" if not normalise_text(draws[s].text) else "duplicate"
            rejects.append(Reject(
                stage=STAGE, scope="part", group_id=gid, field="candidates",
                reason=f"slot {s} (model {self.slot_model[s].label!r}) still {what} after "
                       f"{cfg.max_resample} re-samples; left out"))
        candidates = [self._candidate(gid, s, draws[s]) for s in good]
        return CandidateGroup(group_id=gid, prompt=prompt, candidates=candidates)

    def _candidate(self, gid: str, slot: int, draw: Draw) -> Candidate:
        cfg, model = self.config, self.slot_model[slot]
        params: dict[str, str | int | float | bool] = {
            "temperature": cfg.temperature, "top_p": cfg.top_p,
            "max_new_tokens": cfg.max_new_tokens, "run_seed": cfg.seed,
            "attempt": draw.attempt, "eos": draw.eos}
        if model.served and self.served is not None:
            params.update(self.served.params(model, draw))
        source = CandidateSource(kind="model", model=model.label, params=params, seed=draw.seed)
        logp = None if draw.logp is None else min(draw.logp, 0.0)
        return Candidate(candidate_id=make_candidate_id(gid, draw.text), text=draw.text,
                         source=source, num_tokens=draw.num_tokens, behavior_logp=logp)

    @property
    def generated_tokens(self) -> int:
        """Tokens this process generated (a resumed run counts only its own work)."""
        return self._tokens

    def session_stats(self) -> dict[str, float | int | None]:
        """Throughput of this process (a resumed run counts only its own work)."""
        secs = self._seconds
        return {"generated_tokens": self._tokens, "sampled": self._sampled,
                "resampled": self._resampled, "generate_seconds": round(secs, 3),
                "model_load_seconds": round(self._load_seconds, 3),
                "tokens_per_s": round(self._tokens / secs, 2) if secs else None,
                "prompts_per_s": round(self._prompts / secs, 3) if secs else None}
