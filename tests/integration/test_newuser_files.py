"""A team's own data as it arrives: compressed JSON Lines and CSV, TSV, a folder in the Hub's
layout (a cloned dataset repository), misspelt score options. The files are in
``tests/data/newuser/``, hand-written in the published schemas (TRL pairs, nvidia/HelpSteer2);
the compressed and Parquet forms are made from them with the standard tools' libraries."""

from __future__ import annotations

import bz2
import gzip
import importlib.util
import json
import lzma
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow.json as pa_json
import pyarrow.parquet as pq
import pytest

from grouppref.errors import InputFileError
from grouppref.pipeline.imports.config import ImportConfig
from grouppref.pipeline.imports.layouts.raw_groups import Imported
from grouppref.pipeline.imports.stage import read_import
from grouppref.readers.rows import iter_rows
from tests.support.paths import REPO, TEST_DATA

DATA = TEST_DATA / "newuser"
PAIRS = DATA / "trl_pairs.jsonl"
COMPRESSORS: dict[str, Callable[[bytes], bytes]] = {
    ".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}


def summary(imported: Imported) -> tuple[list[str], list[list[str]], int]:
    """What an import made, independent of the file it came from: prompts, candidate texts,
    number of rankings."""
    groups = sorted(imported.groups, key=lambda g: g.prompt.text or "")
    return ([g.prompt.text or "" for g in groups],
            [sorted(c.text for c in g.candidates) for g in groups],
            sum(len(g.rankings) for g in groups))


@pytest.mark.parametrize("suffix", list(COMPRESSORS))
@pytest.mark.parametrize("name", ["trl_pairs.jsonl", "helpsteer2.tsv"])
def test_a_compressed_file_reads_as_the_plain_one(tmp_path: Path, name: str, suffix: str) -> None:
    packed = tmp_path / (name + suffix)
    packed.write_bytes(COMPRESSORS[suffix]((DATA / name).read_bytes()))
    plain, got = (read_import(ImportConfig(source=str(p))) for p in (DATA / name, packed))
    assert summary(got) == summary(plain)
    assert got.stats["layout"] == plain.stats["layout"]
    assert got.rows == plain.rows == 5 and got.rejects == plain.rejects == []


def test_a_zstandard_file_reads_or_names_the_package(tmp_path: Path) -> None:
    packed = tmp_path / "pairs.jsonl.zst"
    if importlib.util.find_spec("zstandard") is None:
        packed.write_bytes(b"\x28\xb5\x2f\xfd")  # the zstd magic number: never opened
        with pytest.raises(InputFileError, match="pip install zstandard"):
            read_import(ImportConfig(source=str(packed)))
        return
    import zstandard

    packed.write_bytes(zstandard.ZstdCompressor().compress(PAIRS.read_bytes()))
    assert summary(read_import(ImportConfig(source=str(packed)))) == \
        summary(read_import(ImportConfig(source=str(PAIRS))))


def test_a_broken_compressed_file_is_one_line_naming_it(tmp_path: Path) -> None:
    cut = tmp_path / "pairs.jsonl.gz"
    cut.write_bytes(gzip.compress(PAIRS.read_bytes())[:40])  # a download cut short
    result = subprocess.run([sys.executable, "-m", "grouppref", "import", str(cut), "--out",
                             str(tmp_path / "run")], capture_output=True, text=True, check=False)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert "cannot decompress it as .gz" in result.stderr and result.stdout == ""


def test_helpsteer2_as_tsv(tmp_path: Path) -> None:
    imported = read_import(ImportConfig(source=str(DATA / "helpsteer2.tsv")))
    assert imported.stats["layout"] == "helpsteer2" and imported.rejects == []
    by_prompt = {g.prompt.text: g for g in imported.groups}
    assert set(by_prompt) == {"c#", "Écris « bonjour »."}
    french = by_prompt["Écris « bonjour »."]
    helpfulness = next(r for r in french.rankings if r.annotator.id == "helpfulness")
    assert len(helpfulness.tiers) == 1 and len(helpfulness.tiers[0]) == 2  # 4 = 4: a tie
    assert "C# is a language; it compiles to bytecode for the .NET runtime." in \
        {c.text for c in by_prompt["c#"].candidates}  # the quoted cell, unquoted


def _as_parquet(folder: Path) -> None:
    """Each JSON Lines data file of ``folder`` replaced by a Parquet file of the same rows."""
    for name in folder.glob("data/*.jsonl"):
        pq.write_table(pa_json.read_json(name), name.with_suffix(".parquet"))
        name.unlink()


@pytest.mark.parametrize("files", ["jsonl", "parquet"])
def test_a_folder_in_the_hub_layout_reads_by_split(tmp_path: Path, files: str) -> None:
    folder = tmp_path / "prefs"
    shutil.copytree(DATA / "hub", folder)
    if files == "parquet":
        _as_parquet(folder)
    train = read_import(ImportConfig(source=str(folder)))
    assert train.stats["layout"] == "pairs" and train.rows == 3 and train.rejects == []
    assert sorted(g.prompt.text for g in train.groups) == ["Name a colour.", "What is 2+2?"]
    test = read_import(ImportConfig(source=str(folder), split="test"))
    assert [g.prompt.text for g in test.groups] == ["Name a fruit."]
    with pytest.raises(InputFileError, match=r"no split 'validation'; it has \['train', 'test'\]"):
        read_import(ImportConfig(source=str(folder), split="validation"))


def test_rows_of_a_split_in_several_files_are_numbered_across_them(tmp_path: Path) -> None:
    folder = tmp_path / "prefs"
    (folder / "data").mkdir(parents=True)
    lines = PAIRS.read_text(encoding="utf-8").splitlines(keepends=True)
    (folder / "data" / "train-00000-of-00002.jsonl").write_text("".join(lines[:2]), "utf-8")
    (folder / "data" / "train-00001-of-00002.jsonl").write_text("".join(lines[2:]), "utf-8")
    numbered = list(iter_rows(folder))
    assert [n for n, _ in numbered] == [1, 2, 3, 4, 5]
    assert [row["prompt"] for _, row in numbered] == \
        [json.loads(line)["prompt"] for line in lines]


def test_a_folder_of_no_data_files_names_what_it_reads(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputFileError, match="not a dataset folder grouppref can read.*"
                       "data/train-00000-of-00001.parquet"):
        read_import(ImportConfig(source=str(tmp_path / "empty")))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("nothing here\n", encoding="utf-8")
    with pytest.raises(InputFileError, match=r"unknown format '\.txt'; use one of .*\.tsv"):
        read_import(ImportConfig(source=str(tmp_path / "notes")))


@pytest.mark.parametrize(("example", "option", "value", "named"), [
    ("ultrafeedback.jsonl", "scores", ["overall"], "'overall'"),
    ("nectar.jsonl", "rank_key", "ranking", "'ranking'")])
def test_a_misspelt_score_field_is_a_reject_not_silence(example: str, option: str,
                                                        value: object, named: str) -> None:
    source = REPO / "examples" / "data" / "import" / example
    imported = read_import(ImportConfig(source=str(source), **{option: value}))
    assert all(not g.rankings for g in imported.groups) and imported.groups
    reasons = {r.reason for r in imported.rejects}
    assert len(imported.rejects) == imported.rows  # one per row, naming the option
    assert all(f"no response has {named}" in r and "see --" in r for r in reasons)


def test_json_lines_named_json_and_a_json_list_named_jsonl(tmp_path: Path) -> None:
    """As ``datasets`` reads them: the file's content decides, not only its suffix."""
    rows = [json.loads(line) for line in PAIRS.read_text(encoding="utf-8").splitlines()]
    lines_as_json = tmp_path / "pairs.json"
    lines_as_json.write_bytes(PAIRS.read_bytes())
    list_as_jsonl = tmp_path / "pairs.jsonl.gz"
    list_as_jsonl.write_bytes(gzip.compress(json.dumps(rows, indent=2).encode()))
    want = summary(read_import(ImportConfig(source=str(PAIRS))))
    for path in (lines_as_json, list_as_jsonl):
        got = read_import(ImportConfig(source=str(path)))
        assert summary(got) == want and got.rows == 5 and got.rejects == []
    lists = tmp_path / "lists.jsonl"  # a list per line is still a reject per line
    lists.write_text("[1, 2]\n[3]\n", encoding="utf-8")
    assert [(n, type(row).__name__) for n, row in iter_rows(lists)] == [(1, "RowError"),
                                                                        (2, "RowError")]


def test_pandas_column_wise_json_names_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "df.json"  # DataFrame.to_json() with its default orient="columns"
    path.write_text(json.dumps({"prompt": {"0": "Hi?"}, "chosen": {"0": "Hi!"},
                                "rejected": {"0": "No."}}), encoding="utf-8")
    with pytest.raises(InputFileError, match=r"orient='records', lines=True"):
        read_import(ImportConfig(source=str(path)))


def test_null_cells_and_same_text_pairs_say_what_they_are(tmp_path: Path) -> None:
    path = tmp_path / "pairs.jsonl"
    rows = [{"prompt": "P", "chosen": None, "rejected": "r"},
            {"prompt": None, "chosen": "c", "rejected": "r"},
            {"prompt": "Say hi.", "chosen": "Hi!", "rejected": "hi! "},  # one text, folded
            {"prompt": "P2", "chosen": "c", "rejected": "r"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    got = read_import(ImportConfig(source=str(path)))
    assert len(got.groups) == 1 and got.units == 4  # 1 out + 3 rejected
    reasons = {(r.row, r.scope): r.reason for r in got.rejects}
    assert reasons[(1, "row")] == "'chosen' is empty (null)"
    assert reasons[(2, "row")].startswith("the prompt ('prompt') is empty and chosen / "
                                          "rejected are not chat messages")
    assert [k for k in reasons if k[0] == 3] == [(3, "part"), (3, "row")]  # once each
    assert "one and the same text" in reasons[(3, "part")]


def test_ultrafeedback_binarized_rows_validate_and_train_as_pairs(tmp_path: Path) -> None:
    """HuggingFaceH4/ultrafeedback_binarized keeps the prompt's turn in chosen/rejected: the
    readers of validate --source and train take the reply after it (was: every row rejected)."""
    from grouppref.readers.published import read_validated

    source = REPO / "examples" / "data" / "import" / "pairs.jsonl"
    read = read_validated(source)
    assert read.format == "trl-pairs" and read.rejects == [] and len(read.groups) == 3
    assert [[c.text for c in g.candidates] for g in read.groups] == [
        ["13", "15"], ["11", "15"], ["No, it is usually blue.", "Yes."]]
    row = json.loads(source.read_text(encoding="utf-8").splitlines()[0])
    row["chosen"][0]["content"] = "Another question."  # not the prompt's turn
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(row) + "\n", encoding="utf-8")
    bad = read_validated(path)
    assert bad.groups == [] and [r.row for r in bad.rejects] == [1]
    assert bad.rejects[0].reason.startswith(
        "chosen holds 2 chat turns; expected one assistant turn, after the prompt's turns")


def test_implicit_prompt_pairs_validate_and_train(tmp_path: Path) -> None:
    """TRL's implicit prompt (no prompt column; trl-lib's conversational datasets): the shared
    turns are the prompt. Anthropic transcripts (strings) are a reject naming `--layout hh`."""
    from grouppref.readers.published import read_validated

    system = {"role": "system", "content": "Be brief."}
    ask = {"role": "user", "content": "What is 2+2?"}
    rows = [{"chosen": [system, ask, {"role": "assistant", "content": "4"}],
             "rejected": [system, ask, {"role": "assistant", "content": "5"}]},
            {"chosen": "\n\nHuman: Hi\n\nAssistant: Hello!",
             "rejected": "\n\nHuman: Hi\n\nAssistant: Go away."}]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    read = read_validated(path)
    assert read.format == "trl-pairs" and len(read.groups) == 1
    (group,) = read.groups
    assert [m.content for m in group.prompt.as_messages()] == ["Be brief.", "What is 2+2?"]
    assert [c.text for c in group.candidates] == ["4", "5"]
    assert [r.row for r in read.rejects] == [2]
    assert "`grouppref import --layout hh`" in read.rejects[0].reason


def test_a_team_csv_from_excel_with_its_own_column_names(tmp_path: Path) -> None:
    """BOM + CRLF, quoted cells, RTL text, K of 3, 2 and 1, ties, 'NA' for not rated; the
    mapping options name the columns. 'NA' is a part-reject naming --missing, until given."""
    config = {"source": str(DATA / "team_scores.csv"), "layout": "scores",
              "scores": ["rater_1", "rater_2"], "group_by": "qid",
              "mapping": {"text": "question", "response": "answer"}}
    got = read_import(ImportConfig(**config))
    assert got.rows == 6 and len(got.groups) == 2 and got.units == 3  # q3: one answer
    assert {g.prompt.text for g in got.groups} == {"Name a colour.",
                                                   'Translate "hello" to Hebrew.'}
    na = [r for r in got.rejects if "'NA'" in r.reason]
    assert [r.row for r in na] == [2, 5]
    assert all("--missing 'NA'" in r.reason for r in na)
    quiet = read_import(ImportConfig(**config, missing=["NA", ""]))
    assert not [r for r in quiet.rejects if "'NA'" in r.reason]
    assert summary(quiet) == summary(got)  # the same rankings: NA was left out either way
    colour = next(g for g in quiet.groups if g.prompt.text == "Name a colour.")
    text = {c.candidate_id: c.text for c in colour.candidates}
    tiers = {r.annotator.id: [sorted(text[c] for c in t) for t in r.tiers]
             for r in colour.rankings}
    assert tiers == {"rater_1": [["Blue", "Red"], ["Seven"]], "rater_2": [["Blue"], ["Red"]]}


def test_default_aspects_a_team_has_fewer_of_are_no_reject(tmp_path: Path) -> None:
    """Rows rated on helpfulness only: no noise about the other default aspects; a row with
    no rating of any aspect says so."""
    def completion(text: str, annotations: dict) -> dict:
        return {"model": "m", "response": text, "annotations": annotations}
    rows = [{"instruction": "Q1?", "completions": [
                completion("a", {"helpfulness": {"Rating": "4"}}),
                completion("b", {"helpfulness": {"Rating": "2"}})]},
            {"instruction": "Q2?", "completions": [completion("c", {}), completion("d", {})]}]
    path = tmp_path / "uf.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    got = read_import(ImportConfig(source=str(path), layout="ultrafeedback"))
    assert [len(g.rankings) for g in got.groups] == [1, 0]
    assert [(r.row, r.reason.split(" (")[0]) for r in got.rejects] == [
        (2, "no response has 'helpfulness', 'honesty', 'instruction_following', 'truthfulness'")]
