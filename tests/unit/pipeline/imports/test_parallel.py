"""A JSON Lines file read in ranges, a process each (:mod:`grouppref.pipeline.imports.parallel`),
gives what one read of the whole file gives: the same groups in the same order, the same
rejects in the same order, the same counts and stats; the stage writes the same bytes. The
files are cut into many small ranges, so that every kind of row meets a cut: the hostile
corpus, its prompts read again in later ranges (a prompt repeated across ranges, the repeat of
a repeat, a prompt id taken in an earlier range, an id freed because the row that took it in
its own range is itself a repeat), and an UltraFeedback file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from grouppref.errors import InputFileError
from grouppref.pipeline.imports.config import STAGE, ImportConfig
from grouppref.pipeline.imports.layouts.raw_groups import Imported
from grouppref.pipeline.imports.parallel import plan, read_parallel
from grouppref.pipeline.imports.stage import read_import, run_import
from grouppref.readers import lines
from grouppref.runs.store import RunStore
from tests.support.equivalence import hostile_files
from tests.support.paths import REPO
from tests.support.stage_files import assert_same_stage

QUESTION = "\n\nHuman: {}\n\nAssistant:"


def _row(question: str, **more: Any) -> dict[str, Any]:
    answers = [{"answer": f"{question} {a}", "model": "m", "rank": r}
               for a, r in (("Yes.", 1.0), ("No.", 2.0), ("Maybe.", 3.0))]
    return {"prompt": QUESTION.format(question), "answers": answers, **more}


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().removeprefix(b"\xef\xbb\xbf").splitlines()


def _write(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _dumped(*rows: dict[str, Any]) -> list[bytes]:
    return [json.dumps(r).encode() for r in rows]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    folder = tmp_path_factory.mktemp("parallel")
    hostile = hostile_files(folder / "hostile")["nectar_hostile"]
    lines = _lines(hostile)
    early = _dumped(_row("First?", prompt_id="q"), _row("Taken?", prompt_id="t"),
                    _row("Short?", answers=[{"answer": "Only.", "rank": 1.0}]))
    late = _dumped(
        _row("First?", prompt_id="p"),  # the prompt of an earlier range, under another id
        _row("Other?", prompt_id="p"),  # id p is free in the whole file: row above repeats
        _row("Taken, other prompt?", prompt_id="t"),  # id t was taken in an earlier range
        _row("Short?"),  # its first row was rejected (one answer), its prompt still read
        _row("First?"))  # the repeat of a repeat
    # each row its own range at 7 parts: row 2 loses id p to row 1; row 3, the same prompt
    # as row 2, is the first of it; row 4 repeats row 3 (row 3 decides it and is not read
    # again: it must count as read after row 2, not before)
    crossed = _dumped(_row("Zero?", prompt_id="p"), _row("Kay?", prompt_id="p"),
                      _row("Kay?", prompt_id="q"), _row("Kay?"))
    uf = REPO / "examples" / "data" / "import" / "ultrafeedback.jsonl"
    return {
        "hostile": (hostile, "nectar"),
        "repeated": (_write(folder / "repeated.jsonl", [*early, *lines, *late, *lines, *late]),
                     "nectar"),
        "crossed": (_write(folder / "crossed.jsonl", crossed), "nectar"),
        "ultrafeedback": (_write(folder / "uf.jsonl", [*_lines(uf), b"", *_lines(uf)]),
                          "ultrafeedback"),
    }


def _assert_same(got: Imported, want: Imported) -> None:
    assert got.table.equals(want.table)
    assert got.table.to_pylist() == want.table.to_pylist()
    assert got.group_rows == want.group_rows
    assert [r.model_dump() for r in got.rejects] == [r.model_dump() for r in want.rejects]
    assert (got.rows, got.blank, got.reading, got.stats) == (
        want.rows, want.blank, want.reading, want.stats)
    assert got.counts == want.counts


@pytest.mark.parametrize("name", ["hostile", "repeated", "crossed", "ultrafeedback"])
@pytest.mark.parametrize("parts", [2, 7])
def test_a_file_read_in_ranges_gives_what_one_read_gives(
        files: dict[str, tuple[Path, str]], name: str, parts: int) -> None:
    path, layout = files[name]
    config = ImportConfig(source=str(path), layout=layout, workers=parts)
    ranges = plan(config, layout, range_bytes=1)
    assert ranges is not None and 1 < len(ranges) <= parts
    got = read_parallel(config, layout, STAGE, ranges)
    assert got is not None
    want = read_import(config.model_copy(update={"workers": 1}))
    _assert_same(got, want)
    if name == "repeated":  # rows were read again: the cut separates prompts and repeats
        assert any("same prompt as row 1 " in r.reason for r in want.rejects)
        assert any("first seen at row 2 " in r.reason for r in want.rejects)
    if name == "crossed":
        assert [r.row for r in want.rejects] == [2, 4]
        assert want.rejects[0].reason.startswith("duplicate prompt_id 'p' with a different")
        assert want.rejects[1].reason.startswith("same prompt as row 3 ")


def test_the_ranges_cut_between_lines_and_count_them(files: dict[str, tuple[Path, str]]
                                                    ) -> None:
    path, layout = files["repeated"]
    config = ImportConfig(source=str(path), layout=layout, workers=5)
    ranges = plan(config, layout, range_bytes=1)
    assert ranges is not None
    data = path.read_bytes()
    assert ranges[0].start == 0 and ranges[-1].end == len(data)
    for before, after in zip(ranges, ranges[1:], strict=False):
        assert before.end == after.start and data[after.start - 1 : after.start] == b"\n"
        assert after.first_row == data[: after.start].count(b"\n") + 1


def test_a_file_of_which_no_line_decodes_is_refused_as_one_read_refuses_it(
        tmp_path: Path) -> None:
    path = _write(tmp_path / "latin1.jsonl",
                  [json.dumps({"prompt": "x", "answers": []}).encode()[:-1] + "é}".encode(
                      "latin-1") for _ in range(6)])
    config = ImportConfig(source=str(path), layout="nectar", workers=3)
    ranges = plan(config, "nectar", range_bytes=1)
    assert ranges is not None
    with pytest.raises(InputFileError) as whole:
        read_import(config.model_copy(update={"workers": 1}))
    with pytest.raises(InputFileError) as in_parts:
        read_parallel(config, "nectar", STAGE, ranges)
    assert str(in_parts.value) == str(whole.value)


def test_only_a_plain_jsonl_file_of_a_layout_of_one_row_per_group_is_read_in_ranges(
        files: dict[str, tuple[Path, str]], tmp_path: Path) -> None:
    path, _ = files["repeated"]

    def ranges(source: Path, layout: str = "nectar", **settings: Any) -> bool:
        config = ImportConfig(source=str(source), layout=layout,
                              **{"workers": 4, **settings})
        return plan(config, layout, range_bytes=1) is not None

    assert ranges(path)
    assert not ranges(path, workers=1)
    assert not ranges(path, layout="responses")  # rows of one prompt merge
    assert not ranges(path, mapping={"duplicate_ids": "reject_all"})  # a later row retracts
    as_json = tmp_path / "rows.json"
    as_json.write_bytes(path.read_bytes())
    assert not ranges(as_json)
    listed = tmp_path / "listed.jsonl"
    listed.write_text(json.dumps([_row("A list?")]), encoding="utf-8")
    assert not ranges(listed)
    config = ImportConfig(source=str(path), layout="nectar", workers=4)
    assert plan(config, "nectar") is None  # smaller than a range of the default size


def test_the_stage_writes_the_same_bytes_in_ranges(files: dict[str, tuple[Path, str]],
                                                  tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path, _ = files["repeated"]
    runs = {}
    for workers in (1, 3):
        monkeypatch.setattr(lines, "RANGE_BYTES", 1)
        store = RunStore(tmp_path / f"w{workers}")
        run_import(store, ImportConfig(source=str(path), layout="nectar", workers=workers,
                                       shard_size=4))
        runs[workers] = store.stage_dir(STAGE)
    assert_same_stage(runs[1], runs[3])


def test_the_ranges_report_the_bytes_they_read(files: dict[str, tuple[Path, str]],
                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Each process reports its range's bytes as it reads (here after every 64 bytes) and at
    its end; the stage's bar, printed once where stderr is not a terminal, ends at the whole
    file."""
    path, _ = files["repeated"]
    monkeypatch.setattr(lines, "RANGE_BYTES", 1)
    monkeypatch.setattr(lines, "REPORT_BYTES", 64)
    seen: list[int] = []
    follow = lines._follow

    def spy(futures: Any, done: Any, total: int, name: str) -> None:
        follow(futures, done, total, name)
        seen.extend([total, sum(done)])

    monkeypatch.setattr(lines, "_follow", spy)
    run_import(RunStore(tmp_path / "run"), ImportConfig(source=str(path), layout="nectar",
                                                         workers=3))
    assert seen == [path.stat().st_size] * 2
    bar = [line for line in capsys.readouterr().err.splitlines() if line.startswith(STAGE)]
    size = f"{path.stat().st_size / 1000:.1f}/{path.stat().st_size / 1000:.1f} kB"
    assert len(bar) == 1 and size in bar[0], bar
