"""A login storm on the embedded Argilla: grouppref's launcher vs argilla-server's own login.

20 annotators sign in at the same moment (``POST /api/v1/token``, as the UI's sign-in page
does, then ``GET /api/v1/me`` with the token) while another client polls ``GET /api/v1/me``
with the owner's API key every 50 ms. Reported per server: when the last annotator was in
(seconds after the common start), the median, and the slowest ``/me`` poll during the storm.
The target (issue 15): every annotator in within 2 s, no other request waiting over 1 s.

The peer is the same embedded server with ``GROUPPREF_ARGILLA_STOCK_LOGIN=1``: argilla-server
2.8's own login (bcrypt cost 12 on its event loop), measured in the same run.

    .venv/bin/python benchmarks/argilla_logins.py --users 20 [--database-url postgresql://...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from grouppref.labeling.server.embedded import EmbeddedArgilla

STOCK_ENV = "GROUPPREF_ARGILLA_STOCK_LOGIN"  # read by argilla_plugin/launch.py


@dataclass
class Storm:
    """What one storm measured (seconds)."""

    logins: list[float] = field(default_factory=list)  # end of each login, from the start
    me_tokens: list[str] = field(default_factory=list)  # /me username seen with each token
    polls: list[float] = field(default_factory=list)  # latency of every /me poll in the storm
    failures: list[str] = field(default_factory=list)
    server_cpu: float = 0.0  # CPU seconds the server process used during the storm

    @property
    def last_in(self) -> float:
        return max(self.logins)

    @property
    def slowest_poll(self) -> float:
        return max(self.polls)


def _login(url: str, username: str, password: str, start: threading.Barrier, t0: list[float],
           storm: Storm, lock: threading.Lock) -> None:
    with httpx.Client(base_url=url, timeout=120) as http:
        start.wait()
        r = http.post("/api/v1/token", data={"username": username, "password": password})
        me = http.get("/api/v1/me", headers={
            "Authorization": f"Bearer {r.json().get('access_token', '')}"}) \
            if r.status_code == 201 else None
        done = time.perf_counter() - t0[0]
    with lock:
        if me is None or me.status_code != 200:
            storm.failures.append(f"{username}: token {r.status_code}, me "
                                  f"{me.status_code if me is not None else '-'}")
            return
        storm.logins.append(done)
        storm.me_tokens.append(me.json()["username"])


def _poll(url: str, api_key: str, stop: threading.Event, storm: Storm) -> None:
    with httpx.Client(base_url=url, timeout=120,
                      headers={"X-Argilla-Api-Key": api_key}) as http:
        while not stop.is_set():
            began = time.perf_counter()
            http.get("/api/v1/me").raise_for_status()
            storm.polls.append(time.perf_counter() - began)
            time.sleep(0.05)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def login_storm(url: str, owner_key: str, accounts: list[tuple[str, str]],
                server_pid: int | None = None) -> Storm:
    """Sign every ``(username, password)`` in at once while the owner polls ``/me``."""
    storm, lock, stop = Storm(), threading.Lock(), threading.Event()
    t0 = [0.0]
    start = threading.Barrier(len(accounts) + 1)
    threads = [threading.Thread(target=_login, args=(url, u, p, start, t0, storm, lock))
               for u, p in accounts]
    for t in threads:
        t.start()
    poller = threading.Thread(target=_poll, args=(url, owner_key, stop, storm))
    poller.start()
    time.sleep(0.3)  # the poller is warm; its first polls are before the storm
    storm.polls.clear()
    cpu = cpu_seconds(server_pid) if server_pid else 0.0
    t0[0] = time.perf_counter()
    start.wait()
    for t in threads:
        t.join()
    stop.set()
    poller.join()
    storm.server_cpu = cpu_seconds(server_pid) - cpu if server_pid else 0.0
    return storm


def make_accounts(server: EmbeddedArgilla, n: int, tag: str) -> list[tuple[str, str]]:
    return [server.create_user(f"storm{i:02d}-{tag}")[:2] for i in range(n)]


def _run_one(label: str, users: int, database_url: str | None, stock: bool) -> Storm:
    if stock:
        os.environ[STOCK_ENV] = "1"
    try:
        with tempfile.TemporaryDirectory() as tmp, EmbeddedArgilla(
                state_dir=Path(tmp) / "state", port=0, database_url=database_url) as server:
            accounts = make_accounts(server, users, label)
            storm = login_storm(server.url, server.api_key, accounts,
                                server.pids()["server"])
    finally:
        os.environ.pop(STOCK_ENV, None)
    assert not storm.failures, storm.failures
    print(f"{label:>10}: last annotator in after {storm.last_in:5.2f} s (median "
          f"{statistics.median(storm.logins):5.2f} s); /me polls during the storm: "
          f"{len(storm.polls)}, slowest {storm.slowest_poll:5.2f} s; server CPU "
          f"{storm.server_cpu:.2f} s", flush=True)
    return storm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--database-url", default=None,
                        help="PostgreSQL URL (both servers use it in turn; default SQLite)")
    args = parser.parse_args()
    print(f"{args.users} simultaneous logins; {os.cpu_count()} cores; load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    stock = _run_one("argilla", args.users, args.database_url, stock=True)
    ours = _run_one("grouppref", args.users, args.database_url, stock=False)
    print(f"ratio argilla/grouppref: last annotator in {stock.last_in / ours.last_in:.1f}x, "
          f"slowest /me {stock.slowest_poll / ours.slowest_poll:.1f}x")


if __name__ == "__main__":
    main()
