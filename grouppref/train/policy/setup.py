"""Set-up of a policy training before its loop (:mod:`grouppref.train.policy.trainer`): everything
that can fail before a model loads (the checkpoint to resume from, tokenising and splitting the
groups, the label sources of ``mix``, the refresh plan), then the policy loaded, the reference
log-probs filled, and gradient checkpointing / LoRA put on."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from grouppref.errors import ConfigError
from grouppref.models.loading import load_causal_lm, load_tokenizer
from grouppref.schemas import Reject, ValidatedGroup
from grouppref.train.data.reference import ReferenceInfo, ensure_reference, require_reference
from grouppref.train.data.tokenize import tokenize_groups
from grouppref.train.engine import checkpoint
from grouppref.train.engine.prepare import (
    add_lora,
    enable_checkpointing,
    fresh_accelerator,
    require_trainable,
)
from grouppref.train.objective.candidates import trim_for_loss
from grouppref.train.policy.mix_sampler import check_sources
from grouppref.train.settings.policy import TrainConfig
from grouppref.train.tensors import packing
from grouppref.train.tensors.batch import TokenizedGroup

if TYPE_CHECKING:
    from accelerate import Accelerator

    from grouppref.train.refresh.fresh_groups import RefreshPlan


@dataclass
class Prepared:
    """What set-up hands the loop and the finish: the data, tokenizer, checkpoint to resume
    from, refresh plan and where the reference log-probs came from."""

    accelerator: Accelerator
    tokenizer: Any
    train_set: list[TokenizedGroup]
    held_out: list[TokenizedGroup]
    rejects: list[Reject]
    checkpoint: Path | None
    plan: RefreshPlan | None = None  # when config.refresh is set
    reference: ReferenceInfo | None = None


def split_groups(groups: Sequence[ValidatedGroup], tokenizer: Any, config: TrainConfig,
                 ) -> tuple[list[TokenizedGroup], list[TokenizedGroup], list[Reject]]:
    """Tokenize and split into (train, held-out, rejects); ``split=None`` counts as train.
    Training groups keep only the candidates the loss reads (:mod:`grouppref.train.objective.candidates`).

    Raises:
        StageError: no group is left to train on (the message gives the reject reasons).
    """
    tokenized, rejects = tokenize_groups(groups, tokenizer, config.data, stage="train")
    train_set = [trim_for_loss(g, config.loss) for g in tokenized if g.split != "test"]
    held_out = [g for g in tokenized if g.split == "test"]
    require_trainable(train_set, held_out, rejects, len(groups), "the max lengths")
    return train_set, held_out, rejects


def prepare_data(config: TrainConfig, groups: Sequence[ValidatedGroup], out_dir: Path,
                 resume: bool | str | Path) -> Prepared:
    """Everything that can fail before a model loads: the checkpoint to resume from, the
    tokenised split, the label sources of ``mix`` and the refresh plan."""
    from accelerate.utils import set_seed

    accelerator = fresh_accelerator(config, log_with=list(config.report_to) or None,
                                    project_config=checkpoint.project_config(out_dir))
    set_seed(config.seed)
    ckpt = checkpoint.find(out_dir, resume) if resume else None
    if ckpt is not None:
        checkpoint.check_compatible(ckpt, config)
    tokenizer = load_tokenizer(config.model, padding_side="right")
    train_set, held_out, rejects = split_groups(groups, tokenizer, config)
    if config.mix is not None:  # every source the schedule draws from has groups
        check_sources(config.mix, [config.mix.source_of(g.kinds) for g in train_set])
    check_compile_distributed(config, accelerator.distributed_type.value)
    plan = None
    if config.refresh is not None:
        from grouppref.train.refresh.fresh_groups import plan_refresh

        plan = plan_refresh(config, groups, tokenizer, accelerator.distributed_type.value)
    return Prepared(accelerator=accelerator, tokenizer=tokenizer, train_set=train_set,
                    held_out=held_out, rejects=rejects, checkpoint=ckpt, plan=plan)


def _disable_dropout(model: Any) -> None:
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


def check_checkpointing(model: Any, config: TrainConfig) -> None:
    """Gradient checkpointing turns transformers' KV cache off, so with ``share_prefix`` the
    model must run the packed pass (:mod:`grouppref.train.tensors.packing`: ``sdpa`` attention); the
    KV-cache fallback of other attention implementations cannot run.

    Raises:
        ConfigError: ``gradient_checkpointing`` and ``share_prefix`` on a model not on ``sdpa``.
    """
    attention = getattr(model.config, "_attn_implementation", None)
    if (config.gradient_checkpointing and config.share_prefix
            and attention not in ("sdpa", packing.NAME)):
        raise ConfigError(f"gradient_checkpointing with share_prefix needs a model on sdpa "
                          f"attention, and this one uses {attention!r}; set --no-share-prefix "
                          "or turn gradient checkpointing off")


def check_compile_distributed(config: TrainConfig, distributed_type: str) -> None:
    """``compile`` is tested on one process and under DDP (docs/train.md, "Compile"); FSDP
    shards the parameters the compiled layers read, which no test runs.

    Raises:
        ConfigError: ``compile`` under FSDP.
    """
    if config.compile and distributed_type == "FSDP":
        raise ConfigError("--compile is not supported with FSDP (untested: the compiled layers "
                          "would read sharded parameters); train without --compile, or with DDP")


def check_compile(model: Any, config: TrainConfig) -> None:
    """``compile`` with ``share_prefix`` needs the packed pass: the KV-cache fallback (models
    not on ``sdpa``, or where the packed attention does not apply) hands each layer a growing
    cache, which no test runs compiled. Call it after the model's first packed pass.

    Raises:
        ConfigError: ``compile`` and ``share_prefix`` on a model that takes the fallback.
    """
    from grouppref.train.tensors.logps import takes_fallback

    if config.compile and config.share_prefix and takes_fallback(model):
        attention = getattr(model.config, "_attn_implementation", None)
        raise ConfigError(f"--compile with share_prefix needs the packed pass (a model on sdpa "
                          f"attention), and this one ({attention!r}) takes the KV-cache "
                          "fallback; set --no-share-prefix or train without --compile")


def _prepare_policy(model: Any, config: TrainConfig) -> Any:
    """Gradient checkpointing, LoRA adapters and ``torch.compile`` of the decoder layers, then
    train mode.

    Raises:
        ConfigError: ``compile`` on a model without decoder layers to compile.
    """
    if config.gradient_checkpointing:
        enable_checkpointing(model)
    if config.lora is not None:
        model = add_lora(model, config.lora, "CAUSAL_LM", config.gradient_checkpointing)
    if config.compile and packing.compile_layers(model) == 0:
        raise ConfigError(f"--compile found no decoder layer to compile in "
                          f"{type(model).__name__} (it names none in _no_split_modules); "
                          "train without --compile")
    return model.train()


def load_policy(config: TrainConfig, prep: Prepared, cache_dir: Path) -> Any:
    """Load the policy, fill the reference log-probs of ``prep``'s groups (the loaded policy
    serves as the reference when it is the default one in float32, else the reference model is
    loaded, used and freed; with ``reference_free`` there is no reference pass at all), then
    make the policy trainable."""
    policy = load_causal_lm(config.model, device=str(prep.accelerator.device))
    if config.disable_dropout:
        _disable_dropout(policy)
    check_checkpointing(policy, config)
    if config.compile and config.share_prefix:  # a first packed pass decides the fallback
        _first_packed_pass(policy, prep)
        check_compile(policy, config)
    if config.reference_free:  # SimPO: the loss reads no reference log-probs
        return _prepare_policy(policy, config)
    reuse = config.ref_model is None and config.ref_dtype == "float32"
    filled, prep.reference = ensure_reference(
        prep.train_set + prep.held_out, model_name=config.reference_name(), cache_dir=cache_dir,
        data_config=config.data, batch_size=config.eval_batch_size,
        pad_token_id=prep.tokenizer.pad_token_id, share_prefix=config.share_prefix,
        dtype=config.ref_dtype, model=policy if reuse else None)
    require_reference(filled)
    n = len(prep.train_set)
    prep.train_set, prep.held_out = filled[:n], filled[n:]
    return _prepare_policy(policy, config)


def _first_packed_pass(model: Any, prep: Prepared) -> None:
    """One eager, gradient-free shared pass over the first training group, before the
    reference pass (which may be long, or read from its cache)."""
    from grouppref.train.tensors.batch import collate_groups
    from grouppref.train.tensors.logps import group_logps

    batch = collate_groups(prep.train_set[:1], prep.tokenizer.pad_token_id)
    with torch.no_grad():
        group_logps(model, batch.to(prep.accelerator.device))
