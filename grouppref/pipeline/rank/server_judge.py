"""An LLM judge served by an OpenAI-compatible server (``judge`` with ``backend: openai``).

Every judge question is one ``/chat/completions`` request (the server applies the model's chat
template). All of a shard's requests, this judge's and those of the stage's other served judges,
go out at once on one event loop, up to each server's ``concurrency``
(:mod:`~grouppref.pipeline.rank.shard_scoring`):

- **pointwise**: the in-process judge's question (:data:`POINTWISE_TEMPLATE`), one token asked
  for with its ``top_logprobs``; the score is :func:`verdict_log_odds` of Yes against No.
- **pairwise**: every ordered pair (i as A, j as B; both orders), ``d[i, j]`` = log-odds of A
  against B; the score is :func:`~grouppref.pipeline.rank.scoring.pairwise_scores` (the
  position bias cancels).
- **rubric**: a 1-10 rating per candidate with a rationale (UltraFeedback style), greedy, read by
  :func:`parse_rating`, which never guesses: an answer that is not exactly one rating in range
  skips the group (a counted part-reject naming the candidate and the answer). The ratings and
  rationales go to the ranking's metadata (``rating:<candidate_id>``, ``rationale:<...>``).

Log-probs are read at temperature 1 and top_p 1, so servers that report the processed
distribution (TGI; SGLang by default) report the model's own one here too. The samplers a
server applies beyond those (llama.cpp's top_k, min_p and repeat penalty, the model's
generation config in vLLM and SGLang) are switched off in every request of every mode for the
servers ``GET /models`` names (``neutral_sampling``, as in ``generate``): a repeat penalty must
not move a greedy rating, nor a processed distribution a verdict's log-odds. The values sent
are in each ranking's metadata (``server_params``).

No request is spent on checking: before the stage opens, each judge's first question (the
first group's first one) goes out alone and its answer is kept for the shard that asks it
(:meth:`~grouppref.models.served.pool.ServerPool.first_request`), so a bad URL, model, key or setting
stops the stage with one line. Only when that question is refused does a short probe tell a
refused setting from a refused prompt; a resumed stage sends the probe instead.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

import torch

from grouppref.models.served.pool import RequestRefused, ServerError, ServerPool, gather
from grouppref.models.served.protocol import (
    CHAT,
    answer_text,
    first_token_top_logprobs,
    merge_params,
    neutral_params,
    param_origins,
)
from grouppref.models.served.settings import read_api_key, server_label
from grouppref.pipeline.rank import judge_prompts
from grouppref.pipeline.rank import scoring as rs
from grouppref.pipeline.rank.outcomes import Judged, Outcome, RankerInputError, Skip
from grouppref.pipeline.rank.settings import JudgeRankerSettings
from grouppref.runs.hashing import canonical_json
from grouppref.schemas import CandidateGroup
from grouppref.schemas.reports import ServerUsage

RUBRIC_TEMPLATE = ("Here is a request and a response.\n\n[Request]\n{prompt}\n\n[Response]\n"
                   "{answer}\n\n{rubric} Rate the response from 1 (worst) to 10 (best).")
TEXT_REPLY = ("\nReply in exactly this form:\nRating: <an integer from 1 to 10>\n"
              "Rationale: <one or two sentences>")
JSON_REPLY = ('\nReply with a JSON object only: {"rating": <an integer from 1 to 10>, '
              '"rationale": "<one or two sentences>"}')
RATING_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"rating": {"type": "integer", "enum": list(range(1, 11))},
                   "rationale": {"type": "string"}},
    "required": ["rating", "rationale"], "additionalProperties": False}
_RATING_LINE = re.compile(r"^[\s*#_]*rating[\s*_]*[:=][\s*_]*(\S+?)[\s*_]*(?:/\s*10)?[\s*_.]*$",
                          re.IGNORECASE | re.MULTILINE)
_RATIONALE = re.compile(r"^[\s*#_]*rationale[\s*_]*[:=]\s*", re.IGNORECASE | re.MULTILINE)
RATIONALE_CHARS = 2000
# json_object: the rationale's most characters, so that an enforced answer ends inside
# answer_tokens (a token is at least one character; the rest of the object and its whitespace
# take at most JSON_OVERHEAD_TOKENS), else a degenerate rationale ("1.1.1...") is cut off
RATIONALE_JSON_CHARS, JSON_OVERHEAD_TOKENS = 300, 48


def verdict_log_odds(top: dict[str, float], positive: str, negative: str,
                     ) -> tuple[float, bool] | None:
    """``log P(positive) - log P(negative)`` of the next token, from its top log-probs.

    Tokens count for a verdict when they equal it after stripping whitespace and case
    (``"Yes"``, ``" yes"``); the probabilities of such variants add up (log-sum-exp). A verdict
    missing from the top list gets the smallest listed log-prob, an upper bound on its own, so the
    log-odds is then a bound towards 0 (``bounded`` is True).

    Returns:
        ``(log_odds, bounded)``, or None when neither verdict is among the top tokens.

    Example:
        >>> verdict_log_odds({"Yes": -0.5, " yes": -2.0, "No": -1.5}, "yes", "no")[0]  # doctest: +ELLIPSIS
        1.2014...
    """
    def mass(word: str) -> float | None:
        values = [v for token, v in top.items() if token.strip().casefold() == word]
        return None if not values else math.log(math.fsum(math.exp(v) for v in values))

    pos, neg = mass(positive), mass(negative)
    if pos is None and neg is None:
        return None
    floor = min(top.values())
    return (pos if pos is not None else floor) - (neg if neg is not None else floor), (
        pos is None or neg is None)


def parse_rating(answer: str, json_reply: bool) -> tuple[int, str]:
    """The rating (1-10) and rationale in a judge's answer; nothing is guessed.

    Text form: exactly one line ``Rating: N`` (``N`` an integer 1-10, ``/10`` and markdown
    emphasis allowed); the rationale is what follows ``Rationale:``, else the rest of the
    answer. JSON form: an object with an integer ``rating`` in 1-10 and a string ``rationale``.

    Raises:
        RankerInputError: anything else (no rating, several, a fraction, out of range, bad JSON).

    Example:
        >>> parse_rating("Rating: 7/10\\nRationale: Correct but terse.", json_reply=False)
        (7, 'Correct but terse.')
    """
    if json_reply:
        try:
            data = json.loads(answer)
        except ValueError as e:
            raise RankerInputError("not a JSON object") from e
        rating = data.get("rating") if isinstance(data, dict) else None
        rationale = data.get("rationale") if isinstance(data, dict) else None
        if not isinstance(rating, int) or isinstance(rating, bool) or not isinstance(rationale, str):
            raise RankerInputError('not {"rating": <integer>, "rationale": <text>}')
        text = rationale
    else:
        found = _RATING_LINE.findall(answer)
        if len(found) != 1:
            raise RankerInputError("no 'Rating: N' line" if not found else
                                   f"{len(found)} 'Rating:' lines")
        if not found[0].isdigit():
            raise RankerInputError(f"rating {found[0]!r} is not an integer")
        rating = int(found[0])
        rest = _RATIONALE.split(answer, maxsplit=1)
        text = rest[1] if len(rest) > 1 else _RATING_LINE.sub("", answer)
    if not 1 <= rating <= 10:
        raise RankerInputError(f"rating {rating} is not in 1-10")
    return rating, text.strip()[:RATIONALE_CHARS]


class ServerJudgeRanker:
    """The ``judge`` ranker on an OpenAI-compatible server (see the module docstring)."""

    def __init__(self, settings: JudgeRankerSettings) -> None:
        self.settings = settings
        self.url = settings.server.base_url or ""
        self.pool: ServerPool | None = None
        self._owns_pool = False  # False: a pool the stage shares among its served judges
        self._opened = False  # the model is checked (GET /models) and the server kind known
        self._checked = False  # the settings are checked with one request through this pool
        self._kind: str | None = None
        self._neutral: dict[str, Any] = {}
        self._usage: list[ServerUsage] = []

    def model_path(self) -> None:
        """None: the weights behind a server cannot be fingerprinted (its URL and model name
        are in the settings, hence in the cache key)."""
        return None

    def check(self) -> None:
        """Raise ``ConfigError`` when the named API-key variable is not set (no request yet)."""
        read_api_key(self.settings.server.api_key_env)

    def attach(self, pool: ServerPool) -> None:
        """Send through ``pool``, which the rank stage shares among its served judges (it holds
        a client for this judge's URL; the stage counts its usage and closes it)."""
        self.pool, self._owns_pool, self._opened, self._checked = pool, False, False, False

    def load(self) -> None:
        """Check the model on the server (``GET /models``, which also says which server it is:
        ``neutral_sampling``), through the attached pool or a pool of its own. The judge's
        settings are checked by the first question :meth:`score` sends (:meth:`connect`)."""
        if self._opened:
            return
        if self.pool is None:
            self.pool = ServerPool({self.url: self.settings.server})
            self.pool.__enter__()
            self._owns_pool = True
        entry = self.pool.check_model(self.url, self.settings.model or "")
        self._kind, self._neutral = neutral_params(self.settings.neutral_sampling, entry)
        self._opened = True

    def connect(self, first: CandidateGroup | None = None) -> None:
        """:meth:`load`, then check the judge's settings with one request (once per pool): the
        first question about ``first``, whose answer the pool keeps for the :meth:`score` that
        asks it (so the check costs no request), or, without ``first`` (a resumed stage), a
        short probe. A refused first question is told from refused settings by a short probe.
        The rank stage calls it before it opens the stage, so a bad URL, model, key or setting
        leaves the run as it was.

        Raises:
            ServerError: unreachable, unknown model, refused key, refused settings (naming the
                setting of a refused field), or, for the log-prob modes, no top log-probs.
        """
        self.load()
        if self._checked or self.pool is None:
            return
        s = self.settings
        probe = self._body("Answer with Yes or No." if s.mode != "rubric" else "Say OK.")
        probe["max_tokens"] = 1
        questions = self.questions(first) if first is not None else []
        origins = param_origins(s.neutral_sampling, self._kind, s.server.server_params, {
            "max_tokens": "answer_tokens", "top_logprobs": "top_logprobs",
            "response_format": "structured_output"})
        answer = (self.pool.first_request(self.url, CHAT, self._body(questions[0]), probe, origins)
                  if questions else self.pool.probe(self.url, CHAT, probe, origins))
        if s.mode != "rubric" and not first_token_top_logprobs(answer, CHAT):
            raise ServerError(f"judge {s.model!r} at {server_label(self.url)}: no top log-probs "
                              f"in its answer; the {s.mode} mode reads the verdict's top "
                              "log-probs (use mode rubric with a server without them)")
        self._checked = True

    def close(self) -> None:
        """Close its own connection pool (keeping its usage counts), or let go of a shared one."""
        if self.pool is not None and self._owns_pool:
            self._usage = self.pool.usage()
            self.pool.__exit__(None, None, None)
        self.pool, self._owns_pool, self._opened, self._checked = None, False, False, False

    def usage(self) -> list[ServerUsage]:
        """Requests and tokens so far (this session) through a pool of its own; a shared
        pool's usage is counted by its owner."""
        return self.pool.usage() if self.pool is not None and self._owns_pool else self._usage

    # -- requests -----------------------------------------------------------------------------
    def server_params(self) -> dict[str, Any]:
        """What is merged last into each request body: the neutral values of the server's own
        samplers (``neutral_sampling``, known after :meth:`load`), then ``server_params``."""
        return {**self._neutral, **self.settings.server.server_params}

    def _body(self, content: str) -> dict[str, Any]:
        s = self.settings
        body: dict[str, Any] = {"model": s.model, "messages": [{"role": "user", "content": content}],
                                "seed": 0, "n": 1}
        if s.mode == "rubric":
            body.update(max_tokens=s.answer_tokens, temperature=0.0)
            if s.structured_output == "json_schema":
                body["response_format"] = {"type": "json_schema", "json_schema": {
                    "name": "rating", "strict": True, "schema": RATING_SCHEMA}}
            elif s.structured_output == "json_object":  # llama.cpp's form; it bounds lengths too
                schema = {**RATING_SCHEMA, "properties": {
                    **RATING_SCHEMA["properties"],
                    "rationale": {"type": "string", "maxLength": max(1, min(
                        RATIONALE_JSON_CHARS, s.answer_tokens - JSON_OVERHEAD_TOKENS))}}}
                body["response_format"] = {"type": "json_object", "schema": schema}
        else:
            body.update(max_tokens=1, temperature=1.0, top_p=1.0, logprobs=True,
                        top_logprobs=s.top_logprobs)
        return merge_params(body, self.server_params())

    def questions(self, group: CandidateGroup) -> list[str]:
        """The judge questions of one group: K (pointwise, rubric) or K(K-1) (pairwise,
        row-major i, j)."""
        s, p = self.settings, group.prompt.display_text()
        texts = [c.text for c in group.candidates]
        if s.mode == "pointwise":
            return [judge_prompts.POINTWISE_TEMPLATE.format(prompt=p, answer=t, question=s.question)
                    for t in texts]
        if s.mode == "pairwise":
            return [judge_prompts.PAIRWISE_TEMPLATE.format(prompt=p, a=a, b=b)
                    for i, a in enumerate(texts) for j, b in enumerate(texts) if i != j]
        reply = TEXT_REPLY if s.structured_output == "none" else JSON_REPLY
        return [RUBRIC_TEMPLATE.format(prompt=p, answer=t, rubric=s.rubric) + reply for t in texts]

    def score(self, groups: Sequence[CandidateGroup]) -> list[Outcome]:
        """Per group: scores (pointwise, pairwise), :class:`Judged` (rubric, or verdicts that
        were bounds), or a :class:`Skip` with the reason. The first call checks the settings
        with its first question (:meth:`connect`)."""
        if not groups:
            return []
        self.connect(groups[0])
        if self.pool is None:
            raise RuntimeError("load() the judge first")
        return self.pool.run(self.score_async(groups))

    async def score_async(self, groups: Sequence[CandidateGroup]) -> list[Outcome]:
        """:meth:`score` as a coroutine on the pool's event loop, so that other judges' requests
        (:class:`~grouppref.pipeline.rank.shard_scoring.ShardScorer`) are in flight with these;
        every question of every group is sent at once (the server's limit applies)."""
        if self.pool is None:
            raise RuntimeError("load() the judge first")
        questions = [self.questions(g) for g in groups]
        bodies = [self._body(q) for qs in questions for q in qs]
        answers = await gather([self.pool.request(self.url, CHAT, b) for b in bodies])
        out: list[Outcome] = []
        at = 0
        for group, qs in zip(groups, questions, strict=True):
            mine = answers[at:at + len(qs)]
            at += len(qs)
            out.append(self._outcome(group, mine))
        return out

    def _outcome(self, group: CandidateGroup, answers: list[dict[str, Any] | RequestRefused]
                 ) -> Outcome:
        refused = next((a for a in answers if isinstance(a, RequestRefused)), None)
        if refused is not None:
            return Skip(f"the server refused a judge request: {refused}")
        answered = [a for a in answers if isinstance(a, dict)]
        try:
            out = (self._rubric(group, answered) if self.settings.mode == "rubric"
                   else self._verdicts(group, answered))
        except RankerInputError as e:
            return Skip(str(e))
        if not (params := self.server_params()):
            return out
        scores, notes = (out.scores, out.metadata) if isinstance(out, Judged) else (out, {})
        return Judged(scores, {**notes, "server_params": canonical_json(params)})

    def _verdicts(self, group: CandidateGroup, answers: list[dict[str, Any]]) -> list[float] | Judged:
        pointwise = self.settings.mode == "pointwise"
        words = ("yes", "no") if pointwise else ("a", "b")
        values, bounded = [], 0
        for n, answer in enumerate(answers):
            top = first_token_top_logprobs(answer, CHAT)
            verdict = verdict_log_odds(top, *words)
            if verdict is None:
                shown = ", ".join(repr(t) for t in list(top)[:5])
                which = group.candidates[n].candidate_id if pointwise else f"pair {n}"
                raise RankerInputError(f"{which}: neither {words[0]!r} nor {words[1]!r} among the "
                                       f"judge's top {len(top)} tokens ({shown})")
            values.append(verdict[0])
            bounded += verdict[1]
        if pointwise:
            scores = values
        else:
            k = group.k
            d = torch.zeros((k, k), dtype=torch.float64)
            d[~torch.eye(k, dtype=torch.bool)] = torch.tensor(values, dtype=torch.float64)
            scores = rs.pairwise_scores(d).tolist()
        return Judged(scores, {"bounded_verdicts": bounded}) if bounded else scores

    def _rubric(self, group: CandidateGroup, answers: list[dict[str, Any]]) -> Judged:
        json_reply = self.settings.structured_output != "none"
        scores: list[float] = []
        notes: dict[str, str | int | float | bool] = {}
        for candidate, answer in zip(group.candidates, answers, strict=True):
            text = answer_text(answer, CHAT)
            try:
                rating, rationale = parse_rating(text, json_reply)
            except RankerInputError as e:
                raise RankerInputError(f"{candidate.candidate_id}: the judge's answer is not a "
                                       f"rating ({e}): {text[:120]!r}") from e
            scores.append(float(rating))
            notes[f"rating:{candidate.candidate_id}"] = rating
            notes[f"rationale:{candidate.candidate_id}"] = rationale
        return Judged(scores, notes)
