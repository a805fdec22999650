"""The dataset card (``README.md``) of an export: YAML metadata plus what the data is and how it
was made (row counts, agreement and noise, validation checks, each stage's config).

The YAML is built with ``huggingface_hub.DatasetCardData`` and ``datasets``' own helpers
(``DatasetInfosDict``, ``MetadataConfigs``), so it is the metadata the Hub writes itself.

What a card may publish (:func:`publishable`): secrets never (values of keys named like
credentials, :data:`SECRET_KEYS`, and passwords inside URLs are replaced by ``***``; settings
such as ``max_new_tokens`` or a ``keywords`` rule are not secrets and stay); local paths never
(an absolute path, or a relative one that names a local file, becomes its file name; Hub ids
stay as they are).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import datasets
import yaml
from datasets.info import DatasetInfo, DatasetInfosDict
from datasets.splits import SplitDict, SplitInfo
from datasets.utils.metadata import MetadataConfigs
from huggingface_hub import DatasetCardData

from grouppref.pipeline.export.config import ExportConfig
from grouppref.runs.freshness import stale_note
from grouppref.runs.store import RunStore
from grouppref.schemas.reports import ExportReport

SECRET_KEYS = frozenset({"api_key", "apikey", "token", "access_token", "auth_token", "hf_token",
                         "password", "passwd", "secret", "client_secret", "secret_key"})
_URL_PASSWORD = re.compile(r"(?<=://)([^:/@\s]+):[^@/\s]+@")
_PATH_SUFFIX = re.compile(r"\.(jsonl|ndjson|json|csv|parquet|arrow|ya?ml|toml|txt|gguf|"
                          r"safetensors|bin|pt)$", re.IGNORECASE)
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


def _secret_key(key: Any) -> bool:
    return str(key).strip().lower().replace("-", "_") in SECRET_KEYS


def _looks_like_path(text: str) -> bool:
    """An absolute or home path, ``./x``, or a relative path (no spaces) naming a data or model
    file or an existing local file or folder; ``owner/name`` Hub ids that are not local stay."""
    if text.startswith(("/", "~", "./", "../")) or re.match(r"^[A-Za-z]:[\\/]", text):
        return True
    if ("/" not in text and "\\" not in text) or any(c.isspace() for c in text):
        return False
    return bool(_PATH_SUFFIX.search(text)) or Path(text).exists()


def _publishable_text(text: str) -> str:
    text = _URL_PASSWORD.sub(r"\1:***@", text)
    if "://" not in text and "\n" not in text and _looks_like_path(text):
        return Path(text.rstrip("/")).name or text
    return text


def publishable(value: Any) -> Any:
    """``value`` fit for a public card: secrets redacted and local paths cut to their file
    name (see the module docstring)."""
    if isinstance(value, dict):
        return {k: "***" if _secret_key(k) and v else publishable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [publishable(v) for v in value]
    if isinstance(value, str):
        return _publishable_text(value)
    return value


def card_data(dsd: datasets.DatasetDict, config: ExportConfig,
              data_files: dict[str, str] | None) -> DatasetCardData:
    """The YAML metadata: license, task, size, tags, features and splits, and (for a repo whose
    README sits beside Parquet files) the ``configs`` entry mapping each split to its files."""
    data = DatasetCardData(
        license=config.license, task_categories=["text-generation"],
        size_categories=[size_category(sum(len(ds) for ds in dsd.values()))],
        pretty_name=config.pretty_name, tags=["preference", "rlhf", "dpo", "grouppref"])
    if config.license == "other":  # the Hub's custom-license fields, only those given
        for key, value in (("license_name", config.license_name),
                           ("license_link", config.license_link)):
            if value:
                setattr(data, key, value)
    first = next(iter(dsd.values()))
    info = DatasetInfo(features=first.features)
    info.splits = SplitDict({s: SplitInfo(name=s, num_bytes=ds.data.nbytes,
                                                   num_examples=len(ds)) for s, ds in dsd.items()})
    DatasetInfosDict({"default": info}).to_dataset_card_data(data)
    if data_files:
        MetadataConfigs({"default": {"data_files": [
            {"split": s, "path": path} for s, path in data_files.items()]}}
        ).to_dataset_card_data(data)
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
                  "```yaml", yaml.safe_dump(publishable(m.config), sort_keys=True).rstrip(),
                  "```", ""]
    return lines


def _license_line(config: ExportConfig) -> str:
    if config.license is None:
        return ("License: none given (export again with --license SPDX-ID, or --license other "
                "--license-name NAME).")
    if config.license == "other":
        link = f" ({config.license_link})" if config.license_link else ""
        return f"License: `{config.license_name}`{link}."
    return f"License: `{config.license}`."


def dataset_card(store: RunStore, dsd: datasets.DatasetDict, config: ExportConfig,
                 report: ExportReport, *, data_files: dict[str, str] | None = None,
                 stale: dict[str, list[str]] | None = None) -> str:
    """The full ``README.md`` of an export of ``store``; ``stale`` (stage -> changed upstream
    stages) when it was made with ``--allow-stale``."""
    title = config.pretty_name or f"grouppref run {store.name}"
    lines = [f"> **Warning.** {stale_note(stale)}", ""] if stale else []
    lines += ["## Splits", "", "| split | rows | groups |", "|---|---|---|"]
    lines += [f"| {s} | {len(ds)} | {report.groups.get(s, 0)} |" for s, ds in dsd.items()]
    lines += ["", "## Format", "", f"`{config.format}`: {_FORMATS[config.format]}", "",
              _license_line(config), ""]
    if config.format == "trl-pairs":
        skipped = report.skipped_pairs
        lines += [f"Pairs: `{config.pairs}`, min weight {config.min_weight}. Pairs left out: "
                  f"{json.dumps(skipped, sort_keys=True) if skipped else 'none'}.", ""]
    for stage, title_ in (("aggregate", "Agreement and noise (aggregate)"),
                          ("validate", "Validation")):
        manifest = store.manifest(stage)
        if manifest and manifest.stats:
            lines += [f"## {title_}", "", "| statistic | value |", "|---|---|",
                      *_scalars(publishable(manifest.stats)), ""]
    lines += _provenance(store)
    body = "\n".join([f"# {title}", "", "Group-wise preference data made with grouppref.", "",
                      *lines]).rstrip() + "\n"
    yaml_block = card_data(dsd, config, data_files).to_yaml()
    return f"---\n{yaml_block}\n---\n\n{body}"
