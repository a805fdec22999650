"""Shared fixtures: the embedded SmolLM2 and tiny models built from a config and saved to disk
(the real loading path, no hub access)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.tiny_models import save_tiny_llama

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a hub lookup fails at once instead of hanging
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


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


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """Where tests save screenshots and other artifacts (git-ignored)."""
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch on one thread for a module's tests, restored afterwards: the tiny models gain
    nothing from threads, and on a busy 2-core machine OpenMP threads oversubscribe (measured:
    a held-out scoring pass took 43 s with the default, 6 s with 1). A module asks for it with
    ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

# failures for missing requirements and the end-of-run count of tests run (tests/suite_setup.py,
# first: the others import it), the embedded Argilla server and PostgreSQL fixtures
# (tests/argilla_fixtures.py), llama.cpp's server (tests/llama_server.py)
pytest_plugins = ["tests.suite_setup", "tests.argilla_fixtures", "tests.llama_server"]


@pytest.fixture
def fresh_dynamo():
    """dynamo's caches and counters emptied for one test (and again after it); yields the
    counters (``["stats"]["unique_graphs"]``: graphs compiled since). ``torch._dynamo.reset()``
    alone keeps the counters, so a test that ran compiled code before would leak its graphs."""
    import torch

    def clean() -> None:
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()

    clean()
    yield torch._dynamo.utils.counters
    clean()

