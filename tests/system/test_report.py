"""``grouppref report``: one self-contained HTML file, rendered in headless Chromium.

The run is the import example (no model) plus two training steps and an evaluation of a tiny
2-layer Llama (``tiny_lm_dir``), so every section of the report has data. The browser test
records every request the page makes (only the file itself may be loaded), every console
message and page error, checks each section and that every plot decoded, and saves a
full-page screenshot to ``test-artifacts/report.png``.
"""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from grouppref.commands import run as run_commands
from grouppref.pipeline.aggregate.stage import read_report as read_aggregate_report
from grouppref.pipeline.report.config import ReportConfig
from grouppref.pipeline.report.reward_model import section_reward_model
from grouppref.pipeline.report.stage import reject_kind, render_report, run_report
from grouppref.pipeline.report.training_curves import read_metrics
from grouppref.runner import load_run_config, run_pipeline
from grouppref.runs.store import RunStore
from grouppref.schemas.reports import AggregateReport, AggregateSummary
from tests.support.browser import chromium_page
from tests.support.paths import REPO

ROOT = REPO
EXAMPLE = ROOT / "examples" / "import.yaml"
SECTIONS = {"stages": "Stages", "agreement": "Agreement and pair weights",
            "noise": "Annotators and noise", "training": "Training",
            "evaluation": "Evaluation on the held-out split"}


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory, tiny_lm_dir: Path) -> RunStore:
    """The import example, then 2 GSPO steps and an evaluation of the tiny LM."""
    base = tmp_path_factory.mktemp("report")
    train = {"model": str(tiny_lm_dir), "max_steps": 2, "batch_size": 2, "logging_steps": 1,
             "eval_steps": 1, "lr": 1e-3, "data": {"max_prompt_length": 64,
                                                    "max_response_length": 32}}
    cfg = load_run_config(EXAMPLE, [
        f"import.source={ROOT / 'examples' / 'data' / 'candidates.jsonl'}",
        f"export.0.to_dir={base / 'export' / 'groups'}",
        f"export.1.parquet={base / 'export' / 'pairs'}",
        f"train={json.dumps(train)}", "eval={}"], run_dir=str(base / "run"))
    outcome = run_pipeline(cfg)
    assert outcome.status == "done" and "eval" in outcome.ran and outcome.report is not None
    return RunStore(cfg.run_dir)


def test_report_has_every_section_with_the_run_numbers(trained_run: RunStore) -> None:
    page = render_report(trained_run, ReportConfig(title="t <&> t"))
    for anchor, title in SECTIONS.items():
        assert f"<h2 id='{anchor}'>{html.escape(title)}</h2>" in page
    assert "<title>t &lt;&amp;&gt; t</title>" in page  # escaped
    # every stage's counts as the manifests have them (not the report's own earlier one)
    assert "<td>report</td>" not in page
    for m in trained_run.manifests():
        if m.stage == "report":
            continue
        c = m.counts
        assert (f"<td>{m.stage}</td><td>complete</td><td class=num>{c.inputs}</td><td class=num>"
                f"{c.outputs}</td><td class=num>{c.rejected}</td><td class=num>{c.partial}</td>"
                ) in page
    # the verify rule skips the 4 groups without a reference: part-rejects, counted together
    assert ("<td>rank</td><td>part of a row</td><td>ranker &#x27;rule:verify&#x27; skipped the "
            "group: the prompt has no reference answer</td><td class=num>4</td>") in page
    # before/after evaluation rows are metrics.json's numbers (3 decimals)
    metrics = json.loads((trained_run.stage_dir("eval") / "metrics.json").read_text())
    before, after = metrics["metrics"]["baseline"], metrics["metrics"]["model"]
    acc = "pair_accuracy"
    assert (f"<td>{acc}</td><td class=num>{before[acc]:.3f}</td><td class=num>"
            f"{after[acc]:.3f}</td><td class=num>{after[acc] - before[acc]:.3f}</td>") in page
    assert "Recommended loss: <b>" in page and "Estimated label noise" in page
    targets = read_aggregate_report(trained_run).recommendation.pair_targets  # auto: by the noise
    assert f"Pair targets: <b>{targets}</b>" in page
    # self-contained: plots are data URIs, nothing refers to another file or host
    assert len(re.findall(r"<img src=\"data:image/png;base64,", page)) == 3
    assert not re.search(r"(src|href)=[\"'](?!data:|#)", page)


def test_reject_kinds_count_equal_causes_together() -> None:
    assert reject_kind("empty response #3 left out") == reject_kind("empty response #12 left out")
    assert reject_kind("only 1 distinct responses; --min-k is 2") == \
        "only # distinct responses; --min-k is #"


@pytest.mark.browser
def test_report_renders_in_chromium_without_errors_or_requests(
        trained_run: RunStore, chromium_executable: str, artifacts_dir: Path) -> None:
    path = Path(run_report(trained_run).outputs["html"]).resolve()
    url = path.as_uri()
    requests: list[str] = []
    problems: list[str] = []
    with chromium_page(chromium_executable, 1280, 900) as page:
        page.on("request", lambda r: requests.append(r.url))
        page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
                if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.goto(url, wait_until="load")
        for anchor, title in SECTIONS.items():
            assert page.locator(f"h2#{anchor}").inner_text() == title
        images: list[dict[str, Any]] = page.evaluate(
            "Array.from(document.images).map(i => ({ok: i.complete, w: i.naturalWidth}))")
        assert len(images) == 3 and all(i["ok"] and i["w"] > 300 for i in images)
        rows = page.locator("#stages + table tbody tr").count()
        assert rows == len(trained_run.manifests()) - 1  # every stage but the report
        page.screenshot(path=str(artifacts_dir / "report.png"), full_page=True)
    assert problems == []
    assert requests == [url]  # the page itself and nothing else


def test_report_command_writes_the_file_and_refuses_a_non_run(trained_run: RunStore,
                                                               tmp_path: Path) -> None:
    app = typer.Typer()
    run_commands.register(app)
    out = tmp_path / "r.html"
    result = CliRunner().invoke(app, ["report", str(trained_run.root), "--output", str(out),
                                      "--title", "My run"])
    assert result.exit_code == 0, result.output
    assert "<title>My run</title>" in out.read_text()
    bad = CliRunner().invoke(app, ["report", str(tmp_path / "nowhere")])
    assert "no stage has run here" in str(bad.exception)


def test_docs_list_every_setting() -> None:
    doc = (ROOT / "docs" / "report.md").read_text()
    for name in ReportConfig.model_fields:
        assert f"| `{name}` |" in doc, name


def test_report_names_the_aggregate_settings(trained_run: RunStore) -> None:
    settings = read_aggregate_report(trained_run).settings
    assert settings is not None and settings.model == "bradley_terry"
    assert settings.reliability_weight == "tau" and settings.pair_targets == "auto"
    assert settings.noise_filters["low_agreement"].threshold == 0.5
    assert settings.audit_share is None and settings.audit_groups == 0  # nothing selected
    manifest = AggregateSummary.model_validate(trained_run.require("aggregate").stats)
    assert manifest.settings == settings  # the manifest's stats name them too
    page = render_report(trained_run, ReportConfig())
    assert f"<b>Aggregate settings.</b> {html.escape(settings.describe())}" in page
    for said in ("Bradley-Terry fit (prior 0.1)", "reliability weight tau (3 rounds",
                 "pair targets auto (hard above 25% estimated noise)",
                 "low_agreement flag at 0.5", "coin_flip flag at 0.1",
                 "audit share: no groups selected by uncertainty"):
        assert said in page, said


def _copy(run: RunStore, tmp_path: Path) -> RunStore:
    shutil.copytree(run.root, tmp_path / "run")
    return RunStore(tmp_path / "run")


def test_old_aggregate_report_and_bad_metrics_lines_render_with_notices(
        trained_run: RunStore, tmp_path: Path) -> None:
    store = _copy(trained_run, tmp_path)
    path = store.stage_dir("aggregate") / "report.json"
    raw = json.loads(path.read_text())
    del raw["settings"], raw["summary"]["settings"]  # as written before settings were recorded
    path.write_text(json.dumps(raw))
    assert AggregateReport.model_validate(raw).settings is None
    log = next(store.stage_dir("train").rglob("metrics.jsonl"))  # the real trainer's lines
    good = read_metrics([log])
    assert good.notices == [] and [r.step for r in good.of("train")] == [1, 2]
    assert all(r.loss is not None and r.groups_per_s is not None and r.lr is not None
               for r in good.of("train"))
    assert good.of("eval") and all(r.pair_accuracy is not None for r in good.of("eval"))
    with log.open("a", encoding="utf-8") as fh:
        fh.write("{not json\n[1, 2]\n" + json.dumps({"split": "train", "loss": 1.0}) + "\n"
                 + json.dumps({"step": 3, "split": "train", "loss": "high"}) + "\n\n"
                 + json.dumps({"step": 3, "split": "train", "loss": 0.5, "new_metric": 2}) + "\n")
    read = read_metrics([log])
    assert read.lines[:-1] == good.lines and read.lines[-1].model_extra == {"new_metric": 2}
    n = len(log.read_text().splitlines())
    assert [x.split(": ")[:2] for x in read.notices] == [
        [f"metrics.jsonl line {n - 5}", "line"], [f"metrics.jsonl line {n - 4}", "line"],
        [f"metrics.jsonl line {n - 3}", "step"], [f"metrics.jsonl line {n - 2}", "loss"]]
    page = render_report(store, ReportConfig())
    assert "4 line(s) of the training metrics log left out: metrics.jsonl line" in page
    assert "Field required" in page and "<h2 id='training'>Training</h2><img" in page
    assert "Aggregate settings: not in this report (written by an older version)" in page


def test_reward_model_section_reads_the_rm_trainers_lines(trained_run: RunStore,
                                                          tiny_lm_dir: Path,
                                                          tmp_path: Path) -> None:
    from grouppref.cli import app

    store = _copy(trained_run, tmp_path)
    done = CliRunner().invoke(app, ["train-rm", str(store.root), "--model", str(tiny_lm_dir),
                                    "--max-steps", "4", "--batch-size", "4",
                                    "--logging-steps", "2"])
    assert done.exit_code == 0, done.output
    manifest = store.require("train_rm")
    log = read_metrics([Path(manifest.outputs["model"]) / "metrics.jsonl"])
    assert log.notices == [] and [r.step for r in log.of("train")] == [2, 4]
    assert all(r.loss is not None and r.pair_accuracy is not None for r in log.of("train"))
    section = section_reward_model(manifest)
    assert section.count("<img src=\"data:image/png;base64,") == 1 and "left out" not in section
