"""The model fixtures both test roots use (loaded from conftest's ``pytest_plugins``): the
embedded SmolLM2 and tiny models built from a config and saved to disk (the real loading path,
no hub access)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tiny_models import save_tiny_llama


@pytest.fixture(scope="session")
def embedded_model_dir() -> Path:
    """The embedded SmolLM2-135M-Instruct as a safetensors folder (converted once, cached)."""
    from grouppref.models.loading import embedded_model_dir as resolve

    return resolve()


@pytest.fixture(scope="session")
def tiny_lm_dir(tmp_path_factory: pytest.TempPathFactory, embedded_model_dir: Path) -> Path:
    """A 2-layer, 32-wide Llama with SmolLM2's tokenizer and chat template, saved to disk."""
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-lm"), embedded_model_dir)


@pytest.fixture(scope="session")
def tiny_reward_model_dir(tmp_path_factory: pytest.TempPathFactory, embedded_model_dir: Path) -> Path:
    """A tiny Llama sequence classifier with one output (a reward model), saved to disk."""
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-rm"), embedded_model_dir, reward_head=True)
