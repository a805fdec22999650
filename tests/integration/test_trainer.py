"""The GSPO trainer, reference cache, eval and CLI on a 2-layer tiny Llama (real files, CPU).

The synthetic task has a known preference: in every group the two candidates that start with
"sunny" beat the two that start with "rainy" (p = 1, weight 1 for the 4 cross pairs). Before
training the policy *is* the reference, so every implicit reward is 0 and held-out pair
accuracy is exactly 0.5 (ties count 1/2). After 12 steps (48 train groups, batch 8, 2 epochs,
lr 5e-3, beta 0.5) it measured 1.0 on the 16 held-out groups; the test asks for >= 0.9.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import typer
from typer.testing import CliRunner

from grouppref.commands import train as train_commands
from grouppref.errors import ConfigError, StageError
from grouppref.models.loading import load_causal_lm, load_tokenizer
from grouppref.schemas import (
    ValidatedGroup,
)
from grouppref.train.data.reference import (
    MissingReferenceError,
    ensure_reference,
    require_reference,
    with_reference,
)
from grouppref.train.data.tokenize import tokenize_groups
from grouppref.train.policy.step import Objective, group_loss
from grouppref.train.policy.trainer import split_groups, train
from grouppref.train.settings.policy import TrainConfig
from grouppref.train.settings.shared import DataConfig, LoraSettings
from grouppref.train.tensors.batch import collate_groups
from grouppref.train.tensors.logps import group_logps
from tests.support.tolerances import MODEL_ATOL, MODEL_RTOL, assert_trained_close
from tests.support.training import (
    PLAIN,
    WORDS,
    _final_params,
    _write_validate,
    synthetic_group,
    synthetic_groups,
)

ATOL = MODEL_ATOL  # fp32 log-probs of one model computed two ways (tests/support/tolerances.py)
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def naive_eval(model_dir: Path, ref_dir: Path, groups: list[ValidatedGroup],
               beta: float) -> tuple[float, float]:
    """Held-out pair accuracy and mean margin computed the slow way: one full forward per
    candidate (no prefix sharing, no batching), pairs from the records, plain Python."""
    tok = load_tokenizer(str(model_dir))
    policy, ref = load_causal_lm(str(model_dir)), load_causal_lm(str(ref_dir))

    def logp(model, prompt_ids: list[int], resp: list[int]) -> float:
        ids = torch.tensor([prompt_ids + resp])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1].float()
        return float(torch.log_softmax(logits, -1).gather(1, torch.tensor(resp)[:, None]).sum())

    accs, margins = [], []
    for g in groups:
        prompt_ids = tok(g.prompt.text)["input_ids"]
        s = {}
        for c in g.candidates:
            resp = tok(c.text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            s[c.candidate_id] = beta * (logp(policy, prompt_ids, resp) - logp(ref, prompt_ids, resp))
        diffs = [s[p.winner] - s[p.loser] for p in g.pairs]
        accs.append(sum(1.0 if d > 0 else 0.5 if d == 0 else 0.0 for d in diffs) / len(diffs))
        margins.append(sum(diffs) / len(diffs))
    return sum(accs) / len(accs), sum(margins) / len(margins)


@pytest.fixture(scope="module")
def trained(tiny_lm_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """One short GSPO run on the known-preference task (shared by the checks below)."""
    out = tmp_path_factory.mktemp("gspo")
    config = TrainConfig(model=str(tiny_lm_dir), beta=0.5, lr=5e-3, lr_scheduler="constant",
                         batch_size=8, epochs=2, logging_steps=2, eval_steps=6, data=PLAIN)
    groups = synthetic_groups(48, 16)
    return train(config, groups, out), groups


def test_known_preference_raises_held_out_pair_accuracy(trained) -> None:
    result, _ = trained
    start, end = result.stats.eval_start, result.stats.eval
    assert result.stats.steps == 12  # 48 groups / batch 8 = 6 steps per epoch, 2 epochs
    # policy == reference: every reward is 0 up to float noise from different batch padding
    # (measured exactly 0.5 / 0.0 here), and a tie counts 1/2.
    # ties count 1/2; 0.1 lets a few pairs whose zero margin rounds to +-1e-7 count either way
    assert start["pair_accuracy"] == pytest.approx(0.5, abs=0.1)
    assert abs(start["margin"]) < ATOL and start["kl"] < ATOL
    assert end["pair_accuracy"] >= 0.9  # measured 1.0
    assert end["margin"] > 1.0  # measured 7.3
    assert end["reward_best"] > 0 > end["reward_worst"]
    assert end["logp_pair_accuracy"] >= 0.9  # the model's own likelihood now prefers "sunny"
    assert end["kl"] > 0


def test_metrics_log_and_saved_model(trained, tiny_lm_dir: Path) -> None:
    result, groups = trained
    out = result.out_dir
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_lines = [r for r in records if r["split"] == "train"]
    eval_lines = [r for r in records if r["split"] == "eval"]
    assert [r["step"] for r in train_lines] == [2, 4, 6, 8, 10, 12]
    assert [r["step"] for r in eval_lines] == [0, 6, 12]
    for key in ("loss", "pair_accuracy", "margin", "reward_best", "reward_worst", "kl",
                "grad_norm", "groups_per_s", "tokens_per_s", "lr"):
        assert key in train_lines[-1], key
    assert train_lines[-1]["groups_per_s"] > 0 and train_lines[-1]["tokens_per_s"] > 0
    final = json.loads((out / "metrics.json").read_text())
    assert final["groups"] == {"train": 48, "held_out": 16, "rejected": 0,
                               "dropped_candidates": 0, "truncated_responses": 0}
    assert (out / "config.json").exists() and (out / "tokenizer.json").exists()
    # The saved model, scored the slow way, reproduces the logged held-out numbers.
    acc, margin = naive_eval(out, tiny_lm_dir, [g for g in groups if g.split == "test"], 0.5)
    # a share of pairs: equal unless a margin within fp32 noise of 0 flips (they are ~7 here)
    assert acc == pytest.approx(final["eval"]["pair_accuracy"], abs=ATOL)
    # the margin is a difference of log-prob sums (~-30 each, ~5 tokens of MODEL_ATOL noise
    # each side) averaged: ~1e-3 absolute on a margin of ~7, 1e-3 relative covers it 7x
    assert margin == pytest.approx(final["eval"]["margin"], rel=1e-3)


def test_reference_cache_is_reused_and_matches_a_direct_pass(trained, tiny_lm_dir: Path,
                                                             tmp_path: Path) -> None:
    tok = load_tokenizer(str(tiny_lm_dir))
    groups, _ = tokenize_groups(synthetic_groups(4, 0, seed=3), tok, PLAIN)
    kwargs = dict(model_name=str(tiny_lm_dir), cache_dir=tmp_path, data_config=PLAIN,
                  batch_size=3, pad_token_id=tok.pad_token_id)
    first, info1 = ensure_reference(groups, **kwargs)
    second, info2 = ensure_reference(groups, **kwargs)
    assert not info1.cached and info2.cached and info1.key == info2.key
    model = load_causal_lm(str(tiny_lm_dir))
    with torch.no_grad():
        direct = group_logps(model, collate_groups(groups, tok.pad_token_id), share_prefix=False)
    for i, g in enumerate(second):
        assert g.ref_logps == first[i].ref_logps
        # the cache's batches of 3 vs one batch of all: other padding, other reduction order
        torch.testing.assert_close(torch.tensor(g.ref_logps), direct[i], atol=ATOL, rtol=MODEL_RTOL)
    other, info3 = ensure_reference(groups, **{**kwargs, "data_config": DataConfig(
        chat_template=False, max_response_length=100)})
    assert not info3.cached and info3.key != info1.key  # the DataConfig is part of the key


def test_missing_reference_logps_are_an_error(tiny_lm_dir: Path) -> None:
    tok = load_tokenizer(str(tiny_lm_dir))
    groups, _ = tokenize_groups(synthetic_groups(3, 0), tok, PLAIN)
    with pytest.raises(MissingReferenceError, match="3 of 3 groups have no reference log-probs"):
        require_reference(groups)
    with pytest.raises(MissingReferenceError, match="missing for 1 of 3 groups"):
        with_reference(groups, {g.group_id: [0.0] * 4 for g in groups[:2]})
    batch = collate_groups(groups, tok.pad_token_id)
    with pytest.raises(ConfigError, match="reference log-probs are missing"):
        group_loss(torch.zeros(3, 4), batch, Objective.of(TrainConfig()))


def test_groups_left_with_one_candidate_are_rejected_and_counted(tiny_lm_dir: Path) -> None:
    tok = load_tokenizer(str(tiny_lm_dir))
    rng = random.Random(0)
    long = "rainy " + " ".join(WORDS)  # far over 6 tokens
    groups = synthetic_groups(3, 1) + [synthetic_group(
        9, "train", rng, texts=["sunny ok", long, long + " again", long + " more"])]
    config = TrainConfig(data=DataConfig(chat_template=False, max_response_length=6,
                                         overflow="reject"))
    train_set, held_out, rejects = split_groups(groups, tok, config)
    rows = [r for r in rejects if r.scope == "row"]
    assert len(train_set) == 3 and len(held_out) == 1 and len(rows) == 1
    assert "only 1 candidate(s) left" in rows[0].reason and rows[0].row == 5
    assert "after dropping 3 over max_response_length=6" in rows[0].reason
    with pytest.raises(StageError, match="no trainable groups: 1 given, 0 held out, 1 rejected"):
        split_groups(groups[-1:], tok, config)


def test_resume_continues_exactly(tiny_lm_dir: Path, tmp_path: Path) -> None:
    """5 steps straight == 2 steps, checkpoint (mid-epoch), resume to 5 (crossing an epoch)."""
    groups = synthetic_groups(24, 0, seed=1)  # 6 micro-batches of 4, grad_accum 2: 3 steps/epoch
    base = dict(model=str(tiny_lm_dir), lr=1e-3, lr_scheduler="constant", batch_size=4,
                grad_accum=2, epochs=2, logging_steps=1, data=PLAIN)
    straight = train(TrainConfig(**base, max_steps=5), groups, tmp_path / "a")
    train(TrainConfig(**base, max_steps=2, save_steps=2), groups, tmp_path / "b")
    with pytest.raises(ConfigError, match="beta: 0.1 -> 0.2"):
        train(TrainConfig(**base, max_steps=5, beta=0.2), groups, tmp_path / "b", resume=True)
    resumed = train(TrainConfig(**base, max_steps=5), groups, tmp_path / "b", resume=True)
    assert resumed.stats.steps == 5
    # exact: the resume restores weights, Adam's moments, the sampler and the RNG bit for bit,
    # then runs the same kernels on the same batches as the straight run (one thread, one machine)
    assert torch.equal(_final_params(straight.model), _final_params(resumed.model))
    steps = [json.loads(x)["step"] for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5]


def test_settings_that_cannot_work_here_fail_before_loading(tmp_path: Path) -> None:
    import importlib.util

    groups = synthetic_groups(2, 0)
    if importlib.util.find_spec("trackio") is None:
        with pytest.raises(ConfigError, match="report_to 'trackio'.*pip install trackio"):
            train(TrainConfig(model="/no/such/model", report_to=["trackio"]), groups, tmp_path)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="'fp16' needs a CUDA GPU"):
            train(TrainConfig(model="/no/such/model", mixed_precision="fp16"), groups, tmp_path)


def _train_lines(out: Path) -> list[dict]:
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["split"] == "train"]


def test_gradient_checkpointing_with_shared_prefix_equals_the_run_without(
        tiny_lm_dir: Path, tmp_path: Path) -> None:
    """Checkpointing recomputes the packed shared-prefix pass in backward: every step's loss
    and gradient norm, the held-out eval and the trained weights equal the run without it
    (fp32; 3 steps, 2 micro-batches each)."""
    groups = synthetic_groups(12, 4, seed=2)
    base = dict(model=str(tiny_lm_dir), lr=1e-3, lr_scheduler="constant", batch_size=3,
                grad_accum=2, max_steps=3, logging_steps=1, data=PLAIN)
    plain = train(TrainConfig(**base), groups, tmp_path / "plain")
    ckpt = train(TrainConfig(**base, gradient_checkpointing=True), groups, tmp_path / "ckpt")
    assert ckpt.model.is_activation_checkpointing and not plain.model.is_activation_checkpointing
    lines, ref_lines = _train_lines(tmp_path / "ckpt"), _train_lines(tmp_path / "plain")
    assert [r["step"] for r in lines] == [r["step"] for r in ref_lines] == [1, 2, 3]
    for got, want in zip(lines, ref_lines, strict=True):
        for key in ("loss", "grad_norm", "margin", "kl"):
            # the recompute replays the forward's kernels (measured bit-identical on Intel);
            # rel 1e-5 = ~100 float32 roundings of slack for a backward summed in another order
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), (got["step"], key)
    assert ref_lines[-1]["grad_norm"] > 0
    # a share of pairs (multiples of 1/pairs): equal, approx's rel 1e-6 only absorbs the float sum
    assert ckpt.stats.eval["pair_accuracy"] == pytest.approx(plain.stats.eval["pair_accuracy"])
    weights, ref_weights = _final_params(ckpt.model), _final_params(plain.model)
    assert not torch.equal(ref_weights, _final_params(load_causal_lm(str(tiny_lm_dir))))
    # 3 Adam steps at lr 1e-3 (tests/support/tolerances.py; bit-identical on Intel, measured)
    assert_trained_close(weights, ref_weights, steps=3, lr=1e-3)


def test_checkpointing_with_shared_prefix_needs_an_sdpa_model(tiny_lm_dir: Path) -> None:
    """Other attention takes the KV-cache fallback, which checkpointing turns off: one clear
    error before the reference pass (the checks of the packed pass are in test_logps.py)."""
    from transformers import LlamaForCausalLM

    from grouppref.train.policy.trainer import check_checkpointing

    both = TrainConfig(model=str(tiny_lm_dir), gradient_checkpointing=True)
    sdpa = LlamaForCausalLM.from_pretrained(tiny_lm_dir, attn_implementation="sdpa")
    eager = LlamaForCausalLM.from_pretrained(tiny_lm_dir, attn_implementation="eager")
    check_checkpointing(sdpa, both)
    check_checkpointing(eager, both.model_copy(update={"share_prefix": False}))
    check_checkpointing(eager, both.model_copy(update={"gradient_checkpointing": False}))
    with pytest.raises(ConfigError, match="needs a model on sdpa attention, and this one uses "
                                          "'eager'; set --no-share-prefix"):
        check_checkpointing(eager, both)


def test_resume_without_checkpoint_fails_before_loading(tmp_path: Path) -> None:
    with pytest.raises(StageError, match="no complete checkpoint"):
        train(TrainConfig(model="/no/such/model"), synthetic_groups(2, 0), tmp_path, resume=True)


@pytest.mark.parametrize("save", ["merged", "adapter"])
def test_lora_trains_adapters_only(tiny_lm_dir: Path, tmp_path: Path, save: str) -> None:
    lora = LoraSettings(r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"], save=save)
    config = TrainConfig(model=str(tiny_lm_dir), lr=1e-2, batch_size=4, max_steps=2, lora=lora,
                         data=PLAIN)
    result = train(config, synthetic_groups(8, 0), tmp_path)
    base = load_causal_lm(str(tiny_lm_dir)).state_dict()
    if save == "adapter":
        assert (tmp_path / "adapter_config.json").exists()
        assert (tmp_path / "adapter_model.safetensors").exists()
        return
    assert not (tmp_path / "adapter_config.json").exists()
    saved = load_causal_lm(str(tmp_path)).state_dict()
    assert set(saved) == set(base)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(saved[q], base[q])  # the adapter was merged into q_proj
    k = "model.layers.0.self_attn.k_proj.weight"
    assert torch.equal(saved[k], base[k]) and torch.equal(saved["model.embed_tokens.weight"],
                                                          base["model.embed_tokens.weight"])
    assert result.stats.steps == 2


def test_cli_train_then_eval_on_a_run(tiny_lm_dir: Path, tmp_path: Path) -> None:
    rng = random.Random(5)
    long = "rainy " + " ".join(WORDS)
    groups = synthetic_groups(16, 8, seed=2) + [synthetic_group(
        99, "train", rng, texts=["sunny fine", long, long + " b", long + " c"])]
    store = _write_validate(tmp_path / "run", groups)
    app = typer.Typer()
    train_commands.register(app)
    runner = CliRunner()
    args = ["train", str(store.root), "--model", str(tiny_lm_dir), "--max-steps", "4",
            "--batch-size", "4", "--lr", "5e-3", "--beta", "0.5", "--no-chat-template",
            "--overflow", "reject", "--max-response-length", "8", "--report-to", "tensorboard",
            "--logging-steps", "2"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    manifest = store.require("train")
    assert manifest.counts.inputs == 25 and manifest.counts.outputs == 24
    assert manifest.counts.rejected == 1 and manifest.counts.partial == 0
    model_dir = store.stage_dir("train") / "model"
    assert (model_dir / "config.json").exists()
    assert list((model_dir / "logs").rglob("events.out.tfevents*"))  # tensorboard backend
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and "skipped" in again.output
    result = runner.invoke(app, ["eval", str(store.root)])
    assert result.exit_code == 0, result.output
    report = json.loads((store.stage_dir("eval") / "metrics.json").read_text())
    assert report["baseline"] == str(tiny_lm_dir) and report["split"] == "test"
    assert report["metrics"]["baseline"]["pair_accuracy"] == 0.5  # reference = baseline, same batches
    # The eval stage scores exactly what training logged at its end on the same groups.
    trained_eval = manifest.stats["eval"]
    for key in ("pair_accuracy", "margin", "logp_pair_accuracy"):
        # the eval stage's batches vs the trainer's: fp32 log-probs in another padding
        assert report["metrics"]["model"][key] == pytest.approx(trained_eval[key], abs=ATOL)
    # one float64 subtraction: approx's rel 1e-6 is ~1e10 eps64
    assert report["delta"]["pair_accuracy"] == pytest.approx(
        report["metrics"]["model"]["pair_accuracy"] - 0.5)


def test_cli_reports_bad_settings_in_one_line(tmp_path: Path) -> None:
    app = typer.Typer()
    train_commands.register(app)
    result = CliRunner().invoke(app, ["train", str(tmp_path), "--loss", "ppo", "--out",
                                      str(tmp_path / "o")])
    assert isinstance(result.exception, ConfigError)
    assert "loss" in str(result.exception) and "'gspo'" in str(result.exception)


def test_load_groups_from_a_saved_dataset_dict(tmp_path: Path) -> None:
    import datasets

    from grouppref.schemas import features_for, to_row
    from grouppref.train.data.sources import load_groups

    groups = synthetic_groups(3, 0, seed=4)
    rows = [to_row(g) for g in groups]
    rows[0]["split"] = None
    rows[1]["pairs"][0]["p"] = 0.3  # not a valid PairPreference: p must be >= 0.5
    features = features_for(ValidatedGroup)
    held = [to_row(g.model_copy(update={"split": None})) for g in synthetic_groups(0, 2, seed=5)]
    datasets.DatasetDict({
        "train": datasets.Dataset.from_list(rows, features=features),
        "validation": datasets.Dataset.from_list(held, features=features),
    }).save_to_disk(str(tmp_path / "ds"))
    source = load_groups(tmp_path / "ds")
    assert source.rows == 5 and len(source.groups) == 4 and len(source.rejects) == 1
    assert source.rejects[0].row == 2 and source.rejects[0].field == "pairs.0.p"
    assert [g.split for g in source.groups] == ["train", "train", "test", "test"]
    app = typer.Typer()
    train_commands.register(app)
    result = CliRunner().invoke(app, ["train", str(tmp_path / "ds")])
    assert isinstance(result.exception, ConfigError)
    assert "not a run directory: pass --out" in str(result.exception)


@pytest.mark.parametrize("extra", [
    {"loss": "plackett_luce", "sft_weight": 0.5},
    {"loss": "dpo", "label_smoothing": 0.1, "robust": True, "importance_clip": (0.5, 2.0)},
    {"gradient_checkpointing": True, "share_prefix": False, "length_normalise": True},
], ids=["plackett_luce+sft", "dpo+rdpo+importance", "checkpointing+unshared"])
def test_loss_variants_train(tiny_lm_dir: Path, tmp_path: Path, extra: dict) -> None:
    config = TrainConfig(model=str(tiny_lm_dir), lr=5e-3, batch_size=4, max_steps=3,
                         logging_steps=1, data=PLAIN, **extra)
    result = train(config, synthetic_groups(12, 0), tmp_path)
    last = result.stats.train
    assert result.stats.steps == 3 and last["loss"] == last["loss"]  # finite, not NaN
    if "sft_weight" in extra:
        assert last["sft_loss"] > 0
    if "importance_clip" in extra:
        # every behavior_logp is -5 over ~3 tokens, far above the policy's log-probs: rho hits
        # the lower clip
        assert last["rho"] == pytest.approx(0.5)  # the clip's float32 0.5 (exact), a mean of them
    assert last["margin"] > 0  # 3 steps already separate best from worst


def test_cli_eval_on_a_saved_dataset(tiny_lm_dir: Path, tmp_path: Path) -> None:
    import datasets

    from grouppref.schemas import to_dataset

    datasets.DatasetDict({"train": to_dataset(synthetic_groups(4, 0), ValidatedGroup)}
                         ).save_to_disk(str(tmp_path / "ds"))
    app = typer.Typer()
    train_commands.register(app)
    out = tmp_path / "report.json"
    result = CliRunner().invoke(app, [
        "eval", str(tmp_path / "ds"), "--model", str(tiny_lm_dir), "--baseline",
        str(tiny_lm_dir), "--split", "all", "--no-chat-template", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["groups"] == 4 and report["ref_model"] == str(tiny_lm_dir)
    for role in ("model", "baseline"):  # the same model as its own reference: all rewards 0
        assert report["metrics"][role]["pair_accuracy"] == 0.5
    assert report["delta"]["logp_pair_accuracy"] == 0.0
