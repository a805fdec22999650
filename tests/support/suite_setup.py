"""What the test set-up promises, checked at run time (loaded from conftest's ``pytest_plugins``).

- ``missing_requirement``: a fixture whose requirement is missing (a system package, an
  extra) fails the test with the command that installs it. ``make test`` installs every such
  requirement first, so a missing one is a broken set-up and never a reason to skip.
- The end-of-run summary says how many tests ran of how many were collected, and why each
  skipped test was skipped (only conditions no install can change may skip).
"""

from __future__ import annotations

from collections import Counter
from typing import NoReturn

import pytest

APT_HINT = "`make test` run as root installs it"


def missing_requirement(what: str, fix: str) -> NoReturn:
    """Fail the requesting test: ``what`` is not installed and ``fix`` says how to install it."""
    pytest.fail(f"{what} is not installed: {fix}", pytrace=False)


class RunCounts:
    """Per-test outcome over the setup/call/teardown reports of one session."""

    def __init__(self) -> None:
        self.collected = 0
        self.ran: set[str] = set()
        self.skipped: dict[str, str] = {}  # nodeid -> reason
        self.setup_errors: set[str] = set()

    def record(self, report: pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            self.skipped[report.nodeid] = _skip_reason(report)
        elif report.when == "call":
            self.ran.add(report.nodeid)
        elif report.when == "setup" and report.failed:
            self.setup_errors.add(report.nodeid)

    def lines(self, deselected: int) -> list[str]:
        not_run = self.collected - len(self.ran) - len(self.skipped) - len(self.setup_errors)
        head = f"ran {len(self.ran)} of {self.collected + deselected} collected; skipped {len(self.skipped)}"
        extra = [(deselected, "deselected"), (len(self.setup_errors), "failed in setup (did not run)"),
                 (not_run, "not reached (run stopped early)")]
        head += "".join(f"; {n} {what}" for n, what in extra if n)
        reasons = Counter(self.skipped.values())
        return [head] + [f"  skipped {n}: {reason}" for reason, n in reasons.most_common()]


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (file, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


_COUNTS = RunCounts()


def pytest_collection_finish(session: pytest.Session) -> None:
    _COUNTS.collected = len(session.items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: object, ids: list[str]) -> None:
    """Under pytest-xdist (``make test``) the controller collects nothing itself; every worker
    collects the whole selection, so one worker's count is the run's."""
    _COUNTS.collected = max(_COUNTS.collected, len(ids))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _COUNTS.record(report)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if config.option.collectonly:
        return
    deselected = len(terminalreporter.stats.get("deselected", []))
    terminalreporter.section("tests run")
    for line in _COUNTS.lines(deselected):
        terminalreporter.write_line(line)
