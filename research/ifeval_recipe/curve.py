"""Learning-curve models of the recipe study: loadable model folders at chosen steps.

The package trainer writes resumable checkpoints (``checkpoints/step-NNNNNNNN``: accelerate's
``save_state``, the model's weights as ``model.safetensors`` beside the optimizer's state);
TRL's trainer writes ``checkpoint-N`` folders. :func:`save_curve_models` turns the package's
into ``step-N`` folders that ``load_causal_lm`` reads (the start model's config with the
step's weights) and removes the checkpoints (their optimizer state is 2x the model).
"""

from __future__ import annotations

import shutil
from pathlib import Path


def save_curve_models(folder: Path, base: str, steps: tuple[int, ...]) -> list[Path]:
    """``folder/step-N`` for each N in ``steps`` that has a checkpoint; returns them."""
    from safetensors.torch import load_file

    from grouppref.api import load_causal_lm

    made = []
    for step in steps:
        ckpt = folder / "checkpoints" / f"step-{step:08d}" / "model.safetensors"
        if not ckpt.exists():
            continue
        model = load_causal_lm(base)
        missing, unexpected = model.load_state_dict(load_file(str(ckpt)), strict=False)
        if unexpected or [k for k in missing if "lm_head" not in k]:
            raise RuntimeError(f"{ckpt}: weights do not match {base} "
                               f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
        model.tie_weights()
        model.save_pretrained(folder / f"step-{step}")
        made.append(folder / f"step-{step}")
    shutil.rmtree(folder / "checkpoints", ignore_errors=True)
    return made
