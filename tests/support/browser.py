"""Headless Debian Chromium for the browser tests (driven by playwright, never
``playwright install``): one start-up, shared by the Argilla UI test and the HTML report test."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@contextmanager
def chromium_page(executable: str, width: int, height: int) -> Iterator[Any]:
    """A page of a fresh Chromium (its own throw-away profile, no network extras) with a
    ``width`` x ``height`` viewport; the browser is closed on the way out."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        ctx = p.chromium.launch_persistent_context(
            profile, executable_path=executable, args=FLAGS, headless=True,
            viewport={"width": width, "height": height})
        try:
            yield ctx.new_page()
        finally:
            ctx.close()
