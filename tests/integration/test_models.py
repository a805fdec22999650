"""Model resolution and the embedded SmolLM2 (grouppref/models.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grouppref.models import loading
from grouppref.models.loading import (
    EMBEDDED_NAME,
    ModelNotFoundError,
    cache_root,
    embedded_gguf,
    is_embedded,
    load_causal_lm,
    load_tokenizer,
    model_fingerprint,
    model_label,
    resolve_model,
)


@pytest.mark.slow
def test_converted_embedded_model_gives_the_gguf_logits(embedded_model_dir: Path):
    """The safetensors folder and the GGUF it came from (dequantised by transformers) give the
    same logits on a chat prompt: exactly (atol 0), since the weights are the same fp32 values."""
    from transformers import AutoModelForCausalLM

    gguf = embedded_gguf()
    reference = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name).eval()
    converted = load_causal_lm(None)
    tokenizer = load_tokenizer(None)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Name a colour."}],
                                         add_generation_prompt=True, tokenize=False)
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        want, got = reference(ids).logits, converted(ids).logits
    torch.testing.assert_close(got, want, atol=0.0, rtol=0.0)


def test_embedded_aliases_resolve_to_the_cached_folder(embedded_model_dir: Path):
    for name in (None, "", "embedded", "default", EMBEDDED_NAME,
                 "HuggingFaceTB/SmolLM2-135M-Instruct"):
        assert is_embedded(name)
        assert resolve_model(name) == str(embedded_model_dir)
        assert model_label(name) == EMBEDDED_NAME
    assert (embedded_model_dir / "config.json").exists()
    assert model_label("org/other") == "org/other"


def test_resolve_model_accepts_a_model_folder(tiny_lm_dir: Path):
    assert resolve_model(str(tiny_lm_dir)) == str(tiny_lm_dir)


@pytest.mark.parametrize("name", ["./no/such/folder", "/no/such/model", "not a hub id!",
                                  "a/b/c"])
def test_resolve_model_rejects_missing_paths_and_bad_ids(name: str):
    with pytest.raises(ModelNotFoundError, match="no such folder, and not a Hub id"):
        resolve_model(name)


def test_resolve_model_rejects_a_folder_without_config(tmp_path: Path):
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model(str(tmp_path))


def test_resolve_model_rejects_an_unreachable_hub_id():
    """Offline (HF_HUB_OFFLINE=1 in conftest) and not cached: a clear error, at once."""
    with pytest.raises(ModelNotFoundError, match="the Hub id cannot be loaded"):
        resolve_model("grouppref-tests/no-such-model")


def test_the_embedded_model_is_fingerprinted_by_its_gguf_on_any_machine(
        embedded_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """By name or as its converted folder, the embedded model's fingerprint is its GGUF's: a
    converted folder whose tokenizer config says how the Hub was reached (``local_files_only``,
    written by conversions before this fix) is the same model, so a committed run stays fresh on
    another machine. A copy of the folder elsewhere is fingerprinted by its files, as any model
    folder is."""
    import json
    import shutil

    want = model_fingerprint("embedded")
    assert model_fingerprint(str(embedded_model_dir)) == want
    monkeypatch.setenv("GROUPPREF_CACHE", str(tmp_path / "cache"))
    other = tmp_path / "cache" / "models" / EMBEDDED_NAME  # "another machine's" conversion
    shutil.copytree(embedded_model_dir, other)
    config = other / "tokenizer_config.json"
    settings = json.loads(config.read_text())
    settings["local_files_only"] = not settings.get("local_files_only", False)
    config.write_text(json.dumps(settings))
    assert model_fingerprint(str(other)) == want
    copy = shutil.copytree(other, tmp_path / "elsewhere")
    assert model_fingerprint(str(copy)) != want
    loading._drop_runtime_keys(config)  # what the conversion now does to what it saves
    assert "local_files_only" not in json.loads(config.read_text())


def test_cache_root_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("GROUPPREF_CACHE", str(tmp_path / "gp"))
    assert cache_root() == tmp_path / "gp"
    monkeypatch.delenv("GROUPPREF_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "grouppref"


def test_tokenizer_pads_on_the_left_with_a_pad_token(tiny_lm_dir: Path):
    tokenizer = load_tokenizer(str(tiny_lm_dir))
    assert tokenizer.padding_side == "left" and tokenizer.pad_token is not None
