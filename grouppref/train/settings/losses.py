"""The loss names, torch-free (the settings and the CLI read them; the one dispatch from a name
to its function is :mod:`grouppref.train.objective.dispatch`)."""

from __future__ import annotations

from typing import Literal

LossName = Literal["gspo", "plackett_luce", "dpo", "lipo", "nca", "infonca", "sft"]
