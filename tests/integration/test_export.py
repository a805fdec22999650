"""The export stage: formats, targets, dataset card, and the trl-pairs export inside TRL."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import datasets
import pytest
import torch
import typer
import yaml
from typer.testing import CliRunner

from grouppref.commands import export as export_commands
from grouppref.errors import ConfigError, StageError
from grouppref.pipeline.export.config import ExportConfig
from grouppref.pipeline.export.formats import (
    PairValues,
    build_dataset,
    pairs_from_table,
    select_pairs,
)
from grouppref.pipeline.export.stage import load_validated, run_export, stored_table
from grouppref.pipeline.validate.config import ValidateConfig
from grouppref.pipeline.validate.stage import run_validate
from grouppref.runs.manifest import read_rejects
from grouppref.runs.store import RunStore
from grouppref.schemas import PairPreference, ValidatedGroup, from_dataset
from grouppref.schemas.reports import ExportReport
from tests.support.validated import make_validated, write_aggregate

K = 3  # candidates per group in these fixtures: K(K-1)/2 = 3 consensus pairs per group


def _run(tmp_path: Path, n: int = 12, chat: bool = True, extra: list | None = None) -> RunStore:
    """A run with aggregate + validate done: ``n`` groups (every other one chat when ``chat``)."""
    records = [make_validated(f"Question {i}?", k=K, chat=chat and i % 2 == 0) for i in range(n)]
    store = write_aggregate(tmp_path / "run", records + (extra or []),
                            stats={"noise_rate": 0.125, "recommendation": "gspo"},
                            config={"method": "bt", "api_key": "sk-secret"})
    run_validate(store, ValidateConfig(test_fraction=0.3, seed=0))
    return store


def _front_matter(card: str) -> dict:
    match = re.match(r"^---\n(.*?)\n---\n", card, re.S)
    assert match, card[:200]
    return yaml.safe_load(match.group(1))


def _export(store: RunStore, config: ExportConfig) -> tuple[ExportReport, Any]:
    stage = run_export(store, config)
    return ExportReport.model_validate(stage.manifest.stats), stage


# -- groups -------------------------------------------------------------------------------------
def test_groups_to_dir_round_trip_and_card(tmp_path: Path) -> None:
    store = _run(tmp_path)
    validated = {g.group_id: g for g in store.load_records("validate", ValidatedGroup)}
    config = ExportConfig(to_dir=str(tmp_path / "out"), license="cc-by-4.0")
    result, _ = _export(store, config)
    dsd = datasets.load_from_disk(str(tmp_path / "out"))
    assert set(dsd) == {"train", "test"}
    for split, ds in dsd.items():
        for group in from_dataset(ds, ValidatedGroup):
            assert group.split == split and group == validated[group.group_id]
    assert sum(result.rows.values()) == 12
    card = (tmp_path / "out" / "README.md").read_text()
    meta = _front_matter(card)
    assert meta["license"] == "cc-by-4.0"
    assert meta["task_categories"] == ["text-generation"]
    assert meta["size_categories"] == ["n<1K"]
    assert "configs" not in meta  # save_to_disk has no Parquet files to point at
    assert {s["name"]: s["num_examples"] for s in meta["dataset_info"]["splits"]} == result.rows
    assert f"| train | {result.rows['train']} | {result.rows['train']} |" in card
    assert "| noise_rate | 0.125 |" in card and "| recommendation | gspo |" in card
    assert "method: bt" in card and "test_fraction: 0.3" in card
    assert "sk-secret" not in card and "api_key: '***'" in card
    manifest = store.manifest(config.stage_name())
    assert manifest and manifest.counts.inputs == manifest.counts.outputs == 12
    assert manifest.stage.startswith("export/dir-out-") and manifest.outputs == {
        "location": str(tmp_path / "out")}
    assert run_export(store, config).cached  # the same export of the same input
    # A second export replaces the first; a directory that is not an export is refused.
    run_export(store, ExportConfig(to_dir=str(tmp_path / "out")))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not a dataset export"):
        run_export(store, ExportConfig(to_dir=str(tmp_path / "other")))


def test_export_reads_only_fresh_validated_data(tmp_path: Path) -> None:
    store = write_aggregate(tmp_path / "run", [make_validated("One?")])
    with pytest.raises(StageError, match="validate"):
        run_export(store, ExportConfig(to_dir=str(tmp_path / "out")))
    run_validate(store, ValidateConfig())
    write_aggregate(tmp_path / "run", [make_validated("One?"), make_validated("Two?")])
    with pytest.raises(StageError, match=r"validate is stale \(input changed: aggregate\): "
                       r"re-run validate first .*--allow-stale"):
        run_export(store, ExportConfig(to_dir=str(tmp_path / "out")))


def test_config_needs_exactly_one_target() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        ExportConfig()
    with pytest.raises(ValueError, match="exactly one"):
        ExportConfig(to_dir="a", parquet="b.parquet")
    with pytest.raises(ValueError, match="only goes with --hub"):
        ExportConfig(to_dir="a", dry_run=True)


# -- trl-pairs ----------------------------------------------------------------------------------
def test_select_pairs_skip_ties_and_against_and_light_pairs() -> None:
    group = make_validated("Pairs?", k=4)
    a, b, c, d = [cid for (cid,) in group.consensus]
    tied = group.model_copy(update={"consensus": [[a], [b, c], [d]]})
    pairs = [PairPreference(winner=a, loser=b, p=0.9, weight=0.9),
             PairPreference(winner=b, loser=c, p=0.5, weight=0.9),   # tie in consensus
             PairPreference(winner=d, loser=c, p=0.6, weight=0.9),   # against consensus
             PairPreference(winner=a, loser=d, p=0.95, weight=0.1),  # light
             PairPreference(winner=c, loser=d, p=0.7, weight=0.5)]
    tied = tied.model_copy(update={"pairs": pairs})
    values = [PairValues(p.winner, p.loser, p.p, p.weight) for p in tied.pairs]
    kept, skipped = select_pairs(tied.consensus, values,
                                 ExportConfig(to_dir="x", min_weight=0.2))
    assert [(values[i].winner, values[i].loser) for i in kept] == [(a, b), (c, d)]
    assert skipped == {"tie_in_consensus": 1, "against_consensus": 1, "below_min_weight": 1}
    best, skipped = select_pairs(tied.consensus, values,
                                 ExportConfig(to_dir="x", pairs="best_worst"))
    assert [(values[i].winner, values[i].loser) for i in best] == [(a, d)]  # top vs bottom
    assert skipped["not_best_worst"] == 2  # (a, b) and (c, d)


@pytest.mark.parametrize("chat", [True, False])
def test_trl_pairs_from_the_stored_table_equal_the_records_path(tmp_path: Path, chat: bool
                                                                ) -> None:
    # the stage reads validate's own table as Arrow (pairs_from_table); build_dataset on the
    # same groups as records is the reference: equal rows, skipped pairs and rejects, under
    # each setting that changes what is exported
    all_tied = make_validated("All tied?", k=K)
    ids = all_tied.candidate_ids()
    all_tied = all_tied.model_copy(update={"consensus": [ids], "pairs": [
        PairPreference(winner=ids[0], loser=ids[1], p=0.5, weight=0.2)]})
    store = _run(tmp_path, n=10, chat=chat, extra=[all_tied])
    table = stored_table(store)
    assert table is not None
    key = store.require("validate").output_fingerprint or ""
    for settings in ({}, {"pairs": "best_worst"}, {"min_weight": 0.5}, {"split": "test"},
                     {"chat": "always"}):
        config = ExportConfig(format="trl-pairs", to_dir="x", **settings)
        groups = [g for g in load_validated(store) if config.split in (None, g.split)]
        want, want_skipped, want_rejects = build_dataset(groups, config, key)
        got, got_skipped, got_rejects = pairs_from_table(table, config, key)
        assert list(got) == list(want), settings
        for split in want:
            assert got[split].features == want[split].features, settings
            assert got[split].to_list() == want[split].to_list(), settings
            assert got[split]._fingerprint == want[split]._fingerprint
        assert got_skipped == want_skipped and got_rejects == want_rejects, settings
        # the all-tied group (in train) has no pair to export
        assert len(got_rejects) == (0 if config.split == "test" else 1), settings


def test_trl_pairs_parquet_one_file_per_split_and_rejects(tmp_path: Path) -> None:
    all_tied = make_validated("All tied?", k=K)
    ids = all_tied.candidate_ids()
    all_tied = all_tied.model_copy(update={"consensus": [ids], "pairs": [
        PairPreference(winner=ids[0], loser=ids[1], p=0.5, weight=0.2)]})
    store = _run(tmp_path, n=6, extra=[all_tied])
    out = tmp_path / "pairs"
    config = ExportConfig(format="trl-pairs", parquet=str(out))
    result, stage = _export(store, config)
    assert result.files == ["train.parquet", "test.parquet", "README.md"]
    # The Hugging Face convention: one file per split, so no test row lands in train.
    dsd = datasets.load_dataset("parquet", data_files={s: str(out / f"{s}.parquet")
                                                       for s in ("train", "test")})
    assert {s: len(ds) for s, ds in dsd.items()} == result.rows
    assert sum(result.rows.values()) == 6 * K * (K - 1) // 2
    groups = {g.group_id: g for g in store.load_records("validate", ValidatedGroup)}
    for split, ds in dsd.items():
        assert set(ds.column_names) == {"prompt", "chosen", "rejected", "p", "weight",
                                        "group_id", "chosen_id", "rejected_id"}
        for row in ds:
            group = groups[row["group_id"]]
            assert group.split == split
            text = {c.candidate_id: c.text for c in group.candidates}
            assert row["chosen"] == [{"role": "assistant", "content": text[row["chosen_id"]]}]
            assert row["rejected"] == [{"role": "assistant",
                                        "content": text[row["rejected_id"]]}]
            pair = next(p for p in group.pairs if (p.winner, p.loser) == (row["chosen_id"],
                                                                         row["rejected_id"]))
            assert (row["p"], row["weight"]) == (pair.p, pair.weight)
            assert row["prompt"][-1] == {"role": "user", "content": group.prompt.messages[-1]
                                         .content if group.prompt.messages else group.prompt.text}
    # The folder loads like a Hub repo too: its README's `configs` name the files per split.
    meta = _front_matter((out / "README.md").read_text())
    assert meta["configs"][0]["data_files"] == [{"split": "train", "path": "train.parquet"},
                                               {"split": "test", "path": "test.parquet"}]
    assert {s: len(ds) for s, ds in datasets.load_dataset(str(out)).items()} == result.rows
    (reject,) = stage.rejects()
    assert reject.group_id == all_tied.group_id and "no consensus pair" in reject.reason
    assert result.skipped_pairs == {"tie_in_consensus": 1}
    counts = store.manifest(config.stage_name()).counts
    assert (counts.inputs, counts.outputs, counts.rejected) == (7, 6, 1)
    assert [r.group_id for r in read_rejects(stage.dir / "rejects.jsonl")] == [
        all_tied.group_id]


def test_parquet_file_holds_the_split_it_is_asked_for(tmp_path: Path) -> None:
    store = _run(tmp_path, n=8)
    with pytest.raises(ValueError, match="a .parquet file holds one split; add --split"):
        ExportConfig(parquet=str(tmp_path / "all.parquet"))
    out = tmp_path / "heldout.parquet"
    result, _ = _export(store, ExportConfig(parquet=str(out), split="test"))
    test_groups = [g for g in store.load_records("validate", ValidatedGroup) if g.split == "test"]
    assert result.rows == {"test": len(test_groups)} and result.groups == {"test": len(test_groups)}
    assert sorted(from_dataset(datasets.Dataset.from_parquet(str(out)), ValidatedGroup),
                  key=lambda g: g.group_id) == sorted(test_groups, key=lambda g: g.group_id)
    meta = _front_matter(out.with_suffix(".md").read_text())
    assert [s["name"] for s in meta["dataset_info"]["splits"]] == ["test"]
    assert "configs" not in meta  # FILE.md is no repo README: nothing to point at


def test_hub_dry_run_writes_the_hub_layout(tmp_path: Path) -> None:
    store = _run(tmp_path)
    result, stage = _export(store, ExportConfig(format="trl-pairs", hub="me/prefs", dry_run=True,
                                                pairs="best_worst"))
    where = stage.dir / "dry-run"
    assert Path(result.location) == where
    assert result.files == ["data/train-00000-of-00001.parquet",
                            "data/test-00000-of-00001.parquet", "README.md"]
    # The names match the pattern `datasets` itself gives pushed shards.
    from datasets.arrow_dataset import PUSH_TO_HUB_WITHOUT_METADATA_CONFIGS_SPLIT_PATTERN_SHARDED

    pattern = PUSH_TO_HUB_WITHOUT_METADATA_CONFIGS_SPLIT_PATTERN_SHARDED.replace("{split}", "train")
    assert Path(where / result.files[0]).match(pattern)
    assert sorted(str(p.relative_to(where)) for p in where.rglob("*") if p.is_file()) == sorted(
        result.files)
    # The folder loads like the Hub repo would: through the card's `configs`.
    dsd = datasets.load_dataset(str(where))
    assert {s: len(ds) for s, ds in dsd.items()} == result.rows
    assert sum(result.rows.values()) == 12  # best_worst: one pair per group
    meta = _front_matter((where / "README.md").read_text())
    assert meta["configs"][0]["data_files"][0] == {"split": "train", "path": "data/train-*"}


def test_hub_push_without_token_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import get_token

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    if get_token():
        pytest.skip("a Hugging Face token is saved on this machine: this test would push")
    store = _run(tmp_path, n=4)
    with pytest.raises(ConfigError, match="HF_TOKEN"):
        run_export(store, ExportConfig(hub="me/prefs"))


def test_cli_export(tmp_path: Path) -> None:
    store = _run(tmp_path, n=4)
    app = typer.Typer()
    export_commands.register(app)
    out = tmp_path / "cli"
    result = CliRunner().invoke(app, ["export", str(store.root), "--parquet", str(out),
                                      "--format", "trl-pairs"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "export (trl-pairs)" in result.output and (out / "train.parquet").exists()
    bad = CliRunner().invoke(app, ["export", str(store.root), "--to", "a", "--parquet", "b"])
    assert isinstance(bad.exception, ConfigError)  # cli.main prints it as one line, exit 2
    assert "export: give exactly one of --to, --parquet, --hub" in str(bad.exception)


# -- TRL ----------------------------------------------------------------------------------------
CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} <eos> {% endfor %}"
                 "{% if add_generation_prompt %}<assistant> {% endif %}")


def _word_tokenizer(texts: list[str]):  # noqa: ANN202 - transformers type
    """A word-level tokenizer trained on ``texts`` with a tiny chat template (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = ["<pad>", "<unk>", "<eos>", "<system>", "<user>", "<assistant>"]
    tok.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=specials))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>",
                                        unk_token="<unk>", eos_token="<eos>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def test_trl_pairs_train_one_dpo_step(tmp_path: Path) -> None:
    """TRL's own data utilities and DPOTrainer accept the export: with policy == reference the
    first DPO loss is exactly -log sigmoid(0) = log 2, and the step changes the weights."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import DPOConfig, DPOTrainer
    from trl.data_utils import is_conversational, maybe_apply_chat_template

    store = _run(tmp_path, n=8)
    run_export(store, ExportConfig(format="trl-pairs", to_dir=str(tmp_path / "out")))
    train = datasets.load_from_disk(str(tmp_path / "out"))["train"]
    assert is_conversational(train[0])
    texts = [m["content"] for row in train for col in ("prompt", "chosen", "rejected")
             for m in row[col]]
    tokenizer = _word_tokenizer(texts)
    rendered = maybe_apply_chat_template(train[0], tokenizer)
    assert rendered["prompt"].endswith("<assistant> ")
    assert rendered["chosen"].startswith(train[0]["chosen"][0]["content"])

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = DPOConfig(output_dir=str(tmp_path / "dpo"), max_steps=1, per_device_train_batch_size=4,
                     bf16=False, use_cpu=True, report_to="none", logging_steps=1,
                     save_strategy="no", max_length=64, learning_rate=1e-2)
    trainer = DPOTrainer(model=model, ref_model=copy.deepcopy(model), args=args,
                         train_dataset=train, processing_class=tokenizer)
    first = trainer.train_dataset[0]
    chosen = tokenizer.decode(first["chosen_ids"]).split()
    assert chosen == [*train[0]["chosen"][0]["content"].split(), "<eos>"]
    trainer.train()
    loss = trainer.state.log_history[0]["loss"]
    # TRL's first DPO loss with policy == reference: -log sigmoid(0) = log 2 in float32 (logits equal
    # bit for bit), ~eps32 * 0.7 off; 1e-6 = 12 eps32
    assert loss == pytest.approx(torch.log(torch.tensor(2.0)).item(), abs=1e-6)
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())


def test_trl_pairs_plain_text_prompts(tmp_path: Path) -> None:
    from trl.data_utils import is_conversational

    store = _run(tmp_path, n=4, chat=False)
    run_export(store, ExportConfig(format="trl-pairs", to_dir=str(tmp_path / "out")))
    row = datasets.load_from_disk(str(tmp_path / "out"))["train"][0]
    assert not is_conversational(row)
    assert isinstance(row["prompt"], str) and isinstance(row["chosen"], str)
    json.dumps(row)  # plain JSON-able values


def test_hub_push_network_failure_is_a_stage_error_without_the_token(tmp_path: Path) -> None:
    """The real push path (push_to_hub) against a closed loopback port: one clear error line,
    and the token appears nowhere. A subprocess, because the Hub endpoint is read at import."""
    import os
    import socket
    import subprocess
    import sys

    store = _run(tmp_path, n=4)
    with socket.socket() as s:  # a port that was free a moment ago: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (
        "import sys\n"
        "from grouppref.errors import StageError\n"
        "from grouppref.pipeline.export.stage import ExportConfig, run_export\n"
        "from grouppref.runs.store import RunStore\n"
        "try:\n"
        f"    run_export(RunStore({str(store.root)!r}), ExportConfig(hub='me/prefs'))\n"
        "except StageError as e:\n"
        "    print('STAGE_ERROR', e)\n"
        "    sys.exit(0)\n"
        "sys.exit(1)\n")
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{port}",
           "HF_TOKEN": "hf_TOKENthatMustNotLeak", "HF_HUB_DISABLE_TELEMETRY": "1",
           "HF_HUB_OFFLINE": "0"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "STAGE_ERROR push to the Hub dataset 'me/prefs' failed" in proc.stdout
    assert "TOKENthatMustNotLeak" not in proc.stdout + proc.stderr
