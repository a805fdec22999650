"""The floor under a per-group import (issue 32): on the Nectar-shaped file of
``data_stages.py``, the work every import path must do for each group, timed part by part in
one process, against the peer of ``data_stages.py`` (pyarrow reading the file and writing it
as Parquet) in the same process.

The parts, each with the package's own function, over values ``pyarrow.json`` read (no prompt
model, no output table, no run store, no reject handling): the transcript parsed into turns
(``parse_hh``), the prompt's content key (``prompt_content_key``) and group id
(``group_id_of``), the candidate ids (``candidate_ids``: sha256 of every answer text), the
duplicate-text check (``duplicate_keys``) and the tiers from the ranks (``tiers_from_scores``);
and the read's own ``to_pylist`` of the columns. If these alone come near 3x the peer, an import
that keeps them in Python per group cannot be within 3x of it.

Usage::

    .venv/bin/python benchmarks/import_floor.py --groups 50000 --work /tmp/b50
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from data_stages import file_arguments, nectar_file  # noqa: E402


def _cpu(fn: Callable[[], object]) -> tuple[float, object]:
    t = time.process_time()
    out = fn()
    return time.process_time() - t, out


def _peer(data: Path, out: Path) -> float:
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    seconds, _ = _cpu(lambda: pq.write_table(pj.read_json(str(data)), str(out)))
    return seconds


def _parts(data: Path) -> dict[str, float]:
    """CPU seconds of each part of the per-group work over the whole file."""
    import pyarrow.json as pj

    from grouppref.pipeline.imports.layouts.build import tiers_from_scores
    from grouppref.pipeline.imports.layouts.keys import candidate_ids
    from grouppref.pipeline.imports.layouts.transcript import parse_hh
    from grouppref.schemas.records import group_id_of, prompt_content_key
    from grouppref.schemas.texts import duplicate_keys

    seconds: dict[str, float] = {}
    seconds["read (pyarrow.json)"], table = _cpu(lambda: pj.read_json(str(data)))

    def columns() -> tuple[list[str], list[int], list[str], list[float]]:
        answers = table.column("answers").combine_chunks()
        return (table.column("prompt").to_pylist(), answers.offsets.to_pylist(),
                answers.values.field("answer").to_pylist(),
                answers.values.field("rank").to_pylist())

    seconds["columns to Python"], (prompts, offsets, texts, ranks) = _cpu(columns)
    spans = [(offsets[i], offsets[i + 1]) for i in range(len(prompts))]
    seconds["transcript -> turns"], turns = _cpu(lambda: [parse_hh(p) or [] for p in prompts])
    seconds["content key"], keys = _cpu(lambda: [
        prompt_content_key(None, [(t["role"], t["content"]) for t in tt]) for tt in turns])
    seconds["group id"], gids = _cpu(lambda: [group_id_of(k) for k in keys])
    seconds["candidate ids"], _ = _cpu(lambda: [candidate_ids(g, texts[a:b])
                                                for g, (a, b) in zip(gids, spans, strict=True)])
    seconds["duplicate check"], _ = _cpu(lambda: [duplicate_keys(texts[a:b]) for a, b in spans])
    seconds["tiers"], _ = _cpu(lambda: [
        tiers_from_scores({j: -r for j, r in enumerate(ranks[a:b])}) for a, b in spans])
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    file_arguments(parser)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    work, data = nectar_file(args, "grouppref-floor-")
    peers, runs = [], []
    for _ in range(args.repeats):  # alternating: the machine's speed moves
        peers.append(_peer(data, work / "floor-peer.parquet"))
        runs.append(_parts(data))
    peers.append(_peer(data, work / "floor-peer.parquet"))
    peer = statistics.median(peers)
    print(f"groups: {args.groups} (K={args.k}), peer (pyarrow read + Parquet write, in "
          f"process) CPU-s: {', '.join(f'{p:.2f}' for p in peers)}; median {peer:.2f}")
    print(f"{'part':24s} " + " ".join(f"{'run ' + str(i + 1):>8s}" for i in range(len(runs)))
          + "  x peer (median run)")
    for part in runs[0]:
        values = [r[part] for r in runs]
        print(f"{part:24s} " + " ".join(f"{v:8.2f}" for v in values)
              + f"  {statistics.median(values) / peer:6.2f}")
    totals = [sum(r.values()) for r in runs]
    print(f"{'total':24s} " + " ".join(f"{v:8.2f}" for v in totals)
          + f"  {statistics.median(totals) / peer:6.2f}")


if __name__ == "__main__":
    main()
