"""Rankers: pure scoring helpers against hand-worked values, and each model ranker against an
independent, unbatched computation on tiny real models saved to disk."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from grouppref.errors import ConfigError
from grouppref.models.loading import ModelNotFoundError
from grouppref.pipeline.rank import scoring as rs
from grouppref.pipeline.rank.rankers import (
    POINTWISE_TEMPLATE,
    JudgeRanker,
    RewardRanker,
    RuleRanker,
    SimilarityRanker,
    Skip,
    format_for_reward,
    minilm_dir,
    padded_batches,
)
from grouppref.pipeline.rank.settings import (
    JudgeRankerSettings,
    KeywordsCheck,
    LengthCheck,
    RewardRankerSettings,
    RuleRankerSettings,
    SimilarityRankerSettings,
    VerifyCheck,
    annotator_for,
    parse_ranker_spec,
    parse_weights,
    ranker_keys,
)
from tests.support.factories import make_group

# MODEL_ATOL's derivation (tests/support/tolerances.py)
ATOL = 1e-4  # fp32 forward passes, batched (padded) vs one sequence alone


# -- rule checks -------------------------------------------------------------------------------
def test_length_regex_keywords() -> None:
    assert rs.length_score(60, 80) == -0.25
    assert rs.length_score(80, 80) == 0.0
    assert rs.text_length("one two  three", "words") == 3
    assert rs.text_length("one two", "chars") == 7
    assert rs.regex_score("answer: 42", re.compile(r"\d+")) == 1.0
    assert rs.regex_score("no digits", re.compile(r"\d+")) == 0.0
    assert rs.keywords_score("Red and BLUE.", ["red", "blue", "green", "re"]) == 0.5  # "re" is
    assert rs.keywords_score("Red", ["red"], case_sensitive=True) == 0.0  # not a whole word


@pytest.mark.parametrize("text,numeric,expected", [
    ("so 3 + 4 = 7.\nThe answer is 7.", True, "7."),
    ("we get \\boxed{\\frac{1}{2}} in the end", True, "\\frac{1}{2}"),
    ("steps\n#### 1,000", True, "1,000"),
    ("Final answer: Paris", False, "Paris"),
    ("first 12, then 13 apples", True, "13.0"),
    ("Thinking...\nParis\n", False, "Paris"),
    ("no number here", True, None),
])
def test_extract_final_answer(text: str, numeric: bool, expected: str | None) -> None:
    assert rs.extract_final_answer(text, numeric) == expected


@pytest.mark.parametrize("text,value", [
    ("$1,234.50", 1234.5), ("3/4", 0.75), ("\\frac{3}{4}", 0.75), ("-.5", -0.5), ("1e3", 1000.0),
    ("50%", 50.0), ("**42**.", 42.0), ("42 apples", None), ("Paris", None), ("1/0", None),
])
def test_parse_number(text: str, value: float | None) -> None:
    assert rs.parse_number(text) == value


@pytest.mark.parametrize("text,reference,ok", [
    ("The answer is 7.", "7", True),
    ("Final answer: 7.0", "7", True),
    ("It is 8", "7", False),
    ("#### 1,000", "1000", True),
    ("\\boxed{0.75}", "3/4", True),
    ("Final answer: **Paris**", "paris", True),
    ("Final answer:   new  YORK.", "New York", True),
    ("Paris is the capital", "Paris", False),  # text without a marker: the whole last line
    ("The answer is 0.3333333", "1/3", True),  # relative error 1e-7 <= rel_tol 1e-6
    ("The answer is 0.33334", "1/3", False),  # relative error 2e-5
])
def test_verify_score(text: str, reference: str, ok: bool) -> None:
    assert rs.verify_score(text, reference) == (1.0 if ok else 0.0)


def test_rule_ranker_weighted_sum_and_missing_reference() -> None:
    settings = RuleRankerSettings(checks=[LengthCheck(target=10, weight=0.5),
                                          KeywordsCheck(keywords=["paris", "france"], weight=2),
                                          VerifyCheck()])
    with_ref = make_group(reference="Paris", texts=["Paris", "Final answer: Lyon, France"])
    no_ref = make_group(prompt_text="other", texts=["a", "b"])
    out = RuleRanker(settings).score([with_ref, no_ref])
    # "Paris": 0.5*(-|5-10|/10) + 2*(1/2) + 1 = 1.75; the other: 0.5*(-16/10) + 2*(1/2) + 0 = 0.2
    # float64 rule scores, a few ops on exact decimals: ~eps64
    assert out[0] == pytest.approx([1.75, 0.2], abs=1e-12)
    assert out[1] == Skip("the prompt has no reference answer")


# -- scores -> tiers, ensemble ---------------------------------------------------------------------
def test_scores_to_tiers_ties_and_tolerance() -> None:
    ids = ["a", "b", "c", "d", "e"]
    assert rs.scores_to_tiers(ids, [1.0, 3.0, 1.0, 2.0, 0.0], tol=0.0) == [
        ["b"], ["d"], ["a", "c"], ["e"]]
    # within a tier no two scores differ by more than tol: 1.0, 0.9995, 0.999 at tol 1e-3 share
    # a tier but 0.9985 (1.5e-3 below the tier's best) opens the next one
    assert rs.scores_to_tiers(ids[:4], [0.999, 1.0, 0.9985, 0.9995], tol=1e-3) == [
        ["a", "b", "d"], ["c"]]
    assert rs.scores_to_tiers(["x", "y"], [5.0, 5.0], tol=0.0) == [["x", "y"]]
    with pytest.raises(ValueError):
        rs.scores_to_tiers(["x"], [1.0, 2.0], tol=0.0)


def test_ensemble_scores_against_naive() -> None:
    s = torch.tensor([[1.0, 2.0, 3.0], [10.0, 10.0, 10.0], [0.0, 4.0, 2.0]])
    w = torch.tensor([1.0, 5.0, 2.0])

    def z(row: list[float]) -> list[float]:
        m = sum(row) / len(row)
        sd = math.sqrt(sum((x - m) ** 2 for x in row) / len(row))
        return [0.0 if sd == 0 else (x - m) / sd for x in row]

    rows = [z(r) for r in s.tolist()]
    naive = [sum(wr * rows[r][k] for r, wr in enumerate(w.tolist())) / 8.0 for k in range(3)]
    # float64 z-scores of 3 values, weighted sum of 8: ~10 eps64
    assert rs.ensemble_scores(s, w).tolist() == pytest.approx(naive, abs=1e-12)


def test_pairwise_scores_cancel_position_bias() -> None:
    # true preference log-odds t = [[0, 2, 4], [-2, 0, 1], [-4, -1, 0]], position bias b = 0.7:
    # d[i, j] = t[i, j] + b. s_0 = ((2+.7)-(-2+.7) + (4+.7)-(-4+.7)) / 4 = (4 + 8) / 4 = 3
    t = torch.tensor([[0.0, 2.0, 4.0], [-2.0, 0.0, 1.0], [-4.0, -1.0, 0.0]])
    d = t + 0.7
    # float32 means of 2-4 exact small numbers: ~eps32 * 8 = 1e-6
    assert rs.pairwise_scores(d).tolist() == pytest.approx([3.0, -0.5, -2.5], abs=1e-6)


def test_verdict_log_odds_is_log_softmax_difference() -> None:
    logits = torch.randn(3, 11, generator=torch.Generator().manual_seed(0))
    ref = logits.log_softmax(-1)[:, 4] - logits.log_softmax(-1)[:, 7]
    # float32 log-odds (~1) from one log-softmax over 11 logits in two ways: ~10 eps32
    torch.testing.assert_close(rs.verdict_log_odds(logits, 4, 7), ref, atol=1e-6, rtol=0)


def test_padded_batches_positions() -> None:
    seqs = [[5, 6, 7], [8], [9, 10]]
    batches = list(padded_batches(seqs, batch_size=3, pad_id=0, left=True))
    idx, ids, mask, pos = batches[0]
    assert idx == [0, 2, 1]  # longest first
    assert ids.tolist() == [[5, 6, 7], [0, 9, 10], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 1, 1], [0, 0, 1]]
    assert pos.tolist() == [[0, 1, 2], [0, 0, 1], [0, 0, 0]]


# -- specs and identities ------------------------------------------------------------------------
def test_parse_ranker_specs() -> None:
    assert parse_ranker_spec("reward:org/rm").model == "org/rm"
    rule = parse_ranker_spec("rule:length=80;2*keywords=a, b;regex=^x;y$;verify")
    assert [c.check for c in rule.checks] == ["length", "keywords", "regex", "verify"]
    assert rule.checks[1].weight == 2.0 and rule.checks[1].keywords == ["a", "b"]
    assert rule.checks[2].pattern == "^x;y$"  # a ';' not followed by a check name stays
    assert parse_ranker_spec("rule:length=20w").checks[0].unit == "words"
    assert parse_ranker_spec("similarity").model is None
    assert parse_ranker_spec("judge").model is None
    assert parse_weights("reward=1, verify=2.5") == {"reward": 1.0, "verify": 2.5}
    for bad in ("reward", "rule:size=3", "rule:length=ten", "rule:regex=(", "bogus:x"):
        with pytest.raises(ConfigError):
            parse_ranker_spec(bad)
    with pytest.raises(ConfigError):
        parse_weights("reward=heavy")


def test_annotator_ids_kinds_versions() -> None:
    verify = annotator_for(parse_ranker_spec("verify"))
    assert (verify.id, verify.kind) == ("rule:verify", "rule")
    assert annotator_for(parse_ranker_spec("rule:length=80;2*keywords=a,b")).id == \
        "rule:length=80+2*keywords=a,b"
    assert annotator_for(parse_ranker_spec("similarity")).id == "similarity:all-MiniLM-L6-v2"
    judge = annotator_for(parse_ranker_spec("judge"))
    assert (judge.id, judge.kind) == ("judge:smollm2-135m-instruct", "llm_judge")
    reward = annotator_for(RewardRankerSettings(model="org/rm", name="rm1"))
    assert (reward.id, reward.kind) == ("reward:rm1", "reward_model")
    # the version is a hash of the settings: equal settings, equal versions
    assert annotator_for(parse_ranker_spec("verify")).version == verify.version
    assert annotator_for(RuleRankerSettings(checks=[VerifyCheck(rel_tol=0.1)])).version != \
        verify.version
    rankers = [parse_ranker_spec(s) for s in ("judge", "verify", "judge", "rule:length=3")]
    assert ranker_keys(rankers) == ["judge", "verify", "judge-2", "rule"]


# -- reward model --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reward(tiny_reward_model_dir: Path) -> RewardRanker:
    ranker = RewardRanker(RewardRankerSettings(model=str(tiny_reward_model_dir), batch_size=3))
    ranker.check()
    ranker.load()
    return ranker


def _groups() -> list:
    return [make_group(prompt_text="What is 2+3?", reference="5",
                       texts=["It is 5.", "The answer is 6, I think.", "5", "five"]),
            make_group(prompt_text="Say hi", texts=["hi", "hello there, friend"])]


def test_reward_scores_match_unbatched_forward(reward: RewardRanker) -> None:
    groups = _groups()
    out = reward.score(groups)
    model, tok = reward.model, reward.tokenizer
    for g, scores in zip(groups, out, strict=True):
        for c, got in zip(g.candidates, scores, strict=True):
            messages = [{"role": "user", "content": g.prompt.text},
                        {"role": "assistant", "content": c.text}]
            ids = tok(tok.apply_chat_template(messages, tokenize=False),
                      add_special_tokens=False, return_tensors="pt")["input_ids"]
            with torch.no_grad():
                h = model.model(input_ids=ids).last_hidden_state[0, -1]  # (H,) last token
                want = model.score(h).item()
            assert got == pytest.approx(want, abs=ATOL)


def test_reward_format_uses_own_chat_template(reward: RewardRanker) -> None:
    g = _groups()[1]
    text, special = format_for_reward(reward.tokenizer, g, "hi")
    assert text.endswith("<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\nhi<|im_end|>\n")
    assert special is False

    class Plain:  # a tokenizer without a chat template
        chat_template = None

    assert format_for_reward(Plain(), g, "hi") == ("Say hi\n\nhi", True)


def test_reward_too_long_group_is_skipped(tiny_reward_model_dir: Path) -> None:
    ranker = RewardRanker(RewardRankerSettings(model=str(tiny_reward_model_dir), max_length=40))
    ranker.load()
    long = make_group(prompt_text="Write a lot.", texts=["word " * 50, "short"])
    out = ranker.score([long, _groups()[1]])
    assert isinstance(out[0], Skip) and "more than max_length 40" in out[0].reason
    assert isinstance(out[1], list) and len(out[1]) == 2


def test_reward_check_rejects_wrong_models(tmp_path: Path, tiny_lm_dir: Path) -> None:
    from transformers import LlamaConfig

    with pytest.raises(ModelNotFoundError):
        RewardRanker(RewardRankerSettings(model=str(tmp_path / "nope"))).check()
    with pytest.raises(ConfigError, match="not a sequence classifier"):
        RewardRanker(RewardRankerSettings(model=str(tiny_lm_dir))).check()
    two = tmp_path / "two-outputs"
    LlamaConfig(num_labels=2, architectures=["LlamaForSequenceClassification"]).save_pretrained(two)
    with pytest.raises(ConfigError, match="2 outputs"):
        RewardRanker(RewardRankerSettings(model=str(two))).check()


# -- LLM judge -----------------------------------------------------------------------------------
def _judge(model: Path | None, mode: str = "pointwise", batch_size: int = 8) -> JudgeRanker:
    ranker = JudgeRanker(JudgeRankerSettings(model=str(model) if model else None, mode=mode,
                                             batch_size=batch_size))
    ranker.check()
    ranker.load()
    return ranker


def _next_token_log_odds(judge: JudgeRanker, content: str, words: tuple[str, str]) -> float:
    tok = judge.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                   add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logp = judge.model(input_ids=ids).logits[0, -1].log_softmax(-1)  # (V,)
    yes, no = (tok.encode(w, add_special_tokens=False)[0] for w in words)
    return (logp[yes] - logp[no]).item()


def test_judge_pointwise_matches_unbatched(tiny_lm_dir: Path) -> None:
    judge = _judge(tiny_lm_dir, batch_size=3)
    groups = _groups()
    out = judge.score(groups)
    for g, scores in zip(groups, out, strict=True):
        for c, got in zip(g.candidates, scores, strict=True):
            content = POINTWISE_TEMPLATE.format(prompt=g.prompt.text, answer=c.text,
                                                question=judge.settings.question)
            assert got == pytest.approx(_next_token_log_odds(judge, content, ("Yes", "No")),
                                        abs=ATOL)


def test_judge_pairwise_matches_naive(tiny_lm_dir: Path) -> None:
    from grouppref.pipeline.rank.rankers import PAIRWISE_TEMPLATE

    judge = _judge(tiny_lm_dir, mode="pairwise", batch_size=4)
    g = _groups()[0]
    (got,) = judge.score([g])
    texts = [c.text for c in g.candidates]
    k = len(texts)
    d = [[0.0 if i == j else _next_token_log_odds(
        judge, PAIRWISE_TEMPLATE.format(prompt=g.prompt.text, a=texts[i], b=texts[j]), ("A", "B"))
        for j in range(k)] for i in range(k)]
    naive = [sum(d[i][j] - d[j][i] for j in range(k) if j != i) / (2 * (k - 1)) for i in range(k)]
    assert got == pytest.approx(naive, abs=ATOL)


def test_judge_too_long_group_is_skipped(tiny_lm_dir: Path) -> None:
    judge = JudgeRanker(JudgeRankerSettings(model=str(tiny_lm_dir), max_length=64))
    judge.load()
    out = judge.score([make_group(texts=["word " * 80, "short"])])
    assert isinstance(out[0], Skip) and "more than max_length 64" in out[0].reason


def test_judge_check_rejects_reward_model(tiny_reward_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="not a causal LM"):
        JudgeRanker(JudgeRankerSettings(model=str(tiny_reward_model_dir))).check()


def test_embedded_judge_on_two_groups(embedded_model_dir: Path) -> None:
    """The default judge (embedded SmolLM2-135M-Instruct) loads and scores: finite log-odds.

    (Batch invariance is checked on the tiny LM above; quality is not asserted: with 135M
    parameters the verdicts are weak.)"""
    judge = _judge(None, batch_size=4)
    assert judge.settings.model is None and judge.chat
    groups = [make_group(prompt_text="What is 2+2?", texts=["4", "The capital of France is Paris."]),
              make_group(prompt_text="Name a primary colour.", texts=["Red.", "Seven."])]
    for scores in judge.score(groups):
        assert isinstance(scores, list) and len(scores) == 2
        assert all(math.isfinite(x) for x in scores)


# -- reference similarity --------------------------------------------------------------------------
def test_similarity_matches_manual_mean_pooling() -> None:
    from transformers import AutoModel, AutoTokenizer

    ranker = SimilarityRanker(SimilarityRankerSettings(batch_size=3))
    ranker.check()
    ranker.load()
    g = make_group(prompt_text="Capital of France?", reference="The capital of France is Paris.",
                   texts=["Paris is the capital of France.", "I like turtles.", "Lyon"])
    (got,) = ranker.score([g, make_group(prompt_text="no ref", texts=["a", "b"])])[:1]
    assert got[0] == max(got)  # the paraphrase is closest to the reference
    # independent reference: BERT last hidden state, mean over real tokens, cosine
    tok = AutoTokenizer.from_pretrained(minilm_dir())
    model = AutoModel.from_pretrained(minilm_dir()).eval()
    batch = tok([g.prompt.reference] + [c.text for c in g.candidates], padding=True,
                return_tensors="pt")
    with torch.no_grad():
        h = model(**batch).last_hidden_state  # (N, T, H)
    m = batch["attention_mask"][..., None].float()
    e = (h * m).sum(1) / m.sum(1)  # (N, H)
    want = torch.nn.functional.cosine_similarity(e[1:], e[:1], dim=-1)
    # float32 cosines (<= 1) of mean-pooled 32-wide embeddings, batched vs alone: sqrt(32) * eps32 * few
    # ~ 1e-6; 1e-5 with room
    assert got == pytest.approx(want.tolist(), abs=1e-5)
    assert ranker.score([make_group(texts=["a", "b"])])[0] == \
        Skip("the prompt has no reference answer")
