"""Shared fixtures and the plugins every test loads: each test's tier from its folder
(tests/support/tiers.py), the embedded SmolLM2 and tiny models saved to disk
(tests/support/model_fixtures.py), artifacts, torch threads, dynamo's caches."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a hub lookup fails at once instead of hanging
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


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
# first: the others import it), each test's tier from its folder (tests/support/tiers.py), the model
# fixtures (tests/support/model_fixtures.py), the embedded Argilla server and PostgreSQL fixtures
# (tests/support/argilla_fixtures.py), llama.cpp's server (tests/support/llama_server.py), the
# run of groups the served-judge fakes rank (``groups_run``, tests/support/served_fakes.py)
pytest_plugins = ["tests.support.suite_setup", "tests.support.tiers", "tests.support.model_fixtures",
                  "tests.support.argilla_fixtures", "tests.support.llama_server",
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

