"""Browser end to end: an annotator ranks records in Argilla's web UI, ``pull`` returns them.

Debian's chromium driven by playwright (never ``playwright install``) logs in as a new
annotator and opens the run's two datasets (groups of 3 and of 2 candidates: one dataset per
size). On each record it checks what annotators see: the chat prompt as Argilla's chat turns
(role and text), and a ranking widget with exactly the group's responses (no empty slot),
pre-filled with the suggested order. It drags the cards into the reverse order, checks the
page shows exactly that, submits, and ``pull`` must return exactly those orders. Screenshots
go to ``test-artifacts/``.

Why drag and drop: a first try that focused each card and pressed its rank number submitted
the default order. Every drop is checked in the DOM (a drop sometimes lands next to its
target while the list animates, so it is retried), and the final check is always the order
the server stored, read back through ``pull``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from grouppref.labeling.client import connect, resolve_credentials
from grouppref.labeling.config import PullConfig, PushConfig
from grouppref.labeling.pull import pull_run
from grouppref.labeling.push import push_run
from tests.support.browser import chromium_page
from tests.support.labelling import as_chat, make_groups, write_stage

pytestmark = [pytest.mark.argilla, pytest.mark.browser]

SLOT = ".draggable__slot"
CHAT = [("system", "You are a painter."), ("user", "Which colour is the sky?"),
        ("assistant", "Blue, mostly."), ("user", "And at sunset?")]


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


def chat_turns(page: Any) -> list[tuple[str, str]]:
    """The prompt's chat turns as the page shows them: (role, text)."""
    return [(item.locator(".chat__role").inner_text().strip().lower(),
             item.locator(".chat__bubble").inner_text().strip())
            for item in page.locator(".chat__item").all()]


def rank_in_page(page: Any, group: Any, turns: list[tuple[str, str]], shot: str,
                 artifacts_dir: Path) -> list[str]:
    """Check the record of ``group`` (shown now), rank its cards in reverse order of the
    suggestion, submit; return the submitted slot order."""
    page.get_by_text(turns[-1][1], exact=True).first.wait_for(timeout=60_000)
    assert chat_turns(page) == turns
    slot_of = {c.candidate_id: f"response_{i + 1}" for i, c in enumerate(group.candidates)}
    suggested = [slot_of[c] for tier in group.rankings[0].tiers for c in tier]
    # pre-filled from the suggestion; exactly the group's k responses, no empty slot
    wait_for_slots(page, [[s] for s in suggested])
    assert page.locator(f"{SLOT} .draggable__slot-box > div[id]").count() == group.k
    chosen = list(reversed(suggested))
    for rank_index, card in enumerate(chosen):
        place(page, card, rank_index)
    assert slot_contents(page) == [[s] for s in chosen]
    page.screenshot(path=str(artifacts_dir / f"label-browser-{shot}.png"))
    with page.expect_response(lambda r: r.url.endswith("/responses")
                              and r.request.method == "POST") as answer:
        page.get_by_role("button", name="Submit").click()
    assert answer.value.status == 201, answer.value.text()
    return chosen


def test_annotator_ranks_in_the_browser_and_pull_returns_that_order(
        argilla_server: Any, chromium_executable: str, artifacts_dir: Path,
        tmp_path: Path) -> None:
    three, two = make_groups(2, tag="browser", sizes=(3, 2))
    three = as_chat(three, CHAT)
    store = write_stage(tmp_path / "run", [three, two])
    creds = resolve_credentials(state_dir=argilla_server.state_dir)
    config = PushConfig(dataset="browser", workspace=creds.workspace)
    with connect(creds) as client:
        report = push_run(store, config, client, progress=False)
    username, password, _key = argilla_server.create_user("browser-ann")

    chosen: dict[str, list[str]] = {}
    with chromium_page(chromium_executable, 1400, 1100) as page:
        page.goto(f"{argilla_server.url}/sign-in", timeout=60_000)
        page.get_by_label("Username").fill(username)
        page.get_by_label("Password").fill(password)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url("**/", timeout=60_000)
        for group, turns, shot in ((three, CHAT, "chat-k3"),
                                   (two, [("user", two.prompt.text)], "k2")):
            page.goto(f"{argilla_server.url}/dataset/{report.by_k(group.k).dataset_id}"
                      "/annotation-mode", timeout=60_000)
            page.locator(SLOT).first.wait_for(timeout=60_000)
            chosen[group.group_id] = rank_in_page(page, group, turns, shot, artifacts_dir)

    with connect(creds) as client:
        pulled = pull_run(store, PullConfig(dataset="browser", workspace=creds.workspace),
                          client, progress=False)
    by_group = {g.group_id: g for g in pulled.stage.records()}
    for group in (three, two):
        human = [r for r in by_group[group.group_id].rankings if r.annotator.id == username]
        candidate_of = {f"response_{i + 1}": c.candidate_id for i, c in enumerate(group.candidates)}
        expected = [[candidate_of[s]] for s in chosen[group.group_id]]
        assert len(human) == 1 and human[0].tiers == expected
        assert human[0].tiers != group.rankings[0].tiers  # not the suggested order
    assert pulled.stats["human_rankings"] == 2
