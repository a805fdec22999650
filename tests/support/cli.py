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


def grouppref_here(*args: object, cwd: Path | None = None, env: dict[str, str] | None = None,
                   stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``grouppref ARGS`` through the same entry point, ``cli.main()``, in this process: stdout
    and stderr apart, the exit code (a ``GroupPrefError`` is one line and exit 2 as in a child
    process). For tests that check a command's output and exit code, not the process around it
    (a child process costs seconds of imports; the real entry point in a child process is
    :func:`grouppref`). ``cwd``, ``env`` (the whole environment) and ``stdin`` apply for the
    call only; warnings print to the captured stderr under Python's default filters, as in a
    child."""
    import contextlib
    import io
    import os
    import warnings

    from grouppref import cli

    out, err = io.StringIO(), io.StringIO()
    saved = sys.argv, os.getcwd(), dict(os.environ), sys.stdin
    code: int = 0
    try:
        sys.argv = ["grouppref", *map(str, args)]
        if cwd is not None:
            os.chdir(cwd)
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        sys.stdin = io.StringIO(stdin or "")
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                warnings.catch_warnings():
            warnings.resetwarnings()  # Python's defaults, not pytest's: a warning is output
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning,
                             ResourceWarning):
                warnings.simplefilter("ignore", category)
            warnings.showwarning = _show_on_stderr
            try:
                cli.main()
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = saved[0]
        os.chdir(saved[1])
        os.environ.clear()
        os.environ.update(saved[2])
        sys.stdin = saved[3]
    return subprocess.CompletedProcess(["grouppref", *map(str, args)], code, out.getvalue(),
                                       err.getvalue())


def _show_on_stderr(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                    file: object = None, line: str | None = None) -> None:
    """How a child process shows a warning: on (this call's) stderr."""
    import warnings

    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))
