"""Import layouts on hand-written rows in each dataset's published schema (field names as the
dataset cards give them): openbmb/UltraFeedback, berkeley-nest/Nectar, nvidia/HelpSteer2,
HuggingFaceH4/ultrafeedback_binarized and TRL pairs, Anthropic/hh-rlhf, grouppref's own groups,
and the general ``scores`` layout. N/A ratings, ties, partial rankings, merged duplicates,
HH prefix extraction, oversize groups and the auto-detection of each layout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from grouppref.errors import InputFileError
from grouppref.pipeline.imports.config import ImportConfig
from grouppref.pipeline.imports.layouts import detect
from grouppref.pipeline.imports.layouts.raw_groups import Imported
from grouppref.pipeline.imports.layouts.transcript import parse_helpsteer, parse_hh
from grouppref.pipeline.imports.stage import read_import
from grouppref.schemas import AnnotatedGroup, Ranking
from tests.support.factories import make_annotated, make_group
from tests.support.import_rows import NECTAR_ROWS, UF_ROWS


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def read(tmp_path: Path, rows: list[Any], **settings: Any) -> Imported:
    return read_import(ImportConfig(source=str(write_jsonl(tmp_path / "in.jsonl", rows)),
                                    **settings))


def texts(group: AnnotatedGroup, ranking: Ranking) -> list[list[str]]:
    """A ranking's tiers as candidate texts."""
    by_id = {c.candidate_id: c.text for c in group.candidates}
    return [[by_id[c] for c in tier] for tier in ranking.tiers]


def by_annotator(group: AnnotatedGroup) -> dict[str, list[list[str]]]:
    return {r.annotator.id: texts(group, r) for r in group.rankings}


def test_ultrafeedback_one_ranking_per_aspect_na_partial_ties(tmp_path: Path) -> None:
    result = read(tmp_path, UF_ROWS, layout="ultrafeedback")
    prime, hello, sums = result.groups
    assert prime.prompt.text == "Name a prime number."
    assert prime.prompt.metadata == {"source": "evol_instruct"}
    assert [c.source.model for c in prime.candidates] == ["gpt-4", "alpaca-7b", "wizardlm-7b"]
    assert by_annotator(prime) == {
        "helpfulness": [["7 is prime."], ["2"], ["9"]],
        "honesty": [["7 is prime."], ["2"]],  # "N/A": "9" left out of this ranking (partial)
        "instruction_following": [["7 is prime."], ["9", "2"]],  # equal ratings: a tie
        "truthfulness": [["7 is prime.", "2"], ["9"]]}
    assert {r.annotator.kind for r in prime.rankings} == {"llm_judge"}
    honesty = next(r for r in prime.rankings if r.annotator.id == "honesty")
    assert sorted(honesty.scores.values()) == [4.0, 5.0]  # the ratings kept, N/A not
    assert by_annotator(hello)["helpfulness"] == [["Bonjour.", "Salut !"]]  # 5 = 5: tied
    # "4" is N/A everywhere: no aspect ranks two candidates -> no rankings (3 aspects rate
    # only "5" and are dropped with the reason; truthfulness rates neither)
    assert sums.rankings == [] and sums.k == 2
    dropped = [r for r in result.rejects if "left out" in r.reason and r.row == 3]
    assert len(dropped) == 3 and all("rates 1 usable candidate" in r.reason for r in dropped)
    assert result.stats["partial_rankings"] == 1 and result.stats["layout"] == "ultrafeedback"


def test_ultrafeedback_overall_score_by_option(tmp_path: Path) -> None:
    result = read(tmp_path, UF_ROWS[:2], layout="ultrafeedback",
                  scores=["overall_score", "fine-grained_score"])
    prime, hello = result.groups
    assert by_annotator(prime) == {"overall_score": [["7 is prime."], ["2"], ["9"]],
                                   "fine-grained_score": [["7 is prime."], ["2"], ["9"]]}
    assert by_annotator(hello)["overall_score"] == [["Bonjour.", "Salut !"]]  # 8.5 = 8.5


def test_nectar_transcript_prompt_rank_partial_tie_and_merged_duplicate(tmp_path: Path) -> None:
    result = read(tmp_path, NECTAR_ROWS, layout="nectar")
    prime, joke, yes = result.groups
    assert [m.model_dump() for m in prime.prompt.messages] == [
        {"role": "user", "content": "Name a prime number."}]
    assert prime.prompt.metadata == {"turns": 1, "num_responses": 3, "good_natured": True}
    assert by_annotator(prime) == {"nectar": [["7"], ["2"], ["9"]]}
    assert prime.rankings[0].annotator.kind == "llm_judge"
    assert [(m.role, m.content) for m in joke.prompt.messages] == [
        ("user", "Hi!"), ("assistant", "Hello! How can I help?"), ("user", "Tell me a joke.")]
    # "A pun. " duplicates "A pun." (merged, its rank kept); "No." has no rank: left out
    assert [c.text for c in joke.candidates] == ["Why did the chicken cross the road?", "No.",
                                                 "A pun."]
    assert by_annotator(joke) == {"nectar": [["Why did the chicken cross the road?"],
                                             ["A pun."]]}
    assert any("merged into one candidate" in r.reason and r.row == 2 for r in result.rejects)
    assert by_annotator(yes) == {"nectar": [["Yes.", "Yes!"]]}  # equal ranks: a tie


# -- nvidia/HelpSteer2 ---------------------------------------------------------------------------
def hs_row(prompt: str, response: str, h: int, c: int, co: int, cx: int, v: int) -> dict[str, Any]:
    return {"prompt": prompt, "response": response, "helpfulness": h, "correctness": c,
            "coherence": co, "complexity": cx, "verbosity": v}


MULTI = "Hi\n<extra_id_1>Assistant\nHello, how can I help?\n<extra_id_1>User\nWhat is C#?"
HS_ROWS = [
    hs_row("c#", "C# is a language by Microsoft.", 3, 4, 4, 2, 1),
    hs_row("c#", "C sharp.", 1, 2, 4, 1, 0),
    hs_row(MULTI, "A .NET language.", 2, 3, 4, 1, 1),
    hs_row(MULTI, "C# is object oriented.", 2, 4, 3, 2, 2),
    hs_row("Name a colour.", "Red", 4, 4, 4, 0, 0),
]


def test_helpsteer2_rows_grouped_by_prompt_one_ranking_per_attribute(tmp_path: Path) -> None:
    result = read(tmp_path, HS_ROWS, layout="helpsteer2")
    cs, multi = result.groups  # "Name a colour." has one response: rejected
    assert by_annotator(cs) == {
        "helpfulness": [["C# is a language by Microsoft."], ["C sharp."]],
        "correctness": [["C# is a language by Microsoft."], ["C sharp."]],
        "coherence": [["C# is a language by Microsoft.", "C sharp."]]}  # 4 = 4: a tie
    assert {r.annotator.kind for r in cs.rankings} == {"human"}
    assert [(m.role, m.content) for m in multi.prompt.messages] == [
        ("user", "Hi"), ("assistant", "Hello, how can I help?"), ("user", "What is C#?")]
    assert by_annotator(multi)["helpfulness"] == [["A .NET language.", "C# is object oriented."]]
    (lone,) = [r for r in result.rejects if r.scope == "row"]
    assert lone.row == 5 and "1 distinct non-empty response" in lone.reason
    assert result.units == 3 and result.rows == 5
    more = read(tmp_path, HS_ROWS[:2], layout="helpsteer2", scores=["verbosity"])
    assert by_annotator(more.groups[0]) == {
        "verbosity": [["C# is a language by Microsoft."], ["C sharp."]]}


# -- the general scores layout -------------------------------------------------------------------
def test_scores_layout_group_by_lower_is_better_and_na(tmp_path: Path) -> None:
    rows = [
        {"qid": "q1", "prompt": "Name a colour.", "response": "Red", "rank_a": 1, "rank_b": "N/A"},
        {"qid": "q1", "prompt": "Name a colour.", "response": "Blue", "rank_a": 2, "rank_b": 1},
        {"qid": "q1", "prompt": "Name a colour.", "response": "Sky", "rank_a": 2, "rank_b": 2},
        {"qid": "q2", "prompt": "Name a fruit.", "response": "Apple", "rank_a": 1},
    ]
    result = read(tmp_path, rows, layout="scores", scores=["rank_a", "rank_b"],
                  lower_is_better=True, group_by="qid")
    (colours,) = result.groups
    assert by_annotator(colours) == {"rank_a": [["Red"], ["Blue", "Sky"]],
                                     "rank_b": [["Blue"], ["Sky"]]}  # partial: Red unrated
    assert all(r.scores is None for r in colours.rankings)  # ranks are not "higher is better"
    (missing,) = [r for r in result.rejects if r.row == 4]
    assert "no score column 'rank_b'" in missing.reason and missing.field == "rank_b"
    with pytest.raises(ValueError, match="needs the score columns"):
        ImportConfig(source="x.jsonl", layout="scores")


# -- pairs: HuggingFaceH4/ultrafeedback_binarized and TRL ----------------------------------------
def ufb_row(prompt: str, chosen: str, rejected: str, sc: float, sr: float) -> dict[str, Any]:
    """A row as on the ultrafeedback_binarized card: chosen/rejected are whole conversations."""
    user = {"role": "user", "content": prompt}
    return {"prompt": prompt, "prompt_id": f"id-{len(prompt)}",
            "chosen": [user, {"role": "assistant", "content": chosen}],
            "rejected": [user, {"role": "assistant", "content": rejected}],
            "messages": [user, {"role": "assistant", "content": chosen}],
            "score_chosen": sc, "score_rejected": sr}


def test_pairs_of_one_prompt_merge_into_one_group_of_partial_rankings(tmp_path: Path) -> None:
    rows = [ufb_row("Name a prime.", "7", "9", 9.0, 2.0),
            ufb_row("Say hi.", "Hi!", "Go away.", 8.0, 1.0),
            ufb_row("Name a prime.", "2", "9", 7.0, 2.0),
            ufb_row("Name a prime.", "7", "4", 8.0, 3.0)]
    result = read(tmp_path, rows)  # auto: a prompt column and chosen/rejected -> pairs
    assert result.stats["layout"] == "pairs"
    primes, hi = result.groups
    assert primes.prompt.prompt_id == "id-13" and primes.prompt.text == "Name a prime."
    assert [c.text for c in primes.candidates] == ["7", "9", "2", "4"]  # duplicates merged
    assert by_annotator(primes) == {"pairs": [["7"], ["9"]], "pairs#2": [["2"], ["9"]],
                                    "pairs#3": [["7"], ["4"]]}
    first = primes.rankings[0]
    assert sorted(first.scores.values()) == [2.0, 9.0]  # score_chosen / score_rejected kept
    assert by_annotator(hi) == {"pairs": [["Hi!"], ["Go away."]]}
    assert result.stats["partial_rankings"] == 3 and result.units == 2


def test_pairs_trl_standard_conversational_and_implicit_prompt(tmp_path: Path) -> None:
    user = [{"role": "user", "content": "Name a colour."}]
    rows = [
        {"prompt": "Name a fruit.", "chosen": "Apple", "rejected": "Brick"},  # standard
        {"prompt": user, "chosen": [{"role": "assistant", "content": "Red"}],  # conversational
         "rejected": [{"role": "assistant", "content": "Seven"}]},
        {"chosen": [*user, {"role": "assistant", "content": "Blue"}],  # implicit prompt
         "rejected": [*user, {"role": "assistant", "content": "Seven"}]},
        {"prompt": "Same.", "chosen": "Yes", "rejected": "yes "},  # one text: the pair goes
    ]
    result = read(tmp_path, rows, layout="pairs")
    fruit, colour = result.groups
    assert by_annotator(fruit) == {"pairs": [["Apple"], ["Brick"]]}
    assert [m.content for m in colour.prompt.messages] == ["Name a colour."]
    assert by_annotator(colour) == {"pairs": [["Red"], ["Seven"]], "pairs#2": [["Blue"], ["Seven"]]}
    row4 = [(r.scope, r.reason) for r in result.rejects if r.row == 4]
    assert any(s == "part" and "one and the same text" in why for s, why in row4)
    assert any(s == "row" and "1 distinct" in why for s, why in row4)


# -- Anthropic/hh-rlhf ---------------------------------------------------------------------------
def test_hh_prefix_is_the_prompt_last_assistant_turns_the_candidates(tmp_path: Path) -> None:
    convo = "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: What is 2+2?"
    rows = [
        {"chosen": convo + "\n\nAssistant: 4.", "rejected": convo + "\n\nAssistant: 5."},
        {"chosen": convo + "\n\nAssistant: Four.", "rejected": convo + "\n\nAssistant: 5."},
        {"chosen": "\n\nHuman: Hi\n\nAssistant: Hey\n\nHuman: Bye\n\nAssistant: Ciao",
         "rejected": "\n\nHuman: Hi\n\nAssistant: Go\n\nHuman: Bye\n\nAssistant: Ciao"},
        {"chosen": convo + "\n\nAssistant: 4.", "rejected": convo + "\n\nAssistant: 4."},
    ]
    result = read(tmp_path, rows)  # auto: chosen/rejected strings, no prompt -> hh
    assert result.stats["layout"] == "hh"
    (group,) = result.groups
    assert [(m.role, m.content) for m in group.prompt.messages] == [
        ("user", "Hi"), ("assistant", "Hello!"), ("user", "What is 2+2?")]
    assert [c.text for c in group.candidates] == ["4.", "5.", "Four."]
    assert by_annotator(group) == {"hh": [["4."], ["5."]], "hh#2": [["Four."], ["5."]]}
    assert {r.annotator.kind for r in group.rankings} == {"human"}
    reasons = {r.row: r.reason for r in result.rejects if r.scope == "row"}
    assert "part at turn 2" in reasons[3] and "only a final assistant turn" in reasons[3]
    assert "same conversation" in reasons[4]


def test_transcript_parsers() -> None:
    assert parse_hh("no markers here") is None
    assert parse_hh("\n\nHuman: a\n\nAssistant:") == [{"role": "user", "content": "a"}]
    assert parse_hh("\n\nHuman: a\n\nAssistant:", cue=False)[-1] == {"role": "assistant",
                                                                      "content": ""}
    assert parse_helpsteer("single turn") is None
    assert [t["role"] for t in parse_helpsteer(MULTI)] == ["user", "assistant", "user"]


# -- grouppref's own groups ----------------------------------------------------------------------
def test_groups_keep_rankings_partial_ones_valid_bad_ones_part_rejected(tmp_path: Path) -> None:
    group = make_annotated(make_group(k=4), [[0, 1, 2, 3], [3, 2, 1, 0]])
    row = group.model_dump(mode="json")
    ids = group.candidate_ids()
    partial = {**row["rankings"][0], "annotator": {"id": "ann-3", "kind": "human"},
               "tiers": [[ids[2]], [ids[0]]]}
    unknown = {**row["rankings"][0], "annotator": {"id": "ann-4", "kind": "human"},
               "tiers": [[ids[0]], ["c-nope"]]}
    single = {**row["rankings"][0], "annotator": {"id": "ann-5", "kind": "human"},
              "tiers": [[ids[0]]]}
    other = make_annotated(make_group(k=2, prompt_text="Other."), [[1, 0]]).model_dump(mode="json")
    result = read(tmp_path, [{**row, "rankings": [*row["rankings"], partial, unknown, single]},
                             other, {"prompt": "not a group"}])
    assert result.stats["layout"] == "groups"
    first, second = result.groups
    assert first.group_id == group.group_id  # ids kept as given
    assert [r.annotator.id for r in first.rankings] == ["ann-1", "ann-2", "ann-3"]
    parts = {r.field: r.reason for r in result.rejects if r.scope == "part"}
    assert "unknown candidates" in parts["rankings[3]"] and "at least 2" in parts["rankings[4]"]
    (bad,) = [r for r in result.rejects if r.scope == "row"]
    assert bad.row == 3 and "not a group" in bad.reason
    assert second.rankings[0].tiers == [[second.candidate_ids()[1]], [second.candidate_ids()[0]]]


# -- sizes, duplicates, detection ----------------------------------------------------------------
def test_oversize_group_is_split_with_rankings_or_rejected(tmp_path: Path) -> None:
    rows = [{"prompt": "Count.", "response": f"{i} apples", "judge": i} for i in range(20)]
    result = read(tmp_path, rows, layout="scores", scores=["judge"])
    assert [g.k for g in result.groups] == [10, 10]
    assert [g.group_id.split("-")[-1] for g in result.groups] == ["1of2", "2of2"]
    for g in result.groups:  # each part keeps the judge's order of its own candidates
        (ranking,) = g.rankings
        assert [t[0] for t in texts(g, ranking)] == sorted(
            (c.text for c in g.candidates), key=lambda t: -int(t.split()[0]))
    assert result.units == 2 and result.stats["groups_split"] == 1
    rejected = read(tmp_path, rows, layout="scores", scores=["judge"], oversize="reject")
    assert rejected.groups == [] and "at most 16" in rejected.rejects[0].reason


@pytest.mark.parametrize("row,layout", [
    (UF_ROWS[0], "ultrafeedback"), (NECTAR_ROWS[0], "nectar"), (HS_ROWS[0], "helpsteer2"),
    (ufb_row("p", "a", "b", 1.0, 0.0), "pairs"), ({"chosen": "\n\nHuman: a\n\nAssistant: b",
                                                   "rejected": "x"}, "hh"),
    ({"prompt": "p", "responses": ["a", "b"]}, "responses"),
    ({"prompt": "p", "response": "a"}, "responses"),
    (make_annotated(make_group(k=2), [[0, 1]]).model_dump(mode="json"), "groups"),
])
def test_layout_is_told_from_the_first_row(row: dict[str, Any], layout: str) -> None:
    assert detect(row, ImportConfig(source="x"), "x") == layout


def test_unknown_columns_name_the_layouts() -> None:
    with pytest.raises(InputFileError, match=r"cannot tell the layout .* give --layout"):
        detect({"question": "q", "answer": "a"}, ImportConfig(source="x"), "x.jsonl")
