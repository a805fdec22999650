"""The Argilla dataset of a run: its settings, its records, and rankings read back from it.

One record per group (record ``external_id`` = ``group_id``, so pushing again updates it):

- fields ``prompt`` and ``response_1 .. response_K`` (K = the largest group; ``response_i`` with
  i > k are *optional* fields left out for a group of k < K candidates);
- a ``ranking`` question (Argilla's RankingQuestion) over ``response_1 .. response_K``, and an
  optional free-text ``rationale`` question;
- metadata properties ``group_id`` (terms), ``models`` (terms) and ``k`` (integer), plus the
  extra metadata ``candidate_ids`` = ``{"response_i": candidate_id}``: the map pull needs to
  turn an annotator's ranking back into candidate ids;
- a suggestion for ``ranking`` from one automatic ranking (agent = its annotator id, score =
  its per-candidate scores scaled to [0, 1]);
- task distribution ``overlap`` with ``min_submitted = N`` (Argilla's ``TaskDistribution``).

Argilla requires a submitted ranking to rank *every* option, so for a group of k < K
candidates the annotator also places the empty slots; pull ignores them and keeps the relative
order of the k real candidates.

All functions here are pure (JSON in, JSON out): the settings are written as the REST payloads
the SDK would send, so they can be built and checked without a server.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from grouppref.schemas import MAX_K, MIN_K, AnnotatedGroup, Annotator, Ranking, check_tiers

SCHEMA_VERSION = "1"
RANKING = "ranking"
RATIONALE = "rationale"
MAPPING_KEY = "candidate_ids"
DEFAULT_GUIDELINES = (
    "Rank the responses to the prompt from best (1) to worst. Judge helpfulness, correctness "
    "and harmlessness. Empty response slots (groups with fewer candidates) can go anywhere: "
    "they are ignored. Responses you find equally good may share a rank."
)


class DatasetSpec(BaseModel):
    """The shape of a run's Argilla dataset: what ``push`` creates and checks."""

    model_config = ConfigDict(extra="forbid")

    k: int = Field(ge=MIN_K, le=MAX_K, description="Number of response slots (the largest group).")
    min_submitted: int = Field(default=1, ge=1,
                               description="Submitted rankings needed before a group counts "
                               "as completed (Argilla TaskDistribution min_submitted).")
    rationale: bool = Field(default=True, description="Add an optional free-text rationale "
                            "question next to the ranking.")
    use_markdown: bool = Field(default=False, description="Render prompt and responses as "
                               "Markdown in the Argilla UI.")
    guidelines: str = Field(default=DEFAULT_GUIDELINES, min_length=1, max_length=10000,
                            description="Annotation guidelines shown in Argilla.")


def response_field(i: int) -> str:
    """Name of the i-th (1-based) response field."""
    return f"response_{i}"


def dataset_payload(name: str, workspace_id: str, spec: DatasetSpec) -> dict[str, Any]:
    """Body of ``POST /api/v1/datasets``."""
    return {
        "name": name,
        "workspace_id": workspace_id,
        "guidelines": spec.guidelines,
        "allow_extra_metadata": True,  # carries the candidate id map
        "distribution": {"strategy": "overlap", "min_submitted": spec.min_submitted},
        "metadata": {"grouppref_schema": SCHEMA_VERSION, "k": spec.k},
    }


def fields_payload(spec: DatasetSpec) -> list[dict[str, Any]]:
    """Bodies of ``POST /api/v1/datasets/{id}/fields``, in display order."""
    text = {"type": "text", "use_markdown": spec.use_markdown}
    fields = [{"name": "prompt", "title": "Prompt", "required": True, "settings": text}]
    fields += [{"name": response_field(i), "title": f"Response {i}", "required": False,
                "settings": text} for i in range(1, spec.k + 1)]
    return fields


def questions_payload(spec: DatasetSpec) -> list[dict[str, Any]]:
    """Bodies of ``POST /api/v1/datasets/{id}/questions``."""
    options = [{"value": response_field(i), "text": f"Response {i}"}
               for i in range(1, spec.k + 1)]
    questions = [{"name": RANKING, "title": "Rank the responses, best first",
                  "description": "1 = best. Equally good responses may share a rank.",
                  "required": True, "settings": {"type": "ranking", "options": options}}]
    if spec.rationale:
        questions.append({"name": RATIONALE, "title": "Why? (optional)", "required": False,
                          "settings": {"type": "text", "use_markdown": False}})
    return questions


def metadata_payload() -> list[dict[str, Any]]:
    """Bodies of ``POST /api/v1/datasets/{id}/metadata-properties``."""
    return [
        {"name": "group_id", "title": "Group id", "settings": {"type": "terms"},
         "visible_for_annotators": False},
        {"name": "models", "title": "Models", "settings": {"type": "terms"},
         "visible_for_annotators": False},
        {"name": "k", "title": "Candidates", "settings": {"type": "integer"},
         "visible_for_annotators": True},
    ]


# -- schema check ----------------------------------------------------------------------------
def schema_summary(dataset: dict[str, Any], fields: list[dict[str, Any]],
                   questions: list[dict[str, Any]], metadata: list[dict[str, Any]]
                   ) -> dict[str, Any]:
    """The parts of a dataset grouppref depends on, in one comparable form.

    Takes the same shapes as the create payloads and as the server's GET answers, so the
    expected and the actual dataset go through the same function.
    """
    def need(item: dict[str, Any]) -> str:
        return "required" if item.get("required") else "optional"

    def question(q: dict[str, Any]) -> str:
        settings = q["settings"]
        if settings["type"] == "ranking":
            options = ", ".join(o["value"] for o in settings["options"])
            return f"ranking of [{options}], {need(q)}"
        return f"{settings['type']}, {need(q)}"

    return {
        "allow_extra_metadata": bool(dataset.get("allow_extra_metadata")),
        "min_submitted": (dataset.get("distribution") or {}).get("min_submitted"),
        "fields": {f["name"]: f"{f['settings']['type']}, {need(f)}" for f in fields},
        "questions": {q["name"]: question(q) for q in questions},
        "metadata": {m["name"]: m["settings"]["type"] for m in metadata},
    }


def expected_summary(spec: DatasetSpec) -> dict[str, Any]:
    """:func:`schema_summary` of the dataset ``spec`` describes."""
    return schema_summary(dataset_payload("", "", spec), fields_payload(spec),
                          questions_payload(spec), metadata_payload())


def schema_diff(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    """One line per difference between two :func:`schema_summary` results (empty: same)."""
    lines: list[str] = []
    for key in ("allow_extra_metadata", "min_submitted"):
        if expected[key] != actual[key]:
            lines.append(f"{key}: Argilla has {actual[key]!r}, the run needs {expected[key]!r}")
    for part in ("fields", "questions", "metadata"):
        want, have = expected[part], actual[part]
        kind = part.removesuffix("s")
        for name in sorted(set(want) | set(have)):
            if name not in have:
                lines.append(f"{kind} {name!r}: missing in Argilla (the run needs: {want[name]})")
            elif name not in want:
                lines.append(f"{kind} {name!r}: in Argilla ({have[name]}) but not in the run")
            elif want[name] != have[name]:
                lines.append(f"{kind} {name!r}: Argilla has ({have[name]}), the run needs "
                             f"({want[name]})")
    return lines


def existing_k(fields: list[dict[str, Any]]) -> int:
    """How many ``response_i`` slots a dataset has (0 if none)."""
    names = {f["name"] for f in fields}
    k = 0
    while response_field(k + 1) in names:
        k += 1
    return k


# -- records ---------------------------------------------------------------------------------
def candidate_map(group: AnnotatedGroup) -> dict[str, str]:
    """``{"response_i": candidate_id}`` in the group's candidate order."""
    return {response_field(i + 1): c.candidate_id for i, c in enumerate(group.candidates)}


def pick_suggestion(group: AnnotatedGroup, suggest_from: str | None) -> Ranking | None:
    """The automatic ranking to suggest: ``suggest_from``'s, else the first non-human one."""
    for r in group.rankings:
        if suggest_from is not None and r.annotator.id == suggest_from:
            return r
    if suggest_from is not None:
        return None
    return next((r for r in group.rankings if r.annotator.kind != "human"), None)


def scaled_scores(ranking: Ranking, ids: list[str]) -> list[float] | None:
    """The ranking's scores for ``ids`` min-max scaled to [0, 1] (Argilla's score range).

    ``x' = (x - min) / (max - min)``; all-equal scores give 0.5. ``None`` when the ranking has
    no score for one of ``ids``.
    """
    if ranking.scores is None or any(cid not in ranking.scores for cid in ids):
        return None
    xs = [ranking.scores[cid] for cid in ids]
    lo, hi = min(xs), max(xs)
    if math.isclose(lo, hi):
        return [0.5] * len(xs)
    return [round((x - lo) / (hi - lo), 6) for x in xs]


def suggestion_agent(ranking: Ranking) -> str:
    """``annotator id[:version]`` with characters Argilla refuses in an agent replaced by ``_``."""
    a = ranking.annotator
    text = a.id + (f":{a.version}" if a.version else "")
    return re.sub(r"[^a-zA-Z0-9\-_:./ ]", "_", text)[:200]


def suggestion_payload(group: AnnotatedGroup, ranking: Ranking, question_id: str, k_slots: int
                       ) -> dict[str, Any]:
    """A ``ranking`` suggestion: tier t (0-based) becomes rank t + 1, so ties share a rank.

    The empty slots of a group with fewer than ``k_slots`` candidates come last, sharing one
    rank (score 0), so the UI shows them already placed and the annotator only orders the real
    responses.
    """
    slot = {cid: field for field, cid in candidate_map(group).items()}
    ordered = [(slot[cid], t + 1) for t, tier in enumerate(ranking.tiers) for cid in tier]
    empties = [(response_field(i), len(ranking.tiers) + 1)
               for i in range(group.k + 1, k_slots + 1)]
    payload: dict[str, Any] = {
        "question_id": question_id,
        "value": [{"value": s, "rank": rank} for s, rank in ordered + empties],
        "agent": suggestion_agent(ranking),
        "type": "model",
    }
    scores = scaled_scores(ranking, [cid for tier in ranking.tiers for cid in tier])
    if scores is not None:
        payload["score"] = scores + [0.0] * len(empties)
    return payload


def record_payload(group: AnnotatedGroup, question_ids: dict[str, str], k_slots: int,
                   suggest_from: str | None = None) -> dict[str, Any]:
    """Body item of ``PUT /api/v1/datasets/{id}/records/bulk`` for one group (an upsert).

    Args:
        group (AnnotatedGroup): the group; its candidates fill ``response_1 .. response_k``.
        question_ids (dict[str, str]): question name -> id in the dataset.
        k_slots (int): the dataset's number of response slots K (>= the group's k).
        suggest_from (str | None): see :func:`pick_suggestion`.
    """
    fields = {"prompt": group.prompt.display_text()}
    fields.update({response_field(i + 1): c.text for i, c in enumerate(group.candidates)})
    models = sorted({c.source.model or c.source.kind for c in group.candidates})
    item: dict[str, Any] = {
        "external_id": group.group_id,
        "fields": fields,
        "metadata": {"group_id": group.group_id, "models": models, "k": group.k,
                     MAPPING_KEY: candidate_map(group)},
    }
    ranking = pick_suggestion(group, suggest_from)
    if ranking is not None:
        item["suggestions"] = [suggestion_payload(group, ranking, question_ids[RANKING],
                                                  k_slots)]
    return item


# -- responses -> rankings -------------------------------------------------------------------
def ranking_from_response(value: list[dict[str, Any]], mapping: dict[str, str],
                          group: AnnotatedGroup, username: str, submitted_at: datetime
                          ) -> Ranking:
    """Turn a submitted Argilla ranking into a :class:`Ranking` of the group's candidates.

    Items for empty slots (not in ``mapping``) are dropped; items sharing a rank form one
    tier; an item without a rank takes its 1-based position.

    Raises:
        ValueError: the ranking does not cover the group's candidates exactly once, or the
            record's map names candidates the group does not have (pushed from other data).
    """
    group_ids = set(group.candidate_ids())
    if set(mapping.values()) != group_ids:
        raise ValueError("the Argilla record was pushed for other candidates than the run's "
                         "group (re-run `grouppref label push` after regenerating)")
    by_rank: dict[int, list[str]] = {}
    for position, item in enumerate(value, start=1):
        cid = mapping.get(item["value"])
        if cid is None:
            continue  # an empty response slot
        rank = item.get("rank")
        by_rank.setdefault(int(rank) if rank is not None else position, []).append(cid)
    tiers = [by_rank[r] for r in sorted(by_rank)]
    check_tiers(tiers, group.candidate_ids())
    return Ranking(annotator=Annotator(id=username, kind="human", name="argilla"),
                   group_id=group.group_id, tiers=tiers, created_at=submitted_at)
