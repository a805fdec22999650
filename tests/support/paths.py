"""Where a test finds the repository and its data, wherever under tests/ the test file lives."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEST_DATA = REPO / "tests" / "data"
