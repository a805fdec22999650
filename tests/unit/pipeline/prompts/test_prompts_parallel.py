"""A JSON Lines prompt file read in ranges, a process each
(:mod:`grouppref.pipeline.prompts.parallel`), gives what one read of the whole file gives: the
same prompts in the same order, the same rejects in the same order, the same counts; the stage
writes the same bytes. The files are cut into many small ranges: the hostile corpus (CRLF
line ends, a BOM, blank lines, bytes that are not UTF-8, bad JSON, reused ids), and the same
rows again after it, so that prompts and ids meet their first rows across cuts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grouppref.errors import InputFileError
from grouppref.pipeline.prompts.config import STAGE, PromptsConfig
from grouppref.pipeline.prompts.parallel import plan, read_parallel
from grouppref.pipeline.prompts.stage import run_prompts
from grouppref.readers import lines
from grouppref.readers.prompts import read_prompts
from grouppref.runs.store import RunStore
from grouppref.schemas import Prompt
from grouppref.schemas.arrow import to_table
from tests.support.equivalence import hostile_files
from tests.support.stage_files import assert_same_stage


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("prompts_parallel")
    hostile = hostile_files(folder / "hostile")["prompts_hostile"]
    body = hostile.read_bytes()
    twice = folder / "twice.jsonl"
    twice.write_bytes(body + body.removeprefix(b"\xef\xbb\xbf") + b'{"prompt_id": "b", '
                      b'"prompt": "Tea, again?"}\r\n{"prompt": "New?"}\r\n')
    return {"hostile": hostile, "twice": twice}


@pytest.mark.parametrize("name", ["hostile", "twice"])
@pytest.mark.parametrize("parts", [2, 7])
def test_a_prompt_file_read_in_ranges_gives_what_one_read_gives(
        files: dict[str, Path], name: str, parts: int, tmp_path: Path) -> None:
    config = PromptsConfig(source=str(files[name]), workers=parts)
    ranges = plan(config, range_bytes=1)
    assert ranges is not None and len(ranges) == parts
    got = read_parallel(config, ranges, tmp_path / "parts")
    want = read_prompts(config.source, config.mapping, stage=STAGE)
    assert got.table.equals(to_table(want.items, Prompt))
    assert [r.model_dump() for r in got.rejects] == [r.model_dump() for r in want.rejects]
    assert (got.rows, got.blank) == (want.rows, want.blank)
    assert not list((tmp_path / "parts").iterdir())  # the processes' files are gone
    if name == "twice":
        reasons = [r.reason for r in want.rejects]
        assert "same prompt as row 1" in reasons  # a prompt met again across the cuts
        assert any("'b' with a different prompt; first seen at row 2 " in r for r in reasons)


def test_a_file_of_no_rows_or_no_text_is_refused_as_one_read_refuses_it(tmp_path: Path
                                                                        ) -> None:
    blank = tmp_path / "blank.jsonl"
    blank.write_bytes(b"\n" * 40)
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(b"".join(json.dumps({"prompt": "x"}).encode()[:-2] + "é\"}\n".encode(
        "latin-1") for _ in range(8)))
    for path in (blank, latin1):
        config = PromptsConfig(source=str(path), workers=3)
        ranges = plan(config, range_bytes=1)
        assert ranges is not None
        with pytest.raises(InputFileError) as whole:
            read_prompts(path)
        with pytest.raises(InputFileError) as in_parts:
            read_parallel(config, ranges, tmp_path / "parts")
        assert str(in_parts.value) == str(whole.value)


def test_a_utf16_file_is_refused_before_it_is_cut(tmp_path: Path) -> None:
    utf16 = tmp_path / "utf16.jsonl"
    utf16.write_bytes("".join(json.dumps({"prompt": f"Q{i}?"}) + "\n" for i in range(50))
                      .encode("utf-16"))
    with pytest.raises(InputFileError) as whole:
        read_prompts(utf16)
    with pytest.raises(InputFileError) as in_parts:
        plan(PromptsConfig(source=str(utf16), workers=3), range_bytes=1)
    assert str(in_parts.value) == str(whole.value) and "UTF-16" in str(whole.value)


def test_a_limit_or_reject_all_reads_in_one_process(files: dict[str, Path]) -> None:
    source = str(files["twice"])
    assert plan(PromptsConfig(source=source, workers=3), range_bytes=1) is not None
    assert plan(PromptsConfig(source=source, workers=3, limit=5), range_bytes=1) is None
    assert plan(PromptsConfig(source=source, workers=3,
                              mapping={"duplicate_ids": "reject_all"}), range_bytes=1) is None
    assert plan(PromptsConfig(source=source, workers=3)) is None  # smaller than a range


def test_the_stage_writes_the_same_bytes_in_ranges(files: dict[str, Path], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lines, "RANGE_BYTES", 1)
    written = {}
    for workers in (1, 4):
        store = RunStore(tmp_path / f"w{workers}" / "run")
        run_prompts(store, PromptsConfig(source=str(files["twice"]), workers=workers))
        written[workers] = store.stage_dir(STAGE)
        assert not (written[workers] / "parts").exists()
    assert_same_stage(written[1], written[4])
