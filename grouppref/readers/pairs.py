"""TRL preference rows (``prompt``/``chosen``/``rejected``, optionally ``p``, ``weight``,
``group_id``, ``chosen_id``, ``rejected_id``) read as groups of K=2 (:func:`pair_group`).
TRL's forms: standard (strings), conversational (chat turns; ``chosen``/``rejected`` one
assistant turn or the whole conversation repeating the prompt's turns) and implicit prompt
(no ``prompt`` column: the turns both conversations share are the prompt)."""

from __future__ import annotations

import math
from typing import Any, Literal

from grouppref.readers.rows import maybe_json
from grouppref.runs.hashing import canonical_json, sha256_text
from grouppref.schemas import (
    Agreement,
    Candidate,
    CandidateSource,
    ChatMessage,
    PairPreference,
    Prompt,
    ValidatedGroup,
    make_candidate_id,
    make_group_id,
)

FROM_PAIR = "from_pair"  # flag of a K=2 group read from one preference pair
_P_CAP = 1 - 1e-9  # strengths are finite: logit(p) with p capped below 1


def _pair_prompt(value: Any) -> Prompt:
    value = maybe_json(value)
    if isinstance(value, str):
        probe = Prompt(prompt_id="probe", text=value)
    elif isinstance(value, list) and all(isinstance(m, dict) for m in value):
        probe = Prompt(prompt_id="probe", messages=[ChatMessage.model_validate(
            {"role": m.get("role"), "content": m.get("content")}) for m in value])
    else:
        raise ValueError(f"prompt must be a string or a list of chat turns, got "
                         f"{type(value).__name__}")
    return probe.model_copy(update={"prompt_id": "p-" + make_group_id(probe)[2:]})


def _pair_answer(value: Any, column: str, prompt: Prompt) -> str:
    """The answer in ``value``: a string, one assistant turn, or the whole conversation that
    repeats the prompt's turns before one assistant turn (HuggingFaceH4/ultrafeedback_binarized,
    TRL's conversational form with the prompt kept in ``chosen``/``rejected``)."""
    value = maybe_json(value)
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(t, dict) for t in value):
        turns = [{"role": t.get("role"), "content": t.get("content")} for t in value]
        asked = [m.model_dump() for m in prompt.as_messages()]
        if len(turns) > len(asked) and turns[:len(asked)] == asked:
            turns = turns[len(asked):]
        if len(turns) == 1 and turns[0]["role"] == "assistant" \
                and isinstance(turns[0]["content"], str):
            return turns[0]["content"]
        raise ValueError(f"{column} holds {len(value)} chat turns; expected one assistant turn, "
                         "after the prompt's turns when it repeats them (conversations that "
                         "differ from the prompt column: `grouppref import` reads them, the "
                         "shared turns as the prompt; 'Human:/Assistant:' transcripts: "
                         "`grouppref import --layout hh`)")
    raise ValueError(f"{column} must be a string or chat turns, got {type(value).__name__}")


def _turns(value: Any) -> list[dict[str, Any]] | None:
    value = maybe_json(value)
    if isinstance(value, list) and value and all(isinstance(t, dict) for t in value):
        return [{"role": t.get("role"), "content": t.get("content")} for t in value]
    return None


def _implicit(data: dict[str, Any]) -> tuple[Prompt, str, str]:
    """TRL's implicit prompt: no prompt column, ``chosen``/``rejected`` whole conversations
    whose shared turns are the prompt and whose last turns the answers."""
    chosen, rejected = _turns(data.get("chosen")), _turns(data.get("rejected"))
    if chosen is None or rejected is None:
        raise ValueError("no prompt column, and chosen/rejected are not chat turns: give a "
                         "'prompt' column ('Human:/Assistant:' transcripts: `grouppref import "
                         "--layout hh`)")
    shared = 0
    while shared < min(len(chosen), len(rejected)) - 1 and chosen[shared] == rejected[shared]:
        shared += 1
    if shared == 0:
        raise ValueError("no prompt column, and chosen/rejected share no first turn to take "
                         "as the prompt")
    prompt = _pair_prompt(chosen[:shared])
    return (prompt, _pair_answer(chosen[shared:], "chosen", prompt),
            _pair_answer(rejected[shared:], "rejected", prompt))


def _unit(value: Any, name: str) -> float:
    """``p`` / ``weight`` of a pair row: 1 when absent."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return 1.0
    try:
        return float(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name} must be a number, got {value!r}") from e


def pair_group(data: dict[str, Any], split: Literal["train", "test"]) -> ValidatedGroup:
    """A TRL preference row as a group of K=2: candidates chosen and rejected, consensus
    chosen > rejected (one tier when ``p`` is 0.5), the one pair with the row's ``p`` and
    ``weight``, strengths ``±logit(p)/2`` (so the BT probability of the pair is ``p``), no
    rankings, flagged :data:`FROM_PAIR`. The group id hashes prompt, chosen and rejected, so
    pairs of one prompt are distinct groups; the row's ``group_id`` is kept in the prompt's
    metadata as ``source_group_id``.

    Raises:
        ValueError, ValidationError: the row cannot make a valid group (the reason says why).
    """
    if data.get("prompt") is None:
        prompt, chosen, rejected = _implicit(data)
    else:
        prompt = _pair_prompt(data.get("prompt"))
        chosen, rejected = _pair_answer(data.get("chosen"), "chosen", prompt), \
            _pair_answer(data.get("rejected"), "rejected", prompt)
    gid = "g-" + sha256_text(canonical_json([prompt.content_key(), chosen, rejected]))[:16]
    given = [data.get("chosen_id"), data.get("rejected_id")]
    ids: list[str] = ([i for i in given if isinstance(i, str)]
                      if all(isinstance(i, str) and i for i in given) and given[0] != given[1]
                      else [make_candidate_id(gid, chosen), make_candidate_id(gid, rejected)])
    if isinstance(data.get("group_id"), str):
        prompt = prompt.model_copy(update={"metadata": {"source_group_id": data["group_id"]}})
    p, weight = _unit(data.get("p"), "p"), _unit(data.get("weight"), "weight")
    capped = min(max(p, 1 - _P_CAP), _P_CAP)  # an out-of-range p is refused by PairPreference
    half = 0.5 * math.log(capped / (1 - capped))
    source = CandidateSource(kind="import")
    return ValidatedGroup(
        group_id=gid, prompt=prompt,
        candidates=[Candidate(candidate_id=ids[0], text=chosen, source=source),
                    Candidate(candidate_id=ids[1], text=rejected, source=source)],
        consensus=[[ids[0]], [ids[1]]] if p > 0.5 else [ids],
        strengths={ids[0]: half, ids[1]: -half},
        pairs=[PairPreference(winner=ids[0], loser=ids[1], p=p, weight=weight)],
        agreement=Agreement(num_annotators=0), flags=[FROM_PAIR], split=split)
