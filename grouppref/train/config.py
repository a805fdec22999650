"""Settings of ``grouppref train`` and ``grouppref eval``: one pydantic model each, every field with
the description that is also its CLI help. Everything here is checked before a model loads."""

from __future__ import annotations

import importlib.util
import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from grouppref.errors import ConfigError
from grouppref.pipeline.rank.config import EnsembleSettings, RankConfig
from grouppref.pipeline.rank.settings import RankerSettings, validation_message
from grouppref.runs.stage import StageSpec
from grouppref.schemas import MAX_K, MIN_K
from grouppref.train.mix import MixConfig

LossName = Literal["gspo", "plackett_luce", "dpo", "lipo", "nca", "infonca", "sft"]
Tracker = Literal["tensorboard", "trackio"]
_TRACKER_PACKAGES = {"tensorboard": "tensorboard", "trackio": "trackio"}


class DataConfig(BaseModel):
    """How groups are turned into tokens."""

    model_config = ConfigDict(extra="forbid")

    max_prompt_length: int = Field(
        default=512, ge=1, description="Longest prompt in tokens; a longer prompt rejects its group.")
    max_response_length: int = Field(
        default=512, ge=1, description="Longest response in tokens, EOS included; see 'overflow'.")
    overflow: Literal["truncate", "reject"] = Field(
        default="truncate",
        description="A response over max_response_length: 'truncate' it, or 'reject' the "
                    "candidate (a group left with fewer than 2 candidates is rejected).")
    chat_template: bool = Field(
        default=True,
        description="Render prompts with the tokenizer's chat template (needed for chat "
                    "prompts); off: the prompt text is used as is.")



class LoraSettings(BaseModel):
    """Low-rank adapters through ``peft`` (only the adapters train; the base stays frozen)."""

    model_config = ConfigDict(extra="forbid")

    r: int = Field(default=16, ge=1, description="LoRA rank.")
    alpha: float = Field(default=32.0, gt=0, description="LoRA scaling numerator (alpha / r).")
    dropout: float = Field(default=0.05, ge=0.0, lt=1.0, description="Dropout on the LoRA input.")
    target_modules: list[str] | Literal["all-linear"] = Field(
        default="all-linear",
        description="Module names to adapt (e.g. q_proj v_proj), or 'all-linear'.",
    )
    save: Literal["merged", "adapter"] = Field(
        default="merged",
        description="'merged': save the full model with the adapters folded in (loads like any "
        "model); 'adapter': save only the peft adapter (small; load with peft).",
    )


class RefreshConfig(BaseModel):
    """Offline-online hybrid (docs/train.md, "Refresh"): every ``every`` optimizer steps, sample
    ``k`` candidates for ``prompts`` prompts from the *current* policy, rank them with
    automatic rankers, aggregate them like the aggregate stage, and mix the newest ``buffer``
    of these fresh groups into each batch at the share ``fresh_share``."""

    model_config = ConfigDict(extra="forbid")

    every: int = Field(ge=1, description="Run a refresh round every N optimizer steps (the "
                       "first before step 1).")
    prompts: int = Field(ge=1, description="Prompts per round (M), shared out between processes.")
    k: int = Field(default=4, ge=MIN_K, le=MAX_K, description="Candidates per prompt.")
    rankers: list[RankerSettings] = Field(
        min_length=1, description="Automatic rankers of the fresh groups, as in the rank stage "
        "(reward model, rules / verifiable answers, similarity, judge).")
    ensemble: EnsembleSettings | None = Field(
        default=None, description="Weighted ensemble of the rankers' z-scored scores, as an "
        "extra ranking (as in the rank stage).")
    fresh_share: float = Field(
        default=0.5, ge=0.0, le=1.0, description="Share of each batch taken from the fresh "
        "buffer, the rest from the offline data (0: generate and report only; 1: fresh only).")
    buffer: int | None = Field(default=None, ge=1, description="Fresh groups kept, the newest "
                               "(default: 2 x prompts, the last two rounds).")
    source: str | None = Field(
        default=None, description="Prompt file (JSONL/JSON/CSV/Parquet), saved dataset or Hub "
        "id to refresh from (default: the prompts of the training groups).")
    temperature: float = Field(default=1.0, gt=0.0, le=10.0, description="Sampling temperature "
                               "(1 keeps the on-policy KL estimate unbiased).")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass kept.")
    max_new_tokens: int = Field(default=128, ge=1, description="Most tokens per fresh "
                                "candidate (below data.max_response_length).")
    max_resample: int = Field(default=3, ge=0, le=20, description="Re-samples of an empty or "
                              "duplicate candidate before it is left out.")
    batch_size: int = Field(default=16, ge=1, description="Sequences per generate call.")
    tie_tolerance: float = Field(default=1e-6, ge=0.0, description="Ranker scores this close "
                                 "share a tier (a tie).")

    @model_validator(mode="after")
    def _rankers_agree(self) -> RefreshConfig:
        try:
            self.rank_config()
        except ValidationError as e:  # repeated annotator ids, unknown ensemble keys
            raise ValueError(validation_message(e)) from e
        return self

    def rank_config(self, device: str = "cpu", dtype: str = "float32") -> RankConfig:
        """The rank stage's settings for these rankers (the refresh rounds rank with them)."""
        return RankConfig(rankers=self.rankers, ensemble=self.ensemble,
                          tie_tolerance=self.tie_tolerance, device=device, dtype=dtype)

    def buffer_size(self) -> int:
        """``buffer``, or two rounds' worth of groups."""
        return self.buffer if self.buffer is not None else 2 * self.prompts

    def fresh_per_batch(self, batch_size: int) -> int:
        """Fresh groups in a micro-batch of ``batch_size``: ``floor(F * b + 1/2)``."""
        return math.floor(self.fresh_share * batch_size + 0.5)

    def offline_per_batch(self, batch_size: int) -> int:
        """Offline groups per micro-batch (the data loader's batch size). With ``fresh_share``
        1 the offline batches only pace the epochs (and stand in while the buffer is empty)."""
        fresh = self.fresh_per_batch(batch_size)
        return batch_size if fresh == batch_size else batch_size - fresh

    def check_split(self, batch_size: int) -> None:
        """Raise ``ValueError`` when ``fresh_share`` rounds to no fresh or no offline group."""
        fresh = self.fresh_per_batch(batch_size)
        share = self.fresh_share
        if 0 < share < 1 and fresh in (0, batch_size):
            raise ValueError(
                f"refresh.fresh_share {share:g} with batch_size {batch_size} gives {fresh} fresh "
                f"and {batch_size - fresh} offline groups per batch; use a larger batch_size, or "
                "fresh_share 0 (report only) / 1 (fresh groups only)")


class TrainConfig(BaseModel):
    """Settings of the ``train`` stage (GSPO and its baselines; DESIGN.md §4)."""

    model_config = ConfigDict(extra="forbid")

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
    pair_targets: Literal["soft", "hard"] = Field(
        default="soft",
        description="gspo only. soft: the aggregation's p_ij and confidence w_ij; hard: p=1 for "
        "the winner of every pair in different consensus tiers, weight 1, tied pairs left out.",
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
    target_temperature: float = Field(
        default=1.0, gt=0.0, description="nca and infonca: temperature alpha of the soft "
        "targets softmax(strengths / alpha) over a group's candidates (strengths: the "
        "aggregated Bradley-Terry log-strengths; small alpha: all weight on the best).")
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
    lr: float = Field(default=5e-6, gt=0, description="Peak learning rate (AdamW).")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    warmup_steps: int = Field(default=0, ge=0, description="Linear warm-up steps.")
    lr_scheduler: Literal["constant", "linear", "cosine"] = Field(
        default="linear", description="Learning-rate schedule after warm-up."
    )
    max_grad_norm: float = Field(default=1.0, gt=0, description="Gradient clipping norm.")
    epochs: int = Field(default=1, ge=1, description="Passes over the training groups.")
    max_steps: int | None = Field(
        default=None, ge=1, description="Stop after this many optimizer steps (overrides epochs)."
    )
    batch_size: int = Field(default=4, ge=1, description="Groups per device per micro-batch.")
    eval_batch_size: int = Field(default=8, ge=1, description="Groups per device when evaluating.")
    grad_accum: int = Field(default=1, ge=1, description="Micro-batches per optimizer step.")
    mixed_precision: Literal["no", "bf16", "fp16"] = Field(
        default="no", description="Autocast precision: bf16 (CPU or a bf16 GPU), fp16 (CUDA only)."
    )
    gradient_checkpointing: bool = Field(
        default=False, description="Recompute activations in backward to save memory (with "
        "share_prefix: models on sdpa attention only)."
    )
    compile: bool = Field(
        default=False, description="torch.compile each decoder layer (inductor; a one-off "
        "compile on the first steps and one more when batch shapes first change; not with "
        "FSDP, nor with share_prefix on a model not on sdpa; see docs/train.md)."
    )
    lora: LoraSettings | None = Field(default=None, description="Train LoRA adapters only.")
    share_prefix: bool = Field(
        default=True, description="Compute each group's prompt once for its K candidates."
    )
    disable_dropout: bool = Field(
        default=True, description="Set the model's dropout to 0 (implicit rewards start at 0)."
    )
    seed: int = Field(default=0, description="Seed of initialisation, shuffling and dropout.")
    logging_steps: int = Field(default=10, ge=1, description="Log training metrics every N steps.")
    eval_steps: int | None = Field(
        default=None, ge=1,
        description="Evaluate on the held-out split every N steps (always at start and end).",
    )
    save_steps: int | None = Field(
        default=None, ge=1, description="Write a resumable checkpoint every N steps."
    )
    save_total_limit: int = Field(default=2, ge=1, description="Checkpoints kept (oldest removed).")
    report_to: list[Tracker] = Field(
        default_factory=list, description="Extra metric backends: tensorboard, trackio."
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
        if self.label_smoothing > 0 and self.loss in ("lipo", "nca", "infonca"):
            raise ValueError(f"label_smoothing applies to loss 'gspo' and 'dpo', not {self.loss!r}")
        if self.target_margin > 0 and self.loss not in ("gspo", "dpo", "lipo"):
            raise ValueError(f"target_margin applies to the pairwise losses gspo, dpo and lipo, "
                             f"not {self.loss!r}")
        if self.target_temperature != 1.0 and self.loss not in ("nca", "infonca"):
            raise ValueError(f"target_temperature applies to loss 'nca' and 'infonca', not "
                             f"{self.loss!r}")
        if not self.reference_free:
            return
        if self.loss in ("nca", "sft"):
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


def check_trackers(report_to: list[str]) -> None:
    """Fail before any loading when a requested metric backend is not installed.

    Raises:
        ConfigError: a backend of ``report_to`` whose package is missing.
    """
    for name in report_to:
        if importlib.util.find_spec(_TRACKER_PACKAGES[name]) is None:
            raise ConfigError(f"report_to {name!r}: the package {_TRACKER_PACKAGES[name]!r} is "
                              f"not installed; `pip install {_TRACKER_PACKAGES[name]}` or drop it")


def check_precision(mixed_precision: str) -> None:
    """Fail early when the hardware cannot run the requested precision.

    Raises:
        ConfigError: fp16 without CUDA, or bf16 on a GPU without bf16 support.
    """
    import torch

    if mixed_precision == "fp16" and not torch.cuda.is_available():
        raise ConfigError("mixed_precision 'fp16' needs a CUDA GPU; use 'bf16' (CPU works) or 'no'")
    if (mixed_precision == "bf16" and torch.cuda.is_available()
            and not torch.cuda.is_bf16_supported()):
        raise ConfigError("mixed_precision 'bf16': this GPU has no bf16; use 'fp16' or 'no'")


class EvalConfig(BaseModel):
    """Settings of the ``eval`` stage: pair accuracy and margins of models on a group dataset."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(
        default=None,
        description="Model to evaluate (in a run: default the model RUN/train saved).",
    )
    baseline: str | None = Field(
        default=None,
        description="Model to compare with (in a run: default the model training started from).",
    )
    ref_model: str | None = Field(
        default=None,
        description="Reference of the implicit reward beta*(log pi - log pi_ref) (default: the "
        "baseline); without one only the models' own log-prob orderings are scored.",
    )
    split: Literal["test", "train", "all"] = Field(
        default="test", description="Which groups to score: the held-out split, train, or all."
    )
    beta: float | None = Field(
        default=None, gt=0,
        description="Implicit reward scale (default: the one RUN/train used, else 0.1).",
    )
    length_normalise: bool | None = Field(
        default=None, description="Divide each candidate's log-ratio by its token count "
        "(default: as RUN/train did, else off).",
    )
    batch_size: int = Field(default=8, ge=1, description="Groups per forward pass.")
    share_prefix: bool = Field(default=True, description="Compute each prompt once per group.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        default="float32", description="Precision of the scoring passes."
    )
    data: DataConfig = Field(default_factory=DataConfig,
                             description="Tokenisation: max lengths, overflow, chat template.")


def _eval_reads(config: EvalConfig) -> tuple[str, ...]:
    return ("validate",) if config.model else ("validate", "train")


TRAIN = StageSpec(name="train", config=TrainConfig, entry="grouppref.train.stage:run_train",
                  summary="Train the policy on RUN/validate (model in RUN/train/model).",
                  reads=lambda config: ("validate",))
EVAL = StageSpec(name="eval", config=EvalConfig, entry="grouppref.train.eval:run_eval",
                 summary="Compare the trained model with its start on the held-out split.",
                 reads=_eval_reads)
