"""Label stages, groups and annotators answering over REST, for the tests against the real Argilla."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from pydantic import SecretStr

from grouppref.labeling.client import (
    ArgillaCredentials,
)
from grouppref.runs.hashing import fingerprint_records
from grouppref.runs.store import RunStore
from grouppref.schemas import AnnotatedGroup, Annotator, ChatMessage, Prompt, Ranking
from tests.support.factories import make_group

SIZES = (5, 3, 4, 2)  # group sizes cycle through these: four datasets, -k2 .. -k5


# -- helpers shared with test_label_browser.py -----------------------------------------------


def make_groups(n: int, tag: str = "", sizes: tuple[int, ...] = SIZES) -> list[AnnotatedGroup]:
    """``n`` groups of sizes 5, 3, 4, 2, ..., each with a reward-model ranking with scores."""
    groups = []
    for i in range(n):
        k = sizes[i % len(sizes)]
        g = make_group(k, prompt_text=f"Prompt {tag}{i}: name a colour.",
                       texts=[f"answer {i}.{j} {tag}" for j in range(k)])
        ids = g.candidate_ids()
        scores = {cid: float((j * 7 + i) % k) - 0.5 * j for j, cid in enumerate(ids)}
        order = sorted(ids, key=lambda c: -scores[c])
        rm = Ranking(annotator=Annotator(id="rm-tiny", kind="reward_model", version="1"),
                     group_id=g.group_id, tiers=[[c] for c in order], scores=scores)
        groups.append(AnnotatedGroup(**g.model_dump(), rankings=[rm]))
    return groups


def as_chat(group: AnnotatedGroup, turns: list[tuple[str, str]]) -> AnnotatedGroup:
    """``group`` with a chat prompt of ``turns`` (role, content); same group id and candidates."""
    prompt = Prompt(prompt_id=group.prompt.prompt_id,
                    messages=[ChatMessage(role=r, content=c) for r, c in turns])
    return group.model_copy(update={"prompt": prompt})


def write_stage(root: Path, groups: list[AnnotatedGroup], stage: str = "rank") -> RunStore:
    """A run directory whose ``stage`` holds ``groups`` (complete, as the rank stage leaves it)."""
    store = RunStore(root)
    run = store.open_stage(stage, {"test": True}, input_fingerprint=fingerprint_records(groups),
                           record_type=AnnotatedGroup, force=True)
    for shard in run.pending_shards(groups, shard_size=max(len(groups), 1)):
        run.write_shard(shard, list(shard.items), [])
    run.finish(inputs=len(groups))
    return store


def annotator_http(url: str, api_key: str) -> httpx.Client:
    """An httpx client acting as one annotator (the SDK's list/search calls are 403 for them)."""
    return httpx.Client(base_url=url, headers={"X-Argilla-Api-Key": api_key}, timeout=60)


def annotator_records(http: httpx.Client, dataset_id: str) -> dict[str, dict[str, Any]]:
    """``external_id -> record`` of every record the annotator sees."""
    out: list[dict[str, Any]] = []
    while True:
        r = http.post(f"/api/v1/me/datasets/{dataset_id}/records/search",
                      params={"offset": len(out), "limit": 100}, json={"query": {}})
        r.raise_for_status()
        body = r.json()
        out += [item["record"] for item in body["items"]]
        if not body["items"] or len(out) >= body["total"]:
            return {rec["external_id"]: rec for rec in out}


def respond(http: httpx.Client, record_id: str, slot_tiers: list[list[str]],
            status: str = "submitted") -> dict[str, Any]:
    """Answer the ranking question: ``slot_tiers`` are response field names, best tier first."""
    value = [{"value": s, "rank": t + 1} for t, tier in enumerate(slot_tiers) for s in tier]
    r = http.post(f"/api/v1/records/{record_id}/responses",
                  json={"values": {"ranking": {"value": value}}, "status": status})
    r.raise_for_status()
    return r.json()


def owner_credentials(server: Any) -> ArgillaCredentials:
    return ArgillaCredentials(api_url=server.url, api_key=SecretStr(server.api_key),
                              source="test")
