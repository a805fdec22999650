"""Tokenising and batching validated groups: pair matrices, consensus order, overflow policy,
bad input (K = 1 after filtering, no chat template, missing reference log-probs), counts."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from grouppref.errors import ConfigError, RowError
from grouppref.schemas import Agreement, ChatMessage, PairPreference, Prompt, ValidatedGroup
from grouppref.train.data.tokenize import tokenize_group, tokenize_groups
from grouppref.train.settings.shared import DataConfig
from grouppref.train.tensors.batch import collate_groups
from tests.support.factories import make_annotated, make_group


@pytest.fixture(scope="module")
def tokenizer(tiny_lm_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_lm_dir)


def make_validated(texts: list[str], consensus: list[list[int]], pairs: list[tuple[int, int, float, float]],
                   strengths: list[float] | None = None, prompt_text: str = "Name a colour.",
                   chat: bool = False) -> ValidatedGroup:
    """A validated group: consensus tiers and pairs (winner, loser, p, weight) by candidate index."""
    group = make_group(len(texts), prompt_text=prompt_text, texts=texts)
    if chat:
        prompt = Prompt(prompt_id=group.prompt.prompt_id,
                        messages=[ChatMessage(role="user", content=prompt_text)])
        group = group.model_copy(update={"prompt": prompt})
    ids = group.candidate_ids()
    ann = make_annotated(group, [list(range(len(texts)))])
    strengths = strengths or [-float(i) for i in range(len(texts))]
    return ValidatedGroup(
        **ann.model_dump(), consensus=[[ids[i] for i in tier] for tier in consensus],
        strengths={ids[i]: s for i, s in enumerate(strengths)},
        pairs=[PairPreference(winner=ids[w], loser=ids[lo], p=p, weight=wt) for w, lo, p, wt in pairs],
        agreement=Agreement(num_annotators=1), split="train")


def test_pair_matrices_order_and_eos(tokenizer):
    # Consensus: {2, 0} tied on top (2 stronger), then 1. Pair (0, 1) has no preference.
    group = make_validated(["red", "blue sky", "green"], [[0, 2], [1]],
                           [(2, 0, 0.6, 0.5), (2, 1, 0.9, 1.0)], strengths=[0.1, -1.0, 0.4])
    tok = tokenize_group(group, tokenizer, DataConfig(chat_template=False))
    assert tok.order == [2, 0, 1]
    # 1 - 0.6 and 1 - 0.9 in float64: ~eps64; the rest exact
    assert tok.p_ij == [[0.5, 0.5, pytest.approx(0.4)], [0.5, 0.5, pytest.approx(0.1)], [0.6, 0.9, 0.5]]
    assert tok.w_ij == [[0.0, 0.0, 0.5], [0.0, 0.0, 1.0], [0.5, 1.0, 0.0]]
    assert all(c[-1] == tokenizer.eos_token_id for c in tok.cand_ids)
    assert tok.cand_ids[1][:-1] == tokenizer("blue sky", add_special_tokens=False)["input_ids"]
    assert tok.behavior_logps == [-1.0, -1.0, -1.0] and tok.ref_logps is None
    assert tok.candidate_ids == group.candidate_ids() and tok.split == "train"


def test_chat_template_renders_prompt(tokenizer):
    group = make_validated(["red", "blue"], [[0], [1]], [(0, 1, 1.0, 1.0)], chat=True)
    tok = tokenize_group(group, tokenizer, DataConfig())
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Name a colour."}],
                                         add_generation_prompt=True, tokenize=False)
    assert tok.prompt_ids == tokenizer(text, add_special_tokens=False)["input_ids"]
    with pytest.raises(RowError, match="chat_template is off"):
        tokenize_group(group, tokenizer, DataConfig(chat_template=False))


def test_tokenizer_without_chat_template_is_a_config_error(tokenizer):
    plain = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    plain.chat_template = None
    group = make_validated(["red", "blue"], [[0], [1]], [(0, 1, 1.0, 1.0)], chat=True)
    with pytest.raises(ConfigError, match="no chat template"):
        tokenize_groups([group], plain, DataConfig())


def test_overflow_truncate_counts_and_forgets_behavior_logp(tokenizer):
    long = "word " * 30
    group = make_validated(["red", long], [[0], [1]], [(0, 1, 1.0, 1.0)])
    tok = tokenize_group(group, tokenizer, DataConfig(chat_template=False, max_response_length=8))
    assert len(tok.cand_ids[1]) == 8 and tok.num_truncated == 1
    assert tok.behavior_logps == [-1.0, None]


def test_overflow_reject_drops_candidate_with_part_reject(tokenizer):
    long = "word " * 30
    keep = make_validated(["red", "blue", long], [[0], [1], [2]],
                          [(0, 1, 1.0, 1.0), (0, 2, 1.0, 1.0), (1, 2, 1.0, 1.0)])
    one_left = make_validated(["red", long], [[0], [1]], [(0, 1, 1.0, 1.0)], prompt_text="Other.")
    config = DataConfig(chat_template=False, max_response_length=8, overflow="reject")
    out, rejects = tokenize_groups([keep, one_left], tokenizer, config)
    assert [g.group_id for g in out] == [keep.group_id]
    assert len(out[0].cand_ids) == 2 and out[0].p_ij == [[0.5, 1.0], [0.0, 0.5]]
    part, row = sorted(rejects, key=lambda r: r.scope)
    assert part.scope == "part" and part.row == 1 and "over max_response_length=8" in part.reason
    assert row.scope == "row" and row.row == 2 and "only 1 candidate(s) left" in row.reason
    assert 2 == len(out) + sum(r.scope == "row" for r in rejects)  # counts add up


def test_long_prompt_and_no_weighted_pair_rejected(tokenizer):
    long_prompt = make_validated(["a", "b"], [[0], [1]], [(0, 1, 1.0, 1.0)], prompt_text="x " * 40)
    no_signal = make_validated(["a", "b"], [[0, 1]], [(0, 1, 0.5, 0.0)], prompt_text="Other.")
    out, rejects = tokenize_groups([long_prompt, no_signal], tokenizer,
                                   DataConfig(chat_template=False, max_prompt_length=16))
    assert out == []
    assert "over max_prompt_length=16" in rejects[0].reason and rejects[0].field == "prompt"
    assert "no preference pair with weight > 0" in rejects[1].reason


def test_collate_pads_candidates_and_checks_reference(tokenizer):
    config = DataConfig(chat_template=False)
    g3 = tokenize_group(make_validated(["a", "b", "c"], [[1], [0], [2]],
                                       [(1, 0, 0.8, 1.0), (0, 2, 0.7, 0.5)]), tokenizer, config)
    g2 = tokenize_group(make_validated(["x", "y"], [[0], [1]], [(0, 1, 1.0, 1.0)],
                                       prompt_text="A longer prompt here."), tokenizer, config)
    g2 = dataclasses.replace(g2, behavior_logps=[None, -2.0])
    batch = collate_groups([g3, g2], pad_token_id=tokenizer.pad_token_id)
    assert batch.valid.tolist() == [[True] * 3, [True, True, False]]
    assert batch.order.tolist() == [[1, 0, 2], [0, 1, 2]]
    assert batch.p_ij[1, 2].tolist() == [0.5] * 3 and batch.w_ij[1, :, 2].tolist() == [0.0] * 3
    assert torch.isnan(batch.behavior_logps[1, [0, 2]]).all() and batch.behavior_logps[1, 1] == -2.0
    assert batch.num_tokens[1].tolist() == [len(g2.cand_ids[0]), len(g2.cand_ids[1]), 0]
    assert batch.ref_logps is None
    with_ref = [dataclasses.replace(g, ref_logps=[-1.0] * len(g.cand_ids)) for g in (g3, g2)]
    assert collate_groups(with_ref, 0).ref_logps.tolist() == [[-1.0] * 3, [-1.0, -1.0, 0.0]]
    with pytest.raises(ConfigError, match="reference log-probs missing"):
        collate_groups([with_ref[0], g2], 0)
    assert batch.to("cpu").group_ids == [g3.group_id, g2.group_id]


def test_data_config_forbids_unknown_keys():
    with pytest.raises(ValueError, match="overflow"):
        DataConfig(overflow="drop")
    with pytest.raises(ValueError, match="extra"):
        DataConfig(max_len=3)
