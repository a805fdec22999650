"""What the data stages make of a fixed set of inputs, as one JSON-able snapshot: the records
each stage stored (its Arrow rows as written), its rejects, its counts and its stats, and the
exported files read back. ``tests/integration/test_data_equivalence.py`` compares a snapshot of the current
code with one recorded from the per-row implementation (issue 32) in
``tests/data/equivalence/snapshot.json``.

The inputs: the demo prompts, every import fixture (``examples/data/import``,
``tests/data/import``), a small Nectar-shaped file (``benchmarks/data_stages.py``'s writer), and a
hostile corpus written here (bytes that are not UTF-8, blank lines, a BOM, rows that are not
objects, bad JSON, repeated prompts and reused ids, bad ranks and answers, oversize groups;
aggregate rows and annotated rows with invalid rankings, pairs and duplicates written straight
into a run as a hand-edited run would hold them).

Record again (only when a change of output is intended)::

    PYTHONPATH=. .venv/bin/python -m tests.support.equivalence tests/data/equivalence/snapshot.json
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from grouppref.errors import GroupPrefError
from grouppref.pipeline.aggregate.config import AggregateConfig
from grouppref.pipeline.aggregate.stage import run_aggregate
from grouppref.pipeline.export.config import ExportConfig
from grouppref.pipeline.export.stage import run_export
from grouppref.pipeline.imports.config import ImportConfig
from grouppref.pipeline.imports.stage import run_import
from grouppref.pipeline.prompts.config import PromptsConfig
from grouppref.pipeline.prompts.stage import run_prompts
from grouppref.pipeline.validate.config import ValidateConfig
from grouppref.pipeline.validate.stage import run_validate
from grouppref.runs.store import RunStore, StageRun
from grouppref.schemas import (
    AnnotatedGroup,
    PairPreference,
    Ranking,
    ValidatedGroup,
)
from tests.support.factories import make_annotated, make_group
from tests.support.validated import make_validated, write_aggregate

ROOT = Path(__file__).resolve().parents[2]
WORK = "<WORK>"


def _jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                    encoding="utf-8")
    return path


def _nectar_row(prompt: str, answers: list[Any], **more: Any) -> dict[str, Any]:
    return {"prompt": prompt, "answers": answers, "turns": 1, "num_responses": len(answers),
            "source": ["sharegpt"], "good_natured": True, **more}


def _answer(text: Any, rank: Any, model: str = "gpt-4") -> dict[str, Any]:
    return {"answer": text, "model": model, "rank": rank}


def hostile_files(folder: Path) -> dict[str, Path]:
    """The hostile input files, name -> path."""
    folder.mkdir(parents=True, exist_ok=True)
    good = [_answer("Seven.", 1.0), _answer("Nine.", 2.0), _answer("Eleven.", 3.0)]
    rows = [
        _nectar_row("\n\nHuman: A prime?\n\nAssistant:", good),
        _nectar_row("\n\nHuman: Not a list?\n\nAssistant:", "seven"),
        _nectar_row("\n\nHuman: Item not an object?\n\nAssistant:", [*good, "loose"]),
        _nectar_row("\n\nHuman: Rank words?\n\nAssistant:",
                    [_answer("A.", "first"), _answer("B.", 2.0), _answer("C.", None)]),
        _nectar_row("\n\nHuman: Empty answers?\n\nAssistant:",
                    [_answer("", 1.0), _answer("   ", 2.0), _answer("Only one.", 3.0)]),
        _nectar_row("\n\nHuman: Same answers?\n\nAssistant:",
                    [_answer("Same  text.", 1.0), _answer("same text.", 2.0),
                     _answer("Other.", 3.0)]),
        _nectar_row("\n\nHuman: A prime?\n\nAssistant:", good),  # a repeated prompt
        _nectar_row("\n\nHuman: Too many?\n\nAssistant:",
                    [_answer(f"Answer {i}.", float(i + 1)) for i in range(20)]),
        _nectar_row("Plain text, no transcript", good),
        _nectar_row(["not", "text"], good),
        _nectar_row("\n\nHuman: Ties?\n\nAssistant:",
                    [_answer("X.", 1.0), _answer("Y.", 1.0), _answer("Z.", float("nan"))]),
        _nectar_row("\n\nHuman: Answer not text?\n\nAssistant:",
                    [_answer(7, 1.0), _answer(None, 2.0), _answer("Fine.", 3.0),
                     _answer("Also fine.", 4.0)]),
        _nectar_row("\n\nHuman: Reused id?\n\nAssistant:", good, prompt_id="dup"),
        _nectar_row("\n\nHuman: Reused id, other prompt?\n\nAssistant:", good, prompt_id="dup"),
        _nectar_row("\n\nHuman: No rank key?\n\nAssistant:",
                    [{"answer": "A.", "model": "m"}, {"answer": "B.", "model": "m"}]),
        _nectar_row("\n\nHuman: Metadata null?\n\nAssistant:", good, turns=None),
        {"answers": good},
    ]
    lines = [json.dumps(r, ensure_ascii=False).encode("utf-8") for r in rows]
    lines.insert(3, b"")  # a blank line
    lines.insert(5, '{"prompt": "Cr\u00e8me?", "answers": []}'.encode("latin-1"))
    lines.insert(7, b'{"prompt": "unterminated')
    lines.insert(9, b'["a", "row", "that", "is", "a", "list"]')
    nectar = folder / "nectar_hostile.jsonl"
    nectar.write_bytes(b"\xef\xbb\xbf" + b"\n".join(lines) + b"\n")
    prompts = folder / "prompts_hostile.jsonl"
    prompt_lines = [json.dumps(r, ensure_ascii=False).encode("utf-8") for r in [
        {"prompt_id": "a", "prompt": "Caf\u00e9?"}, {"prompt_id": "b", "prompt": "Tea?"},
        {"prompt_id": "a", "prompt": "Another prompt with a reused id?"},
        {"prompt": "Tea?"}, {"prompt": ""}, {"prompt": "   "}, {"prompt": 5},
        {"prompt": "Meta?", "metadata": {"k": None}},
        {"prompt": "Meta nested?", "metadata": {"k": {"deep": 1}}},
        {"prompt": "Meta ok?", "metadata": {"k": 1, "f": 1.5, "b": True, "s": "x"}},
        {"messages": [{"role": "user", "content": "Chat?"}]},
        {"messages": [{"role": "robot", "content": "Chat?"}]},
        {"messages": []}, {"nothing": "here"},
        {"prompt": "With reference?", "reference": 42},
    ]]
    prompt_lines.insert(2, b"")
    prompt_lines.insert(4, b'{"prompt": "\xff\xfe"}')
    prompt_lines.insert(6, b"[1, 2]")
    prompt_lines.insert(8, b"{bad json")
    prompts.write_bytes(b"\xef\xbb\xbf" + b"\r\n".join(prompt_lines) + b"\r\n")
    csv = folder / "prompts_hostile.csv"
    csv.write_bytes("\ufeffprompt_id,prompt\nx,First?\n,\ny,Second?,extra\nz,First?\n"
                    .encode("utf-8") + b"w,\xe9t\xe9\n")
    return {"nectar_hostile": nectar, "prompts_hostile": prompts,
            "prompts_hostile_csv": csv}


FIXED_TIME = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _fixed(group: Any) -> Any:
    """``group`` with its rankings' times fixed (the builders stamp them with now)."""
    return group.model_copy(update={"rankings": [
        r.model_copy(update={"created_at": FIXED_TIME}) for r in group.rankings]})


def bad_annotated_rows() -> list[AnnotatedGroup]:
    """Annotated groups (as an import or rank stage would hold them) with invalid rankings,
    repeated group ids and duplicate annotators, built without validation where needed."""
    good = [make_annotated(make_group(k=4, prompt_text=f"Question {i}?"),
                           [[0, 1, 2, 3], [1, 0, 2, 3], [0, 2, 1, 3]]) for i in range(6)]
    g = good[1]
    unknown = Ranking.model_construct(**{**dict(g.rankings[0]),
                                         "tiers": [["c-unknown"], [g.candidates[0].candidate_id]]})
    other = Ranking.model_construct(**{**dict(g.rankings[1]), "group_id": "g-elsewhere"})
    bad = AnnotatedGroup.model_construct(**{**dict(g), "rankings": [unknown, other,
                                                                     g.rankings[2]]})
    twice = AnnotatedGroup.model_construct(**{**dict(good[2]), "rankings": [
        good[2].rankings[0], good[2].rankings[0], good[2].rankings[1]]})
    conflict = AnnotatedGroup.model_construct(**{**dict(good[3]), "rankings": [
        good[3].rankings[0], good[3].rankings[1].model_copy(
            update={"annotator": good[3].rankings[0].annotator})]})
    merged = good[0].model_copy(update={"rankings": [
        good[0].rankings[0], good[0].rankings[1].model_copy(
            update={"annotator": good[0].rankings[1].annotator.model_copy(
                update={"id": "ann-9"})})]})
    none = good[4].model_copy(update={"rankings": []})
    return [_fixed(g) for g in (good[0], bad, twice, conflict, merged, none, good[5])]


def bad_validated_rows() -> list[ValidatedGroup]:
    """Aggregate rows with known problems (schema, conflicts, duplicates, few pairs, flags)."""
    good = [make_validated(f"Question number {i}?", k=4) for i in range(4)]
    unknown = make_validated("Unknown candidate?")
    r0 = unknown.rankings[0]
    unknown = unknown.model_copy(update={"rankings": [
        r0.model_copy(update={"tiers": [*r0.tiers[:-1], ["c-doesnotexist"]]}),
        unknown.rankings[1]]})
    twice = make_validated("Annotator twice?")
    twice = twice.model_copy(update={"rankings": [twice.rankings[0], twice.rankings[0]]})
    high_p = make_validated("Probability too high?")
    pair = PairPreference.model_construct(**{**high_p.pairs[1].model_dump(), "p": 1.3})
    high_p = high_p.model_copy(update={"pairs": [high_p.pairs[0], pair, *high_p.pairs[2:]]})
    conflict_a = make_validated("Conflict?", k=3)
    conflict_b = make_validated("Conflict?", k=4)
    reprompt = make_validated("Question number 1?").model_copy(update={"group_id": "g-other"})
    reprompt = reprompt.model_copy(update={"rankings": [
        r.model_copy(update={"group_id": "g-other"}) for r in reprompt.rankings]})
    no_pairs = make_validated("No pairs?").model_copy(update={"pairs": []})
    flagged = make_validated("Flagged?", flags=["low_agreement"])
    chat = make_validated("Chat prompt?", chat=True)
    return [_fixed(g) for g in (good[0], unknown, good[1], twice, high_p, conflict_a, good[2],
                                good[0], conflict_b, reprompt, no_pairs, flagged, chat, good[3])]


_WORKS: list[str] = []  # the folder of the snapshot being taken, as given and resolved


def _anonymous(text: str) -> str:
    for folder in _WORKS:
        text = text.replace(folder, WORK)
    return text


def digest(value: Any) -> dict[str, Any]:
    """How many, and the sha256 of their canonical JSON (rows are too many to keep)."""
    text = _anonymous(json.dumps(value, sort_keys=True, ensure_ascii=False, default=str))
    return {"n": len(value), "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}


_STARTED: list[datetime] = []  # when the snapshot began


def _rounded(value: float) -> float:
    """A float to 9 significant digits: the fits' last bits differ between CPUs (Intel, AMD:
    other SIMD kernels), the equivalence this snapshot checks is not in them. A magnitude below
    1e-12 is 0: strengths of order 1 that cancel (a tie's centred strength) leave ~1e-16 of
    rounding noise, whose digits differ between CPUs too."""
    return 0.0 if abs(value) < 1e-12 else float(f"{value:.9g}")


def _stable(value: Any) -> Any:
    """``value`` with the times stamped during the snapshot (a ranking read without
    ``created_at`` gets the time it was read) written ``<NOW>``, floats :func:`_rounded`, also
    inside the JSON text a dict field is stored as in Arrow (``strengths``, ``scores``, ...)."""
    if isinstance(value, float):
        return _rounded(value)
    if isinstance(value, str) and value.startswith("{"):
        return _stable_json_text(value)
    if isinstance(value, dict):
        return {k: "<NOW>" if k == "created_at" and _recent(v) else _stable(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def _stable_json_text(text: str) -> str:
    """A dict field's JSON text (canonical: what the Arrow codec writes) with its floats
    :func:`_rounded`; any other text as it is."""
    try:
        loaded = json.loads(text)
    except ValueError:
        return text
    if not isinstance(loaded, dict) or json.dumps(loaded, sort_keys=True,
                                                  ensure_ascii=False) != text:
        return text
    return json.dumps(_stable(loaded), sort_keys=True, ensure_ascii=False)


def _recent(value: Any) -> bool:
    try:
        return isinstance(value, str) and datetime.fromisoformat(value) >= _STARTED[0]
    except ValueError:
        return False


def _stage(stage: StageRun[Any]) -> dict[str, Any]:
    data = stage.dir / "data"
    rows: list[Any] = []
    if data.is_dir() and stage.record_type is not None and stage.counts.outputs:
        rows = _stable(stage.dataset().data.table.to_pylist())
    out: dict[str, Any] = {
        "counts": stage.counts.model_dump(), "stats": stage.manifest.stats,
        "rows": rows if len(rows) <= 20 else digest(rows),
        "rejects": [r.model_dump(mode="json") for r in stage.rejects()]}
    for report in ("report.json",):
        if (stage.dir / report).exists():
            loaded = json.loads((stage.dir / report).read_text(encoding="utf-8"))
            loaded.pop("run", None)
            out[report] = loaded
    return out


def _export(stage: StageRun[Any], folder: Path) -> dict[str, Any]:
    out = _stage(stage)
    out["files"] = {p.name: digest(_stable(pq.read_table(p).to_pylist()))
                    for p in sorted(folder.glob("*.parquet"))}
    return out


def _try(fn: Any) -> Any:
    try:
        return fn()
    except GroupPrefError as e:
        return {"error": type(e).__name__, "message": str(e)}


def _chain(run: RunStore, work: Path, name: str) -> dict[str, Any]:
    """aggregate -> validate -> export (groups and trl-pairs) of a run holding an input stage."""
    out: dict[str, Any] = {}
    agg = _try(lambda: run_aggregate(run, AggregateConfig()))
    out["aggregate"] = agg if isinstance(agg, dict) else _stage(agg)
    if isinstance(agg, dict):
        return out
    val = _try(lambda: run_validate(run, ValidateConfig(test_fraction=0.3)))
    out["validate"] = val if isinstance(val, dict) else _stage(val)
    if isinstance(val, dict):
        return out
    for fmt in ("groups", "trl-pairs"):
        folder = work / f"export-{name}-{fmt}"
        exp = _try(lambda fmt=fmt, folder=folder: run_export(
            run, ExportConfig(format=fmt, parquet=str(folder))))
        out[f"export {fmt}"] = exp if isinstance(exp, dict) else _export(exp, folder)
    return out


def snapshot(work: Path) -> dict[str, Any]:
    """Run every stage on every input under ``work``; the results, with ``work`` written
    ``<WORK>`` so that two snapshots compare."""
    from benchmarks.data_stages import write_nectar

    work.mkdir(parents=True, exist_ok=True)
    _STARTED[:] = [datetime.now(timezone.utc) - timedelta(minutes=1)]
    _WORKS[:] = sorted({str(work.resolve()), str(work)}, key=len, reverse=True)
    inputs = work / "inputs"
    inputs.mkdir(exist_ok=True)
    files = {"demo_prompts": shutil.copy(ROOT / "data" / "demo_prompts.jsonl", inputs)}
    for folder in (ROOT / "examples" / "data" / "import", ROOT / "tests" / "data" / "import"):
        for path in sorted(folder.glob("*.jsonl")):
            files[f"{folder.parent.parent.name}/{path.stem}"] = shutil.copy(
                path, inputs / f"{folder.parent.parent.name}-{path.name}")
    nectar = inputs / "nectar-generated.jsonl"
    write_nectar(nectar, 300, 7, 600, 0)
    files["nectar_generated"] = nectar
    files.update(hostile_files(inputs / "hostile"))
    result: dict[str, Any] = {}
    for name, path in files.items():
        path = Path(path)
        entry: dict[str, Any] = {}
        run = RunStore(work / "runs" / name.replace("/", "-"))
        prompts = _try(lambda path=path, run=run: run_prompts(
            RunStore(run.root.with_name(run.root.name + "-prompts")),
            PromptsConfig(source=str(path))))
        entry["prompts"] = prompts if isinstance(prompts, dict) else _stage(prompts)
        if "prompts" not in name:
            imported = _try(lambda path=path, run=run: run_import(
                run, ImportConfig(source=str(path))))
            entry["import"] = imported if isinstance(imported, dict) else _stage(imported)
            if not isinstance(imported, dict) and imported.counts.outputs:
                entry.update(_chain(run, work, name.replace("/", "-")))
        result[name] = entry
    annotated = RunStore(work / "runs" / "bad-annotated")
    stage = annotated.open_stage("import", {"rows": "bad"}, input_fingerprint="bad",
                                 record_type=AnnotatedGroup)
    rows = bad_annotated_rows()
    for shard in stage.pending_shards(rows, shard_size=len(rows)):
        stage.write_shard(shard, list(shard.items), [])
    stage.finish(inputs=len(rows))
    result["bad_annotated"] = _chain(annotated, work, "bad-annotated")
    validated = write_aggregate(work / "runs" / "bad-validated", bad_validated_rows())
    val = run_validate(validated, ValidateConfig(test_fraction=0.3))
    result["bad_validated"] = {"validate": _stage(val)}
    for fmt in ("groups", "trl-pairs"):
        folder = work / f"export-bad-validated-{fmt}"
        exp = _try(lambda fmt=fmt, folder=folder: run_export(
            validated, ExportConfig(format=fmt, parquet=str(folder))))
        result["bad_validated"][f"export {fmt}"] = exp if isinstance(exp, dict) else _export(
            exp, folder)
    text = json.dumps(result, sort_keys=True, ensure_ascii=False, default=str)
    return json.loads(_anonymous(text))  # type: ignore[no-any-return]


def _clean(value: Any) -> Any:
    """Drop what differs from run to run (times, package versions, temporary paths) and round
    floats (:func:`_rounded`)."""
    if isinstance(value, float):
        return _rounded(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()
                if k not in ("seconds", "started_at", "finished_at", "created", "versions")}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def clean_snapshot(work: Path) -> dict[str, Any]:
    return _clean(snapshot(work))  # type: ignore[no-any-return]


if __name__ == "__main__":
    import tempfile

    import datasets

    datasets.disable_progress_bars()
    with tempfile.TemporaryDirectory() as tmp:
        snap = clean_snapshot(Path(tmp))
    target = Path(sys.argv[1])
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(snap, sort_keys=True, ensure_ascii=False, indent=1) + "\n",
                      encoding="utf-8")
    print(f"wrote {target} ({target.stat().st_size / 1e6:.1f} MB)")
