"""What both trainers' model folders publish alike: public names (Hub ids and file names, never
a local or cache path), the training data as a card names it (:class:`TrainedOn`), rejects with
public file names, a LoRA adapter that names its base model by Hub id, and files readable by
everyone (0644 under the usual umask). Each trainer writes its own model card
(:mod:`grouppref.train.policy.model_card`, :mod:`grouppref.train.reward_model.model_card`).

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
from grouppref.schemas import Reject

EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
ADAPTER_CONFIG = "adapter_config.json"
_CACHE_FOLDER = re.compile(r"models--([^/\\]+?)--([^/\\]+)")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


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


def fix_adapter_base(out_dir: Path, base: str | None) -> None:
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


def card_value(value: Any) -> str:
    """A value as a model card's table shows it: floats to 4 significant digits, None empty."""
    return "" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)
