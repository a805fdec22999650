"""Browser end to end: an annotator ranks a record in Argilla's web UI, ``pull`` returns it.

Debian's chromium driven by playwright (never ``playwright install``) logs in as a new
annotator, drags the ranking cards into a chosen order that differs from the suggested
(pre-filled) one and puts an empty response slot in the middle, checks the page shows exactly
that order, submits, and then ``pull`` must return exactly that order without the empty slot.
Screenshots go to ``test-artifacts/``.

Why drag and drop: a first try that focused each card and pressed its rank number submitted
the default order. Every drop is checked in the DOM (a drop onto an empty slot sometimes
lands next to it while the list animates, so it is retried), and the final check is always
the order the server stored, read back through ``pull``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from grouppref.labeling.client import connect, resolve_credentials
from grouppref.labeling.config import PullConfig, PushConfig
from grouppref.labeling.pull import pull_run
from grouppref.labeling.push import push_run
from tests.test_label_push_pull import make_groups, write_stage

pytestmark = [pytest.mark.argilla, pytest.mark.browser]

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SLOT = ".draggable__slot"


def slot_contents(page: Any) -> list[list[str]]:
    """The ranking widget as the page shows it: the card ids in each rank slot, top first."""
    return [[card.get_attribute("id") for card in slot.locator(".draggable__slot-box > div[id]")
             .all()] for slot in page.locator(SLOT).all()]


def wait_for_slots(page: Any, expected: list[list[str]], tries: int = 50) -> None:
    """Wait until the widget shows ``expected`` (it re-renders after a record change)."""
    for _ in range(tries):
        if slot_contents(page) == expected:
            return
        page.wait_for_timeout(200)
    assert slot_contents(page) == expected


def place(page: Any, card: str, rank_index: int, attempts: int = 3) -> None:
    """Drag card ``#card`` into rank slot ``rank_index`` (0-based) and wait until it is there."""
    slot = page.locator(SLOT).nth(rank_index)
    for _ in range(attempts):
        page.locator(f"#{card}").drag_to(slot.locator(".draggable__slot-box"))
        try:
            slot.locator(f".draggable__slot-box > #{card}").wait_for(timeout=3000)
            return
        except Exception:  # playwright TimeoutError: the drop missed; drag again
            continue
    raise AssertionError(f"could not drop {card} into rank {rank_index + 1}: "
                         f"{slot_contents(page)}")


def test_annotator_ranks_in_the_browser_and_pull_returns_that_order(
        argilla_server: Any, chromium_executable: str, artifacts_dir: Path,
        tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    groups = make_groups(4, tag="browser")  # sizes 5, 3, 4, 2: K = 5
    store = write_stage(tmp_path / "run", [groups[2], groups[0]])  # k = 4 and 5
    creds = resolve_credentials(state_dir=argilla_server.state_dir)
    config = PushConfig(dataset="browser", workspace=creds.workspace)
    with connect(creds) as client:
        dataset_id = push_run(store, config, client, progress=False).dataset_id
    username, password, _key = argilla_server.create_user("browser-ann")

    with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        ctx = p.chromium.launch_persistent_context(
            profile, executable_path=chromium_executable, args=FLAGS, headless=True,
            viewport={"width": 1400, "height": 1100})
        try:
            page = ctx.new_page()
            page.goto(f"{argilla_server.url}/sign-in", timeout=60_000)
            page.get_by_label("Username").fill(username)
            page.get_by_label("Password").fill(password)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url("**/", timeout=60_000)
            page.goto(f"{argilla_server.url}/dataset/{dataset_id}/annotation-mode",
                      timeout=60_000)
            page.locator(SLOT).first.wait_for(timeout=60_000)
            group = groups[2]  # the k = 4 group: response_5 is an empty slot
            prompt = page.get_by_text(group.prompt.text, exact=True)
            if not prompt.count():  # the UI showed the other record first
                page.get_by_role("button", name="Next (→)").click()
            prompt.wait_for(timeout=30_000)
            slot_of = {c.candidate_id: f"response_{i + 1}" for i, c in enumerate(group.candidates)}
            suggested = [slot_of[c] for tier in group.rankings[0].tiers for c in tier]
            # the reverse of the suggestion, with the empty slot put in the middle
            chosen = list(reversed(suggested))
            chosen.insert(2, "response_5")
            # pre-filled from the suggestion: the empty slot already last
            wait_for_slots(page, [[s] for s in suggested] + [["response_5"]])
            for rank_index, card in enumerate(chosen):
                place(page, card, rank_index)
            assert slot_contents(page) == [[s] for s in chosen]
            page.screenshot(path=str(artifacts_dir / "label-browser-ranked.png"))
            with page.expect_response(lambda r: r.url.endswith("/responses")
                                      and r.request.method == "POST") as answer:
                page.get_by_role("button", name="Submit").click()
            assert answer.value.status == 201, answer.value.text()
            page.screenshot(path=str(artifacts_dir / "label-browser-submitted.png"))
        finally:
            ctx.close()

    with connect(creds) as client:
        pulled = pull_run(store, PullConfig(dataset="browser", workspace=creds.workspace),
                          client, progress=False)
    by_group = {g.group_id: g for g in pulled.stage.records()}
    human = [r for r in by_group[group.group_id].rankings if r.annotator.id == username]
    candidate_of = {s: c for c, s in slot_of.items()}
    expected = [[candidate_of[s]] for s in chosen if s in candidate_of]
    assert len(human) == 1 and human[0].tiers == expected
    assert human[0].tiers != [[candidate_of[s]] for s in suggested]  # not the default order
    assert pulled.stats["human_rankings"] == 1
