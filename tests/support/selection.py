"""Selection panels, ranked runs and selection tables, for the label-select tests."""

from __future__ import annotations

import subprocess
from html.parser import HTMLParser
from pathlib import Path

from grouppref.schemas import AnnotatedGroup, Annotator, Ranking
from tests.support.cli import grouppref_here
from tests.support.factories import make_group

ROOT = Path(__file__).resolve().parents[2]


IDENTITY = [0, 1, 2, 3]


# -- constructed groups --------------------------------------------------------------------


def ranked(i: int, orders: dict[str, list[int]], rm_scores: list[float] | None = None,
           k: int = 4) -> AnnotatedGroup:
    """Group ``i`` with one strict ranking per automatic ranker (``rm``: reward_model with
    ``rm_scores``, ``rule``: rule, ``judge``: llm_judge); orders list candidate indices."""
    g = make_group(k, prompt_text=f"Prompt {i}: name a colour.",
                   texts=[f"answer {i}.{j}" for j in range(k)])
    ids = g.candidate_ids()
    kinds = {"rm": "reward_model", "rule": "rule", "judge": "llm_judge"}
    rankings = []
    for name, order in orders.items():
        scores = None
        if name == "rm" and rm_scores is not None:
            scores = {ids[j]: s for j, s in enumerate(rm_scores)}
        rankings.append(Ranking(annotator=Annotator(id=name, kind=kinds[name]),
                                group_id=g.group_id, tiers=[[ids[j]] for j in order],
                                scores=scores))
    return AnnotatedGroup(**g.model_dump(), rankings=rankings)


def panel() -> list[AnnotatedGroup]:
    """Nine groups: six unanimous, three with growing disagreement (6: mild, 7: more,
    8: the most); the reward model's scores are close in groups 2 (gap 0.05) and 4 (gap
    0.02), well apart elsewhere."""
    same = dict.fromkeys(("rm", "rule", "judge"), IDENTITY)
    wide = [3.0, 2.0, 1.0, 0.0]
    groups = [ranked(i, same, wide) for i in range(6)]
    groups[2] = ranked(2, same, [3.0, 2.95, 1.0, 0.0])
    groups[4] = ranked(4, same, [3.0, 2.0, 1.02, 1.0])
    groups.append(ranked(6, {"rm": IDENTITY, "rule": [0, 1, 3, 2], "judge": IDENTITY}, wide))
    groups.append(ranked(7, {"rm": IDENTITY, "rule": [1, 0, 2, 3], "judge": [0, 1, 3, 2]},
                         wide))
    groups.append(ranked(8, {"rm": IDENTITY, "rule": [3, 2, 1, 0], "judge": [2, 3, 0, 1]},
                         wide))
    return groups


# -- bad input through the CLI --------------------------------------------------------------


def _push(run: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``grouppref label push`` against a closed port: every error here must come first
    (``cli.main()`` in this process, under only these environment variables)."""
    return grouppref_here("label", "push", run, "--api-url", "http://127.0.0.1:9", *args,
                          cwd=ROOT, env={"PATH": "/usr/bin:/bin", "HOME": str(run.parent),
                                         "ARGILLA_API_KEY": "unused-key-1234"})


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip() and "Saving the" not in ln]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def run_groups() -> list[AnnotatedGroup]:
    """The nine K=4 groups of :func:`panel` (6, 7, 8 disagree) and three unanimous K=3 ones."""
    same = dict.fromkeys(("rm", "rule", "judge"), [0, 1, 2])
    return panel() + [ranked(20 + i, same, [2.0, 1.0, 0.0], k=3) for i in range(3)]


class _Table(HTMLParser):
    """The cells of the first table after the element with id ``labeling``."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = self.inside = False
        self.rows: list[list[str]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if ("id", "labeling") in attrs:
            self.seen = True
        elif tag == "table" and self.seen and not self.rows:
            self.inside = True
        elif self.inside and tag == "tr":
            self.rows.append([])
        elif self.inside and tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self.inside = False
        elif self.inside and tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def selection_rows(html: str) -> list[dict[str, str]]:
    """The rows of the report's "which groups people saw" table, by column name."""
    parser = _Table()
    parser.feed(html)
    header, *rows = parser.rows
    return [dict(zip(header, row, strict=True)) for row in rows]
