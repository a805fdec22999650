"""The research experiments' tests (research/tests/<tier>/): the same plugins as the product's
tests (tests/conftest.py): the tier check and markers, the model fixtures, the end-of-run count."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a hub lookup fails at once instead of hanging
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# registered once when both test roots are collected (pytest skips a plugin already loaded)
pytest_plugins = ["tests.support.suite_setup", "tests.support.tiers", "tests.support.model_fixtures"]
