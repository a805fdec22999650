"""The IFEval-style experiment's pieces (research/ifeval_cpu): the prompt builder (held-out
topics and constraint pairs, every prompt's constraints valid and checkable), the batched
decoder of the evaluation (its greedy row equals transformers' greedy ``generate`` on a tiny
real model, and the KL of a model to itself is 0), the answer text it checks (EOS and special
tokens dropped, nothing else; an empty answer meets nothing), and the report's statistics
against hand-computed values."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from grouppref.api import constraint_met, make_constraint, parse_constraints, satisfaction
from research.ifeval_cpu import build as b
from research.ifeval_cpu.report import markdown, method_stats, prompt_values


@pytest.fixture(scope="module")
def split() -> tuple[list[dict], list[dict]]:
    return b.build(300, 120, seed=0, held_out_topics=40)


def test_sizes_ids_and_no_duplicates(split) -> None:
    train, test = split
    assert (len(train), len(test)) == (300, 120)
    ids = [r["prompt_id"] for r in train + test]
    assert len(set(ids)) == len(ids)
    assert len({r["prompt"] for r in train}) == len(train)


def test_held_out_topics_and_pairs_never_in_training(split) -> None:
    train, test = split
    train_topics = {r["metadata"]["topic"] for r in train}
    assert not train_topics & {r["metadata"]["topic"] for r in test}
    train_kinds = {frozenset(r["metadata"]["kinds"].split("+")) for r in train}
    assert not train_kinds & b.HELD_OUT_PAIRS
    test_kinds = [frozenset(r["metadata"]["kinds"].split("+")) for r in test]
    unseen = sum(k in b.HELD_OUT_PAIRS for k in test_kinds)
    assert unseen == len(test) // 2  # every other held-out prompt asks for an unseen pair


def test_every_prompt_has_valid_compatible_constraints(split) -> None:
    train, test = split
    seen_kinds = set()
    for row in train + test:
        kinds = row["metadata"]["kinds"].split("+")
        seen_kinds.update(kinds)
        assert 1 <= len(kinds) <= 2
        assert frozenset(kinds) not in b.INCOMPATIBLE
        constraints = parse_constraints(row["metadata"]["constraints"])
        assert [c.id for c in constraints] == [b.KINDS[k].id for k in kinds]
    assert seen_kinds == set(b.KINDS)


def test_kinds_are_the_edge_corpus_kinds() -> None:
    """The prompts ask for exactly the kinds whose checks the product's edge-case corpus compares
    with IFEval (tests/data/ifeval_edge/cases.jsonl), under the same constraint ids."""
    corpus = Path(__file__).parents[3] / "tests" / "data" / "ifeval_edge" / "cases.jsonl"
    kinds = {json.loads(line)["kind"] for line in corpus.read_text().splitlines() if line.strip()}
    assert set(b.KINDS) == kinds
    for kind in b.KINDS.values():
        kwargs, _ = kind.draw(random.Random(0))
        assert make_constraint(kind.id, kwargs).id == kind.id


def test_same_seed_same_prompts_other_seed_other_prompts() -> None:
    assert b.build(20, 10, 3, 40) == b.build(20, 10, 3, 40)
    assert b.build(20, 10, 3, 40) != b.build(20, 10, 4, 40)


# A hand-written answer that meets each kind's instruction (kwargs as drawn with seed 0).
ANSWERS = {
    "lowercase": "bees make honey.", "capital": "BEES MAKE HONEY.",
    "no_comma": "Bees make honey.", "json": '{"answer": "bees make honey"}',
    "quotation": '"Bees make honey."', "one_sentence": "Bees make honey.",
}


@pytest.mark.parametrize("kind", sorted(b.KINDS))
def test_each_kind_phrasing_matches_its_check(kind: str) -> None:
    """The instruction sentence asks for what the check tests: an answer written from the
    sentence's own words (phrase, word, count) meets the constraint; a plain one does not."""
    kwargs, sentence = b.KINDS[kind].draw(random.Random(0))
    row = b.make_prompt("p", "bees", "Describe {topic}.", [kind], random.Random(0))
    [constraint] = parse_constraints(row["metadata"]["constraints"])
    assert sentence in row["prompt"]
    if kind == "end_phrase":
        good = f"Bees make honey. {kwargs['end_phrase']}"
    elif kind == "include_word":
        good = f"Bees are {kwargs['keywords'][0]}."
    elif kind == "max_words":
        good = " ".join(["bee"] * (kwargs["num_words"] - 1))
    elif kind == "start_word":
        good = f"{kwargs['first_word'].capitalize()} bees make honey."
    else:
        good = ANSWERS[kind]
    assert constraint_met(constraint, good), (kind, good)
    plain = "Honey, made by bees, is sweet and golden; bees fly and they dance a lot today. Ok."
    assert not constraint_met(constraint, plain), (kind, plain)
    assert satisfaction(good, [constraint]) == 1.0


def test_answer_text_drops_eos_and_special_tokens_only(embedded_model_dir: Path) -> None:
    """The evaluation checks what a chat answer says: the EOS and special tokens go, spaces and
    the text stay; an answer that is only EOS is empty and meets no constraint of any kind."""
    from grouppref.api import load_tokenizer
    from research.ifeval_cpu.evaluate import answer_text

    tok = load_tokenizer(str(embedded_model_dir), padding_side="left")
    eos, start = tok.eos_token_id, tok.convert_tokens_to_ids("<|im_start|>")
    body = tok(" Bees , buzz.\n", add_special_tokens=False)["input_ids"]
    assert answer_text(tok, body + [eos], ended=True) == " Bees , buzz.\n"
    assert answer_text(tok, body, ended=False) == " Bees , buzz.\n"  # ran out of tokens
    assert answer_text(tok, [start, *body, eos], ended=True) == " Bees , buzz.\n"
    assert answer_text(tok, [eos], ended=True) == ""
    rng = random.Random(0)
    for kind in b.KINDS:
        kwargs, _ = b.KINDS[kind].draw(rng)
        assert not constraint_met(make_constraint(b.KINDS[kind].id, kwargs), ""), kind


def test_report_statistics_by_hand() -> None:
    base = {"per_prompt": [{"g": [1, 0], "s": [[1, 1], [0, 0]], "kl": [0.0, 0.0]},
                           {"g": [0], "s": [[0], [1]], "kl": [0.0, 0.0]}]}
    runs = [{"tokens_trained": 100,
             "per_prompt": [{"g": [1, 1], "s": [[1, 1], [1, 0]], "kl": [0.2, 0.4]},
                            {"g": [1], "s": [[1], [1]], "kl": [0.1, 0.1]}]},
            {"tokens_trained": 100,
             "per_prompt": [{"g": [1, 0], "s": [[1, 1], [1, 1]], "kl": [0.0, 0.2]},
                            {"g": [0], "s": [[0], [1]], "kl": [0.3, 0.3]}]}]
    # means of 0/1 verdicts and of given KLs: float64, a few operations: approx's default rel 1e-6 is
    # ~1e9 eps64
    assert prompt_values(runs[0]["per_prompt"][0]) == pytest.approx(
        {"greedy": 1.0, "greedy_all": 1.0, "sampled": 0.75, "sampled_all": 0.5, "kl": 0.3})
    stats = method_stats(runs, base)
    # per-seed greedy means: (1 + 1) / 2 = 1.0 and (0.5 + 0) / 2 = 0.25
    # means and CIs of exact small rationals: float64, a few operations: approx's default rel 1e-6 is
    # ~1e9 eps64
    assert stats["greedy"]["mean"] == pytest.approx(0.625)
    assert stats["greedy"]["seed_ci"] == pytest.approx(12.706 * 0.375 * math.sqrt(2) / math.sqrt(2))
    # per-prompt greedy over seeds: 0.75, 0.5; base: 0.5, 0.0; paired change 0.25, 0.5
    assert stats["greedy"]["delta"] == pytest.approx(0.375)
    assert stats["greedy"]["delta_ci"] == pytest.approx(1.96 * 0.125 * math.sqrt(2) / math.sqrt(2))
    assert stats["kl"]["mean"] == pytest.approx((0.2 + 0.2) / 2)


def test_markdown_of_a_results_file(tmp_path: Path) -> None:
    prompts = [{"prompt_id": "a", "kinds": ["lowercase", "end_phrase"]},
               {"prompt_id": "b", "kinds": ["no_comma"]}]
    pp = [{"g": [1, 0], "s": [[1, 1]], "kl": [0.0], "kl_g": 0.0, "len_g": 5},
          {"g": [1], "s": [[0]], "kl": [0.0], "kl_g": 0.0, "len_g": 5}]
    results = {"prompts": prompts, "scale": "smoke", "scale_settings": {"steps": 2},
               "runs": [{"method": "base", "seed": None, "steps": 0, "tokens_trained": 0,
                         "per_prompt": pp},
                        {"method": "dpo", "seed": 0, "steps": 2, "tokens_trained": 40,
                         "per_prompt": pp}]}
    text = markdown(json.loads(json.dumps(results)))
    # greedy per prompt 0.5 and 1.0: mean 0.75, 1.96 * standard error 1.96 * 0.25
    assert "| dpo | 1 | 0.750 | 0.490 | +0.000 ± 0.000 | 0.500 |" in text
    # per kind (end_phrase, lowercase, no_comma), greedy / sampled
    assert "| base | 0.00 / 1.00 | 1.00 / 1.00 | 1.00 / 0.00 |" in text
    assert "| dpo | 0.750 / 0.500 | 0.750 / 0.500 |" in text  # curve: 0 steps, 2 steps



def test_markdown_greedy_only_uses_the_greedy_kl_and_marks_sampled_rates_unmeasured() -> None:
    prompts = [{"prompt_id": "a", "kinds": ["no_comma"]}]
    run = {"method": "sft", "seed": 0, "steps": 2, "tokens_trained": 10,
           "per_prompt": [{"g": [1], "s": [], "kl": [], "kl_g": 0.25, "len_g": 5}]}
    assert prompt_values(run["per_prompt"][0])["kl"] == 0.25
    worse = {**run, "method": "dpo", "per_prompt": [{**run["per_prompt"][0], "g": [0]}]}
    text = markdown({"prompts": prompts, "scale": "cpu", "scale_settings": {"steps": 2},
                     "runs": [run, worse]})
    assert "| sft | 1 | 1.000 | nan | - | - | 1.000 | - | 0.250 | 10 |" in text
    assert "| sft | 1.00 / - |" in text
    assert "| sft | - | +1.000 ± nan |" in text  # paired: sft − dpo on the one prompt
    assert "| dpo | -1.000 ± nan | - |" in text


@pytest.mark.slow
def test_greedy_decoding_matches_generate_and_self_kl_is_zero(tiny_lm_dir: Path) -> None:
    import torch

    from grouppref.api import load_causal_lm, load_tokenizer
    from research.ifeval_cpu.evaluate import decode_chunk

    torch.set_num_threads(1)
    tokenizer = load_tokenizer(str(tiny_lm_dir))
    model = load_causal_lm(str(tiny_lm_dir))
    prompts = [tokenizer("Describe bees.")["input_ids"], tokenizer("Hi")["input_ids"]]
    got = decode_chunk([model, model], prompts, per_prompt=2, seed=0, temperature=0.7,
                       max_new_tokens=6, eos_ids=[tokenizer.eos_token_id],
                       pad_id=tokenizer.pad_token_id)
    for n, ids in enumerate(prompts):
        ref = model.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)[0, len(ids):].tolist()
        assert got.tokens[2 * n] == ref[:len(got.tokens[2 * n])]
        assert len(got.tokens[2 * n + 1]) >= 1
    # KL of a model to itself from two float32 passes (batched vs cached): per-token log-prob noise
    # MODEL_ATOL-level differences cancel to first order (KL is quadratic in them): 1e-5
    assert got.kl == pytest.approx([0.0] * 4, abs=1e-5)


def test_results_resume_keeps_runs_of_the_same_experiment_only(tmp_path: Path) -> None:
    from research.ifeval_cpu.experiment import Results

    header = {"scale_settings": {"steps": 2}, "methods": {"dpo": {"loss": "dpo"}},
              "model": "m", "prompts": [{"prompt_id": "a", "kinds": ["json"]}]}
    first = Results(tmp_path / "results.json", header)
    first.data["runs"].append({"method": "dpo", "seed": 0, "steps": 2, "per_prompt": []})
    first.data["skipped"].append("sft-seed0-steps2")
    first.save()
    again = Results(tmp_path / "results.json", header)
    assert again.resumed == 1 and again.done("dpo-seed0-steps2")
    assert not again.done("dpo-seed1-steps2") and again.data["skipped"] == []
    changed = Results(tmp_path / "results.json", {**header, "scale_settings": {"steps": 3}})
    assert changed.resumed == 0 and changed.data["runs"] == []
    assert json.loads((tmp_path / "results.json.old").read_text())["runs"][0]["method"] == "dpo"


@pytest.mark.slow
def test_experiment_restarted_reuses_data_and_finished_runs(tiny_lm_dir: Path, tmp_path: Path,
                                                            capsys, monkeypatch) -> None:
    """Killed after its first trained run (a tiny budget skips the rest), the experiment
    restarted with the same --out keeps the generated data (the generate stage is not run
    again) and the finished runs, and does only the tasks left."""
    from research.ifeval_cpu import experiment
    from research.ifeval_cpu.experiment import Scale, main

    # the smoke sizes with K=8 and 48 tokens: the tiny random model's text then differs in
    # commas and sentence ends inside groups (at K=3, 16 tokens every group can be a coin flip)
    monkeypatch.setitem(experiment.SCALES, "test", Scale(
        train=24, test=4, k=8, seeds=1, steps=2, batch=2, samples=1, max_new_tokens=48,
        curve=(1,), gen_batch=64, shard=8, chunk=4, lr=5e-3))
    # three of the five methods: the order (each seed's methods, then the curve) and the
    # resume are the same for any number; the losses themselves are tested in
    # tests/integration/test_losses.py and test_listwise_losses.py
    monkeypatch.setattr(experiment, "METHODS", {m: experiment.METHODS[m]
                                                for m in ("gspo_soft", "dpo", "sft")})
    out = tmp_path / "exp"
    argv = ["--model", str(tiny_lm_dir), "--out", str(out), "--scale", "test", "--threads", "1"]
    main([*argv, "--budget-s", "0.001"])
    first = json.loads((out / "results.json").read_text())
    assert [r["method"] for r in first["runs"]] == ["base", "gspo_soft"]
    assert "dpo-seed0-steps2" in first["skipped"]
    generated = (out / "run" / "generate" / "manifest.json").read_text()
    main([*argv, "--budget-s", "100000"])
    second = json.loads((out / "results.json").read_text())
    assert (out / "run" / "generate" / "manifest.json").read_text() == generated
    assert second["runs"][:2] == first["runs"]  # kept as they were, not run again
    names = [(r["method"], r["steps"]) for r in second["runs"][2:]]
    assert names == [(m, 2) for m in ("dpo", "sft")] + [(m, 1) for m in ("gspo_soft", "dpo", "sft")]
    assert second["finished"] and second["skipped"] == []
    assert "| sft | 1 |" in capsys.readouterr().out
