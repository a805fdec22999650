"""Reference log-probs: one no-grad pass of the reference model over every candidate, stored
beside the data so that training holds only the policy in memory (docs/train-internals.md).

The cache key is a hash of (reference model fingerprint, token fingerprint of the tokenized
groups, DataConfig, dtype, format version). The token fingerprint hashes the token ids
themselves, so a change of tokenizer, chat template, max lengths or overflow rule, or of any
group, gives a new key. The model fingerprint is the sha256 of the model folder's config and
weight files (remembered per path, size and mtime, so a large model is hashed once).

Layout of one cache entry::

    CACHE/<key[:24]>/meta.json          model, fingerprints, dtype, number of groups
    CACHE/<key[:24]>/ref_logps.jsonl    {"group_id": ..., "ref_logps": [K floats]} per group

Under ``accelerate``/``torchrun`` each process scores a strided share of the groups and writes a
part file; the main process merges them, then every process reads the merged file.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from grouppref.errors import StageError
from grouppref.models.loading import load_causal_lm, model_fingerprint, model_label
from grouppref.runs.hashing import canonical_json, sha256_text
from grouppref.train.engine.distributed import process_state
from grouppref.train.settings.shared import DataConfig
from grouppref.train.tensors.batch import TokenizedGroup, collate_groups
from grouppref.train.tensors.logps import group_logps

FORMAT_VERSION = "2"  # 2: log-probs from the packed shared-prefix pass (train/tensors/packing.py)

class MissingReferenceError(StageError):
    """Groups lack reference log-probs (the reference pass was skipped or its cache is partial)."""


# -- fingerprints -----------------------------------------------------------------------------
def tokens_fingerprint(groups: Sequence[TokenizedGroup]) -> str:
    """sha256 over every group's id, prompt token ids and candidate token ids, in order."""
    digest = hashlib.sha256()
    for g in groups:
        digest.update(canonical_json([g.group_id, list(g.prompt_ids),
                                      [list(c) for c in g.cand_ids]]).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def reference_key(model_fp: str, tokens_fp: str, data_config: DataConfig, dtype: str) -> str:
    """The cache key of one reference pass."""
    return sha256_text(canonical_json({
        "model": model_fp, "tokens": tokens_fp, "data": data_config.model_dump(mode="json"),
        "dtype": dtype, "version": FORMAT_VERSION,
    }))


# -- the pass ---------------------------------------------------------------------------------
@torch.no_grad()
def score_groups(model: Any, groups: Sequence[TokenizedGroup], *, batch_size: int,
                 pad_token_id: int, share_prefix: bool = True,
                 autocast_dtype: torch.dtype | None = None) -> list[list[float]]:
    """Summed log-probs of every candidate of every group under ``model`` (no grad).

    Args:
        model: a causal LM (in eval mode) on its device.
        groups (Sequence[TokenizedGroup]): the groups to score.
        batch_size (int): groups per forward pass.
        pad_token_id (int): id used to pad the batch.
        share_prefix (bool): compute each prompt once for its K candidates.
        autocast_dtype (torch.dtype | None): autocast the forward pass to this dtype.

    Returns:
        list[list[float]]: one list of K log-probs per group, in order.
    """
    device = next(model.parameters()).device
    out: list[list[float]] = []
    for start in range(0, len(groups), batch_size):
        chunk = list(groups[start:start + batch_size])
        batch = collate_groups(chunk, pad_token_id).to(device)
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            logps = group_logps(model, batch, share_prefix=share_prefix).float()  # (B, K)
        for row, g in zip(logps.tolist(), chunk, strict=True):
            out.append(row[:len(g.cand_ids)])
    return out


def with_reference(groups: Sequence[TokenizedGroup],
                   ref: dict[str, list[float]]) -> list[TokenizedGroup]:
    """Copies of ``groups`` with ``ref_logps`` filled from ``ref`` (group id -> K log-probs).

    Raises:
        MissingReferenceError: a group has no entry in ``ref``, or one of the wrong length.
    """
    missing = [g.group_id for g in groups if len(ref.get(g.group_id, ())) != len(g.cand_ids)]
    if missing:
        raise MissingReferenceError(
            f"reference log-probs missing for {len(missing)} of {len(groups)} groups (first: "
            f"{missing[:3]}); delete the reference cache entry and train again to recompute it"
        )
    return [dataclasses.replace(g, ref_logps=list(ref[g.group_id])) for g in groups]


def require_reference(groups: Sequence[TokenizedGroup]) -> None:
    """Raise unless every group carries one reference log-prob per candidate.

    Raises:
        MissingReferenceError: naming how many groups lack them and the first few ids.
    """
    missing = [g.group_id for g in groups
               if g.ref_logps is None or len(g.ref_logps) != len(g.cand_ids)]
    if missing:
        raise MissingReferenceError(
            f"{len(missing)} of {len(groups)} groups have no reference log-probs (first: "
            f"{missing[:3]}); compute them with grouppref.train.data.reference.ensure_reference "
            "(grouppref train does this itself) before training"
        )


def _read_entry(entry: Path) -> dict[str, list[float]]:
    with (entry / "ref_logps.jsonl").open(encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return {r["group_id"]: r["ref_logps"] for r in rows}


def _write_jsonl(path: Path, rows: dict[str, list[float]]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for gid, logps in rows.items():
            fh.write(json.dumps({"group_id": gid, "ref_logps": logps}) + "\n")
    os.replace(tmp, path)


def _merge_parts(entry: Path, world: int, meta: dict[str, Any]) -> None:
    merged: dict[str, list[float]] = {}
    for rank in range(world):
        part = entry / f"part-{rank}-of-{world}.jsonl"
        with part.open(encoding="utf-8") as fh:
            for line in fh:
                row = json.loads(line)
                merged[row["group_id"]] = row["ref_logps"]
    _write_jsonl(entry / "ref_logps.jsonl", merged)
    (entry / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    for rank in range(world):
        (entry / f"part-{rank}-of-{world}.jsonl").unlink()


@dataclasses.dataclass(frozen=True)
class ReferenceInfo:
    """Where a reference pass is stored and whether it was reused."""

    key: str
    entry: Path
    model: str
    cached: bool
    groups: int


def ensure_reference(groups: Sequence[TokenizedGroup], *, model_name: str | None,
                     cache_dir: Path, data_config: DataConfig, batch_size: int,
                     pad_token_id: int, share_prefix: bool = True, dtype: str = "float32",
                     model: Any = None) -> tuple[list[TokenizedGroup], ReferenceInfo]:
    """Groups with ``ref_logps`` filled: from the cache, or from one pass of the reference.

    Args:
        groups (Sequence[TokenizedGroup]): tokenized groups (``ref_logps`` may be ``None``).
        model_name (str | None): the reference model (Hub id, folder, ``None`` = embedded).
        cache_dir (Path): folder of cache entries (a run's ``RUN/train/reference``).
        data_config (DataConfig): the tokenisation settings (part of the key).
        batch_size (int): groups per forward pass.
        pad_token_id (int): padding id.
        share_prefix (bool): compute each prompt once per group.
        dtype (str): precision of the reference pass (part of the key).
        model: an already loaded model with the reference weights (the initial policy, when
            the reference is the policy); ``None`` loads ``model_name`` and frees it afterwards.

    Returns:
        tuple[list[TokenizedGroup], ReferenceInfo]: the filled groups and the cache entry.

    Raises:
        MissingReferenceError: the cache entry does not cover every group.
    """
    state = process_state()
    key = reference_key(model_fingerprint(model_name), tokens_fingerprint(groups), data_config,
                        dtype)
    entry = Path(cache_dir) / key[:24]
    info = ReferenceInfo(key=key, entry=entry, model=model_label(model_name),
                         cached=(entry / "meta.json").exists(), groups=len(groups))
    if not info.cached:
        _compute_entry(groups, entry, state, model_name=model_name, model=model,
                       batch_size=batch_size, pad_token_id=pad_token_id,
                       share_prefix=share_prefix, dtype=dtype, key=key)
    return with_reference(groups, _read_entry(entry)), info


def _compute_entry(groups: Sequence[TokenizedGroup], entry: Path, state: Any, *,
                   model_name: str | None, model: Any, batch_size: int, pad_token_id: int,
                   share_prefix: bool, dtype: str, key: str) -> None:
    """Score this process's share of ``groups``, then merge the parts on the main process."""
    entry.mkdir(parents=True, exist_ok=True)
    rank, world = state.process_index, state.num_processes
    own = list(groups[rank::world])
    ref = model if model is not None else load_causal_lm(model_name, dtype=dtype,
                                                         device=str(state.device))
    was_training = ref.training
    ref.eval()
    scores = score_groups(ref, own, batch_size=batch_size, pad_token_id=pad_token_id,
                          share_prefix=share_prefix)
    ref.train(was_training)
    if model is None:  # free the reference before the policy trains
        del ref
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    _write_jsonl(entry / f"part-{rank}-of-{world}.jsonl",
                 {g.group_id: s for g, s in zip(own, scores, strict=True)})
    state.wait_for_everyone()
    if state.is_main_process:
        _merge_parts(entry, world, {"key": key, "model": model_label(model_name),
                                    "dtype": dtype, "groups": len(groups)})
    state.wait_for_everyone()
