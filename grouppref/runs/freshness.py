"""Whether a stage's output belongs with the rest of its run: staleness and run membership.

**Stale.** Every manifest records the output fingerprint of each stage it read. A stage is
stale when one of those inputs changed since (re-run with other settings, re-running, gone),
or when an input is itself stale: re-running ``generate --k 2`` makes rank, aggregate,
validate, export and train stale, each "input changed: generate" (:func:`stale_causes`).
Stages that publish or summarise (export, train, eval, report) refuse stale input unless told
otherwise (:func:`require_fresh`, ``--allow-stale``), and then say so in what they write.

**Membership.** ``grouppref run CONFIG`` writes ``RUN/run.json`` (:class:`RunRecord`): the config
it ran, its hash, when it started, and every stage it produced, reused or read. A stage made
*before* that run which the run did not touch was made by another config (or an earlier run):
:func:`outside_run` marks it, ``inspect`` shows it as not part of this run and the report
leaves it out. A stage made after the run started (a command run by hand later) belongs.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from grouppref.errors import StageError
from grouppref.runs.manifest import Manifest, atomic_write_text, now
from grouppref.runs.store import RunStore

RUN_FILE = "run.json"


# -- staleness --------------------------------------------------------------------------------
def stale_causes(store: RunStore, stage: str) -> list[str]:
    """The upstream stages whose change makes ``stage`` stale, nearest changed stage of each
    path, upstream first; empty when ``stage`` is current or has not completed."""
    memo: dict[str, list[str]] = {}

    def visit(name: str) -> list[str]:
        if name in memo:
            return memo[name]
        memo[name] = []  # a cycle cannot happen (inputs are read before), but never loop
        m = store.manifest(name)
        if m is None or m.status != "complete":
            return []
        causes: list[str] = []
        for upstream, fingerprint in m.inputs.items():
            now_m = store.manifest(upstream)
            changed = (now_m is None or now_m.status != "complete"
                       or now_m.output_fingerprint != fingerprint)
            causes += [upstream] if changed else visit(upstream)
        memo[name] = list(dict.fromkeys(causes))
        return memo[name]

    return visit(stage)


def rerun_chain(store: RunStore, stage: str) -> list[str]:
    """The stages to re-run, upstream first, so that ``stage`` is current again."""
    return [m.stage for m in store.lineage(stage) if stale_causes(store, m.stage)]


def step_of(stage: str) -> str:
    """The pipeline step a stage folder belongs to, as ``run --from`` takes it
    (``export/dir-groups-ac2183`` -> ``export``)."""
    return stage.split("/")[0]


def require_fresh(store: RunStore, stage: str, *, allow_stale: bool, use: str) -> list[str]:
    """Refuse a stale ``stage`` (one line naming what changed and what to re-run) unless
    ``allow_stale``; returns the causes (empty when current) so the caller can record them.

    Args:
        store (RunStore): the run.
        stage (str): the stage whose output is about to be used.
        allow_stale (bool): use it anyway (the caller then writes the causes into its card,
            model card or report).
        use (str): what the caller does with it, for the message ("export it", "train on it").

    Raises:
        StageError: ``stage`` is stale and ``allow_stale`` is False.
    """
    causes = stale_causes(store, stage)
    if causes and not allow_stale:
        chain = rerun_chain(store, stage)
        raise StageError(
            f"{store.root}: {stage} is stale (input changed: {', '.join(causes)}): re-run "
            f"{', '.join(chain)} first (`grouppref run CONFIG --from {step_of(chain[0])}`, or each "
            f"command), or pass --allow-stale to {use} anyway")
    return causes


def stale_note(causes: dict[str, list[str]]) -> str:
    """One sentence for a card or report made from stale input with ``--allow-stale``."""
    parts = "; ".join(f"{stage} (input changed: {', '.join(c)})" for stage, c in causes.items())
    return (f"Made with --allow-stale from stale input: {parts}. Its upstream stages were re-run "
            "with other settings or results after it was made, so it may not match them.")


# -- membership -------------------------------------------------------------------------------
class RunRecord(BaseModel):
    """``RUN/run.json``: what the last ``grouppref run CONFIG`` on this directory did."""

    model_config = ConfigDict(extra="forbid")

    config: str = Field(description="The run config file, as given.")
    config_hash: str = Field(description="Hash of the validated run config.")
    status: Literal["running", "done", "waiting"]
    started_at: datetime
    finished_at: datetime | None = None
    stages: list[str] = Field(default_factory=list, description="Stage folders this run "
                              "produced, reused or read (their lineage included), in order.")


def read_run_record(store: RunStore) -> RunRecord | None:
    path = store.root / RUN_FILE
    if not path.exists():
        return None
    return RunRecord.model_validate_json(path.read_text(encoding="utf-8"))


def write_run_record(store: RunStore, record: RunRecord) -> None:
    store.root.mkdir(parents=True, exist_ok=True)
    atomic_write_text(store.root / RUN_FILE, record.model_dump_json(indent=2) + "\n")


def start_run_record(store: RunStore, config: str, config_hash: str) -> RunRecord:
    """A new record for a run starting now. When the last run had the same config, its stages
    stay members: ``run CONFIG --until validate`` after a full run of CONFIG does not turn that
    run's train and eval into stages of "another config"."""
    last = read_run_record(store)
    kept = last.stages if last is not None and last.config_hash == config_hash else []
    record = RunRecord(config=config, config_hash=config_hash, status="running",
                       started_at=now(), stages=list(kept))
    write_run_record(store, record)
    return record


def add_stages(store: RunStore, record: RunRecord, stages: Iterable[str]) -> RunRecord:
    """``record`` with ``stages``, their lineage and their nested stages (``label/push``)."""
    names = list(record.stages)
    for stage in stages:
        lineage = [m.stage for m in store.lineage(stage)]
        nested = [m.stage for m in store.manifests() if m.stage.startswith(stage + "/")]
        names += [n for n in [*lineage, stage, *nested] if n not in names]
    updated = record.model_copy(update={"stages": names})
    write_run_record(store, updated)
    return updated


def finish_run_record(store: RunStore, record: RunRecord, status: Literal["done", "waiting"]
                      ) -> RunRecord:
    done = record.model_copy(update={"status": status, "finished_at": now()})
    write_run_record(store, done)
    return done


def outside_run(manifest: Manifest, record: RunRecord | None) -> bool:
    """True for a stage made before the last ``grouppref run`` that the run did not touch."""
    return (record is not None and manifest.stage not in record.stages
            and manifest.started_at < record.started_at)


def run_manifests(store: RunStore) -> list[Manifest]:
    """The manifests of the run's current stages: all of them, less those :func:`outside_run`."""
    record = read_run_record(store)
    return [m for m in store.manifests() if not outside_run(m, record)]
