"""The loss names and what each reads, torch-free: the settings validate against these tables
and the one dispatch from a name to its function (:mod:`grouppref.train.objective.dispatch`)
reads them too, so the two cannot disagree."""

from __future__ import annotations

from typing import Literal

LossName = Literal["gspo", "plackett_luce", "dpo", "lipo", "nca", "infonca", "sft"]
# the losses over a reward model's scores (every loss over rewards s; not sft, not dpo)
RewardModelLoss = Literal["gspo", "plackett_luce", "lipo", "nca", "infonca"]

SCORE_LOSSES = ("gspo", "plackett_luce", "dpo", "lipo", "nca", "infonca")  # functions of s (B, K)
MARGIN_LOSSES = ("gspo", "dpo", "lipo")  # a winner-minus-loser margin: target_margin applies
TARGET_LOSSES = ("nca", "infonca")  # soft targets softmax(strengths / alpha): target_temperature
LISTWISE_LOSSES = ("lipo", "nca", "infonca")  # graded labels: no label_smoothing
ANCHORED_LOSSES = ("nca", "sft")  # not reference_free (absolute rewards; no reference at all)
# the losses that read only some candidates: dpo the consensus best and worst, sft the best
TRIMMED_LOSSES = ("dpo", "sft")
