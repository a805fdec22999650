"""Settings of ``grouppref train-rm``: a scalar reward model trained on ranked groups
(docs/reward-model.md). Light (no torch): the CLI builds its options from these models. Its report,
:class:`~grouppref.schemas.reports.RewardModelStats`, lives with the other stage reports."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from grouppref.runs.stage import StageSpec
from grouppref.schemas.reports import RewardModelStats
from grouppref.train.settings.shared import LoraSettings, Tracker

__all__ = ["TRAIN_RM", "RewardModelConfig", "RewardModelStats"]  # the stats live in schemas.reports


class RewardModelConfig(BaseModel):
    """Settings of the ``train_rm`` stage: a sequence-classification head with one output on a
    causal LM or encoder, trained with a group loss on the reward scores."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(
        default=None, description="Base model: Hub id or local folder of a causal LM or an "
        "encoder (default: the embedded SmolLM2); a 1-output head is put on it.")
    loss: Literal["gspo", "plackett_luce", "lipo", "nca", "infonca"] = Field(
        default="gspo", description="gspo: soft Bradley-Terry over every pair of a group with "
        "the aggregation's p_ij and weights w_ij, on the reward scores; plackett_luce: "
        "listwise likelihood of the consensus order; lipo: LiPO-lambda (LambdaLoss-weighted "
        "pairs of the consensus tiers); nca / infonca: noise-contrastive with soft targets "
        "softmax(strengths / target_temperature).")
    target_temperature: float = Field(
        default=1.0, gt=0.0, description="nca and infonca: temperature alpha of the soft "
        "targets softmax(strengths / alpha) (strengths: the aggregated Bradley-Terry "
        "log-strengths).")
    pair_targets: Literal["soft", "hard"] = Field(
        default="soft", description="gspo only. soft: p_ij and w_ij as aggregated; hard: p=1 "
        "for the winner of every pair in different consensus tiers, weight 1.")
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
    lr: float = Field(default=1e-5, gt=0, description="Peak learning rate (AdamW).")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    warmup_steps: int = Field(default=0, ge=0, description="Linear warm-up steps.")
    lr_scheduler: Literal["constant", "linear", "cosine"] = Field(
        default="linear", description="Learning-rate schedule after warm-up.")
    max_grad_norm: float = Field(default=1.0, gt=0, description="Gradient clipping norm.")
    epochs: int = Field(default=1, ge=1, description="Passes over the training groups.")
    max_steps: int | None = Field(
        default=None, ge=1, description="Stop after this many optimizer steps (overrides epochs).")
    batch_size: int = Field(default=4, ge=1, description="Groups per device per micro-batch "
                            "(each group is K sequences).")
    eval_batch_size: int = Field(default=8, ge=1, description="Groups per forward pass when "
                                 "evaluating.")
    grad_accum: int = Field(default=1, ge=1, description="Micro-batches per optimizer step.")
    mixed_precision: Literal["no", "bf16", "fp16"] = Field(
        default="no", description="Autocast precision: bf16 (CPU or a bf16 GPU), fp16 (CUDA only).")
    gradient_checkpointing: bool = Field(
        default=False, description="Recompute activations in backward to save memory.")
    lora: LoraSettings | None = Field(
        default=None, description="Train LoRA adapters (peft, task SEQ_CLS) and the score head "
        "only; the base stays frozen.")
    seed: int = Field(default=0, description="Seed of the head's initialisation, shuffling and "
                      "the held-out split.")
    logging_steps: int = Field(default=10, ge=1, description="Log training metrics every N steps.")
    eval_steps: int | None = Field(
        default=None, ge=1, description="Evaluate on the held-out groups every N steps (always "
        "at start and end).")
    save_steps: int | None = Field(
        default=None, ge=1, description="Write a resumable checkpoint every N steps "
        "(OUT/checkpoints; --resume continues from the newest).")
    save_total_limit: int = Field(default=2, ge=1, description="Checkpoints kept (oldest removed).")
    report_to: list[Tracker] = Field(
        default_factory=list, description="Extra metric backends: tensorboard, trackio (as "
        "train's; logs under OUT/logs).")


TRAIN_RM = StageSpec(name="train_rm", config=RewardModelConfig,
                     entry="grouppref.train.reward_model.stage:run_train_rm",
                     summary="Train a scalar reward model on RUN/validate "
                     "(model in RUN/train_rm/model).",
                     reads=lambda config: ("validate",))
