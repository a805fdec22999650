"""Run a script under ``torchrun --standalone`` on CPU (gloo) from a test: one process group per
call, killed as a whole on timeout, with the output in the failure message."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def torchrun(script: Path | str, args: list[str], nproc: int = 2, timeout: float = 600) -> str:
    """Launch ``script args`` on ``nproc`` CPU processes; return stdout + stderr.

    Raises:
        AssertionError: the launch timed out or a process failed (with its output).
    """
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
           "--standalone", str(script), *args]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every worker
        stdout, stderr = proc.communicate()
        raise AssertionError(f"torchrun timed out:\n{stdout[-3000:]}\n{stderr[-6000:]}") from None
    assert proc.returncode == 0, stdout[-3000:] + stderr[-6000:]
    return stdout + stderr
