"""What a user publishes: the dataset card of an export (secrets redacted and nothing else, no
local paths, an SPDX license) and the trained model folder (a model card with the Hub's YAML,
the loss, the data counts and the held-out metrics; a LoRA adapter naming its base by Hub id;
files readable like the rest)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import yaml

from grouppref.errors import StageError
from grouppref.pipeline.export.config import ExportConfig
from grouppref.pipeline.export.stage import run_export
from grouppref.pipeline.validate.config import ValidateConfig
from grouppref.pipeline.validate.stage import run_validate
from grouppref.runs.stage import StageContext
from grouppref.runs.store import RunStore
from grouppref.schemas import ValidatedGroup
from grouppref.train.engine.model_folder import EMBEDDED_HUB_ID, hub_id, public_name
from grouppref.train.policy.stage import run_train
from grouppref.train.settings.policy import TrainConfig
from tests.support.validated import make_validated, write_aggregate

SECRETS = {"api_key": "sk-live-123", "Token": "hf_abcdef", "password": "pw-one",
           "client": {"secret": "s3cr3t", "id": "client-7"}}


def _front_matter(card: str) -> dict:
    match = re.match(r"^---\n(.*?)\n---\n", card, re.S)
    assert match, card[:200]
    return yaml.safe_load(match.group(1))


def _yaml_blocks(card: str) -> list[dict]:
    return [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)\n```", card, re.S)]


def _run(tmp_path: Path, config: dict | None = None, n: int = 10) -> RunStore:
    records = [make_validated(f"Question {i}?", k=3, chat=i % 2 == 0) for i in range(n)]
    store = write_aggregate(tmp_path / "run", records, stats={"noise_rate": 0.1},
                            config=config)
    run_validate(store, ValidateConfig(test_fraction=0.3, seed=0))
    return store


def test_dataset_card_redacts_only_secrets_and_cuts_local_paths(tmp_path: Path) -> None:
    prompts = tmp_path / "data" / "prompts.jsonl"
    judge = tmp_path / "models" / "my-judge"
    judge.mkdir(parents=True)
    settings = {
        "max_new_tokens": 48, "tokenizer": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "rankers": [{"kind": "rule", "checks": [{"check": "keywords",
                                                 "keywords": ["token", "secret"]}]},
                    {"kind": "judge", "model": str(judge)}],
        "source": str(prompts), "relative": "data/more.jsonl", "home": "~/prompts.csv",
        "server_url": "http://admin:hunter2@localhost:6900", **SECRETS}
    store = _run(tmp_path, settings)
    run_export(store, ExportConfig(to_dir=str(tmp_path / "out")))
    card = (tmp_path / "out" / "README.md").read_text()
    (aggregate, *_) = _yaml_blocks(card)
    # settings that merely look like credentials stay as they are
    assert aggregate["max_new_tokens"] == 48
    assert aggregate["tokenizer"] == "HuggingFaceTB/SmolLM2-135M-Instruct"  # a Hub id stays
    assert aggregate["rankers"][0]["checks"][0]["keywords"] == ["token", "secret"]
    # values of credential keys, at any depth and in any case, and passwords in URLs are not
    assert aggregate["api_key"] == aggregate["Token"] == aggregate["password"] == "***"
    assert aggregate["client"] == {"secret": "***", "id": "client-7"}
    assert aggregate["server_url"] == "http://admin:***@localhost:6900"
    for value in ("sk-live-123", "hf_abcdef", "pw-one", "s3cr3t", "hunter2"):
        assert value not in card
    # a local path becomes its file or folder name
    assert aggregate["source"] == "prompts.jsonl" and aggregate["relative"] == "more.jsonl"
    assert aggregate["home"] == "prompts.csv" and aggregate["rankers"][1]["model"] == "my-judge"
    assert str(tmp_path) not in card and "/data/" not in card


def test_dataset_card_license_is_an_spdx_id_or_other_with_a_name(tmp_path: Path) -> None:
    assert ExportConfig(to_dir="x", license="CC-BY-4.0").license == "cc-by-4.0"
    assert ExportConfig(to_dir="x", license="Apache-2.0").license == "apache-2.0"
    for bad, message in [("creative commons", "is not an SPDX license id"),
                         ("MIT OR Apache-2.0", "give one SPDX id, not an expression")]:
        with pytest.raises(ValueError, match=message):
            ExportConfig(to_dir="x", license=bad)
    with pytest.raises(ValueError, match="--license other needs --license-name"):
        ExportConfig(to_dir="x", license="other")
    with pytest.raises(ValueError, match="go with --license other only"):
        ExportConfig(to_dir="x", license="mit", license_name="mine")
    store = _run(tmp_path)
    run_export(store, ExportConfig(to_dir=str(tmp_path / "out"), license="other",
                                   license_name="acme-data-1.0",
                                   license_link="https://acme.example/license"))
    card = (tmp_path / "out" / "README.md").read_text()
    meta = _front_matter(card)
    assert (meta["license"], meta["license_name"], meta["license_link"]) == (
        "other", "acme-data-1.0", "https://acme.example/license")
    assert "License: `acme-data-1.0` (https://acme.example/license)." in card
    run_export(store, ExportConfig(to_dir=str(tmp_path / "none")))
    card = (tmp_path / "none" / "README.md").read_text()
    assert "license" not in _front_matter(card) and "License: none given" in card


def test_hub_id_of_a_model_reference(tmp_path: Path) -> None:
    snapshot = tmp_path / "hub" / "models--acme--tiny-lm" / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    local = tmp_path / "checkpoints" / "my-model"
    local.mkdir(parents=True)
    assert hub_id("embedded") == hub_id(None) == EMBEDDED_HUB_ID
    assert hub_id("acme/other-lm") == "acme/other-lm"  # not a local path: a Hub id
    assert hub_id(str(snapshot)) == "acme/tiny-lm"  # a folder of the Hugging Face cache
    assert hub_id(str(local)) is None and public_name(str(local)) == "my-model"


def test_train_resume_without_a_checkpoint_leaves_the_run_untouched(tmp_path: Path) -> None:
    """``train --resume`` with no checkpoint fails before the run's train stage is opened: no
    manifest left saying "running" (the model is never loaded either)."""
    store = _run(tmp_path, n=4)
    with pytest.raises(StageError, match="checkpoint"):
        run_train(store, TrainConfig(model="/no/such/model"), StageContext(resume=True),
                  out_dir=tmp_path / "model")
    assert store.manifest("train") is None


@pytest.mark.slow  # trains a tiny LM one step (with LoRA, and fully)
@pytest.mark.parametrize("lora", [True, False], ids=["lora-adapter", "full"])
def test_model_card_and_model_folder(tmp_path: Path, tiny_lm_dir: Path, lora: bool) -> None:
    """The model starts from a folder of the Hugging Face cache (LoRA: its Hub id is known) or
    from a plain local folder (full: no Hub id; only the folder's name is shown)."""
    store = _run(tmp_path, n=8)
    base = tmp_path / "hub" / "models--acme--tiny-lm" / "snapshots" / "0123abc"
    shutil.copytree(tiny_lm_dir, base)
    config = TrainConfig(
        model=str(base if lora else tiny_lm_dir), max_steps=1, batch_size=2, beta=0.2,
        lora={"r": 4, "alpha": 8, "save": "adapter"} if lora else None,
        data={"max_prompt_length": 48, "max_response_length": 12})
    out = tmp_path / "model"
    stage = run_train(store, config, out_dir=out)
    card = (out / "README.md").read_text()
    meta = _front_matter(card)
    assert "grouppref" in meta["tags"] and "gspo" in meta["tags"]
    assert meta["pipeline_tag"] == "text-generation" and "datasets" not in meta  # no Hub export
    if lora:
        assert meta["base_model"] == "acme/tiny-lm" and meta["library_name"] == "peft"
        assert "lora" in meta["tags"]
        adapter = json.loads((out / "adapter_config.json").read_text())
        assert adapter["base_model_name_or_path"] == "acme/tiny-lm"  # never the cache path
        assert "Trained from [acme/tiny-lm](https://huggingface.co/acme/tiny-lm) with" in card
        assert 'from_pretrained("model")  # base: acme/tiny-lm' in card  # how to load it
    else:
        assert "base_model" not in meta and meta["library_name"] == "transformers"
        assert f"Trained from {tiny_lm_dir.name} with grouppref's `gspo` loss" in card
    # the data counts are the run's: validate's train and test splits
    groups = store.load_records("validate", ValidatedGroup)
    train, held = (sum(g.split == s for g in groups) for s in ("train", "test"))
    assert f"`run` (run): {train} groups trained on, {held} held out, 0 rejected" in card
    assert "| loss | gspo |" in card and "| beta | 0.2 |" in card and "| steps | 1 |" in card
    evaluated = stage.manifest.stats["eval"]
    row = next(line for line in card.splitlines() if line.startswith("| pair_accuracy |"))
    assert row.split("|")[3].strip() == f"{evaluated['pair_accuracy']:.4g}"
    # nothing local in what is published (the run's manifest keeps the full paths)
    for path in [out / "README.md", *out.glob("*.json")]:
        text = path.read_text()
        assert str(tmp_path) not in text and "models--" not in text, path.name
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["reference"]["entry"] == Path(
        stage.manifest.stats["reference"]["entry"]).name
    # every file readable like the rest (safetensors alone writes weights 0600)
    umask = os.umask(0)
    os.umask(umask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.rglob("*") if p.is_file()}
    weights = "adapter_model.safetensors" if lora else "model.safetensors"
    assert weights in modes and set(modes.values()) == {0o666 & ~umask}
