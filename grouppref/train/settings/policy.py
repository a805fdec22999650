"""Settings of ``grouppref train`` (the policy's training): every field with the description that
is also its CLI help. Everything here is checked before a model loads. Light (no torch)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from grouppref.runs.stage import StageSpec
from grouppref.train.settings.losses import (
    ANCHORED_LOSSES,
    LISTWISE_LOSSES,
    MARGIN_LOSSES,
    TARGET_LOSSES,
    LossName,
)
from grouppref.train.settings.mix import MixConfig
from grouppref.train.settings.refresh import RefreshConfig
from grouppref.train.settings.shared import DataConfig, TrainingSettings


class TrainConfig(TrainingSettings):
    """Settings of the ``train`` stage: GSPO and its baselines (docs/train.md). The fields it
    shares with the reward model's settings (optimisation, schedule, batches, precision,
    checkpoints, LoRA, trackers) are :class:`~grouppref.train.settings.shared.TrainingSettings`'."""

    model: str | None = Field(
        default=None,
        description="Policy to train: Hub id or local folder (default: the embedded SmolLM2).",
    )
    ref_model: str | None = Field(
        default=None,
        description="Reference model for the implicit reward (default: the initial policy). Its "
        "log-probs are computed once, cached with the data, and it is freed before training.",
    )
    loss: LossName = Field(
        default="gspo",
        description="gspo: weighted pairwise loss over every pair with its consensus p_ij; "
        "plackett_luce: listwise over the consensus order; dpo: best vs worst only; lipo: "
        "LiPO-lambda, pairs weighted by LambdaLoss from the consensus tiers; nca / infonca: "
        "noise-contrastive, soft targets softmax(strengths / target_temperature); sft: "
        "supervised fine-tuning on each group's best candidate (best-of-K, rejection sampling). "
        "dpo and sft forward only the candidates they train on.",
    )
    beta: float = Field(default=0.1, gt=0, description="Implicit reward scale: "
                        "s = beta * (log pi - log pi_ref) (reference_free: beta * log pi).")
    reference_free: bool = Field(
        default=False, description="No reference model: s = beta * log pi, per token with "
        "length_normalise (SimPO; there beta is about 2, not 0.1). The reference pass is "
        "skipped. Not with nca, sft, refresh or ref_model.")
    target_margin: float = Field(
        default=0.0, ge=0.0, description="SimPO's target reward margin gamma, subtracted from "
        "every winner-minus-loser margin (gspo, dpo and lipo).")
    length_normalise: bool = Field(
        default=False, description="Divide each candidate's log-prob by its token count."
    )
    label_smoothing: float = Field(
        default=0.0, ge=0.0, lt=0.5,
        description="Robust / conservative label smoothing epsilon (gspo and dpo).",
    )
    robust: bool = Field(
        default=False, description="Use the unbiased rDPO correction with label_smoothing as "
        "the assumed label-flip rate, instead of smoothing the targets.",
    )
    sft_weight: float = Field(
        default=0.0, ge=0.0, description="Weight of an SFT term (NLL per token) on the best candidate."
    )
    importance_clip: tuple[float, float] | None = Field(
        default=None,
        description="Clip range of importance weights exp(mean_t(log pi - log pi_behavior)) for "
        "off-policy data (needs behavior_logp on the candidates); unset: no weighting.",
    )
    compile: bool = Field(
        default=False, description="torch.compile each decoder layer (inductor; a one-off "
        "compile on the first steps and one more when batch shapes first change; not with "
        "FSDP, nor with share_prefix on a model not on sdpa; see docs/train.md)."
    )
    share_prefix: bool = Field(
        default=True, description="Compute each group's prompt once for its K candidates."
    )
    disable_dropout: bool = Field(
        default=True, description="Set the model's dropout to 0 (implicit rewards start at 0)."
    )
    data: DataConfig = Field(default_factory=DataConfig,
                             description="Tokenisation: max lengths, overflow, chat template.")
    ref_dtype: Literal["float32", "bfloat16", "float16"] = Field(
        default="float32", description="Precision of the reference log-prob pass."
    )
    refresh: RefreshConfig | None = Field(
        default=None, description="Offline-online hybrid: mix groups sampled from the current "
        "policy and ranked automatically into training (docs/train.md, Refresh).")
    mix: MixConfig | None = Field(
        default=None, description="Mix groups by label source (human / auto) on a schedule, "
        "e.g. human-heavy first, automatic later (docs/train.md, Mixing label sources).")

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if self.importance_clip is not None:
            low, high = self.importance_clip
            if not 0 < low <= 1 <= high:
                raise ValueError(f"importance_clip {self.importance_clip} must satisfy "
                                 "0 < low <= 1 <= high")
        if self.pair_targets == "hard" and self.loss != "gspo":
            raise ValueError(f"pair_targets 'hard' applies to loss 'gspo', not {self.loss!r}")
        if self.loss == "sft" and self.sft_weight > 0:
            raise ValueError("sft_weight adds an SFT term to a preference loss; with loss "
                             "'sft' leave it at 0")
        if self.robust and self.label_smoothing == 0:
            raise ValueError("robust needs label_smoothing > 0 (the assumed label-flip rate)")
        self._check_listwise()
        if self.refresh is not None:
            self.refresh.check_split(self.batch_size)
            if self.refresh.max_new_tokens >= self.data.max_response_length:
                raise ValueError(
                    f"refresh.max_new_tokens {self.refresh.max_new_tokens} must be below "
                    f"data.max_response_length {self.data.max_response_length} (the EOS token "
                    "is added); lower it or raise max_response_length")
        if self.mix is not None and self.refresh is not None:
            raise ValueError("mix and refresh both decide what each batch holds; use one")
        return self

    def _check_listwise(self) -> None:
        """The settings of the listwise and reference-free losses that only some losses read."""
        if self.label_smoothing > 0 and self.loss in LISTWISE_LOSSES:
            raise ValueError(f"label_smoothing applies to loss 'gspo' and 'dpo', not {self.loss!r}")
        if self.target_margin > 0 and self.loss not in MARGIN_LOSSES:
            raise ValueError(f"target_margin applies to the pairwise losses gspo, dpo and lipo, "
                             f"not {self.loss!r}")
        if self.target_temperature != 1.0 and self.loss not in TARGET_LOSSES:
            raise ValueError(f"target_temperature applies to loss 'nca' and 'infonca', not "
                             f"{self.loss!r}")
        if not self.reference_free:
            return
        if self.loss in ANCHORED_LOSSES:
            why = ("reads absolute rewards, which only the reference anchors" if self.loss == "nca"
                   else "has no reference in its loss already")
            raise ValueError(f"reference_free with loss {self.loss!r}: it {why}")
        if self.ref_model is not None:
            raise ValueError("reference_free uses no reference model; drop ref_model")
        if self.refresh is not None:
            raise ValueError("reference_free with refresh is not supported (a refresh round "
                             "scores its groups with the reference)")

    def reference_name(self) -> str | None:
        """The reference model: ``ref_model`` or, by default, the initial policy."""
        return self.ref_model if self.ref_model is not None else self.model


TRAIN = StageSpec(name="train", config=TrainConfig,
                  summary="Train the policy on RUN/validate (model in RUN/train/model).",
                  reads=lambda config: ("validate",))
