"""torchrun_cpu: a script run under torchrun on CPU processes (the DDP, compile and refresh tests)."""

from __future__ import annotations

from pathlib import Path

from tests.support.torchrun import torchrun


def torchrun_cpu(tmp_path: Path, source: str, model: Path, processes: int = 2) -> Path:
    """Run the script ``source`` with arguments ``MODEL OUT`` under torchrun on ``processes`` CPU
    processes (gloo, :func:`tests.support.torchrun.torchrun`). Returns ``OUT`` (``tmp_path / "out"``)."""
    script, out = tmp_path / "ddp_script.py", tmp_path / "out"
    script.write_text(source)
    torchrun(script, [str(model), str(out)], nproc=processes)
    return out
