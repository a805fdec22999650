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

# The tier of every test file (issue 31). unit: one package's logic, in process (no server,
# subprocess, torchrun, compile, browser); integration: several stages together, in process or
# through the CLI, tiny models, fake HTTP servers; system: real servers (Argilla, PostgreSQL,
# llama.cpp), torchrun, compile, the browser, whole pipelines and the demo. A file missing here
# fails collection, so a new test file cannot be forgotten.
TIERS = {
    "test_aggregate.py": "integration",  # one CLI run in a subprocess
    "test_api.py": "unit",  # one subprocess: the import of grouppref.api alone
    "test_architecture.py": "integration",  # imports the package in subprocesses
    "test_argilla_lifecycle.py": "system",  # two real Argilla server starts
    "test_argilla_load.py": "system",  # the real embedded Argilla
    "test_argilla_logins.py": "system",
    "test_argilla_matching.py": "unit",
    "test_argilla_serve_errors.py": "system",
    "test_argilla_server.py": "system",
    "test_bt.py": "unit",
    "test_cards.py": "integration",  # train on a tiny model, export
    "test_cli.py": "integration",  # the CLI in subprocesses
    "test_cli_flags.py": "integration",
    "test_compile.py": "system",  # torch.compile
    "test_compile_settings.py": "system",
    "test_compile_train.py": "system",  # compile and torchrun
    "test_constraints.py": "unit",
    "test_constraints_ifeval.py": "unit",
    "test_ddp.py": "system",  # torchrun
    "test_data_equivalence.py": "integration",  # every data stage on fixtures and hostile input
    "test_demo.py": "system",  # the whole demo pipeline
    "test_evidence_quick.py": "integration",  # the evidence scripts end to end at toy sizes
    "test_examples.py": "system",  # example configs end to end, real Argilla
    "test_export.py": "integration",
    "test_fsdp.py": "system",  # torchrun
    "test_generate.py": "integration",  # tiny model, CLI
    "test_hostile_input.py": "integration",
    "test_ifeval_benchmark.py": "integration",
    "test_import_layouts.py": "unit",
    "test_import_ranked.py": "integration",
    "test_import_stage.py": "integration",
    "test_judge_server.py": "system",  # llama.cpp's server
    "test_judge_server_check.py": "system",
    "test_label_audit_push.py": "system",  # real Argilla
    "test_label_browser.py": "system",  # chromium and real Argilla
    "test_label_errors.py": "system",
    "test_label_push_pull.py": "system",
    "test_label_select.py": "integration",
    "test_label_select_push.py": "system",
    "test_listwise_losses.py": "integration",  # tiny model
    "test_llama_server_fixture.py": "system",
    "test_logps.py": "integration",
    "test_losses.py": "integration",
    "test_models.py": "integration",  # the embedded SmolLM2
    "test_newuser_files.py": "integration",
    "test_openai_backend.py": "system",  # llama.cpp's server
    "test_output_streams.py": "integration",
    "test_partial_rankings.py": "unit",
    "test_rank.py": "integration",
    "test_rank_served_overlap.py": "integration",  # fake HTTP servers
    "test_rankers.py": "integration",
    "test_readers.py": "unit",
    "test_recipe_study.py": "system",  # the recipe study end to end on the tiny Llama and TRL
    "test_refresh.py": "system",  # torchrun
    "test_refresh_served.py": "integration",
    "test_reliability_audit.py": "unit",
    "test_reliability_weight.py": "integration",
    "test_report.py": "system",  # chromium
    "test_report_selection.py": "unit",
    "test_roundtrip.py": "integration",
    "test_runner.py": "integration",
    "test_schemas.py": "unit",
    "test_served_faults.py": "system",  # llama.cpp's server
    "test_served_overlap.py": "integration",
    "test_served_sampling.py": "system",
    "test_simulate.py": "unit",
    "test_stale.py": "integration",
    "test_store.py": "integration",
    "test_sweep.py": "system",  # PostgreSQL, two worker processes, tiny-model trainings
    "test_train_baselines.py": "integration",
    "test_train_data.py": "integration",
    "test_train_mix.py": "system",  # torchrun
    "test_train_mix_evidence.py": "integration",  # the curriculum experiment end to end (--quick)
    "test_train_peak.py": "integration",
    "test_train_rm.py": "integration",
    "test_train_rm_dist.py": "system",  # torchrun
    "test_train_rm_resume.py": "integration",
    "test_trainer.py": "integration",
    "test_validate.py": "unit",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test with its file's tier (``TIERS``); a test file missing from the table
    stops the run, naming it."""
    missing = set()
    for item in items:
        name = item.path.name
        if not name.startswith("test_"):
            continue
        tier = TIERS.get(name)
        if tier is None:
            missing.add(name)
        else:
            item.add_marker(getattr(pytest.mark, tier))
    if missing:
        raise pytest.UsageError(
            f"{', '.join(sorted(missing))}: not in TIERS of tests/conftest.py; add each test file there "
            "with its tier (unit, integration or system)")


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

