"""The dataset card (``README.md``) of an export: YAML metadata plus what the data is and how it
was made (row counts, agreement and noise, validation checks, each stage's config).

The YAML is built with ``huggingface_hub.DatasetCardData`` and ``datasets``' own helpers
(``DatasetInfosDict``, ``MetadataConfigs``), so it is the metadata the Hub writes itself.
"""

from __future__ import annotations

import json
import re
from typing import Any

import datasets
import yaml
from datasets.info import DatasetInfo, DatasetInfosDict
from datasets.splits import SplitDict, SplitInfo
from datasets.utils.metadata import MetadataConfigs
from huggingface_hub import DatasetCardData

from grouppref.pipeline.export.config import ExportConfig
from grouppref.runs.store import RunStore
from grouppref.schemas.reports import ExportReport

_SECRET = re.compile(r"key|token|secret|password|passwd|credential", re.IGNORECASE)
_SIZES = [(1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"),
          (1_000_000, "100K<n<1M"), (10_000_000, "1M<n<10M"), (100_000_000, "10M<n<100M"),
          (1_000_000_000, "100M<n<1B")]

_FORMATS = {
    "groups": "one row per group: the prompt, its K candidates, every ranking, the consensus "
              "tiers (best first), log-strengths, pair preferences (`p` = P(winner > loser), "
              "`weight` = confidence), agreement and flags. Dict-valued fields are JSON strings.",
    "trl-pairs": "TRL's preference format, one row per consensus pair: `prompt`, `chosen`, "
                 "`rejected` (chat turns when the prompts are chat), plus `p` (P(chosen > "
                 "rejected)), `weight` (confidence in [0, 1]), `group_id`, `chosen_id`, "
                 "`rejected_id`. TRL's `DPOTrainer` reads prompt/chosen/rejected and ignores the "
                 "rest; a group-aware loss can use `p` and `weight`.",
}


def size_category(n: int) -> str:
    """The Hub's ``size_categories`` bucket of ``n`` rows."""
    return next((name for limit, name in _SIZES if n < limit), "n>1B")


def redact(value: Any) -> Any:
    """``value`` with every entry whose key looks like a secret replaced by ``'***'``."""
    if isinstance(value, dict):
        return {k: "***" if _SECRET.search(str(k)) and v else redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


def card_data(dsd: datasets.DatasetDict, config: ExportConfig, hub: bool) -> DatasetCardData:
    """The YAML metadata: license, task, size, tags, features and splits, and (for the Hub)
    the ``configs`` entry that maps each split to its Parquet files."""
    data = DatasetCardData(
        license=config.license, task_categories=["text-generation"],
        size_categories=[size_category(sum(len(ds) for ds in dsd.values()))],
        pretty_name=config.pretty_name, tags=["preference", "rlhf", "dpo", "grouppref"])
    first = next(iter(dsd.values()))
    info = DatasetInfo(features=first.features)
    info.splits = SplitDict({s: SplitInfo(name=s, num_bytes=ds.data.nbytes,
                                                   num_examples=len(ds)) for s, ds in dsd.items()})
    DatasetInfosDict({"default": info}).to_dataset_card_data(data)
    if hub:
        MetadataConfigs({"default": {"data_files": [
            {"split": s, "path": f"data/{s}-*"} for s in dsd]}}).to_dataset_card_data(data)
    return data


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _scalars(stats: dict[str, Any]) -> list[str]:
    """Table rows of a stats dict (floats to 4 significant digits, nested values as JSON)."""
    return [f"| {k} | {_cell(v)} |" for k, v in stats.items()]


def _provenance(store: RunStore) -> list[str]:
    lines = ["## How it was made", ""]
    for m in store.lineage("validate"):
        c = m.counts
        lines += [f"### {m.stage}", "",
                  f"{c.inputs} in, {c.outputs} out, {c.rejected} rejected; finished "
                  f"{m.finished_at:%Y-%m-%d %H:%M:%S} UTC; stage version {m.stage_version}."
                  if m.finished_at else f"status: {m.status}", "",
                  "```yaml", yaml.safe_dump(redact(m.config), sort_keys=True).rstrip(), "```", ""]
    return lines


def dataset_card(store: RunStore, dsd: datasets.DatasetDict, config: ExportConfig,
                 report: ExportReport, hub: bool) -> str:
    """The full ``README.md`` of an export of ``store``."""
    title = config.pretty_name or f"grouppref run {store.name}"
    lines = ["## Splits", "", "| split | rows | groups |", "|---|---|---|"]
    lines += [f"| {s} | {len(ds)} | {report.groups.get(s, 0)} |" for s, ds in dsd.items()]
    lines += ["", "## Format", "", f"`{config.format}`: {_FORMATS[config.format]}", ""]
    if config.format == "trl-pairs":
        skipped = report.skipped_pairs
        lines += [f"Pairs: `{config.pairs}`, min weight {config.min_weight}. Pairs left out: "
                  f"{json.dumps(skipped, sort_keys=True) if skipped else 'none'}.", ""]
    for stage, title_ in (("aggregate", "Agreement and noise (aggregate)"),
                          ("validate", "Validation")):
        manifest = store.manifest(stage)
        if manifest and manifest.stats:
            lines += [f"## {title_}", "", "| statistic | value |", "|---|---|",
                      *_scalars(manifest.stats), ""]
    lines += _provenance(store)
    body = "\n".join([f"# {title}", "", "Group-wise preference data made with grouppref.", "",
                      *lines]).rstrip() + "\n"
    yaml_block = card_data(dsd, config, hub).to_yaml()
    return f"---\n{yaml_block}\n---\n\n{body}"
