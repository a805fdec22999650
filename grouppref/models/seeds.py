"""Per-candidate seeds: one stable 63-bit seed from a run seed and the parts that identify a
candidate (group id, model, slot, attempt), the same on every machine and in every run. Light
(no torch): served models use it too."""

from __future__ import annotations

import hashlib


def derive_seed(base: int, *parts: str | int) -> int:
    """A 63-bit seed from a base seed and any identifying parts (stable across runs/machines)."""
    text = "\x1f".join([str(base), *map(str, parts)])
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") >> 1
