"""The trained model folder as one publishes it: a model card (``README.md``), a LoRA adapter
that names its base model by Hub id, and files readable by everyone (0644 under the usual umask).

The card's YAML is ``huggingface_hub.ModelCardData`` (``base_model``, ``datasets``, ``tags``,
``library_name``, ``pipeline_tag``); the text gives the loss and its settings, the data counts,
the held-out metrics before and after training, and how to load the model. Only Hub ids and
file names appear in it, never a local or cache path.

The base model's Hub id: the embedded model's is :data:`EMBEDDED_HUB_ID`; a Hub id is itself;
a folder of the Hugging Face cache (``models--owner--name/snapshots/...``) gives ``owner/name``;
any other local folder has none (the card then names the folder, never its path, and a LoRA
adapter keeps the path peft recorded, which is where its base is).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grouppref.models.loading import is_embedded
from grouppref.runs.freshness import stale_note
from grouppref.schemas import Reject
from grouppref.schemas.reports import TrainStats
from grouppref.train.config import TrainConfig

EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
ADAPTER_CONFIG = "adapter_config.json"
_CACHE_FOLDER = re.compile(r"models--([^/\\]+?)--([^/\\]+)")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_METRICS = ("pair_accuracy", "margin", "reward_best", "reward_worst", "kl", "logp_pair_accuracy",
            "logp_margin")


@dataclass
class TrainedOn:
    """What the model was trained on, as the card publishes it."""

    name: str  # a Hub id, a run's name or a file name: never a path
    format: str  # run, groups or trl-pairs
    hub_datasets: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    unreadable: int = 0  # rows of the source that were not valid groups


def hub_id(name: str | None) -> str | None:
    """The Hub id of a model reference, when it is known (see the module docstring)."""
    if is_embedded(name):
        return EMBEDDED_HUB_ID
    text = str(name)
    path = Path(text).expanduser()
    if not path.exists():
        return text if _HUB_ID.match(text) else None
    found = _CACHE_FOLDER.search(str(path.resolve()))
    return f"{found.group(1)}/{found.group(2)}" if found else None


def public_name(reference: str | None) -> str:
    """A model or data reference as a card may show it: Hub id, else the folder or file name."""
    return hub_id(reference) or Path(str(reference).rstrip("/")).name


def public_rejects(rejects: list[Reject], source: str) -> list[Reject]:
    """``rejects`` as the model folder publishes them: a file under the data source is named
    from the source's public name down (``prefs/test.parquet``), any other path by its file
    name; never the machine's full path. The run's own ``rejects.jsonl`` keeps the full ones."""
    root = None if hub_id(source) else Path(source).resolve()

    def shown(path: str | None) -> str | None:
        if path is None or hub_id(path) or not Path(path).is_absolute():
            return path
        p = Path(path).resolve()
        if root is not None and root in p.parents:  # a file of the source folder
            return str(Path(public_name(source)) / p.relative_to(root))
        return p.name

    return [r.model_copy(update={"source": shown(r.source)}) for r in rejects]


def public_stats(stats: TrainStats) -> TrainStats:
    """``stats`` as the model folder publishes them (``metrics.json``): the reference model by
    its public name and its log-prob cache entry by its key (the folder name), never a local
    path; the run's manifest keeps the full ones."""
    ref = stats.reference
    if ref is None:  # reference_free: nothing to hide
        return stats
    return stats.model_copy(update={"reference": ref.model_copy(update={
        "model": public_name(ref.model), "entry": Path(ref.entry).name})})


def trained_on(source: str, format: str, store: Any = None,
               stale: list[str] | None = None, unreadable: int = 0) -> TrainedOn:
    """Describe the training data: a Hub dataset id, or a run / file by its name only; a run's
    Hub exports (``export/hub-*``, pushed) give the ``datasets`` of the card."""
    local = Path(source).expanduser().exists()
    hub = [] if local or not _HUB_ID.match(source) else [source]
    if store is not None:
        hub += [m.outputs["location"].removeprefix("hub:") for m in store.manifests()
                if m.status == "complete" and m.outputs.get("location", "").startswith("hub:")]
    return TrainedOn(name=Path(source.rstrip("/")).name if local else source, format=format,
                     hub_datasets=sorted(set(hub)), stale=list(stale or []),
                     unreadable=unreadable)


def _fmt(value: Any) -> str:
    return "" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


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
    return [f"| {k} | {_fmt(v)} |" for k, v in rows]


def _eval_rows(stats: TrainStats) -> list[str]:
    names = [n for n in _METRICS if n in stats.eval or n in stats.eval_start]
    return [f"| {n} | {_fmt(stats.eval_start.get(n))} | {_fmt(stats.eval.get(n))} |"
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


def _fix_adapter_base(out_dir: Path, base: str | None) -> None:
    """peft records the folder the base was loaded from (for the embedded model, a cache path):
    record its Hub id instead when it is known."""
    path = out_dir / ADAPTER_CONFIG
    if base is None or not path.exists():
        return
    data = json.loads(path.read_text(encoding="utf-8"))
    data["base_model_name_or_path"] = base
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def make_readable(out_dir: Path) -> None:
    """Files 0666 and folders 0777, less the umask (safetensors writes weights 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    for path in [out_dir, *out_dir.rglob("*")]:
        if path.is_symlink():
            continue
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def finish_model_folder(out_dir: Path, config: TrainConfig, stats: TrainStats,
                        data: TrainedOn) -> Path:
    """Write the model card, point a LoRA adapter at its base's Hub id, make files readable.

    Returns:
        Path: the ``README.md`` written.
    """
    from huggingface_hub import ModelCard

    _fix_adapter_base(out_dir, hub_id(config.model))
    card = ModelCard(card_text(config, stats, data, repo=out_dir.resolve().name))
    path = out_dir / "README.md"
    card.save(path)
    make_readable(out_dir)
    return path
