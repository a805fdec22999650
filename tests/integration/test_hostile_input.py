"""Hostile and careless input (issue 15, "Input files and configs"), each input built here:
bytes that are not UTF-8 (a reject per line, or one line and exit 2 for a file that is not
UTF-8 text at all: binary, UTF-16, Latin-1 throughout), a UTF-8 BOM in every text format and
in configs, blank lines counted, duplicate prompt ids, reject wording, every reject naming
its file and row, and ``train`` on data that is not group data."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import datasets
import pytest

from grouppref.config import read_config_file
from grouppref.errors import ConfigError, InputFileError
from grouppref.pipeline.imports.config import ImportConfig
from grouppref.pipeline.imports.layouts.raw_groups import collect_rows
from grouppref.pipeline.imports.stage import context, read_import, run_import
from grouppref.readers.mapping import ColumnMapping
from grouppref.readers.prompts import read_prompts
from grouppref.runs.store import RunStore
from grouppref.train.data.sources import load_groups
from tests.support.cli import grouppref_here as grouppref  # cli.main() in this process (tests/support/cli.py)
from tests.support.paths import REPO

BOM = b"\xef\xbb\xbf"
ROOT = REPO


def jsonl_bytes(*rows: dict) -> list[bytes]:
    return [json.dumps(r, ensure_ascii=False).encode("utf-8") for r in rows]


# -- bytes that are not UTF-8 ------------------------------------------------------------------
def test_a_line_that_is_not_utf8_is_a_reject_the_rest_is_read(tmp_path: Path) -> None:
    good = jsonl_bytes({"prompt": "Café?"}, {"prompt": "Tea?"})
    latin1 = '{"prompt": "Crème brûlée?"}'.encode("latin-1")
    path = tmp_path / "p.jsonl"
    path.write_bytes(b"\n".join([good[0], latin1, good[1]]) + b"\n")
    result = read_prompts(path)
    assert [p.text for p in result.items] == ["Café?", "Tea?"]
    (reject,) = result.rejects
    assert (reject.source, reject.row) == (str(path), 2)
    assert "not valid UTF-8: byte 0xE8 at column 15" in reject.reason and "iconv" in reject.reason


@pytest.mark.parametrize("name,content,needle", [
    ("utf16.jsonl", '{"prompt": "hi"}\n'.encode("utf-16"), "UTF-16 little-endian text"),
    ("utf16be.csv", b"\xfe\xff" + "prompt\nhi\n".encode("utf-16-be"), "UTF-16 big-endian"),
    ("random.jsonl", bytes(range(256)) * 8, "not a text file: NUL byte"),
    ("nobom16.json", '[{"prompt": "hi"}]'.encode("utf-16-le"), "not a text file: NUL byte"),
    ("latin1.jsonl", '{"prompt": "Crème"}\n{"prompt": "Déjà"}\n'.encode("latin-1"),
     "not UTF-8 text: none of its 2 rows decodes"),
    ("latin1.csv", "prompt\nCrème\nDéjà\n".encode("latin-1"),
     "not UTF-8 text: none of its 2 rows decodes"),
])
def test_a_file_that_is_not_utf8_text_is_one_line(tmp_path: Path, name: str, content: bytes,
                                                  needle: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(InputFileError, match=needle) as caught:
        read_prompts(path)
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)
    out = grouppref("prompts", path, "--out", tmp_path / "run", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and needle.split(":")[0] in out.stderr


@pytest.mark.slow
def test_every_command_that_reads_a_file_survives_bad_bytes(tmp_path: Path) -> None:
    """prompts, generate --import, import and run: the bad line is a reject, exit 0."""
    rows = jsonl_bytes({"prompt": "Q1", "responses": ["a", "b"]},
                       {"prompt": "Q2", "responses": ["c", "d"]})
    path = tmp_path / "in.jsonl"
    path.write_bytes(rows[0] + b"\n" + b'{"prompt": "\xff\xfe"}\n' + rows[1] + b"\n")
    for args in (["prompts", path, "--out", tmp_path / "r1"],
                 ["generate", "--import", path, "--out", tmp_path / "r2"],
                 ["import", path, "--out", tmp_path / "r3"]):
        out = grouppref(*args, cwd=tmp_path)
        assert out.returncode == 0, (args[0], out.stderr)
        assert "3 in, 2 out, 1 rejected" in out.stdout and "row 2" in out.stderr
    config = tmp_path / "run.yaml"
    config.write_text(f"run_dir: {tmp_path / 'r4'}\nimport: {{source: {path}}}\n"
                      "rank: {rankers: [{kind: rule, checks: [{check: length, target: 5}]}]}\n"
                      "validate: null\nreport: null\naggregate: null\n")
    out = grouppref("run", config, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "r4" / "import" / "manifest.json").read_text())["counts"][
        "rejected"] == 1


@pytest.mark.parametrize("content", [
    b"\x00\x01\x02binary\x00config", "rank: {}\n".encode("utf-16"),
    "run_dir: r\n# caf\xe9\n".encode("latin-1")])
def test_a_config_that_is_not_utf8_text_is_one_line(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(content)
    with pytest.raises(InputFileError, match="cannot read this config file") as caught:
        read_config_file(path)
    assert "\n" not in str(caught.value)
    out = grouppref("run", path, cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


# -- the BOM ------------------------------------------------------------------------------------
def test_a_utf8_bom_is_dropped_in_every_text_format_and_config(tmp_path: Path) -> None:
    rows = [{"prompt_id": "given-1", "prompt": "Hi?"}, {"prompt_id": "given-2", "prompt": "Yo?"}]
    (tmp_path / "p.jsonl").write_bytes(BOM + b"\n".join(jsonl_bytes(*rows)) + b"\n")
    (tmp_path / "p.json").write_bytes(BOM + json.dumps(rows).encode())
    with (tmp_path / "p.csv").open("w", encoding="utf-8-sig", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["prompt_id", "prompt"])
        writer.writeheader()
        writer.writerows(rows)
    assert (tmp_path / "p.csv").read_bytes().startswith(BOM)
    for name in ("p.jsonl", "p.json", "p.csv"):
        result = read_prompts(tmp_path / name)
        assert [p.prompt_id for p in result.items] == ["given-1", "given-2"], name
    for name, text in (("c.yaml", "rank: {device: cpu}\n"), ("c.toml", '[rank]\ndevice = "cpu"\n'),
                       ("c.json", '{"rank": {"device": "cpu"}}')):
        (tmp_path / name).write_bytes(BOM + text.encode())
        assert read_config_file(tmp_path / name) == {"rank": {"device": "cpu"}}, name


# -- blank lines, ids, wording -------------------------------------------------------------------
def test_blank_lines_are_counted_with_a_reason(tmp_path: Path) -> None:
    lines = [json.dumps({"prompt": f"Q{i}"}) for i in range(15)]
    lines[3:3] = ["", "   "]
    lines.append("")
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(lines) + "\n")  # 18 lines: 15 prompts, 3 blank
    result = read_prompts(path)
    assert (result.rows, len(result.items), len(result.rejects)) == (18, 15, 3)
    assert {(r.row, r.reason) for r in result.rejects} == {
        (4, "blank line (skipped)"), (5, "blank line (skipped)"), (18, "blank line (skipped)")}
    out = grouppref("prompts", path, "--out", tmp_path / "run", cwd=tmp_path)
    assert "18 in, 15 out, 3 rejected" in out.stdout
    (tmp_path / "blank.csv").write_text("prompt\nA\n\n,\nB\n")
    csv_result = read_prompts(tmp_path / "blank.csv")
    assert (csv_result.rows, len(csv_result.items)) == (4, 2)
    (tmp_path / "only.jsonl").write_text("\n\n \n")
    with pytest.raises(InputFileError, match=r"no rows \(only 3 blank lines\)"):
        read_prompts(tmp_path / "only.jsonl")


def test_duplicate_prompt_id_with_other_content_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [
        {"prompt_id": "a", "prompt": "First?"}, {"prompt_id": "b", "prompt": "Other?"},
        {"prompt_id": "a", "prompt": "Second?"}, {"prompt_id": "a", "prompt": "First?"}]))
    result = read_prompts(path)
    assert [(p.prompt_id, p.text) for p in result.items] == [("a", "First?"), ("b", "Other?")]
    reasons = {r.row: r.reason for r in result.rejects}
    assert reasons[3].startswith("duplicate prompt_id 'a' with a different prompt; first seen "
                                 "at row 1")
    assert reasons[4] == "same prompt as row 1"
    both = read_prompts(path, ColumnMapping(duplicate_ids="reject_all"))
    assert [p.prompt_id for p in both.items] == ["b"]
    assert {r.row for r in both.rejects} == {1, 3, 4}
    assert "row(s) 3 give the same id" in next(r.reason for r in both.rejects if r.row == 1)


def test_duplicate_prompt_id_never_makes_two_records_in_generate_or_import(tmp_path: Path) -> None:
    rows = [{"prompt_id": "a", "prompt": "First?", "responses": ["x", "y"]},
            {"prompt_id": "a", "prompt": "Second?", "responses": ["z", "w"]}]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    imported = read_import(ImportConfig(source=str(path)))
    assert [g.prompt.prompt_id for g in imported.groups] == ["a"]
    assert "first seen at row 1" in imported.rejects[0].reason and imported.rejects[0].row == 2
    pairs = tmp_path / "pairs.jsonl"  # rows that merge by prompt: ids checked the same way
    pairs.write_text("".join(json.dumps(r) + "\n" for r in [
        {"prompt_id": "p", "prompt": "A?", "chosen": "1", "rejected": "2"},
        {"prompt_id": "p", "prompt": "B?", "chosen": "3", "rejected": "4"}]))
    got = read_import(ImportConfig(source=str(pairs), mapping={"duplicate_ids": "reject_all"}))
    assert got.groups == [] and {r.row for r in got.rejects} == {1, 2}
    out = grouppref("generate", "--import", path, "--out", tmp_path / "run", cwd=tmp_path)
    assert out.returncode == 0 and "2 in, 1 out, 1 rejected" in out.stdout


def test_reject_wording(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join([
        json.dumps({"prompt": ""}),
        json.dumps({"prompt": "Ok?", "metadata": {"score": math.nan}}),
        '{"prompt": "unterminated}',
        json.dumps({"prompt": "Ok 2?", "metadata": {"tags": ["a"]}}),
        json.dumps({"prompt": "Ok 3?", "metadata": {"note": None}}),
    ]) + "\n")
    reasons = {r.row: r.reason for r in read_prompts(path).rejects}
    assert reasons[1] == "empty prompt: column 'prompt' is empty"
    assert reasons[2] == "metadata 'score' is nan; metadata numbers must be finite"
    assert reasons[3] == "invalid JSON: Unterminated string starting at column 12"
    assert "at at" not in reasons[3]
    assert reasons[4].startswith("metadata 'tags' is a list; metadata values are str/int")
    assert reasons[5].startswith("metadata 'note' is null")


@pytest.mark.slow
def test_a_prompt_too_long_for_the_model_is_a_reject_naming_file_and_row(
        tmp_path: Path, tiny_lm_dir: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "Hi?"}) + "\n" +
                    json.dumps({"prompt": "word " * 600}) + "\n")
    out = grouppref("generate", "--prompts", path, "--model", f"{tiny_lm_dir}:2",
                    "--max-new-tokens", "4", "--out", tmp_path / "run", "--quiet",
                    "--no-chat-template", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    (reject,) = [json.loads(line) for line in
                 (tmp_path / "run" / "generate" / "rejects.jsonl").read_text().splitlines()]
    assert (reject["source"], reject["row"]) == (str(path), 2)


# -- train on data that is not group data -------------------------------------------------------
def test_train_on_a_prompts_dataset_or_a_local_file_says_so_in_one_line(tmp_path: Path) -> None:
    prompts = datasets.Dataset.from_list([{"prompt": f"Q{i}"} for i in range(7)])
    prompts.save_to_disk(str(tmp_path / "prompts"))
    columns = r"neither grouppref groups .* nor TRL pairs .*; its columns are \['prompt'\]"
    with pytest.raises(InputFileError, match=columns):
        load_groups(tmp_path / "prompts")
    local = tmp_path / "groups.json"
    local.write_text(json.dumps([{"prompt": "Q"}]))
    with pytest.raises(InputFileError, match=columns):
        load_groups(local)  # read as a file: never looked up on the Hub
    out = grouppref("train", local, "--out", tmp_path / "model", cwd=tmp_path)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "nor TRL pairs" in out.stderr and "its columns are ['prompt']" in out.stderr


def test_a_run_whose_import_rejects_every_row_stops_in_one_line(tmp_path: Path) -> None:
    source = tmp_path / "bad.jsonl"
    source.write_text(json.dumps({"question": "no prompt here"}) + "\n")
    config = tmp_path / "run.yaml"
    config.write_text(f"run_dir: {tmp_path / 'run'}\nimport: {{source: {source}, "
                      "layout: responses}\n")
    out = grouppref("run", config, cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    (error,) = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert "import: all 1 input rows were rejected; most common reason (1 of 1): no responses" \
        in error
    assert not (tmp_path / "run" / "aggregate").exists()


# -- JSON beyond Python's limits, CSV headers and long fields ------------------------------------
def test_json_nested_too_deeply_or_a_huge_number_is_a_reject_not_a_traceback(
        tmp_path: Path) -> None:
    deep = '{"prompt": "Deep?", "metadata": {"x": ' + "[" * 100_000 + "]" * 100_000 + "}}"
    huge = '{"prompt": "Huge?", "metadata": {"n": 1' + "0" * 5000 + "}}"
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join([json.dumps({"prompt": "Fine?"}), deep, huge]) + "\n")
    result = read_prompts(path)
    assert [p.text for p in result.items] == ["Fine?"]
    assert {r.row: r.reason for r in result.rejects} == {
        2: "invalid JSON: lists or objects nested too deeply",
        3: "invalid JSON: a number with more than 4300 digits"}
    whole = tmp_path / "p.json"
    whole.write_text("[" + deep + "]")
    with pytest.raises(InputFileError, match=r"p\.json: not valid JSON \(lists or objects nested "
                                             r"too deeply\)$"):
        read_prompts(whole)
    cell = tmp_path / "p.csv"  # a JSON-looking CSV cell that cannot be decoded stays text
    cell.write_text("prompt,messages\n,\"" + "[" * 100_000 + "\"\n")
    (reject,) = read_prompts(cell).rejects
    assert reject.row == 1


@pytest.mark.parametrize("suffix,text", [
    (".yaml", "rank: " + "[" * 50_000 + "]" * 50_000 + "\n"),
    (".json", '{"rank": ' + "[" * 50_000 + "]" * 50_000 + "}"),
    (".toml", "rank = " + "[" * 50_000 + "]" * 50_000 + "\n")])
def test_a_config_nested_too_deeply_is_one_line(tmp_path: Path, suffix: str, text: str) -> None:
    path = tmp_path / f"c{suffix}"
    path.write_text(text)
    with pytest.raises(InputFileError, match="cannot parse \\(lists or mappings nested too "
                                             "deeply\\)"):
        read_config_file(path)


def test_csv_long_fields_are_read_and_a_repeated_header_is_one_line(tmp_path: Path) -> None:
    long = "word " * 60_000  # 300 KB: over the csv module's default field limit (128 KiB)
    path = tmp_path / "p.csv"
    with path.open("w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([["prompt"], ["Short?"], [long]])
    assert [len(p.text) for p in read_prompts(path).items] == [6, len(long)]
    twice = tmp_path / "twice.csv"
    twice.write_text("prompt,prompt_id,prompt\nA?,a,B?\n")
    with pytest.raises(InputFileError, match=r"names column\(s\) \['prompt'\] more than once"):
        read_prompts(twice)
    out = grouppref("prompts", twice, "--out", tmp_path / "run", cwd=tmp_path)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1


# -- import rows of the wrong shape ------------------------------------------------------------
def test_import_rows_of_the_wrong_shape_are_rejects_with_their_reason(tmp_path: Path) -> None:
    """UltraFeedback ``annotations`` that are no object, a bare rating, NaN pair scores."""
    def completion(response: str, annotations: object) -> dict:
        return {"model": "m", "response": response, "annotations": annotations,
                "overall_score": 1.0}
    rows = [{"instruction": "Q1?", "completions": [
                completion("a", [1]), completion("b", {"helpfulness": {"Rating": "4"}}),
                completion("c", {"helpfulness": {"Rating": "2"}})]},
            {"instruction": "Q2?", "completions": [
                completion("d", {"helpfulness": "5"}), completion("e", {"helpfulness": "3"})]}]
    path = tmp_path / "uf.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = read_import(ImportConfig(source=str(path), layout="ultrafeedback"))
    by_prompt = {g.prompt.text: g for g in got.groups}
    (reject,) = got.rejects
    assert (reject.row, reject.field) == (1, "completions[0].annotations")
    assert reject.reason.startswith("'annotations' must be an object of aspects")
    q1 = by_prompt["Q1?"]
    (ranking,) = q1.rankings  # the completion without aspects is left out of the ranking
    texts = {c.candidate_id: c.text for c in q1.candidates}
    assert [[texts[c] for c in tier] for tier in ranking.tiers] == [["b"], ["c"]]
    (bare,) = by_prompt["Q2?"].rankings  # a bare rating counts as the aspect's Rating
    assert sorted(bare.scores.values()) == [3.0, 5.0]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"prompt": "P?", "chosen": "x", "rejected": "y",
                                 "score_chosen": math.nan, "score_rejected": 1.0}) + "\n")
    (group,) = read_import(ImportConfig(source=str(pairs), layout="pairs")).groups
    (pair,) = group.rankings
    assert pair.scores is None and len(pair.tiers) == 2  # the comparison kept, NaN not


def test_a_shape_no_layout_check_foresaw_is_a_row_reject_not_a_traceback() -> None:
    """The row driver's backstop: an unforeseen shape error in a layout rejects that row only."""
    ctx = context(ImportConfig(source="x.jsonl", layout="responses"), "responses", "x.jsonl",
                  "import")

    def add(row: dict, number: int, ctx: object, grouper: object, rejects: list) -> None:
        row["responses"].get("text")  # a list where a layout expected an object

    out = collect_rows(iter([(1, {"responses": [1]})]), ctx, add, merge=False)
    (reject,) = out.rejects
    assert (reject.source, reject.row, reject.scope) == ("x.jsonl", 1, "row")
    assert reject.reason.startswith("unexpected shape for layout 'responses' (AttributeError: "
                                    "'list' object has no attribute 'get')")


def test_a_run_directory_that_cannot_be_one_is_one_line(tmp_path: Path) -> None:
    source = ROOT / "examples" / "data" / "import" / "nectar.jsonl"
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a run\n")
    config = ImportConfig(source=str(source), layout="nectar")
    with pytest.raises(ConfigError, match=r"notes\.txt: not a directory; the run directory"):
        run_import(RunStore(a_file), config)
    with pytest.raises(ConfigError, match=r"cannot create the run directory \(Not a directory\)"):
        run_import(RunStore(a_file / "run"), config)
    out = grouppref("import", source, "--out", a_file, cwd=tmp_path)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert a_file.read_text() == "not a run\n"
