"""A validated run and an aggregate stage, for the export, card and round-trip tests."""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

from grouppref.runs.store import RunStore
from grouppref.schemas import (
    Agreement,
    ChatMessage,
    PairPreference,
    Prompt,
    ValidatedGroup,
    make_group_id,
)
from tests.support.factories import make_annotated, make_group


def make_validated(prompt_text: str = "Name a colour.", k: int = 3,
                   orders: list[list[int]] | None = None, chat: bool = False,
                   flags: list[str] | None = None) -> ValidatedGroup:
    """A valid aggregate row: consensus = the first order, every ordered pair with p=0.9."""
    orders = orders or [list(range(k)), list(range(k))]
    group = make_group(k=k, prompt_text=prompt_text)
    if chat:
        prompt = Prompt(prompt_id="chat", messages=[
            ChatMessage(role="system", content="Be brief."),
            ChatMessage(role="user", content=prompt_text)])
        gid = make_group_id(prompt)
        group = make_group(k=k, prompt_text=prompt_text).model_copy(
            update={"prompt": prompt, "group_id": gid})
    annotated = make_annotated(group, orders)
    ids = group.candidate_ids()
    order = [ids[i] for i in orders[0]]
    pairs = [PairPreference(winner=a, loser=b, p=0.9 - 0.1 * (j - i) / k, weight=0.8,
                            votes_for=2.0, votes_against=0.0)
             for (i, a), (j, b) in combinations(enumerate(order), 2)]
    return ValidatedGroup(
        **annotated.model_dump(), consensus=[[c] for c in order],
        strengths={c: float(k - i) for i, c in enumerate(order)}, pairs=pairs,
        agreement=Agreement(num_annotators=len(orders), kendall_w=1.0, mean_tau=1.0, noise=0.0),
        flags=flags or [])


def write_aggregate(run: Path, records: list[ValidatedGroup], stats: dict | None = None,
                    config: dict | None = None) -> RunStore:
    """Write ``records`` as the aggregate stage of ``run`` (as the real stage would)."""
    store = RunStore(run)
    stage = store.open_stage("aggregate", config or {"method": "bt"}, input_fingerprint="test",
                             record_type=ValidatedGroup, force=True)
    if records:
        for shard in stage.pending_shards(records, shard_size=len(records)):
            stage.write_shard(shard, list(shard.items), [])
    stage.finish(inputs=len(records), stats=stats or {"noise_rate": 0.05})
    return store
