"""Child processes of the embedded Argilla: spawn, wait for a port, stop, and the run file.

The run file (``run.json`` in the state directory) records the URL and the pids of redis,
the worker and the server, so ``grouppref label stop`` and ``label users add`` find a
server started elsewhere (``--detach`` or another terminal).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, TypedDict

RUN_FILE = "run.json"
_PR_SET_PDEATHSIG = 1


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the parent dies (Linux), so a killed test run or a
    crashed ``label serve`` never leaves servers behind."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass  # not Linux/glibc: rely on stop() and the run file


def spawn(cmd: list[str], env: dict[str, str], log_path: Path, cwd: Path,
          detach: bool) -> subprocess.Popen[bytes]:
    """Start ``cmd`` with its output appended to ``log_path``.

    Args:
        detach (bool): own session, survives the parent (``--detach``); otherwise the child
            shares the terminal's process group (Ctrl-C reaches it) and dies with the
            parent when started from the main thread.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        kwargs: dict[str, Any] = {"stdin": subprocess.DEVNULL, "stdout": log, "stderr": subprocess.STDOUT,
                        "env": env, "cwd": cwd}
        if detach:
            kwargs["start_new_session"] = True
        elif threading.current_thread() is threading.main_thread():
            kwargs["preexec_fn"] = _die_with_parent
        return subprocess.Popen(cmd, **kwargs)


def wait_for_port(host: str, port: int, proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait until ``host:port`` accepts connections; False when ``proc`` died or time ran out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection((host, port), timeout=1):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def pid_alive(pid: int, marker: str, under: Path | None = None) -> bool:
    """Whether ``pid`` runs (not a zombie), its command line contains ``marker`` and, when
    given, its working directory is ``under`` or below it (the children of a state directory
    run there; redis in its ``redis/``): guards against a pid the OS reused for another
    program or for another server's child."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        if under is not None and not Path(os.readlink(f"/proc/{pid}/cwd")).is_relative_to(under):
            return False
    except (OSError, IndexError):
        return False
    return state != "Z" and marker in cmdline


def terminate(pids: list[int], timeout: float = 20.0) -> None:
    """SIGTERM every pid, wait, then SIGKILL what is left."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    remaining = list(pids)
    while remaining and time.monotonic() < deadline:
        remaining = [p for p in remaining if _running(p)]
        time.sleep(0.1)
    for pid in remaining:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _running(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)  # reap our own children
        if done == pid:
            return False
    except ChildProcessError:
        pass  # not our child (a detached server stopped from another process)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


class RunFile(TypedDict):
    """``STATE_DIR/run.json``: what a started server records for ``label stop`` and the
    commands that find it."""

    url: str
    host: str
    port: int
    detached: bool
    pids: dict[str, int]  # child name (server, worker, redis) -> pid


def write_run_file(state_dir: Path, info: RunFile) -> None:
    path = state_dir / RUN_FILE
    path.write_text(json.dumps(info, indent=2) + "\n")


def read_run_file(state_dir: Path) -> RunFile | None:
    try:
        return json.loads((state_dir / RUN_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
