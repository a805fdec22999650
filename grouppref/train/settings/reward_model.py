"""Settings of ``grouppref train-rm``: a scalar reward model trained on ranked groups
(docs/reward-model.md). Light (no torch): the CLI builds its options from these models. Its report,
:class:`~grouppref.schemas.reports.RewardModelStats`, lives with the other stage reports."""

from __future__ import annotations

from pydantic import Field

from grouppref.runs.stage import StageSpec
from grouppref.train.settings.losses import RewardModelLoss
from grouppref.train.settings.shared import LearningRate, TrainingSettings


class RewardModelConfig(TrainingSettings):
    """Settings of the ``train_rm`` stage: a sequence-classification head with one output on a
    causal LM or encoder, trained with a group loss on the reward scores. The fields it shares
    with the policy's settings (optimisation, schedule, batches, precision, checkpoints, LoRA,
    trackers) are :class:`~grouppref.train.settings.shared.TrainingSettings`'; only its
    learning rate's default differs."""

    model: str | None = Field(
        default=None, description="Base model: Hub id or local folder of a causal LM or an "
        "encoder (default: the embedded SmolLM2); a 1-output head is put on it.")
    loss: RewardModelLoss = Field(
        default="gspo", description="gspo: soft Bradley-Terry over every pair of a group with "
        "the aggregation's p_ij and weights w_ij, on the reward scores; plackett_luce: "
        "listwise likelihood of the consensus order; lipo: LiPO-lambda (LambdaLoss-weighted "
        "pairs of the consensus tiers); nca / infonca: noise-contrastive with soft targets "
        "softmax(strengths / target_temperature).")
    center_rewards: float = Field(
        default=0.0, ge=0.0, description="Weight of a penalty on the mean squared reward of "
        "each group's candidates (keeps scores near 0; TRL's center_rewards_coefficient).")
    max_length: int | None = Field(
        default=None, ge=2, description="Most tokens of one (prompt, response) sequence; a "
        "longer candidate is left out with a reject (default: the model's context length).")
    held_out_fraction: float = Field(
        default=0.1, ge=0.0, lt=1.0, description="Share of prompts held out for pair accuracy "
        "when the data has no test split (seeded by 'seed'); 0: none held out.")
    use_test_split: bool = Field(
        default=True, description="Hold out the groups the data marks as test (validate's "
        "split, an export's test split); off: always split by held_out_fraction.")
    lr: LearningRate = 1e-5  # the policy's default is 5e-6


TRAIN_RM = StageSpec(name="train_rm", config=RewardModelConfig,
                     summary="Train a scalar reward model on RUN/validate "
                     "(model in RUN/train_rm/model).",
                     reads=lambda config: ("validate",))
