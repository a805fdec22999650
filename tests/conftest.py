"""Shared fixtures: the embedded SmolLM2 and tiny models built from a config and saved to disk
(the real loading path, no hub access)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a hub lookup fails at once instead of hanging
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


@pytest.fixture(scope="session")
def embedded_model_dir() -> Path:
    """The embedded SmolLM2-135M-Instruct as a safetensors folder (converted once, cached)."""
    from grouppref.models.loading import embedded_model_dir as resolve

    return resolve()


def _tiny_config(vocab_size: int, tokenizer, **extra):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True, **extra,
    )


@pytest.fixture(scope="session")
def tiny_lm_dir(tmp_path_factory: pytest.TempPathFactory, embedded_model_dir: Path) -> Path:
    """A 2-layer, 32-wide Llama with SmolLM2's tokenizer and chat template, saved to disk."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir)
    torch.manual_seed(0)
    model = LlamaForCausalLM(_tiny_config(len(tokenizer), tokenizer))
    out = tmp_path_factory.mktemp("tiny-lm")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_reward_model_dir(tmp_path_factory: pytest.TempPathFactory, embedded_model_dir: Path) -> Path:
    """A tiny Llama sequence classifier with one output (a reward model), saved to disk."""
    import torch
    from transformers import AutoTokenizer, LlamaForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir)
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(_tiny_config(len(tokenizer), tokenizer, num_labels=1))
    out = tmp_path_factory.mktemp("tiny-rm")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """Where tests save screenshots and other artifacts (git-ignored)."""
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS

# failures for missing requirements and the end-of-run count of tests run (tests/suite_setup.py,
# first: the others import it), the embedded Argilla server and PostgreSQL fixtures
# (tests/argilla_fixtures.py), llama.cpp's server (tests/llama_server.py)
pytest_plugins = ["tests.suite_setup", "tests.argilla_fixtures", "tests.llama_server"]
