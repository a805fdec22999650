"""Groups built as their rows are read (one row per group: ``read_groups`` with
``merge=False``) equal the groups built after the whole file is read (``collect_rows`` then
``finish``): the same table, rejects (in the same order), stats and rows; and the grouper hands
each group on once its row is done, keeping only its key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from grouppref.errors import RowError
from grouppref.pipeline.imports.config import ImportConfig
from grouppref.pipeline.imports.layouts import context, raw_groups
from grouppref.pipeline.imports.layouts.build import finish, read_groups
from grouppref.pipeline.imports.layouts.raw_groups import Context, Grouper, collect_rows
from grouppref.readers.rows import iter_rows
from grouppref.schemas import Prompt, Reject
from tests.support.equivalence import hostile_files


def _row(row: dict[str, Any], number: int, ctx: Context, grouper: Grouper,
         rejects: list[Reject]) -> None:
    """A layout of one group per row, through the public Context API: the prompt, then each
    answer and its rank (a row can fail half-way, after its group was made)."""
    answers = ctx.objects(row, number, "answer", rejects)
    group = grouper.group(ctx.prompt(row, number), number)
    for where, answer in answers:
        index = ctx.add_response(group, answer, number, where)
        rank = ctx.number(answer.get("rank"), number, f"{where}.rank", rejects)
        if rank is not None:
            group.vote(ctx.annotator, number).scores[index] = -rank


@pytest.mark.parametrize(("settings", "every"), [({}, 1), ({}, 3), ({}, 1000),
                                                  ({"oversize": "reject", "min_k": 3}, 2)])
def test_groups_built_as_read_equal_groups_built_at_the_end(
        tmp_path: Path, settings: dict[str, Any], every: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(raw_groups, "RELEASE_EVERY", every)  # runs of 1, 3, ... groups
    path = hostile_files(tmp_path)["nectar_hostile"]
    config = ImportConfig(source=str(path), layout="nectar", **settings)
    ctx = context(config, "nectar", str(path), "import")
    held = finish(collect_rows(iter_rows(str(path)), ctx, _row, merge=False), ctx)
    streamed = read_groups(iter_rows(str(path)), ctx, _row, merge=False)
    assert streamed.table.equals(held.table) and streamed.table.num_rows > 3
    assert streamed.rejects == held.rejects and len(held.rejects) > 5
    assert (streamed.stats, streamed.group_rows, streamed.rows, streamed.blank) == \
        (held.stats, held.group_rows, held.rows, held.blank)


def test_a_grouper_of_one_row_per_group_hands_each_group_on_and_keeps_its_key() -> None:
    config = ImportConfig(source="x.jsonl", layout="nectar")
    grouper = Grouper(context(config, "nectar", "x.jsonl", "import"), merge=False)
    first = grouper.group(Prompt(prompt_id="a", text="First?"), 1)
    second = grouper.group(Prompt(prompt_id="b", text="Second?"), 2)
    assert grouper.release() == [first, second] and grouper.release() == []
    assert not grouper.groups  # no longer held
    with pytest.raises(RowError, match="same prompt as row 1"):
        grouper.group(Prompt(prompt_id="a", text="First?"), 3)
    # where a later row can retract an earlier group, nothing is handed on before the end
    held = Grouper(context(config.model_copy(update={"mapping": config.mapping.model_copy(
        update={"duplicate_ids": "reject_all"})}), "nectar", "x.jsonl", "import"), merge=False)
    held.group(Prompt(prompt_id="a", text="First?"), 1)
    assert held.release() == [] and len(held.groups) == 1
