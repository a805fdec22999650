"""Sampling the candidates of served models: one request per candidate slot to an
OpenAI-compatible server, as many in flight as each server's ``concurrency`` allows.

Overlap: every request of a shard goes into one event loop at once (all models, servers and
endpoints together), and each server's connection pool lets ``concurrency`` of them run; the
others wait in arrival order. When every model of the mix is served
(:meth:`ServedSampler.sample_groups`), a prompt whose K answers are in re-samples its empty or
duplicate slots at once, while the other prompts' requests are still in flight: no round
waits for the slowest request of the shard. With a model in process in the mix, the served
slots of each round are in flight, from a background thread, while the in-process model
samples its slots of the round (:meth:`ServedSampler.sample_round`); the rounds stay, as a
re-sample needs every slot's text. Either way each draw depends only on its slot's seed, so the
groups are the same as sampling one after another.

Each request carries the slot's own seed, ``derive_seed(run seed, group id, model, slot,
attempt) mod 2**31`` (servers take 32-bit seeds), so a server that honours seeds (vLLM, SGLang,
llama.cpp; OpenAI only on a best-effort basis) gives the same candidate again when a killed
run resumes. Before any work, :meth:`ServedSampler.check` asks each server's ``/models`` for
the model and sends, per endpoint the prompts need, the first draw the stage will need there
(kept for it, so the check costs no extra request): a wrong model name, a refused key, a
sampling setting the server rejects or an answer without log-probs stop the stage at once with
one line. The ``/models`` entry also
says which server it is (:func:`~grouppref.models.served.protocol.server_kind`): for llama.cpp, vLLM
and SGLang every request carries the values that switch off their own default samplers
(``neutral_sampling``), so that the candidates are drawn with temperature and top_p alone, as
``behavior_logp`` assumes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from grouppref.models.seeds import derive_seed
from grouppref.models.served.pool import RequestRefused, ServerPool, gather
from grouppref.models.served.protocol import (
    CHAT,
    endpoint,
    neutral_params,
    param_origins,
    parse_sample,
    sample_body,
)
from grouppref.models.served.settings import ServerSettings, server_label
from grouppref.pipeline.generate.slots import Draw, ModelSlot, ShardWork, bad_slots
from grouppref.runs.hashing import canonical_json
from grouppref.schemas import Prompt, make_group_id

if TYPE_CHECKING:
    from grouppref.pipeline.generate.config import GenerateConfig

SEED_MASK = 0x7FFFFFFF
PROBE = Prompt(prompt_id="grouppref-probe", text="Say OK.")
Job = tuple[ModelSlot, int, int]  # a served model, a prompt's index in the shard, a group slot
OnAnswer = Callable[[int, int], None]  # (attempt, completion tokens) as each answer arrives


def server_settings(config: GenerateConfig) -> dict[str, ServerSettings]:
    """Base URL -> settings of every server the config samples from (the stage's ``server``
    settings, with each model's own base URL)."""
    urls = dict.fromkeys(m.base_url for m in config.served() if m.base_url)
    return {url: config.server.model_copy(update={"base_url": url}) for url in urls}


class ServedSampler:
    """Samples the slots of served models through a :class:`ServerPool`."""

    def __init__(self, pool: ServerPool, config: GenerateConfig) -> None:
        self.pool, self.config = pool, config
        self.kinds: dict[str, str | None] = {}  # base URL -> server kind (after check)
        self._neutral: dict[str, dict[str, Any]] = {}  # base URL -> its neutral values

    def server_params(self, url: str) -> dict[str, Any]:
        """What is merged last into each request body to ``url``: the neutral values of the
        server's own samplers (``neutral_sampling``), then ``server_params``."""
        return {**self._neutral.get(url, {}), **self.config.server.server_params}

    def _body(self, slot: ModelSlot, prompt: Prompt, path: str, seed: int,
              max_tokens: int | None = None) -> dict[str, Any]:
        cfg = self.config
        return sample_body(slot.name, prompt, path, temperature=cfg.temperature, top_p=cfg.top_p,
                           max_tokens=max_tokens or cfg.max_new_tokens, seed=seed, stop=cfg.stop,
                           logprobs=cfg.logprobs,
                           server_params=self.server_params(slot.share.base_url or ""))

    def check(self, slots: Sequence[ModelSlot], prompts: Sequence[Prompt],
              first_draws: bool = True) -> None:
        """Check every served model and probe each endpoint the prompts need.

        The probe of an endpoint is the first draw the stage needs there anyway (the first
        prompt for that endpoint, the model's first slot, attempt 0), sent with
        :meth:`ServerPool.first_request`, which keeps its answer for that draw: checking costs
        no request beyond ``GET /models``. When that request is refused, a short probe tells a
        refused setting (an error) from a refused prompt (that prompt is rejected as usual);
        with ``first_draws`` off (a resumed stage, whose first prompts may be done) the short
        probe is all that is sent.

        Raises:
            ServerError: unreachable, unknown model, refused key, a refused probe (naming the
                setting of a refused field) or an answer without log-probs (when asked for).
        """
        firsts: dict[str, Prompt | None] = {endpoint(p, self.config.chat_template): p
                                            for p in reversed(prompts)}
        for slot in slots:
            url = slot.share.base_url or ""
            self.kinds[url], self._neutral[url] = neutral_params(
                self.config.neutral_sampling, self.pool.check_model(url, slot.name))
            for path, prompt in sorted(firsts.items()) or [(CHAT, None)]:
                probe = self._body(slot, PROBE, path, 0, 1)
                if first_draws and prompt is not None:
                    seed = derive_seed(self.config.seed, make_group_id(prompt), slot.name,
                                       slot.slots[0], 0) & SEED_MASK
                    answer = self.pool.first_request(url, path, self._body(slot, prompt, path, seed),
                                                     probe, self._origins(url))
                else:
                    answer = self.pool.probe(url, path, probe, self._origins(url))
                parse_sample(answer, path, want_logprobs=self.config.logprobs)

    def _origins(self, url: str) -> dict[str, str]:
        own = {"temperature": "temperature", "top_p": "top_p", "max_tokens": "max_new_tokens",
               "stop": "stop", "logprobs": "logprobs", "top_logprobs": "logprobs"}
        return param_origins(self.config.neutral_sampling, self.kinds.get(url),
                             self.config.server.server_params, own)

    async def sample_round(self, jobs: Sequence[Job], attempt: int, work: ShardWork,
                           on_answer: OnAnswer) -> None:
        """Sample every job of one round (attempt number ``attempt``) into ``work.draws``, all
        in flight together up to each server's concurrency; a prompt the server refuses goes to
        ``work.refused`` with the server's message. A coroutine for the pool's event loop
        (``pool.start``: in a thread, while the models in process sample the round's other
        slots)."""
        await gather([self._draw(job, attempt, work, on_answer) for job in jobs])

    def sample_groups(self, jobs: Sequence[Job], work: ShardWork, on_answer: OnAnswer) -> None:
        """Sample ``jobs`` (every slot of each of their prompts: a mix of served models only)
        and re-sample empty or duplicate slots, up to ``max_resample`` times, prompt by prompt
        as soon as the prompt's answers are in: the same draws as rounds over the whole shard
        (each slot's seed depends only on its attempt number), without their barriers."""
        by_prompt: dict[int, list[tuple[ModelSlot, int]]] = defaultdict(list)
        for model, i, s in jobs:
            by_prompt[i].append((model, s))

        async def one_prompt(i: int, slots: list[tuple[ModelSlot, int]]) -> None:
            for attempt in range(self.config.max_resample + 1):
                await gather([self._draw((m, i, s), attempt, work, on_answer) for m, s in slots])
                bad = set(bad_slots(work.draws[i])) if i not in work.refused else set()
                slots = [(m, s) for m, s in slots if s in bad]
                if not slots:
                    return

        self.pool.run(gather([one_prompt(i, slots) for i, slots in by_prompt.items()]))

    async def _draw(self, job: Job, attempt: int, work: ShardWork, on_answer: OnAnswer) -> None:
        """One request: the slot's draw, or the prompt refused."""
        cfg, (model, i, s) = self.config, job
        prompt = work.prompts[i]
        path = endpoint(prompt, cfg.chat_template)
        seed = derive_seed(cfg.seed, work.gids[i], model.name, s, attempt) & SEED_MASK
        url = model.share.base_url or ""
        # (the first draw was sent by check, before the stage: the pool hands back its answer)
        answer = await self.pool.request(url, path, self._body(model, prompt, path, seed))
        if isinstance(answer, RequestRefused):
            work.refused.setdefault(i, f"the server refused it: {answer}")
            on_answer(attempt, 0)
            return
        sample = parse_sample(answer, path, want_logprobs=cfg.logprobs)
        work.draws[i][s] = Draw(sample.text, sample.num_tokens, sample.logp,
                                sample.finish_reason == "stop", seed, attempt, sample.finish_reason)
        on_answer(attempt, _completion_tokens(answer))

    def params(self, slot: ModelSlot, draw: Draw) -> dict[str, str | int | float | bool]:
        """What a served candidate records beyond the common sampling parameters."""
        cfg = self.config
        out: dict[str, str | int | float | bool] = {
            "backend": "openai", "server": server_label(slot.share.base_url or ""),
            "finish_reason": draw.finish_reason or "unknown"}
        if cfg.stop:
            out["stop"] = canonical_json(cfg.stop)
        if params := self.server_params(slot.share.base_url or ""):
            out["server_params"] = canonical_json(params)
        return out


def _completion_tokens(answer: dict[str, Any]) -> int:
    tokens = (answer.get("usage") or {}).get("completion_tokens")
    return tokens if isinstance(tokens, int) else 0
