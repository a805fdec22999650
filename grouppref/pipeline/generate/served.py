"""Sampling the candidates of served models: one request per candidate slot to an
OpenAI-compatible server, every request of a round in flight at once (up to ``concurrency``).

Each request carries the slot's own seed, ``derive_seed(run seed, group id, model, slot,
attempt) mod 2**31`` (servers take 32-bit seeds), so a server that honours seeds (vLLM, SGLang,
llama.cpp; OpenAI only on a best-effort basis) gives the same candidate again when a killed
run resumes. Before any work, :meth:`ServedSampler.check` asks each server's ``/models`` for
the model and sends one probe request per endpoint the prompts need, with the run's own
sampling settings: a wrong model name, a refused key, a sampling setting the server rejects or
an answer without log-probs stop the stage at once with one line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from grouppref.models.openai import RequestRefused, ServerError, ServerPool
from grouppref.models.openai_api import (
    CHAT,
    endpoint,
    parse_sample,
    sample_body,
)
from grouppref.models.seeds import derive_seed
from grouppref.models.server_settings import ServerSettings, server_label
from grouppref.pipeline.generate.work import Draw, ModelSlot, ShardWork
from grouppref.runs.hashing import canonical_json
from grouppref.schemas import Prompt

if TYPE_CHECKING:
    from grouppref.pipeline.generate.config import GenerateConfig

SEED_MASK = 0x7FFFFFFF
PROBE = Prompt(prompt_id="grouppref-probe", text="Say OK.")


def server_settings(config: GenerateConfig) -> dict[str, ServerSettings]:
    """Base URL -> settings of every server the config samples from (the stage's ``server``
    settings, with each model's own base URL)."""
    urls = dict.fromkeys(m.base_url for m in config.served() if m.base_url)
    return {url: config.server.model_copy(update={"base_url": url}) for url in urls}


class ServedSampler:
    """Samples the slots of served models through a :class:`ServerPool`."""

    def __init__(self, pool: ServerPool, config: GenerateConfig) -> None:
        self.pool, self.config = pool, config

    def _body(self, slot: ModelSlot, prompt: Prompt, path: str, seed: int,
              max_tokens: int | None = None) -> dict[str, Any]:
        cfg = self.config
        return sample_body(slot.name, prompt, path, temperature=cfg.temperature, top_p=cfg.top_p,
                           max_tokens=max_tokens or cfg.max_new_tokens, seed=seed, stop=cfg.stop,
                           logprobs=cfg.logprobs, server_params=cfg.server.server_params)

    def check(self, slots: Sequence[ModelSlot], prompts: Sequence[Prompt]) -> None:
        """Check every served model and probe each endpoint the prompts need (one short request).

        Raises:
            ServerError: unreachable, unknown model, refused key, a refused probe or an answer
                without log-probs (when they are asked for).
        """
        paths = sorted({endpoint(p, self.config.chat_template) for p in prompts}) or [CHAT]
        for slot in slots:
            url = slot.share.base_url or ""
            self.pool.check_model(url, slot.name)
            for path in paths:
                [answer] = self.pool.post(url, path, [self._body(slot, PROBE, path, 0, 1)])
                if isinstance(answer, RequestRefused):
                    raise ServerError(f"model {slot.name!r} at {server_label(url)} refuses "
                                      f"grouppref's requests ({answer}); check the sampling "
                                      "settings and --server-param")
                parse_sample(answer, path, want_logprobs=self.config.logprobs)

    def sample(self, slot: ModelSlot, jobs: list[tuple[int, int]], attempt: int, work: ShardWork,
               on_answer: Callable[[int], None]) -> None:
        """Sample every ``(prompt index, slot)`` of ``jobs`` into ``work.draws``; a prompt the
        server refuses goes to ``work.refused`` with the server's message."""
        cfg, url = self.config, slot.share.base_url or ""
        for path in sorted({endpoint(work.prompts[i], cfg.chat_template) for i, _ in jobs}):
            batch = [(i, s) for i, s in jobs if endpoint(work.prompts[i], cfg.chat_template) == path]
            seeds = [derive_seed(cfg.seed, work.gids[i], slot.name, s, attempt) & SEED_MASK
                     for i, s in batch]
            bodies = [self._body(slot, work.prompts[i], path, seed)
                      for (i, _), seed in zip(batch, seeds, strict=True)]
            answers = self.pool.post(url, path, bodies, on_answer=lambda _, answer: on_answer(
                0 if isinstance(answer, RequestRefused) else _completion_tokens(answer)))
            for (i, s), seed, answer in zip(batch, seeds, answers, strict=True):
                if isinstance(answer, RequestRefused):
                    work.refused.setdefault(i, f"the server refused it: {answer}")
                    continue
                sample = parse_sample(answer, path, want_logprobs=cfg.logprobs)
                work.draws[i][s] = Draw(sample.text, sample.num_tokens, sample.logp,
                                        sample.finish_reason == "stop", seed, attempt,
                                        sample.finish_reason)

    def params(self, slot: ModelSlot, draw: Draw) -> dict[str, str | int | float | bool]:
        """What a served candidate records beyond the common sampling parameters."""
        cfg = self.config
        out: dict[str, str | int | float | bool] = {
            "backend": "openai", "server": server_label(slot.share.base_url or ""),
            "finish_reason": draw.finish_reason or "unknown"}
        if cfg.stop:
            out["stop"] = canonical_json(cfg.stop)
        if cfg.server.server_params:
            out["server_params"] = canonical_json(cfg.server.server_params)
        return out


def _completion_tokens(answer: dict[str, Any]) -> int:
    tokens = (answer.get("usage") or {}).get("completion_tokens")
    return tokens if isinstance(tokens, int) else 0
