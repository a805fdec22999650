"""Small builders of valid records for tests (real records, validated by the schemas), and of a
run holding imported groups."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grouppref.pipeline.imports.config import ImportConfig
from grouppref.pipeline.imports.stage import run_import_candidates
from grouppref.runs.store import RunStore
from grouppref.schemas import (
    AnnotatedGroup,
    Annotator,
    Candidate,
    CandidateGroup,
    CandidateSource,
    Prompt,
    Ranking,
    make_candidate_id,
    make_group_id,
)


def make_group(k: int = 4, prompt_text: str = "Name a colour.", reference: str | None = None,
               texts: list[str] | None = None) -> CandidateGroup:
    """A valid group of ``k`` candidates with distinct texts ("answer 0", "answer 1", ...)."""
    gid = make_group_id(Prompt(prompt_id="x", text=prompt_text))
    prompt = Prompt(prompt_id="p-" + gid[2:], text=prompt_text, reference=reference)
    texts = texts if texts is not None else [f"answer {i}" for i in range(k)]
    candidates = [
        Candidate(candidate_id=make_candidate_id(gid, t), text=t,
                  source=CandidateSource(kind="model", model="tiny"), num_tokens=2,
                  behavior_logp=-1.0)
        for t in texts
    ]
    return CandidateGroup(group_id=gid, prompt=prompt, candidates=candidates)


def make_ranking(group: CandidateGroup, order: list[int], annotator: str = "ann-1",
                 kind: str = "human") -> Ranking:
    """A strict ranking of ``group`` listing candidates by index, best first."""
    ids = group.candidate_ids()
    return Ranking(annotator=Annotator(id=annotator, kind=kind), group_id=group.group_id,
                   tiers=[[ids[i]] for i in order])


def make_annotated(group: CandidateGroup, orders: list[list[int]]) -> AnnotatedGroup:
    """The group with one ranking per order, by annotators ``ann-1``, ``ann-2``, ..."""
    rankings = [make_ranking(group, o, annotator=f"ann-{i + 1}") for i, o in enumerate(orders)]
    return AnnotatedGroup(**group.model_dump(), rankings=rankings)


# two groups of K = 3 to judge, as rows of grouppref's import form (prompt + responses)
JUDGED_ROWS = [{"prompt": "What is 2 + 2?", "responses": ["4", "2 + 2 = 5.", "It is 4."]},
               {"prompt": "Capital of France?", "responses": ["Paris.", "London.", "Rome."]}]


def imported_run(folder: Path, rows: list[dict[str, Any]]) -> RunStore:
    """A run in ``folder/run`` whose candidates are ``rows`` (written to ``folder/groups.jsonl``
    and imported with the ``import`` stage): the input of a rank stage."""
    source = folder / "groups.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    store = RunStore(folder / "run")
    run_import_candidates(store, ImportConfig(source=str(source)))
    return store
