"""Processes of a launch (torchrun / accelerate launch): the shared accelerate state, CPU (gloo)
launches included."""

from __future__ import annotations

from typing import Any


def cpu_launch() -> bool:
    """True under a multi-process launch (torchrun / accelerate launch) on a machine without
    CUDA, XPU or NPU: accelerate then needs ``cpu=True`` to start DDP over gloo, else every
    process would train alone."""
    import os

    import torch
    from accelerate.utils import is_npu_available, is_xpu_available

    launched = int(os.environ.get("LOCAL_RANK", -1)) != -1 or int(os.environ.get("WORLD_SIZE", 1)) > 1
    return launched and not (torch.cuda.is_available() or is_xpu_available() or is_npu_available())


def process_state() -> Any:
    """accelerate's shared ``PartialState`` (rank, world size, barriers), CPU launches included.

    Call this, not ``PartialState()``, wherever the state may be created first.
    """
    from accelerate import PartialState

    return PartialState(cpu=cpu_launch())
