"""The policy's model card (``README.md`` of the model folder ``train`` writes).

The card's YAML is ``huggingface_hub.ModelCardData`` (``base_model``, ``datasets``, ``tags``,
``library_name``, ``pipeline_tag``); the text gives the loss and its settings, the data counts,
the held-out metrics before and after training, and how to load the model. Only Hub ids and
file names appear in it, never a local or cache path
(:mod:`grouppref.train.engine.model_folder`).
"""

from __future__ import annotations

from pathlib import Path

from grouppref.runs.freshness import stale_note
from grouppref.schemas.reports import TrainStats
from grouppref.train.engine.model_folder import (
    TrainedOn,
    card_value,
    fix_adapter_base,
    hub_id,
    make_readable,
    public_name,
)
from grouppref.train.settings.policy import TrainConfig

_METRICS = ("pair_accuracy", "margin", "reward_best", "reward_worst", "kl", "logp_pair_accuracy",
            "logp_margin")


def public_stats(stats: TrainStats) -> TrainStats:
    """``stats`` as the model folder publishes them (``metrics.json``): the reference model by
    its public name and its log-prob cache entry by its key (the folder name), never a local
    path; the run's manifest keeps the full ones."""
    ref = stats.reference
    if ref is None:  # reference_free: nothing to hide
        return stats
    return stats.model_copy(update={"reference": ref.model_copy(update={
        "model": public_name(ref.model), "entry": Path(ref.entry).name})})


def _settings_rows(config: TrainConfig, stats: TrainStats) -> list[str]:
    lora = config.lora
    rows = [("loss", config.loss), ("beta", config.beta),
            ("length_normalise", config.length_normalise),
            ("label_smoothing", config.label_smoothing), ("sft_weight", config.sft_weight),
            ("reference model", "none (reference_free)" if config.reference_free
             else public_name(config.reference_name())),
            ("learning rate", f"{config.lr} ({config.lr_scheduler}, warm-up "
                              f"{config.warmup_steps})"),
            ("batch", f"{config.batch_size} groups x {config.grad_accum} accumulation"),
            ("steps", stats.steps), ("epochs", round(stats.epochs, 3)),
            ("mixed precision", config.mixed_precision), ("seed", config.seed),
            ("LoRA", f"r {lora.r}, alpha {lora.alpha}, {lora.target_modules}, saved "
                     f"{lora.save}" if lora else "no"),
            ("seconds", stats.seconds)]
    return [f"| {k} | {card_value(v)} |" for k, v in rows]


def _eval_rows(stats: TrainStats) -> list[str]:
    names = [n for n in _METRICS if n in stats.eval or n in stats.eval_start]
    return [f"| {n} | {card_value(stats.eval_start.get(n))} | {card_value(stats.eval.get(n))} |"
            for n in names]


def _usage(repo: str, adapter: bool, base: str | None) -> list[str]:
    if adapter:
        code = ["from peft import AutoPeftModelForCausalLM",
                f'model = AutoPeftModelForCausalLM.from_pretrained("{repo}")  # base: {base}']
    else:
        code = ["from transformers import AutoModelForCausalLM, AutoTokenizer",
                f'model = AutoModelForCausalLM.from_pretrained("{repo}")',
                f'tokenizer = AutoTokenizer.from_pretrained("{repo}")']
    return ["## How to use", "", "```python", *code, "```", ""]


def card_text(config: TrainConfig, stats: TrainStats, data: TrainedOn, *, repo: str) -> str:
    """The model card (YAML metadata + text) of a model trained with ``config``."""
    from huggingface_hub import ModelCardData

    base = hub_id(config.model)
    adapter = config.lora is not None and config.lora.save == "adapter"
    meta = ModelCardData(
        base_model=base, datasets=data.hub_datasets or None, pipeline_tag="text-generation",
        library_name="peft" if adapter else "transformers",
        tags=["grouppref", "preference-optimization", config.loss,
              *(["lora"] if config.lora else [])])
    g = stats.groups
    start = f"[{base}](https://huggingface.co/{base})" if base else public_name(config.model)
    lines = [f"# {repo}", "",
             f"Trained from {start} "
             f"with grouppref's `{config.loss}` loss on ranked groups of candidate answers. "
             "GSPO here is Groupwise Supervised Preference Optimization: an offline loss over "
             "an already-ranked dataset (not Qwen's online Group Sequence Policy "
             "Optimization).", ""]
    if data.stale:
        lines += [f"> **Warning.** {stale_note({'validate': data.stale})}", ""]
    lines += ["## Training data", "",
              f"`{data.name}` ({data.format}): {g.train} groups trained on, {g.held_out} held "
              f"out, {g.rejected + data.unreadable} rejected, {g.dropped_candidates} candidates "
              "dropped, "
              f"{g.truncated_responses} responses truncated.", "",
              "## Training", "", "| setting | value |", "|---|---|",
              *_settings_rows(config, stats), "",
              "## Evaluation (held-out groups)", ""]
    evals = _eval_rows(stats)
    lines += (["Implicit reward s = beta * (log pi - log pi_ref); pair accuracy against the "
               "consensus of the aggregated rankings.", "",
               "| metric | before training | after training |", "|---|---|---|", *evals, ""]
              if evals else ["No held-out groups: nothing was evaluated.", ""])
    lines += _usage(repo, adapter, base)
    return f"---\n{meta.to_yaml()}\n---\n\n" + "\n".join(lines).rstrip() + "\n"


def finish_model_folder(out_dir: Path, config: TrainConfig, stats: TrainStats,
                        data: TrainedOn) -> Path:
    """Write the model card, point a LoRA adapter at its base's Hub id, make files readable.

    Returns:
        Path: the ``README.md`` written.
    """
    from huggingface_hub import ModelCard

    fix_adapter_base(out_dir, hub_id(config.model))
    card = ModelCard(card_text(config, stats, data, repo=out_dir.resolve().name))
    path = out_dir / "README.md"
    card.save(path)
    make_readable(out_dir)
    return path
