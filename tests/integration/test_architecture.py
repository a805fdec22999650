"""The house's shape: imports run one way only, no import cycles, and ``--help`` stays light.

Layers, from the ground up (docs/architecture.md): a module may import its own package and
the packages *below* its own, never one above it. Every import counts, including those inside
functions and under ``TYPE_CHECKING``. The sub-packages of ``grouppref.train`` are layered the
same way among themselves (``TRAIN_LAYERS``). The research experiments (research/) sit on top
of the product and use it only through ``grouppref.api``; the product never imports them or
the benchmarks.
"""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

ROOT = REPO / "grouppref"
TESTS = ROOT.parent / "tests"
LAYERS = ["errors", "schemas", "config", "runs", "stats", "models", "readers", "pipeline",
          "labeling", "train", "sweep", "stages", "runner", "api", "commands", "cli"]
TOP = {"__init__": "errors", "__main__": "cli"}
# grouppref.train's sub-packages, from the ground up: the settings (torch-free), tensor code, the
# objective, the engine both trainers share, their data, evaluation, refresh, the two trainers
TRAIN_LAYERS = ["settings", "tensors", "objective", "engine", "data", "eval", "refresh",
                "reward_model", "policy"]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    head = parts[1] if len(parts) > 1 else "__init__"
    return TOP.get(head, head)


def imports_of(path: Path) -> set[str]:
    """Every grouppref module ``path`` imports (``from a import b``: ``a.b`` when that is a
    module, else ``a``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("grouppref"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("grouppref"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.add(sub if MODULES.get(sub) else node.module)
    return out


FILES = sorted(p for p in ROOT.rglob("*.py") if "argilla_plugin" not in p.parts)
MODULES = {module_name(p): p for p in FILES}
GRAPH = {name: imports_of(path) for name, path in MODULES.items()}


def test_every_package_has_a_layer():
    assert {layer_of(m) for m in MODULES} <= set(LAYERS)


def test_imports_run_one_way():
    upward = []
    for module, targets in GRAPH.items():
        mine = LAYERS.index(layer_of(module))
        for target in targets:
            theirs = LAYERS.index(layer_of(target))
            if theirs > mine:
                upward.append(f"{module} ({layer_of(module)}) imports {target} ({layer_of(target)})")
    assert upward == []


def train_layer_of(module: str) -> str | None:
    """The sub-package of ``grouppref.train`` that ``module`` is in (None outside train/)."""
    parts = module.split(".")
    if parts[:2] != ["grouppref", "train"] or len(parts) < 3:
        return None
    return parts[2]


def test_train_modules_are_in_sub_packages():
    """train/ holds sub-packages only, each one of TRAIN_LAYERS (no flat modules)."""
    found = {train_layer_of(m) for m in MODULES} - {None}
    assert found == set(TRAIN_LAYERS)
    flat = [p.name for p in (ROOT / "train").glob("*.py") if p.name != "__init__.py"]
    assert flat == []


def test_train_sub_packages_import_one_way():
    upward = []
    for module, targets in GRAPH.items():
        mine = train_layer_of(module)
        if mine is None:
            continue
        for target in targets:
            theirs = train_layer_of(target)
            if theirs is not None and TRAIN_LAYERS.index(theirs) > TRAIN_LAYERS.index(mine):
                upward.append(f"{module} ({mine}) imports {target} ({theirs})")
    assert upward == []


def test_no_import_cycles():
    """Depth-first search for a back edge; every import counts, type-checking ones too."""
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(GRAPH.get(node, ())):
            if nxt not in MODULES:
                continue
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for module in MODULES:
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_the_registry_lists_every_stage_with_one_call_shape():
    """grouppref.stages is the one list of a run's stages: each RunConfig section is one entry,
    and every stage function is ``run(store, config, context)`` (anything more keyword-only)."""
    from grouppref.runner import RunConfig
    from grouppref.stages import STAGES

    assert [s.section for s in STAGES] == [f for f in RunConfig.model_fields if f != "run_dir"]
    for stage in STAGES:
        params = list(inspect.signature(stage.load()).parameters.values())
        assert [p.name for p in params[:3]] == ["store", "config", "context"], stage.name
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[3:]), stage.name


# What code outside a stage package (grouppref.pipeline.<stage>) may import from it: its
# settings (config) and its core (core: typed records in and out, no run store); from its
# stage.py only the run function and its report readers; a few more modules that are a stage's
# public library (the rankers and their settings, the constraint checks, selection notes, the
# served sampler's seed mask for the server benchmark, the simulator's constructed panels as
# tensors); never a name starting with "_".
STAGE_PUBLIC = {"config", "core"}
STAGE_PUBLIC_MORE = {"rank": {"settings", "rankers", "constraints", "shard_scoring"},
                     "report": {"selection"}, "generate": {"served"}, "simulate": {"panel"}}
STAGE_ENTRY = {"read_report", "load_report"}  # besides the run_<stage> functions
# a benchmark that times a stage's own pure functions one by one, not the stage through its
# core: the public functions it may import from the stage's modules
TIMED_PARTS = {"benchmarks/import_floor.py": {"parse_hh", "tiers_from_scores", "candidate_ids"}}


def stage_imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """Every ``from grouppref.pipeline.<stage>.<module> import names`` of ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [(node.lineno, node.module, [a.name for a in node.names]) for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
            and node.module.startswith("grouppref.pipeline.") and node.module.count(".") >= 3]


def own_stage(path: Path) -> str | None:
    parts = path.relative_to(ROOT.parent).parts
    return parts[2] if parts[:2] == ("grouppref", "pipeline") and len(parts) > 3 else None


def test_stages_are_used_through_their_core():
    """grouppref/ outside a stage package, and the benchmarks, import a stage's settings,
    core and run function, not its internals (the helpers of stage.py, private names)."""
    found = []
    for path in [*FILES, *sorted((ROOT.parent / "benchmarks").rglob("*.py"))]:
        for line, module, names in stage_imports(path):
            stage, part = module.split(".")[2:4]
            if stage == own_stage(path):
                continue
            bad = [n for n in names if n.startswith("_")]
            if part == "stage":
                bad += [n for n in names if not (n.startswith("run_") or n in STAGE_ENTRY)]
            elif part not in STAGE_PUBLIC | STAGE_PUBLIC_MORE.get(stage, set()):
                bad += names
            where = str(path.relative_to(ROOT.parent))
            bad = [n for n in bad if n not in TIMED_PARTS.get(where, set())]
            if bad:
                found.append(f"{where}:{line}: {module} {sorted(set(bad))}")
    assert found == []


RESEARCH = ROOT.parent / "research"
OUTSIDE = ("research", "benchmarks")  # what grouppref/ never imports


def imported_modules(path: Path) -> list[tuple[int, str, list[str]]]:
    """Every import of ``path`` as (line, module, names): ``import a.b`` gives ("a.b", []),
    ``from a import b, c`` gives ("a", ["b", "c"]); relative imports are left out."""
    out: list[tuple[int, str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append((node.lineno, node.module, [a.name for a in node.names]))
    return out


def test_research_uses_the_product_only_through_the_api():
    """Every module under research/ (scripts, shared modules, tests) imports grouppref only as
    ``grouppref.api`` (``from grouppref.api import ...``, ``from grouppref import api``), and
    only names the API publishes: what research needs is published there, not reached for."""
    from grouppref import api

    research = sorted(RESEARCH.rglob("*.py"))
    assert research, "no research modules found"
    found = []
    for path in research:
        for line, module, names in imported_modules(path):
            where = f"{path.relative_to(ROOT.parent)}:{line}"
            if module == "grouppref.api":
                found += [f"{where}: grouppref.api has no {n}" for n in names if n not in api.EXPORTS]
            elif module == "grouppref":
                found += [f"{where}: from grouppref import {n}" for n in names if n != "api"]
            elif module.startswith("grouppref."):
                found.append(f"{where}: {module}")
    assert found == []


def research_graph() -> dict[str, set[str]]:
    """research module -> the research modules it imports (``from research.a import b``:
    ``research.a.b`` when that is a module, else ``research.a``)."""
    modules = {".".join(p.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__"): p
               for p in RESEARCH.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for _, module, names in imported_modules(path):
            if module.split(".")[0] != "research":
                continue
            subs = [f"{module}.{n}" for n in names if f"{module}.{n}" in modules]
            targets.update(subs or [module])
        graph[name] = targets & set(modules)
    return graph


def test_research_has_no_import_cycles():
    """As in grouppref/: no module of research/ reaches itself through its imports."""
    graph = research_graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt):], nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_the_product_never_imports_research_or_benchmarks():
    found = [f"{path.relative_to(ROOT.parent)}:{line}: {module}"
             for path in FILES for line, module, _ in imported_modules(path)
             if module.split(".")[0] in OUTSIDE]
    assert found == []


HEAVY = ("torch", "transformers", "datasets", "accelerate", "optuna")


@pytest.mark.parametrize("argv", [["--help"], ["schema", "Prompt"], ["train", "--help"],
                                  ["train-rm", "--help"], ["eval", "--help"], ["run", "--help"],
                                  ["generate", "--help"], ["label", "push", "--help"],
                                  ["sweep", "--help"]])
def test_light_commands_do_not_import_torch(argv: list[str], tmp_path: Path):
    """``--help``, ``schema`` and every command's ``--help`` start without the ML stack."""
    code = (
        "import sys, contextlib, io\n"
        "from grouppref.cli import main\n"
        f"sys.argv = ['grouppref', *{argv!r}]\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n        main()\n    except SystemExit:\n        pass\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stderr


def test_inspect_does_not_import_torch(tmp_path: Path):
    from grouppref.runs.store import RunStore
    from grouppref.schemas import Prompt

    store = RunStore(tmp_path / "run")
    stage = store.open_stage("prompts", {"source": "x"}, record_type=Prompt)
    stage.write_shard(next(iter(stage.pending_shards([1], 1))),
                      [Prompt(prompt_id="p1", text="hi")], [])
    stage.finish(inputs=1)
    code = ("import sys\nfrom grouppref.cli import main\n"
            f"sys.argv = ['grouppref', 'inspect', {str(store.root)!r}]\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'transformers', 'accelerate') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stderr


# ``from tests.test_x import``, ``import tests.test_x``, ``from tests import test_x``, also in the
# source of a script a test writes (a torchrun script is a string)
TEST_IMPORT = re.compile(r"^\s*(?:from\s+tests\.test_\w+\s+import|import\s+tests\.test_\w+"
                         r"|from\s+tests\s+import\s+(?:\(\s*)?test_)", re.MULTILINE)


@pytest.mark.parametrize("folder", ["tests", "benchmarks", "research"])
def test_no_module_imports_a_test_module(folder: str):
    """Helpers that several test modules share live in tests/support/; a test module (or a
    benchmark) never imports another test module, so a test file can move or go alone."""
    found = []
    for path in sorted((ROOT.parent / folder).rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        found += [f"{path.relative_to(ROOT.parent)}:{text.count(chr(10), 0, m.start()) + 1}: "
                  f"{m.group().strip()}" for m in TEST_IMPORT.finditer(text)]
    assert found == []
