"""``grouppref train-rm``: a reward model trained on ranked groups, on a 2-layer tiny Llama (real
files, CPU), then loaded by the reward ranker through ``grouppref rank``.

The task has a known preference (tests/integration/test_trainer.py): in every group the two candidates that
start with "sunny" beat the two that start with "rainy" (p = 1, weight 1 on the 4 cross pairs).
The new score head starts random, so held-out pair accuracy starts anywhere; after 12 steps
(48 groups, batch 8, 2 epochs, lr 5e-3) it measured 1.0 on the 16 held-out groups (start 0.61);
the test asks for >= 0.9 and a rise.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from grouppref.cli import app
from grouppref.errors import ConfigError, StageError
from grouppref.models.loading import ModelNotFoundError
from grouppref.pipeline.rank.rankers import RewardRanker
from grouppref.pipeline.rank.settings import RewardRankerSettings
from grouppref.runs.store import RunStore, Shard
from grouppref.schemas import AnnotatedGroup, CandidateGroup, ValidatedGroup
from grouppref.train.reward_model.encode import encode_groups, split_held_out
from grouppref.train.reward_model.model import load_reward_model, reward_loss, reward_scores
from grouppref.train.settings.reward_model import RewardModelConfig
from grouppref.train.tensors.batch import collate_groups
from tests.support.cli import grouppref_here
from tests.support.paths import REPO
from tests.support.tolerances import MODEL_ATOL, MODEL_RTOL
from tests.support.training import _write_validate, synthetic_groups

ROOT = REPO
TRAIN_ARGS = ["--max-steps", "12", "--batch-size", "8", "--lr", "5e-3", "--lr-scheduler",
              "constant", "--logging-steps", "4"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _write_generate(store: RunStore, groups: list[ValidatedGroup]) -> None:
    """The same groups as a generate stage (what ``rank`` reads by default)."""
    cands = [CandidateGroup(group_id=g.group_id, prompt=g.prompt, candidates=g.candidates)
             for g in groups]
    stage = store.open_stage("generate", {"test": True}, input_fingerprint="synthetic",
                             record_type=CandidateGroup)
    stage.write_shard(Shard(index=0, start=0, items=cands), cands, [])
    stage.finish(inputs=len(cands))


@pytest.fixture(scope="module")
def trained(tiny_lm_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """``grouppref train-rm RUN --model TINY`` on 48 train + 16 test groups."""
    groups = synthetic_groups(48, 16)
    store = _write_validate(tmp_path_factory.mktemp("rm") / "run", groups)
    result = CliRunner().invoke(app, ["train-rm", str(store.root), "--model", str(tiny_lm_dir),
                                      *TRAIN_ARGS])
    assert result.exit_code == 0, result.output
    return store, groups, result.output


def test_held_out_pair_accuracy_rises_and_is_reported(trained) -> None:
    store, groups, output = trained
    manifest = store.require("train_rm")
    stats = manifest.stats
    assert stats["steps"] == 12 and stats["groups"] == {
        "train": 48, "held_out": 16, "rejected": 0, "dropped_candidates": 0}
    assert stats["eval"]["pair_accuracy"] >= 0.9
    assert stats["eval"]["pair_accuracy"] > stats["eval_start"]["pair_accuracy"]
    assert stats["eval"]["loss"] < stats["eval_start"]["loss"]
    assert manifest.counts.inputs == 64 and manifest.counts.outputs == 64
    assert f"held-out pair accuracy: {stats['eval']['pair_accuracy']:.4g}" in output
    model_dir = Path(manifest.outputs["model"])
    card = (model_dir / "README.md").read_text()
    assert "reward-model" in card and "gspo" in card and stats["data_fingerprint"] in card
    assert f"| pair_accuracy | {stats['eval_start']['pair_accuracy']:.4g} |" in card
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    assert config.num_labels == 1 and config.pad_token_id is not None
    assert config.architectures == ["LlamaForSequenceClassification"]
    logged = [json.loads(line) for line in (model_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if r["split"] == "train"] == [4, 8, 12]


def test_second_run_is_cached(trained, tiny_lm_dir: Path) -> None:
    store, _, _ = trained
    before = store.require("train_rm").finished_at
    result = CliRunner().invoke(app, ["train-rm", str(store.root), "--model", str(tiny_lm_dir),
                                      *TRAIN_ARGS])
    assert result.exit_code == 0, result.output
    assert "skipped" in result.output and store.require("train_rm").finished_at == before


def test_ranker_scores_what_training_scored(trained) -> None:
    """Train and score format identically: the ranker's scores equal the trainer's."""
    store, groups, _ = trained
    model_dir = store.require("train_rm").outputs["model"]
    ranker = RewardRanker(RewardRankerSettings(model=model_dir))
    ranker.check()
    ranker.load()
    held = [g for g in groups if g.split == "test"][:4]
    scored = ranker.score(held)
    model, tokenizer = load_reward_model(model_dir)
    encoded, rejects = encode_groups(held, tokenizer, 512)
    assert not rejects
    with torch.no_grad():
        s = reward_scores(model.eval(), collate_groups(encoded, model.config.pad_token_id))
    # the ranker's batches vs one batch of all: fp32 rewards (~1) through another padding
    torch.testing.assert_close(torch.tensor(scored), s, atol=MODEL_ATOL, rtol=MODEL_RTOL)


def test_rank_with_the_trained_folder(trained) -> None:
    store, groups, _ = trained
    model_dir = store.require("train_rm").outputs["model"]
    _write_generate(store, groups)
    result = CliRunner().invoke(app, ["rank", str(store.root), "--ranker", f"reward:{model_dir}"])
    assert result.exit_code == 0, result.output
    ranked = {g.group_id: g for g in store.load_records("rank", AnnotatedGroup)}
    right = 0
    held = [g for g in groups if g.split == "test"]
    for g in held:
        tiers = ranked[g.group_id].rankings[0].tiers
        top = {cid for tier in tiers[:2] for cid in tier} if len(tiers[0]) == 1 else set(tiers[0])
        right += top == set(g.consensus[0])
    assert right >= 0.9 * len(held)


def test_plackett_luce_and_hard_targets_losses() -> None:
    """The two other objectives on a hand-made batch: the consensus order scores lower loss."""
    from grouppref.train.tensors.batch import TokenizedGroup

    g = TokenizedGroup(group_id="g", prompt_ids=[], cand_ids=[[1, 2], [3], [4, 5]],
                       p_ij=[[0.5, 0.9, 0.8], [0.1, 0.5, 0.6], [0.2, 0.4, 0.5]],
                       w_ij=[[0, 1, 0.5], [1, 0, 0.2], [0.5, 0.2, 0]], order=[0, 1, 2],
                       ref_logps=None, behavior_logps=[None] * 3, split="train")
    batch = collate_groups([g], 0)
    good, bad = torch.tensor([[2.0, 1.0, 0.0]]), torch.tensor([[0.0, 1.0, 2.0]])
    for loss in ("gspo", "plackett_luce"):
        for targets in ("soft", "hard"):
            config = RewardModelConfig(loss=loss, pair_targets=targets)
            assert reward_loss(good, batch, config) < reward_loss(bad, batch, config)
    centred = RewardModelConfig(center_rewards=0.5)
    diff = reward_loss(good, batch, centred) - reward_loss(good, batch, RewardModelConfig())
    # float32 losses of a few exact rewards: ~eps32 * ops, inside approx's rel 1e-6 (~8 eps32)
    assert diff.item() == pytest.approx(0.5 * (4 + 1 + 0) / 3)


def test_held_out_split_by_prompt_is_seeded() -> None:
    groups = [g.model_copy(update={"split": None}) for g in synthetic_groups(20, 0)]
    a = split_held_out(groups, 0.25, seed=3)
    assert [g.split for g in a] == [g.split for g in split_held_out(groups, 0.25, seed=3)]
    assert sum(g.split == "test" for g in a) == 5
    marked = synthetic_groups(6, 2)
    assert [g.split for g in split_held_out(marked, 0.5, seed=0)] == ["train"] * 6 + ["test"] * 2
    free = split_held_out(marked, 0.5, seed=0, use_test_split=False)
    assert sum(g.split == "test" for g in free) == 4


def test_bad_base_models_are_config_errors(tmp_path: Path, tiny_reward_model_dir: Path) -> None:
    from transformers import AutoConfig, LlamaForSequenceClassification

    config = AutoConfig.from_pretrained(tiny_reward_model_dir)
    config.num_labels = 3
    LlamaForSequenceClassification(config).save_pretrained(tmp_path / "three")
    with pytest.raises(ConfigError, match="3 outputs"):
        load_reward_model(str(tmp_path / "three"))
    with pytest.raises(ModelNotFoundError):
        load_reward_model(str(tmp_path / "missing"))


def test_no_trainable_groups_is_a_stage_error(tmp_path: Path, tiny_lm_dir: Path) -> None:
    store = _write_validate(tmp_path / "run", [])
    result = CliRunner().invoke(app, ["train-rm", str(store.root), "--model", str(tiny_lm_dir)])
    assert isinstance(result.exception, StageError)
    assert "no trainable groups: 0 given" in str(result.exception)


# the command's own one-line error and exit code, in this process (cli.main(), as the child
# process ran it; tests/integration/test_cli.py runs the entry point in child processes)
_cli = grouppref_here


@pytest.mark.parametrize("case", ["causal-lm", "two-outputs", "missing"])
def test_rank_refuses_a_folder_that_is_not_a_reward_model(case: str, tmp_path: Path,
                                                          tiny_lm_dir: Path,
                                                          tiny_reward_model_dir: Path) -> None:
    from transformers import AutoConfig, LlamaForSequenceClassification

    store = RunStore(tmp_path / "run")
    _write_generate(store, synthetic_groups(2, 0))
    folder, needle = {"causal-lm": (tiny_lm_dir, "not a sequence classifier"),
                      "two-outputs": (tmp_path / "two", "has 2 outputs"),
                      "missing": (tmp_path / "nope", "no such folder")}[case]
    if case == "two-outputs":
        config = AutoConfig.from_pretrained(tiny_reward_model_dir)
        config.num_labels = 2
        LlamaForSequenceClassification(config).save_pretrained(folder)
    out = _cli("rank", str(store.root), "--ranker", f"reward:{folder}", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert needle in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args,needle", [
    (["RUN", "--model", "MISSING"], "no such folder"),
    (["RUN", "--held-out-fraction", "1.5"], "--held-out-fraction: Input should be less than 1"),
    (["DATA.jsonl", "--model", "TINY"], "pass --out DIR"),
    (["RUN", "--model", "TINY"], "stage 'validate' has not run"),
])
def test_cli_errors_are_one_line(args: list[str], needle: str, tmp_path: Path,
                                 tiny_lm_dir: Path) -> None:
    (tmp_path / "RUN" / "prompts").mkdir(parents=True)
    (tmp_path / "RUN" / "prompts" / "manifest.json").write_text("{}")
    (tmp_path / "DATA.jsonl").write_text("")
    names = {"RUN": str(tmp_path / "RUN"), "MISSING": str(tmp_path / "missing"),
             "TINY": str(tiny_lm_dir), "DATA.jsonl": str(tmp_path / "DATA.jsonl")}
    out = _cli("train-rm", *[names.get(a, a) for a in args], cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert needle in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_run_config_step_reuses_the_cli_stage(trained, tiny_lm_dir: Path) -> None:
    """``train_rm`` as a section of a run config: the same settings as the CLI are the same
    cached stage (the run does not train again)."""
    from grouppref.runner import RunConfig, run_pipeline

    store, _, _ = trained
    before = store.require("train_rm").finished_at
    config = RunConfig.model_validate({
        "run_dir": str(store.root), "import": {"source": "unused.jsonl"}, "report": None,
        "train_rm": {"model": str(tiny_lm_dir), "max_steps": 12, "batch_size": 8, "lr": 5e-3,
                     "lr_scheduler": "constant", "logging_steps": 4}})
    outcome = run_pipeline(config, start="train_rm", until="train_rm")
    assert outcome.cached == ["train_rm"] and outcome.ran == []
    assert store.require("train_rm").finished_at == before


def test_an_encoder_trains_too(tmp_path: Path, embedded_model_dir: Path) -> None:
    """A bidirectional encoder (a tiny BERT from a config) gets the same head and loss: its
    held-out pair accuracy rises on the known-preference task."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from grouppref.train.reward_model.trainer import train_reward_model

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir)
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=4, intermediate_size=64,
                         max_position_embeddings=512, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)).save_pretrained(tmp_path / "bert")
    tokenizer.save_pretrained(tmp_path / "bert")
    config = RewardModelConfig(model=str(tmp_path / "bert"), max_steps=12, batch_size=8,
                               lr=5e-3, lr_scheduler="constant")
    result = train_reward_model(config, synthetic_groups(48, 16), tmp_path / "out")
    stats = result.stats
    assert stats.eval.pair_accuracy >= 0.9
    assert stats.eval.pair_accuracy > stats.eval_start.pair_accuracy
    ranker = RewardRanker(RewardRankerSettings(model=str(tmp_path / "out")))
    ranker.check()  # a BertForSequenceClassification with one output


def test_trl_pairs_file_with_out(tmp_path: Path, tiny_lm_dir: Path) -> None:
    """DATA that is not a run: a TRL pair file (groups of K = 2); the folder gets the model,
    its card, rejects.jsonl and source.json; a row that is no pair is a reject."""
    rows = [{"prompt": f"Describe thing {i}.", "chosen": f"sunny day {i}",
             "rejected": f"rainy day {i}"} for i in range(12)]
    rows.append({"prompt": "Broken row.", "chosen": "only one side"})
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "rm"
    result = CliRunner().invoke(app, ["train-rm", str(tmp_path / "pairs.jsonl"), "--model",
                                      str(tiny_lm_dir), "--out", str(out), "--max-steps", "2",
                                      "--held-out-fraction", "0.25"])
    assert result.exit_code == 0, result.output
    stats = json.loads((out / "metrics.json").read_text())
    assert stats["groups"]["train"] + stats["groups"]["held_out"] == 12
    assert stats["groups"]["held_out"] == 3 and stats["steps"] == 2
    assert json.loads((out / "source.json").read_text())["format"] == "trl-pairs"
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert len(rejects) == 1 and rejects[0]["row"] == 13
    assert rejects[0]["source"] == "pairs.jsonl (train)"  # published: never the full path
    assert "pairs.jsonl" in (out / "README.md").read_text()
