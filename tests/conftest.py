"""Shared fixtures: the embedded SmolLM2 and tiny models built from a config and saved to disk
(the real loading path, no hub access)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.tiny_models import save_tiny_llama

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a hub lookup fails at once instead of hanging
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"

# The tier of a test is the folder under tests/ that holds its file (issue 31): unit/<package>/
# (one package's logic, in process: no server, subprocess, torchrun, compile or browser; the
# folders mirror grouppref/), integration/ (several stages together, in process or through the
# CLI, tiny models, fake HTTP servers) and system/ (real servers: Argilla, PostgreSQL, llama.cpp;
# torchrun, compile, the browser, whole pipelines and the demo). A test file anywhere else stops
# the run, so a new file cannot go untiered.
TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "integration", "system")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test with its tier, the first folder of its file under tests/; a test file
    outside the tier folders stops the run, naming it."""
    misplaced = set()
    for item in items:
        if not item.path.name.startswith("test_"):
            continue
        tier = item.path.resolve().relative_to(TESTS).parts[0]
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
        else:
            misplaced.add(str(item.path.resolve().relative_to(TESTS.parent)))
    if misplaced:
        raise pytest.UsageError(
            f"{', '.join(sorted(misplaced))}: a test file lives in tests/unit/<package>/, "
            "tests/integration/ or tests/system/ (its tier); move it there")


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

# failures for missing requirements and the end-of-run count of tests run (tests/support/suite_setup.py,
# first: the others import it), the embedded Argilla server and PostgreSQL fixtures
# (tests/support/argilla_fixtures.py), llama.cpp's server (tests/support/llama_server.py), the
# run of groups the served-judge fakes rank (``groups_run``, tests/support/served_fakes.py)
pytest_plugins = ["tests.support.suite_setup", "tests.support.argilla_fixtures", "tests.support.llama_server",
                  "tests.support.served_fakes"]


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

