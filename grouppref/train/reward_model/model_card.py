"""The reward model's card (``README.md``) and ``metrics.json`` in the folder ``train-rm`` writes:
YAML metadata, data, settings, held-out accuracy and usage, with public names only
(:mod:`grouppref.train.engine.model_folder`)."""

from __future__ import annotations

from pathlib import Path

from grouppref.schemas.reports import RewardModelStats
from grouppref.train.engine.model_folder import (
    TrainedOn,
    card_value,
    hub_id,
    make_readable,
    public_name,
)
from grouppref.train.settings.reward_model import RewardModelConfig


def _lora_row(config: RewardModelConfig) -> str:
    lora = config.lora
    if lora is None:
        return "no (all weights trained)"
    return (f"r={lora.r}, alpha={lora.alpha}, dropout={lora.dropout}, "
            f"targets={lora.target_modules}, score head trained fully, saved {lora.save}")


def card_text(config: RewardModelConfig, stats: RewardModelStats, data: TrainedOn,
              repo: str) -> str:
    """The reward model's card: YAML metadata, data, settings, held-out accuracy, usage."""
    from huggingface_hub import ModelCardData

    base = hub_id(config.model)
    meta = ModelCardData(base_model=base, datasets=data.hub_datasets or None,
                         pipeline_tag="text-classification", library_name="transformers",
                         tags=["grouppref", "reward-model", config.loss])
    g, start, end = stats.groups, stats.eval_start, stats.eval
    rows = [("base model", base or public_name(config.model)), ("loss", config.loss),
            ("pair targets", config.pair_targets if config.loss == "gspo" else "-"),
            ("center_rewards", config.center_rewards), ("learning rate", config.lr),
            ("LoRA", _lora_row(config)),
            ("batch", f"{config.batch_size} groups x {config.grad_accum} accumulation"),
            ("steps", stats.steps), ("epochs", stats.epochs), ("seed", config.seed),
            ("seconds", stats.seconds), ("pairs/s", stats.pairs_per_s)]
    lines = [f"# {repo}", "",
             "A reward model (sequence classifier with one output) trained by grouppref on "
             "ranked groups of candidate answers.", "",
             "## Training data", "",
             f"`{data.name}` ({data.format}), fingerprint `{stats.data_fingerprint}`: "
             f"{g.train} groups trained on, {g.held_out} held out, "
             f"{g.rejected + data.unreadable} rejected, {g.dropped_candidates} candidates "
             "dropped (over max_length).", ""]
    if data.stale:
        lines += [f"> **Warning.** Trained on stale data: {', '.join(data.stale)} changed "
                  "after validate ran.", ""]
    lines += ["## Training", "", "| setting | value |", "|---|---|",
              *(f"| {k} | {card_value(v)} |" for k, v in rows), "",
              "## Evaluation (held-out groups)", ""]
    if end.measured():
        lines += ["Pair accuracy against the consensus of the aggregated rankings (weighted by "
                  "the pair confidence w_ij; a tie counts 1/2).", "",
                  "| metric | before training | after training |", "|---|---|---|",
                  *(f"| {n} | {card_value(getattr(start, n))} | {card_value(getattr(end, n))} |"
                    for n in ("pair_accuracy", "loss")), ""]
    else:
        lines += ["No held-out groups: nothing was evaluated.", ""]
    lines += ["## How to use", "",
              "Each candidate is scored on `tokenizer.apply_chat_template(prompt turns + "
              "[assistant: response])` (or `prompt + \"\\n\\n\" + response` for a tokenizer "
              "without a chat template), as grouppref's reward ranker does:", "",
              "```bash", "grouppref rank RUN --ranker reward:DIR   # DIR: this folder", "```",
              ""]
    return f"---\n{meta.to_yaml()}\n---\n\n" + "\n".join(lines)


def finish_rm_folder(out_dir: Path, config: RewardModelConfig, stats: RewardModelStats,
                     data: TrainedOn) -> None:
    """Write ``metrics.json`` and the model card; make the files readable."""
    from huggingface_hub import ModelCard

    (out_dir / "metrics.json").write_text(stats.model_dump_json(indent=2, exclude_none=True)
                                          + "\n")
    ModelCard(card_text(config, stats, data, out_dir.resolve().name)).save(out_dir / "README.md")
    make_readable(out_dir)
