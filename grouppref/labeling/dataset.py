"""The Argilla datasets of a run: their settings, their records, and rankings read back.

Argilla's ranking question has a fixed list of options per dataset, and a submitted ranking
must place every option. So a run's groups go to **one dataset per group size k**
(``<name>-k<k>``): annotators rank exactly the k responses a group has, never an empty slot.
One record per group (record ``external_id`` = ``group_id``, so pushing again updates it):

- fields ``prompt`` and ``response_1 .. response_k``; the prompt is Argilla's ``ChatField``
  when the run has chat prompts (each turn shown with its role; a plain prompt in such a
  dataset is one user turn), else a ``TextField``;
- a ``ranking`` question (Argilla's RankingQuestion) over ``response_1 .. response_k``, and an
  optional free-text ``rationale`` question;
- metadata properties ``group_id`` (terms), ``models`` (terms) and ``k`` (integer), plus the
  extra metadata ``candidate_ids`` = ``{"response_i": candidate_id}``: the map pull needs to
  turn an annotator's ranking back into candidate ids;
- a suggestion for ``ranking`` from one automatic ranking (:func:`pick_suggestion`: the
  ensemble's when the group has one), its ties as shared ranks, agent = its annotator id,
  score = its per-candidate scores scaled to [0, 1];
- task distribution ``overlap`` with ``min_submitted = N`` (Argilla's ``TaskDistribution``).

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

SCHEMA_VERSION = "2"
RANKING = "ranking"
RATIONALE = "rationale"
MAPPING_KEY = "candidate_ids"
ENSEMBLE_NAME_PREFIX = "ensemble("  # Annotator.name of the rank stage's ensemble ranking
DEFAULT_GUIDELINES = (
    "Rank the responses to the prompt from best (1) to worst. Judge helpfulness, correctness "
    "and harmlessness. Responses you find equally good may share a rank. The suggested order "
    "comes from the automatic rankers: change it wherever you disagree."
)


def dataset_name(base: str, k: int) -> str:
    """The dataset of the run's groups of ``k`` candidates: ``<base>-k<k>``."""
    return f"{base}-k{k}"


class DatasetSpec(BaseModel):
    """The shape of a run's Argilla dataset: what ``push`` creates and checks."""

    model_config = ConfigDict(extra="forbid")

    k: int = Field(ge=MIN_K, le=MAX_K, description="Number of responses per record (the "
                   "dataset's group size).")
    chat: bool = Field(default=False, description="Show the prompt as Argilla's ChatField "
                       "(turns with roles) instead of a TextField.")
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
    prompt = {"type": "chat", "use_markdown": spec.use_markdown} if spec.chat else text
    fields = [{"name": "prompt", "title": "Prompt", "required": True, "settings": prompt}]
    fields += [{"name": response_field(i), "title": f"Response {i}", "required": True,
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


def is_chat(fields: list[dict[str, Any]]) -> bool:
    """Whether a dataset's ``prompt`` field is a ChatField."""
    return any(f["name"] == "prompt" and f["settings"]["type"] == "chat" for f in fields)


# -- records ---------------------------------------------------------------------------------
def candidate_map(group: AnnotatedGroup) -> dict[str, str]:
    """``{"response_i": candidate_id}`` in the group's candidate order."""
    return {response_field(i + 1): c.candidate_id for i, c in enumerate(group.candidates)}


def is_ensemble(annotator: Annotator) -> bool:
    """Whether a ranking is the rank stage's weighted ensemble (``ensemble_annotator`` names
    it ``ensemble(<weights>)``, whatever its id)."""
    return (annotator.name or "").startswith(ENSEMBLE_NAME_PREFIX)


def pick_suggestion(group: AnnotatedGroup, suggest_from: str | None) -> Ranking | None:
    """The automatic ranking shown to annotators: ``suggest_from``'s when given (none when the
    group has no ranking by that annotator), else the ensemble's, else the first non-human."""
    if suggest_from is not None:
        return next((r for r in group.rankings if r.annotator.id == suggest_from), None)
    automatic = [r for r in group.rankings if r.annotator.kind != "human"]
    return next((r for r in automatic if is_ensemble(r.annotator)),
                automatic[0] if automatic else None)


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


def suggestion_payload(group: AnnotatedGroup, ranking: Ranking, question_id: str
                       ) -> dict[str, Any]:
    """A ``ranking`` suggestion: tier t (0-based) becomes rank t + 1, so ties share a rank."""
    slot = {cid: field for field, cid in candidate_map(group).items()}
    ordered = [(slot[cid], t + 1) for t, tier in enumerate(ranking.tiers) for cid in tier]
    payload: dict[str, Any] = {
        "question_id": question_id,
        "value": [{"value": s, "rank": rank} for s, rank in ordered],
        "agent": suggestion_agent(ranking),
        "type": "model",
    }
    scores = scaled_scores(ranking, [cid for tier in ranking.tiers for cid in tier])
    if scores is not None:
        payload["score"] = scores
    return payload


def prompt_value(group: AnnotatedGroup, chat: bool) -> str | list[dict[str, str]]:
    """The ``prompt`` field: chat turns for a ChatField, else the prompt's text."""
    if chat:
        return [{"role": m.role, "content": m.content} for m in group.prompt.as_messages()]
    return group.prompt.display_text()


def record_payload(group: AnnotatedGroup, question_ids: dict[str, str], chat: bool = False,
                   suggest_from: str | None = None) -> dict[str, Any]:
    """Body item of ``PUT /api/v1/datasets/{id}/records/bulk`` for one group (an upsert).

    Args:
        group (AnnotatedGroup): the group; its candidates fill ``response_1 .. response_k``.
        question_ids (dict[str, str]): question name -> id in the dataset.
        chat (bool): the dataset's prompt is a ChatField.
        suggest_from (str | None): see :func:`pick_suggestion`.
    """
    fields: dict[str, Any] = {"prompt": prompt_value(group, chat)}
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
        item["suggestions"] = [suggestion_payload(group, ranking, question_ids[RANKING])]
    return item


# -- responses -> rankings -------------------------------------------------------------------
def ranking_from_response(value: list[dict[str, Any]], mapping: dict[str, str],
                          group: AnnotatedGroup, username: str, submitted_at: datetime
                          ) -> Ranking:
    """Turn a submitted Argilla ranking into a :class:`Ranking` of the group's candidates.

    Items sharing a rank form one tier; an item without a rank takes its 1-based position.

    Raises:
        ValueError: the ranking does not cover the group's candidates exactly once, names an
            option the record does not have, or the record's map names candidates the group
            does not have (pushed from other data).
    """
    if set(mapping.values()) != set(group.candidate_ids()):
        raise ValueError("the Argilla record was pushed for other candidates than the run's "
                         "group (re-run `grouppref label push` after regenerating)")
    by_rank: dict[int, list[str]] = {}
    for position, item in enumerate(value, start=1):
        cid = mapping.get(item["value"])
        if cid is None:
            raise ValueError(f"ranks {item['value']!r}, which this record does not have")
        rank = item.get("rank")
        by_rank.setdefault(int(rank) if rank is not None else position, []).append(cid)
    tiers = [by_rank[r] for r in sorted(by_rank)]
    check_tiers(tiers, group.candidate_ids())
    return Ranking(annotator=Annotator(id=username, kind="human", name="argilla"),
                   group_id=group.group_id, tiers=tiers, created_at=submitted_at)
