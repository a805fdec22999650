"""Import layouts of ranked data teams already have, on hand-written rows in each dataset's
published schema (tests/data/import/, field names as on the dataset cards):
OpenAssistant oasst1/oasst2 message tables and trees (``oasst``), nvidia/HelpSteer3
preference rows (``helpsteer3``), lmsys/chatbot_arena_conversations battles (``arena``) and
Skywork-Reward-Preference pairs (the ``pairs`` layout's implicit prompt). Rankings, ties,
annotators, what is left out and why, hostile rows as rejects, ``--lang``, detection, the
stage counts, and each layout end to end through aggregate, validate, export and one
training step of a tiny model."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from grouppref.cli import app
from grouppref.pipeline.imports.config import ImportConfig
from grouppref.pipeline.imports.layouts import detect
from grouppref.pipeline.imports.layouts.raw_groups import Imported
from grouppref.pipeline.imports.stage import read_import, run_import
from grouppref.runs.store import RunStore
from grouppref.schemas import AnnotatedGroup, ValidatedGroup
from tests.support.paths import TEST_DATA

DATA = TEST_DATA / "import"


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                    encoding="utf-8")
    return path


def fixture_rows(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (DATA / name).read_text(encoding="utf-8").splitlines()]


def load(source: Path | str, **settings: Any) -> Imported:
    return read_import(ImportConfig(source=str(source), **settings))


def rankings(group: AnnotatedGroup) -> dict[str, list[list[str]]]:
    """Each annotator's tiers as candidate texts."""
    text = {c.candidate_id: c.text for c in group.candidates}
    return {r.annotator.id: [[text[c] for c in tier] for tier in r.tiers] for r in group.rankings}


def by_last_turn(imported: Imported) -> dict[str, AnnotatedGroup]:
    return {g.prompt.as_messages()[-1].content: g for g in imported.groups}


def reasons(imported: Imported) -> dict[tuple[int | None, str | None], str]:
    return {(r.row, r.field): r.reason for r in imported.rejects}


# -- OpenAssistant: message tables ----------------------------------------------------------
def oasst_message(mid: str, parent: str | None, role: str, text: Any, rank: Any = None,
                  **fields: Any) -> dict[str, Any]:
    """One row of the oasst1 / oasst2 message table, every column of the dataset card."""
    row = {"message_id": mid, "parent_id": parent, "user_id": "c3fe8c76-fc30-4fa7",
           "created_date": "2023-02-05T14:23:50.983374+00:00", "text": text, "role": role,
           "lang": "en", "review_count": 3, "review_result": True, "deleted": False,
           "rank": rank, "synthetic": False, "model_name": None, "detoxify": None,
           "message_tree_id": "t1", "tree_state": "ready_for_export", "emojis": None,
           "labels": None}
    return row | fields


def test_oasst_table_in_any_order_groups_every_ranked_prompter_message() -> None:
    """Replies come before their parents in the file; a reply to a reply's prompt is a
    multi-turn group; deleted, failed-review, unranked and too-few-ranked messages are each a
    row-reject naming why, and counted in the stats."""
    got = load(DATA / "oasst_messages.jsonl")
    assert got.stats["layout"] == "oasst" and got.stats["messages"] == got.rows == 17
    groups = by_last_turn(got)
    assert set(groups) == {"What is the capital of France?", "And of Italy?",
                           "Wie heißt die Hauptstadt von Deutschland?"}
    first, second = groups["What is the capital of France?"], groups["And of Italy?"]
    assert rankings(first) == {"oasst": [["Paris."], ["Lyon."]]}  # rank 0 is best
    assert [(m.role, m.content) for m in second.prompt.as_messages()] == [
        ("user", "What is the capital of France?"), ("assistant", "Paris."),
        ("user", "And of Italy?")]
    assert rankings(second) == {"oasst": [["Rome."], ["Milan."]]}
    assert {c.text: c.source.model for c in second.candidates} == {
        "Rome.": None, "Milan.": "oasst-sft-1-pythia-12b"}
    assert second.prompt.prompt_id == "p2" and second.prompt.metadata == {
        "lang": "en", "message_tree_id": "6ab24d72-0181-4594-a9cd-deaf170242fb"}
    assert all(r.annotator.kind == "human" for g in got.groups for r in g.rankings)
    why = reasons(got)
    assert why[(5, "rank")] == "unranked reply (rank: null)"
    assert why[(6, "deleted")] == "deleted message (deleted: true)"
    assert why[(10, "review_result")] == "failed review (review_result: false)"
    assert why[(11, "message_id")] == "prompter message with 1 usable ranked reply; a group needs 2"
    assert why[(17, "parent_id")].startswith("incomplete conversation: parent message 'gone'")
    assert why[(15, "parent_id")].startswith("its prompt (message p9) was left out: incomplete")
    assert all(r.scope == "row" for r in got.rejects)
    # every message is in a group or a reject: 11 used (3 prompts + 6 candidates + context)
    assert len(got.rejects) == 8 and got.units == len(got.groups) + 8
    assert got.stats["left_out"] == {"deleted": 1, "failed_review": 1,
                                     "incomplete_conversation": 3, "too_few_ranked": 2,
                                     "unranked": 1}


def test_oasst_trees_give_the_groups_of_the_table() -> None:
    """The nested tree export: the same groups (ids) as the same messages in a table; a
    malformed message is a part-reject with its path (its replies go with it); a tree with no
    group is one row-reject."""
    trees = load(DATA / "oasst_trees.jsonl")
    table = load(DATA / "oasst_messages.jsonl")
    ids = {g.group_id for g in trees.groups}
    assert len(ids) == 2 and ids <= {g.group_id for g in table.groups}
    assert [g.rankings[0].tiers for g in trees.groups] == [
        g.rankings[0].tiers for g in table.groups if g.group_id in ids]
    why = reasons(trees)
    assert why[(1, "prompt.replies[1].replies[1].role")] == (
        "role must be 'prompter' or 'assistant', got 'moderator'; this message and its replies "
        "are left out")
    assert why[(1, "prompt.replies[2].deleted")] == "deleted message (deleted: true)"
    lonely = why[(2, "prompt")]
    assert lonely.startswith("no group in tree 't-lonely'") and "1 too_few_ranked" in lonely
    assert [r.scope for r in trees.rejects].count("row") == 1
    assert trees.units == 3  # 2 groups + the tree without one


def test_oasst_lang_keeps_the_chosen_languages(tmp_path: Path) -> None:
    got = load(DATA / "oasst_messages.jsonl", langs=["EN"])
    assert len(got.groups) == 2 and got.stats["left_out"]["language"] == 3
    assert reasons(got)[(12, "lang")] == "language 'de' not kept (--lang EN)"
    result = CliRunner().invoke(app, ["import", str(DATA / "oasst_messages.jsonl"), "--out",
                                      str(tmp_path / "run"), "--lang", "de"])
    assert result.exit_code == 0, result.output
    assert "layout oasst, 17 rows read (0 blank) -> 1 groups" in result.output


@pytest.mark.parametrize("rows,field,reason", [
    ([oasst_message("p", None, "prompter", "Q?"), oasst_message("a", "p", "assistant", "A", "first")],
     "rank", "rank must be a whole number >= 0 (0 = best) or null, got 'first'"),
    ([oasst_message("p", None, "moderator", "Q?")], "role",
     "role must be 'prompter' or 'assistant', got 'moderator'"),
    ([oasst_message(None, None, "prompter", "Q?")], "message_id",
     "message_id must be a non-empty string, got None"),
    ([oasst_message("p", None, "prompter", "Q?"), oasst_message("p", None, "prompter", "R?")],
     "message_id", "message_id 'p' already read at row 1"),
    ([oasst_message("p", None, "prompter", "Q?", deleted="no")], "deleted",
     "deleted must be bool or null, got str"),
    ([oasst_message("p", "a", "prompter", "Q?"), oasst_message("a", "p", "assistant", "A", 0),
      oasst_message("b", "p", "assistant", "B", 1)], "parent_id",
     "message 'p' is its own ancestor (parent_id loop)"),
    ([oasst_message("p", None, "prompter", None), oasst_message("a", "p", "assistant", "A", 0),
      oasst_message("b", "p", "assistant", "B", 1)], "messages", "(in messages.0.content)"),
    ([{"message_tree_id": "t", "tree_state": "ready_for_export", "prompt": ["not", "a", "node"]}],
     "prompt", "a tree needs message_tree_id (a string) and prompt"),
])
def test_oasst_hostile_rows_are_rejects_with_field_and_reason(
        tmp_path: Path, rows: list[dict[str, Any]], field: str, reason: str) -> None:
    got = load(write_jsonl(tmp_path / "oasst.jsonl", rows), layout="oasst")
    assert not got.groups
    assert any(r.field == field and reason in r.reason and r.source and r.row
               for r in got.rejects), [r.one_line() for r in got.rejects]


def test_oasst_a_reply_to_a_reply_is_no_candidate_and_loops_end(tmp_path: Path) -> None:
    rows = [oasst_message("p", None, "prompter", "Q?"),
            oasst_message("a", "p", "assistant", "A", None),
            oasst_message("b", "a", "assistant", "B", 0), oasst_message("c", "a", "assistant", "C", 1),
            oasst_message("x", "y", "assistant", "X", 0), oasst_message("y", "x", "assistant", "Y", 0)]
    got = load(write_jsonl(tmp_path / "oasst.jsonl", rows), layout="oasst")
    assert not got.groups and len(got.rejects) == 6 and got.units == 6
    why = reasons(got)
    assert why[(3, "parent_id")].startswith("its parent (message a) is not a prompter message")
    assert why[(5, "parent_id")].startswith("its parent (message y) is not a prompter message")


# -- HelpSteer3 -----------------------------------------------------------------------------
def test_helpsteer3_each_annotator_is_a_ranking_ties_kept_overall_only_alone() -> None:
    got = load(DATA / "helpsteer3.jsonl")
    assert got.stats["layout"] == "helpsteer3"
    groups = by_last_turn(got)
    prime = groups["Name a prime number between 10 and 20."]
    assert rankings(prime) == {f"helpsteer3#{k}": [["13 is prime."], ["15 is prime."]]
                               for k in (1, 2, 3)}
    notes = {r.annotator.id: r.metadata for r in prime.rankings}
    assert notes["helpsteer3#2"] == {"score": -3.0, "reasoning": "@Response 2 is wrong."}
    assert prime.prompt.metadata == {"domain": "general", "language": "english"}
    code = groups["Now make it triple."]
    assert [m.role for m in code.prompt.as_messages()] == ["user", "assistant", "user"]
    tie, slight = rankings(code)["helpsteer3#1"], rankings(code)["helpsteer3#2"]
    assert len(tie) == 1 and len(tie[0]) == 2  # score 0: one tier
    assert slight == [["def triple(x):\n    return x * 3"], ["def triple(x): return 3 * x"]]
    beijing = groups["用一句话介绍北京。"]  # no individual scores: overall_preference (2)
    assert list(rankings(beijing)) == ["helpsteer3"]
    assert beijing.rankings[0].metadata == {"overall_preference": 2.0}
    assert list(rankings(groups["What is 2 + 2?"])) == ["helpsteer3#2"]  # #1's score was 5
    why = reasons(got)
    assert why[(4, "individual_preference[0].score")].startswith(
        "an individual preference needs a score from -3 to 3, got 5")
    assert why[(5, "context")] == "context must be a list of {role, content} turns, got a str"
    assert why[(6, "context")] == "context must end with a user turn, ends with 'assistant'"
    assert why[(7, "response1")] == "response1 must be the response text, got a NoneType"
    assert why[(8, "overall_preference")].startswith("no preference: overall_preference")
    assert got.units == len(got.groups) + 4


def test_helpsteer3_rows_of_one_context_join_one_group(tmp_path: Path) -> None:
    first, *_ = fixture_rows("helpsteer3.jsonl")
    again = first | {"response1": "11 is prime.", "individual_preference": [
        {"score": -1, "reasoning": "ok", "feedback1": "", "feedback2": ""}]}
    (group,) = load(write_jsonl(tmp_path / "hs3.jsonl", [first, again])).groups
    assert group.k == 3 and rankings(group)["helpsteer3#1#2"] == [["11 is prime."],
                                                                  ["15 is prime."]]


# -- Chatbot Arena --------------------------------------------------------------------------
def test_arena_battles_on_one_prompt_are_one_group_with_judges_and_ties() -> None:
    got = load(DATA / "arena.jsonl")
    assert got.stats["layout"] == "arena"
    groups = by_last_turn(got)
    prime = groups["Name a prime number between 10 and 20."]
    assert prime.k == 3
    assert rankings(prime) == {"arena_user_973": [["13."], ["15."]],
                               "arena_user_12": [["15.", "Between 10 and 20: 21."]],
                               "arena_user_973#2": [["13.", "15."]]}
    verdicts = {r.annotator.id: r.metadata["winner"] for r in prime.rankings}
    assert verdicts == {"arena_user_973": "model_a", "arena_user_12": "tie (bothbad)",
                        "arena_user_973#2": "tie"}
    assert {c.text: c.source.model for c in prime.candidates} == {
        "13.": "vicuna-13b", "15.": "alpaca-13b", "Between 10 and 20: 21.": "koala-13b"}
    colour = groups["Name a colour."]  # multi-turn, the earlier reply shared: the prompt
    assert [m.content for m in colour.prompt.as_messages()] == ["Hi", "Hello!", "Name a colour."]
    assert colour.prompt.metadata == {"language": "English", "turn": 2}
    why = reasons(got)
    assert why[(6, "conversation_b")].startswith("conversation_a and conversation_b part at "
                                                 "turn 2 of 4 / 4, before the last reply")
    assert why[(7, "winner")].startswith("winner must be one of 'model_a', 'model_b', 'tie'")
    assert why[(8, "conversation_b")].endswith("got a str")
    spanish = load(DATA / "arena.jsonl", langs=["spanish"])
    assert [g.prompt.as_messages()[0].content for g in spanish.groups] == ["Hola"]


HS3_ROW = fixture_rows("helpsteer3.jsonl")[0]
ARENA_ROW = fixture_rows("arena.jsonl")[0]


@pytest.mark.parametrize("layout,row,field,reason", [
    ("helpsteer3", HS3_ROW | {"context": [{"role": "user", "content": 5}]}, "context",
     "got a list whose item 0 is not {role, content} text (['content', 'role'])"),
    ("helpsteer3", HS3_ROW | {"context": []}, "context", "got an empty list"),
    ("helpsteer3", HS3_ROW | {"individual_preference": "lots"}, "individual_preference",
     "individual_preference must be a list of {score, reasoning}, got str; not read"),
    ("helpsteer3", HS3_ROW | {"individual_preference": [3]}, "individual_preference[0].score",
     "an individual preference needs a score from -3 to 3, got 3"),
    ("helpsteer3", HS3_ROW | {"individual_preference": None, "overall_preference": True},
     "overall_preference", "no preference: overall_preference must be from -3 to 3 (got True)"),
    ("helpsteer3", HS3_ROW | {"response2": {"text": "x"}}, "response2",
     "response2 must be the response text, got a dict"),
    ("arena", ARENA_ROW | {"winner": None}, "winner", "winner must be one of"),
    ("arena", ARENA_ROW | {"conversation_a": []}, "conversation_a", "got an empty list"),
    ("arena", ARENA_ROW | {"conversation_a": [{"role": "user", "content": "Q"}],
                           "conversation_b": [{"role": "user", "content": "Q"}]},
     "conversation_b", "each conversation must be the shared user turns"),
    ("arena", ARENA_ROW | {"conversation_b": ARENA_ROW["conversation_b"] * 2},
     "conversation_b", "part at turn 2 of 2 / 4"),
])
def test_helpsteer3_and_arena_hostile_rows_are_rejects_with_field_and_reason(
        tmp_path: Path, layout: str, row: dict[str, Any], field: str, reason: str) -> None:
    got = load(write_jsonl(tmp_path / "in.jsonl", [row]), layout=layout)
    assert any(r.field == field and reason in r.reason and r.row == 1 and r.source
               for r in got.rejects), [r.one_line() for r in got.rejects]
    assert got.units == len(got.groups) + sum(r.scope == "row" for r in got.rejects)


def test_a_judge_that_is_no_string_votes_as_arena(tmp_path: Path) -> None:
    (group,) = load(write_jsonl(tmp_path / "in.jsonl", [ARENA_ROW | {"judge": None}])).groups
    assert [r.annotator.id for r in group.rankings] == ["arena"]


# -- Skywork-Reward-Preference: the pairs layout's implicit prompt --------------------------
def test_skywork_pairs_are_read_by_the_pairs_layout() -> None:
    got = load(DATA / "skywork.jsonl")
    assert got.stats["layout"] == "pairs" and not got.rejects
    groups = by_last_turn(got)
    prime = groups["Name a prime number between 10 and 20."]
    assert rankings(prime) == {"pairs": [["13 is prime."], ["15 is prime."]],
                               "pairs#2": [["11 is prime."], ["15 is prime."]]}
    assert prime.prompt.metadata == {"source": "magpie_ultra"}
    lock = groups["Yes, my own door."]
    assert [m.role for m in lock.prompt.as_messages()] == ["user", "assistant", "user"]


def test_detect_tells_the_new_layouts_from_their_columns() -> None:
    config = ImportConfig(source="x.jsonl")
    for name, layout in [("oasst_messages.jsonl", "oasst"), ("oasst_trees.jsonl", "oasst"),
                         ("helpsteer3.jsonl", "helpsteer3"), ("arena.jsonl", "arena"),
                         ("skywork.jsonl", "pairs")]:
        assert detect(fixture_rows(name)[0], config, name) == layout, name


def test_stage_counts_add_up_for_every_new_layout(tmp_path: Path) -> None:
    for name in ("oasst_messages.jsonl", "oasst_trees.jsonl", "helpsteer3.jsonl",
                 "arena.jsonl", "skywork.jsonl"):
        stage = run_import(RunStore(tmp_path / name), ImportConfig(source=str(DATA / name)))
        c = stage.counts
        assert c.inputs == c.outputs + c.rejected and c.outputs > 0, (name, c)


# -- end to end -----------------------------------------------------------------------------
def e2e_oasst() -> list[dict[str, Any]]:
    """12 prompts, 3 ranked replies each (the longer, the better), shuffled."""
    rows = []
    for i in range(12):
        rows.append(oasst_message(f"p{i}", None, "prompter", f"Question number {i}?",
                                  message_tree_id=f"t{i}"))
        rows += [oasst_message(f"a{i}-{q}", f"p{i}", "assistant",
                               f"answer {i}-{q}: " + "word " * q, 3 - q, message_tree_id=f"t{i}")
                 for q in (3, 2, 1)]
    random.Random(0).shuffle(rows)
    return rows


def e2e_helpsteer3() -> list[dict[str, Any]]:
    return [{"domain": "general", "language": "english",
             "context": [{"role": "user", "content": f"Question number {i}?"}],
             "response1": f"answer {i}: " + "word " * 3, "response2": f"answer {i}: word",
             "overall_preference": -2, "individual_preference": [
                 {"score": s, "reasoning": "@Response 1 is better.", "feedback1": "",
                  "feedback2": ""} for s in (-2, -3, -1)]} for i in range(12)]


def e2e_arena() -> list[dict[str, Any]]:
    rows = []
    for i in range(12):
        q = {"role": "user", "content": f"Question number {i}?"}
        for (ma, ra), (mb, rb), winner in [(("m3", "word " * 3), ("m1", "word"), "model_a"),
                                           (("m2", "word " * 2), ("m3", "word " * 3), "model_b"),
                                           (("m1", "word"), ("m2", "word " * 2), "tie")]:
            rows.append({"question_id": f"q{i}{winner}", "model_a": ma, "model_b": mb,
                         "winner": winner, "judge": f"arena_user_{i % 3}",
                         "conversation_a": [q, {"role": "assistant", "content": f"{i}: {ra}"}],
                         "conversation_b": [q, {"role": "assistant", "content": f"{i}: {rb}"}],
                         "turn": 1, "anony": True, "language": "English", "tstamp": 1.0e9,
                         "openai_moderation": None, "toxic_chat_tag": None})
    return rows


def e2e_skywork() -> list[dict[str, Any]]:
    def turns(i: int, reply: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"Question number {i}?"},
                {"role": "assistant", "content": reply}]
    return [{"chosen": turns(i, f"answer {i}: " + "word " * good),
             "rejected": turns(i, f"answer {i}: " + "word " * bad), "source": "magpie_ultra"}
            for i in range(12) for good, bad in ((3, 1), (2, 1), (3, 2))]


E2E = {"oasst": e2e_oasst, "helpsteer3": e2e_helpsteer3, "arena": e2e_arena,
       "pairs": e2e_skywork}


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("layout", list(E2E))
def test_each_layout_end_to_end_through_training(tmp_path: Path, tiny_lm_dir: Path,
                                                 layout: str) -> None:
    source = write_jsonl(tmp_path / f"{layout}.jsonl", E2E[layout]())
    run = tmp_path / "run"
    steps = [
        ["import", source, "--out", run],  # the layout told from the columns
        ["aggregate", run],
        ["validate", run, "--test-fraction", "0.25"],
        ["export", run, "--to", tmp_path / "export"],
        ["train", run, "--model", tiny_lm_dir, "--max-steps", "1", "--batch-size", "2",
         "--max-response-length", "16"],  # chat prompts: the tokenizer's chat template
    ]
    for args in steps:
        result = CliRunner().invoke(app, [str(a) for a in args])
        assert result.exit_code == 0, (args[0], result.output)
    store = RunStore(run)
    assert store.manifest("import").stats["layout"] == layout
    counts = store.require("import").counts
    assert counts.inputs == counts.outputs + counts.rejected == 12
    groups = store.load_records("validate", ValidatedGroup)
    assert len(groups) == 12
    for group in groups:  # the most words is the best reply in every layout's data
        best = max(group.candidates, key=lambda c: len(c.text))
        assert group.consensus[0] == [best.candidate_id], layout
    assert store.require("train").counts.outputs > 0
