"""Layout ``ultrafeedback``: openbmb/UltraFeedback rows, one per prompt.

The published schema: ``instruction`` (the prompt), ``source``, ``models``, and
``completions``, a list of ``{model, principle, custom_system_prompt, response, annotations,
critique, overall_score, fine-grained_score}`` whose ``annotations`` map each aspect
(``helpfulness``, ``honesty``, ``instruction_following``, ``truthfulness``) to ``{Rating,
Rationale, ...}`` with ``Rating`` a string, ``"1"``..``"5"`` or ``"N/A"``.

One ranking per score field named in ``scores`` (default: the four aspects), the field name
as annotator id, kind ``llm_judge`` (GPT-4 rated them): an aspect's ``Rating``, or a
completion-level number (``overall_score``, ``fine-grained_score``). An ``"N/A"`` rating leaves
that completion out of that aspect's ranking; equal ratings are ties.

Example row (shortened)::

    {"source": "evol_instruct", "instruction": "Name a prime number.",
     "completions": [{"model": "gpt-4", "response": "7", "overall_score": 8.0,
                      "annotations": {"helpfulness": {"Rating": "5", "Rationale": "..."}, ...}},
                     ...]}
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from grouppref.pipeline.imports.layouts.build import read_groups
from grouppref.pipeline.imports.layouts.raw_groups import Context, Grouper, Imported
from grouppref.readers.rows import Row
from grouppref.schemas import Reject

ASPECTS = ["helpfulness", "honesty", "instruction_following", "truthfulness"]
ONE_ROW_PER_GROUP = True  # a repeated prompt is a reject: no row merges into another's group
DEFAULTS: dict[str, Any] = {"mapping": {"text": "instruction", "responses": "completions"},
                            "text_key": "response", "scores": ASPECTS, "kind": "llm_judge"}


def _rating(completion: dict[str, Any], name: str) -> tuple[Any, str]:
    """The value of score field ``name`` of one completion and where it is."""
    if name in completion and not isinstance(completion[name], dict):
        return completion[name], name
    annotation = (completion.get("annotations") or {}).get(name)
    if isinstance(annotation, dict):
        return annotation.get("Rating"), f"annotations.{name}.Rating"
    return annotation, f"annotations.{name}"  # a bare rating, or None: not rated


def _row(row: dict[str, Any], number: int, ctx: Context, grouper: Grouper,
         rejects: list[Reject]) -> None:
    completions = ctx.objects(row, number, "completion", rejects)
    group = grouper.group(ctx.prompt(row, number, extra=("source",)), number)
    found: set[str] = set()
    keys: set[str] = set()
    for where, completion in completions:
        index = ctx.add_response(group, completion, number, where)
        if not isinstance(completion.get("annotations") or {}, dict):
            rejects.append(ctx.reject(
                "'annotations' must be an object of aspects ({aspect: {Rating, Rationale}}), "
                f"got {type(completion['annotations']).__name__}; this completion's aspects "
                "are left out", number, f"{where}.annotations"))
            completion = {k: v for k, v in completion.items() if k != "annotations"}
        annotations = completion.get("annotations") or {}
        keys |= set(completion) | set(annotations)
        for name in ctx.scores:
            found.update([name] if name in completion or name in annotations else [])
            value, at = _rating(completion, name)
            ctx.add_score(group, name, index, value, number, f"{where}.{at}", rejects)
    # the four default aspects may be fewer in a team's data: only none of them is a reject
    asked = ctx.scores if ctx.config.scores or not found else []
    ctx.absent(asked, found, keys, number, ctx.mapping.responses or "completions", "--score",
               rejects)


def read(rows: Iterable[tuple[int, Row]], ctx: Context) -> Imported:
    """Rows -> groups with one (partial where "N/A") ranking per score field, and rejects."""
    return read_groups(rows, ctx, _row, merge=not ONE_ROW_PER_GROUP)
