"""Input readers: every format, the column mapping, and one clear reject per bad row."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grouppref.errors import InputFileError
from grouppref.readers.mapping import ColumnMapping
from grouppref.readers.prompts import read_prompts

ROWS = [
    {"prompt_id": "a", "prompt": "What is 2+2?", "reference": "4", "metadata": {"task": "math"}},
    {"prompt_id": "b", "messages": [{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": "Hi"}]},
]


def _write(path: Path, rows: list[dict]) -> Path:
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows))
    elif path.suffix == ".csv":
        with path.open("w", newline="") as fh:
            cols = sorted({k for r in rows for k in r})
            writer = csv.DictWriter(fh, fieldnames=cols)
            writer.writeheader()
            for r in rows:
                writer.writerow({k: json.dumps(v) if isinstance(v, list | dict) else v
                                 for k, v in r.items()})
    elif path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist([{**r, "messages": json.dumps(r.get("messages"))
                                              if r.get("messages") else None,
                                              "metadata": json.dumps(r.get("metadata", {}))}
                                             for r in rows]), path)
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv", ".parquet"])
def test_every_file_format_reads_the_same_prompts(tmp_path: Path, suffix: str) -> None:
    result = read_prompts(_write(tmp_path / f"p{suffix}", ROWS))
    assert result.rejects == [] and result.rows == 2
    a, b = result.items
    assert (a.prompt_id, a.text, a.reference, a.metadata) == ("a", "What is 2+2?", "4",
                                                              {"task": "math"})
    assert [m.role for m in b.messages] == ["system", "user"] and b.text is None


def test_saved_dataset_and_custom_mapping(tmp_path: Path) -> None:
    ds = datasets.Dataset.from_list([{"question": "Q1", "answer": "A1", "id": 7, "lang": "en"}])
    ds.save_to_disk(str(tmp_path / "ds"))
    mapping = ColumnMapping(text="question", reference="answer", prompt_id="id",
                            metadata_columns=["lang"])
    (p,) = read_prompts(tmp_path / "ds", mapping).items
    assert (p.prompt_id, p.text, p.reference, p.metadata) == ("7", "Q1", "A1", {"lang": "en"})


def test_bad_rows_become_rejects_naming_file_row_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([
        json.dumps({"prompt": "fine"}),
        json.dumps({"text": "no prompt column"}),                 # missing prompt
        "{not json",                                               # invalid JSON line
        json.dumps({"prompt": 42}),                                # wrong type
        json.dumps({"messages": [{"role": "robot", "content": "x"}]}),  # bad role
        json.dumps({"prompt": "fine"}),                            # same prompt as row 1
        json.dumps(["a list"]),                                     # not an object
    ]) + "\n")
    result = read_prompts(path)
    assert [p.text for p in result.items] == ["fine"]
    assert result.rows == 7 and len(result.rejects) == 6
    by_row = {r.row: r for r in result.rejects}
    assert set(by_row) == {2, 3, 4, 5, 6, 7}
    assert all(r.source == str(path) for r in result.rejects)
    assert "no prompt" in by_row[2].reason and by_row[2].field
    assert "invalid JSON" in by_row[3].reason
    assert by_row[4].field == "prompt" and "must hold text, got int" in by_row[4].reason
    assert by_row[5].field == "messages" and "role" in by_row[5].reason
    assert "same prompt as row 1" in by_row[6].reason
    line = by_row[4].one_line()
    assert str(path) in line and "row 4" in line and "'prompt'" in line


def test_unknown_column_in_mapping_rejects_each_row(tmp_path: Path) -> None:
    path = _write(tmp_path / "p.jsonl", ROWS[:1])
    result = read_prompts(path, ColumnMapping(text="question", messages=None,
                                              metadata_columns=[]))
    (reject,) = result.rejects
    assert reject.row == 1 and reject.field == "question" and "question" in reject.reason
    result = read_prompts(path, ColumnMapping(metadata_columns=["nope"]))
    assert result.rejects[0].field == "nope"


@pytest.mark.parametrize("name,content,match", [
    ("missing.jsonl", None, "file not found"),
    ("empty.jsonl", "", "no rows"),
    ("blank.jsonl", "\n\n", "no rows"),
    ("wrong.txt", "hello", "unknown format"),
    ("broken.json", "{", "not valid JSON"),
    ("scalar.json", "3", "expected a JSON list"),
    ("broken.parquet", "not parquet", "cannot read as Parquet"),
])
def test_unusable_files_raise_one_clear_error(tmp_path: Path, name: str, content: str | None,
                                              match: str) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(InputFileError, match=match):
        read_prompts(path)
