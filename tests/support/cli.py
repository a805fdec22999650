"""The real command line in a child process, for every test that runs it (one helper)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# ``cli.main()`` called from ``python -c`` (what ``main_in_child`` runs): the arguments after it
MAIN = "import sys\nfrom grouppref import cli\nsys.argv = ['grouppref', *sys.argv[1:]]\ncli.main()\n"


def grouppref(*args: object, cwd: Path | None = None, env: dict[str, str] | None = None,
              stdin: str | None = None, main_in_child: bool = False, check: bool = False,
              timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``grouppref ARGS`` in a child process (``python -m grouppref``, or ``cli.main()`` from
    ``python -c`` with ``main_in_child``): stdout and stderr apart, the exit code. ``cwd``
    defaults to the repository root, ``env`` to this process's environment; ``check`` asserts
    exit code 0 (showing stderr)."""
    head = ["-c", MAIN] if main_in_child else ["-m", "grouppref"]
    result = subprocess.run([sys.executable, *head, *map(str, args)], capture_output=True, text=True,
                            cwd=cwd or ROOT, env=env, input=stdin, timeout=timeout)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def one_line_exit_2(result: subprocess.CompletedProcess[str], progress: str = "\0") -> str:
    """The one error line of a failed command (lines starting with ``progress`` aside)."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = [ln for ln in result.stderr.strip().splitlines() if not ln.startswith(progress)]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]
