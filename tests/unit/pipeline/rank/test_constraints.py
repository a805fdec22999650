"""Verifiable constraints (IFEval ids and kwargs): every check on texts that meet it and texts that
narrowly miss it, the spec parser (our form and a hand-written row of IFEval's published schema),
and the rule ranker's ``constraints`` check through the real ``grouppref rank`` command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grouppref.cli import app
from grouppref.pipeline.imports.config import ImportConfig
from grouppref.pipeline.imports.stage import run_import_candidates
from grouppref.pipeline.rank import constraints as cs
from grouppref.pipeline.rank import text as text_mod
from grouppref.pipeline.rank.rankers import RuleRanker, Skip
from grouppref.pipeline.rank.settings import ConstraintsCheck, RuleRankerSettings, parse_ranker_spec
from grouppref.runs.store import RunStore
from grouppref.schemas import AnnotatedGroup, Prompt
from tests.support.factories import make_group


def _met(cid: str, text: str, **kwargs: object) -> bool:
    return cs.constraint_met(cs.make_constraint(cid, kwargs), text)


# id, kwargs, texts that meet it, texts that do not
CASES = [
    ("change_case:english_lowercase", {}, ["hello world.", "it's 5 o'clock"],
     ["Hello world.", "123 456", "", "日本"]),
    ("change_case:english_capital", {}, ["HELLO WORLD!", "IT IS 5 O'CLOCK"],
     ["HELLO World", "42", "日本"]),
    ("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "at least"},
     ["USE THE force", "NASA and ESA"], ["only ONE here", "none"]),
    ("punctuation:no_comma", {}, ["no commas here.", "semi; colon"],
     ["one, two", "a,b", "a\uff0cb", "", " "]),
    ("detectable_format:json_format", {}, ['{"a": 1}', '```json\n{"a": [1, 2]}\n```', "[1, 2]"],
     ['{"a": 1', "answer: {}", "Here: {\"a\": 1}", '{"a": NaN}']),
    ("detectable_format:json_format", {"required_keys": ["answer"]},
     ['{"answer": "rain"}', '```\n{"answer": 3, "x": 1}\n```'],
     ['{"Answer": "rain"}', '["answer"]', '"answer"']),
    ("detectable_format:title", {}, ["<<On Rain>>\nIt falls.", "text <<t>>"],
     ["<< >> nothing", "<<no\nclose>>", "no title"]),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, ["* one\n* two", "- a\n- b\nend"],
     ["* one", "* a\n* b\n- c", "**bold** line\n* one"]),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2},
     ["*one* and *two*", "**bold** and *it*"], ["*one* only", "* *"]),
    ("detectable_content:postscript", {"postscript_marker": "P.S."},
     ["Hi.\nP.S. bye", "Hi.\n  p. s. bye"], ["Hi. P.S. inline", "Hi.\nPS bye"]),
    ("detectable_content:postscript", {"postscript_marker": "Note:"}, ["Hi.\nnote: x"], ["Hi."]),
    ("detectable_content:number_placeholders", {"num_placeholders": 2},
     ["Dear [name], at [place]."], ["Dear [name].", "no placeholders"]),
    ("startend:quotation", {}, ['"Rain falls."', '  "a" \n', "\u201cRain falls.\u201d"],
     ['"Rain falls.', 'Rain "falls"', '"', '""']),
    ("startend:end_checker", {"end_phrase": "That is all."},
     ["Rain falls. That is all.", '"Rain falls. that is all."  '],
     ["That is all. Rain falls.", "Rain falls. That is all", "Rain falls. ThatThat is all."]),
    ("startend:first_word", {"first_word": "yes"},
     ["Yes, rain.", "yes.", "**Yes** indeed", "Yes,rain", "Yes.\n\nNo.", '"Yes," she said.'],
     ["Yesterday it rained.", "Yes-men", "No, yes.", ""]),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Say hi."}, ["say hi. Hi!"], ["Hi! Say hi."]),
    ("keywords:existence", {"keywords": ["rain", "c++"]}, ["RAIN in C++", "rain-soaked C++!"],
     ["rain in C", "rainy C++", "Brain in C++"]),
    ("keywords:forbidden_words", {"forbidden_words": ["very"]}, ["everything is fine"],
     ["it is Very fine"]),
    ("keywords:frequency", {"keyword": "rain", "frequency": 2, "relation": "less than"},
     ["no r-word", "one rain"], ["rain, Rain"]),
    ("keywords:letter_frequency", {"letter": "z", "let_frequency": 2, "let_relation": "at least"},
     ["Zoo zebra"], ["zoo"]),
    ("length_constraints:number_words", {"num_words": 4, "relation": "less than"},
     ["It's raining.", "one two three", "I don't know"], ["one two three four", "", "  "]),
    ("length_constraints:number_words", {"num_words": 3, "relation": "exactly"},
     ["one, two, three."], ["one two", "one two three four"]),
    ("length_constraints:number_words", {"num_words": 2, "relation": "at most"},
     ["one two"], ["one two three"]),
    ("length_constraints:number_sentences", {"num_sentences": 1, "relation": "exactly"},
     ["Pi is 3.14 or so.", "Just one", "Mr. Lee left at 6 a.m. today.", "Wait... really?"],
     ["One. Two.", "Hi! Bye?", "", 'He said "Stop." Then he left.']),
    ("length_constraints:number_sentences", {"num_sentences": 2, "relation": "at least"},
     ["One. Two", "A? B! C."], ["Only one."]),
    ("length_constraints:nth_paragraph_first_word",
     {"num_paragraphs": 1, "nth_paragraph": 1, "first_word": "yes"},
     ["Yes, rain.", '"YES!" it rains', "**Yes** indeed"], ["Yesterday it rained.", "Yes.\n\nNo."]),
    ("length_constraints:nth_paragraph_first_word",
     {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "then"},
     ["First.\n\nThen second."], ["First.\nThen second.", "First.\n\nAnd then."]),
]


@pytest.mark.parametrize("cid,kwargs,good,bad", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_check(cid: str, kwargs: dict, good: list[str], bad: list[str]) -> None:
    for text in good:
        assert _met(cid, text, **kwargs), f"{cid} should accept {text!r}"
    for text in bad:
        assert not _met(cid, text, **kwargs), f"{cid} should reject {text!r}"


def test_every_constraint_type_is_tested() -> None:
    assert {c[0] for c in CASES} == set(cs.CONSTRAINTS)


def test_counts() -> None:
    assert cs.count_words("It's 5 o'clock.") == 3
    assert cs.count_words("My mother-in-law, e.g., paid $3.50 at 7 a.m.") == 8
    assert cs.count_sentences("One. Two! Three") == 3
    assert cs.count_sentences("Version 2.0 is out... really?") == 1
    assert cs.count_sentences("Version 2.0 is out... Really?") == 2
    assert cs.count_sentences("  ") == 0


@pytest.mark.parametrize("text,expected", [
    ("Mr. Lee keeps bees in the U.S. They said \"Stop.\" Then... nothing!",
     ["Mr. Lee keeps bees in the U.S.", 'They said "Stop."', "Then... nothing!"]),
    ("We climbed Mt. Fuji at 6 a.m. with J. K. Rowling, e.g. for fun. Wait… really?",
     ["We climbed Mt. Fuji at 6 a.m. with J. K. Rowling, e.g. for fun.", "Wait… really?"]),
    ("1. Bees buzz.They fly!!! \"Run!\" she said.\n\nNo. 5 has a Ph.D. Bees know.",
     ["1. Bees buzz.", "They fly!!!", '"Run!" she said.', "No. 5 has a Ph.D.", "Bees know."]),
    ("I take vitamin C. It helps. ...", ["I take vitamin C.", "It helps."]),
])
def test_sentences(text: str, expected: list[str]) -> None:
    assert text_mod.sentences(text) == expected


def test_words() -> None:
    assert text_mod.words("I don't know, my mother-in-law left at 7 a.m. with 3.5 kg.") == [
        "I", "don't", "know", "my", "mother-in-law", "left", "at", "7", "a.m.", "with", "3.5", "kg"]
    assert text_mod.first_word('  "**Yes**," she said') == "Yes"
    assert text_mod.first_word("... !") is None


def test_an_empty_answer_meets_no_constraint() -> None:
    """IFEval's strict scoring fails every instruction on an empty response; so do we (an
    answer that is only EOS decodes to ""), also where the check alone would pass."""
    kwargs = {"change_case:capital_word_frequency": {"capital_frequency": 0, "capital_relation": "at least"},
              "keywords:forbidden_words": {"forbidden_words": ["x"]},
              "keywords:frequency": {"keyword": "x", "frequency": 1, "relation": "less than"},
              "keywords:letter_frequency": {"letter": "x", "let_frequency": 1,
                                            "let_relation": "less than"},
              "length_constraints:number_words": {"num_words": 3, "relation": "less than"},
              "length_constraints:number_sentences": {"num_sentences": 2, "relation": "less than"}}
    for cid in ("punctuation:no_comma", *kwargs):
        c = cs.make_constraint(cid, kwargs.get(cid))
        assert cs.CONSTRAINTS[c.id].check("", **c.kwargs), c  # the bare check passes ...
        for text in ("", " \n\t"):
            assert not cs.constraint_met(c, text), (c, text)  # ... constraint_met() does not


def test_satisfaction_is_the_share_met() -> None:
    spec = [{"id": "change_case:english_lowercase"}, {"id": "punctuation:no_comma"},
            {"id": "startend:end_checker", "kwargs": {"end_phrase": "bye"}}]
    parsed = cs.parse_constraints(json.dumps(spec))
    # a share of checks (k / n): float64, a few operations: approx's default rel 1e-6 is ~1e9 eps64
    assert cs.satisfaction("hello, bye", parsed) == pytest.approx(2 / 3)
    assert cs.satisfaction("Hello, hi", parsed) == 0.0
    assert cs.satisfaction("hello bye", parsed) == 1.0


def test_ifeval_published_row() -> None:
    """A row as in google/IFEval (``key``, ``prompt``, ``instruction_id_list``, ``kwargs``, where
    every kwargs dict lists all arguments, null when unused)."""
    names = ["num_highlights", "relation", "num_words", "num_placeholders", "prompt_to_repeat",
             "num_paragraphs", "nth_paragraph", "first_word", "postscript_marker", "keyword",
             "frequency", "keywords", "letter", "let_frequency", "let_relation",
             "capital_frequency", "capital_relation", "forbidden_words", "end_phrase",
             "num_bullets", "section_spliter", "num_sections", "language"]
    null = dict.fromkeys(names)
    row = {"key": 1000, "prompt": "Write a 300+ word summary ... Do not use any commas and "
           "highlight at least 3 sections ...",
           "instruction_id_list": ["punctuation:no_comma",
                                   "detectable_format:number_highlighted_sections",
                                   "length_constraints:number_words"],
           "kwargs": [null, null | {"num_highlights": 3},
                      null | {"relation": "at least", "num_words": 300}]}
    parsed = cs.parse_constraints(json.dumps({k: row[k] for k in ("instruction_id_list", "kwargs")}))
    assert [c.id for c in parsed] == row["instruction_id_list"]
    assert parsed[2].kwargs == {"relation": "at least", "num_words": 300}
    text = "*a* *b* *c* " + "word " * 297
    assert cs.satisfaction(text, parsed) == 1.0
    # k / n: float64, a few operations: approx's default rel 1e-6 is ~1e9 eps64
    assert cs.satisfaction(text.replace("*c*", "c,"), parsed) == pytest.approx(1 / 3)


@pytest.mark.parametrize("spec,message", [
    ("not json", "not valid JSON"),
    ("[]", "non-empty list"),
    ('[{"id": "nope:x"}]', "unknown constraint id 'nope:x'"),
    ('[{"id": "startend:end_checker"}]', "missing kwargs ['end_phrase']"),
    ('[{"id": "punctuation:no_comma", "kwargs": {"x": 1}}]', "unknown kwargs ['x']"),
    ('[{"id": "length_constraints:number_words", "kwargs": {"num_words": 3, "relation": "~"}}]',
     "relation '~' is not one of"),
    ('[{"id": "punctuation:no_comma", "extra": 1}]', "expected {\"id\": str"),
    ('{"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}, {}]}', "equal length"),
])
def test_bad_specs(spec: str, message: str) -> None:
    with pytest.raises(cs.ConstraintError, match=message.replace("[", r"\[").replace("]", r"\]")
                       .replace("(", r"\(").replace("{", r"\{").replace("}", r"\}")):
        cs.parse_constraints(spec)


def _constrained_group(texts: list[str], spec: object):
    group = make_group(texts=texts)
    meta = {} if spec is None else {"constraints": spec if isinstance(spec, str) else json.dumps(spec)}
    prompt = Prompt(prompt_id=group.prompt.prompt_id, text=group.prompt.text, metadata=meta)
    return group.model_copy(update={"prompt": prompt})


def test_rule_ranker_scores_the_share_met() -> None:
    spec = [{"id": "change_case:english_lowercase"}, {"id": "punctuation:no_comma"}]
    ranker = RuleRanker(RuleRankerSettings(checks=[ConstraintsCheck()]))
    good = _constrained_group(["all good", "Not, good", "Half good", "half, good"], spec)
    missing = _constrained_group(["a", "b"], None)
    broken = _constrained_group(["a", "b"], [{"id": "nope:x"}])
    out = ranker.score([good, missing, broken])
    assert out[0] == [1.0, 0.0, 0.5, 0.5]
    assert isinstance(out[1], Skip) and "no constraints in metadata['constraints']" in out[1].reason
    assert isinstance(out[2], Skip) and "unknown constraint id 'nope:x'" in out[2].reason


def test_spec_syntax() -> None:
    assert parse_ranker_spec("rule:constraints").checks[0] == ConstraintsCheck()
    settings = parse_ranker_spec("rule:2*constraints=rules;length=20w")
    assert settings.checks[0] == ConstraintsCheck(metadata_key="rules", weight=2.0)
    assert settings.checks[1].check == "length"


def test_rank_command_with_constraints(tmp_path: Path) -> None:
    """``grouppref rank --ranker rule:constraints`` on imported candidates (the import stage):
    the rule's ranking follows the share of constraints met, ties share a tier."""
    spec = json.dumps([{"id": "change_case:english_lowercase"}, {"id": "startend:quotation"}])
    rows = [{"prompt_id": "p1", "prompt": "Say hi in lowercase, in quotes.",
             "metadata": {"constraints": spec},
             "responses": ['"hi there"', "hi you", '"Hi friend"', "Hi all"]}]
    src = tmp_path / "groups.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    run_import_candidates(RunStore(run), ImportConfig(source=str(src)))
    res = CliRunner().invoke(app, ["rank", str(run), "--ranker", "rule:constraints"])
    assert res.exit_code == 0, res.output
    (group,) = RunStore(run).load_records("rank", AnnotatedGroup)
    texts = {c.candidate_id: c.text for c in group.candidates}
    (ranking,) = group.rankings
    assert [[texts[c] for c in tier] for tier in ranking.tiers] == [
        ['"hi there"'], ["hi you", '"Hi friend"'], ["Hi all"]]
    assert ranking.annotator.id == "rule:constraints"
