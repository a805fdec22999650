"""Every test's tier, from the folder that holds its file (loaded from conftest's
``pytest_plugins``; registered once when both test roots are collected).

The tier of a test is the folder under its test root that holds its file (issue 31). The test
roots are tests/ (the product's) and research/tests/ (the research experiments'). Under
tests/: unit/<package>/ (one package's logic, in process: no server, subprocess, torchrun,
compile or browser; the folders mirror grouppref/), integration/ (several stages together, in
process or through the CLI, tiny models, fake HTTP servers) and system/ (real servers: Argilla,
PostgreSQL, llama.cpp; torchrun, compile, the browser, whole pipelines and the demo);
research/tests/ has the same tier folders. A test file anywhere else stops the run, so a new
file cannot go untiered.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.paths import REPO

ROOTS = (REPO / "tests", REPO / "research" / "tests")
TIERS = ("unit", "integration", "system")


def tier_of(path: Path) -> str | None:
    """The tier folder of a test file, None when it is under no test root's tier folder."""
    resolved = path.resolve()
    for root in ROOTS:
        if resolved.is_relative_to(root):
            tier = resolved.relative_to(root).parts[0]
            return tier if tier in TIERS else None
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test with its tier, the first folder of its file under its test root; a test
    file outside the tier folders stops the run, naming it."""
    misplaced = set()
    for item in items:
        if not item.path.name.startswith("test_"):
            continue
        tier = tier_of(item.path)
        if tier is not None:
            item.add_marker(getattr(pytest.mark, tier))
        else:
            misplaced.add(str(item.path.resolve().relative_to(REPO)))
    if misplaced:
        raise pytest.UsageError(
            f"{', '.join(sorted(misplaced))}: a test file lives in tests/unit/<package>/, "
            "tests/integration/ or tests/system/ (its tier), or in research/tests/integration/ "
            "or research/tests/system/; move it there")
