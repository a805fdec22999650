"""Training state around the loop: resumable checkpoints, the metrics log, the logging window.

A checkpoint is ``OUT/checkpoints/step-NNNNNNNN/``: ``accelerator.save_state`` (model,
optimizer, scheduler, RNG states of every process, accelerate's step counter) plus
``trainer_state.json`` (our step, epoch, batches seen in the epoch, and the settings that
must not change across a resume). ``trainer_state.json`` is written last, so a folder
without it is an interrupted save and is never resumed from. Both trainers use it (their
settings models share the fields named here: ``save_total_limit``, ``report_to``...).
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from grouppref.errors import ConfigError, StageError
from grouppref.runs.progress import stage_progress
from grouppref.train.engine.metric_sums import MetricSums, reduce_sums
from grouppref.train.settings.shared import TrainingSettings

if TYPE_CHECKING:
    from accelerate import Accelerator

STATE_FILE = "trainer_state.json"
LOG_FILE = "metrics.jsonl"
# Settings that may change on --resume (how long to train and what to log), all others may not.
_RESUMABLE = {"epochs", "max_steps", "logging_steps", "eval_steps", "save_steps",
              "save_total_limit", "report_to", "eval_batch_size"}


@dataclass
class TrainState:
    """Where the loop is: optimizer steps done, epoch, micro-batches seen in that epoch."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0

    def epoch_progress(self, steps_per_epoch: int) -> float:
        """Fractional epochs done (steps / steps per epoch)."""
        return round(self.step / max(steps_per_epoch, 1), 4)


@dataclass
class Window:
    """Training metrics accumulated since the last log line."""

    sums: MetricSums = field(default_factory=MetricSums)
    grad_norms: list[float] = field(default_factory=list)
    groups: int = 0
    tokens: int = 0
    lr: float = math.nan
    t0: float = field(default_factory=time.perf_counter)

    def summary(self, names: list[str]) -> dict[str, float]:
        """Means of ``names`` over processes, mean grad norm, groups/s and tokens/s (global)."""
        out = self.sums.means(names)
        groups, tokens = reduce_sums([self.groups, self.tokens])
        seconds = max(time.perf_counter() - self.t0, 1e-9)
        out["grad_norm"] = (sum(self.grad_norms) / len(self.grad_norms)
                            if self.grad_norms else math.nan)
        out["groups_per_s"] = groups / seconds
        out["tokens_per_s"] = tokens / seconds
        return out


def _clean(value: Any) -> Any:
    """NaN -> None (strict JSON), floats rounded to 6 significant digits."""
    if isinstance(value, float):
        return None if math.isnan(value) else float(f"{value:.6g}")
    return value


def strict_json(value: Any) -> Any:
    """``value`` with every NaN float (at any depth) replaced by None, for strict JSON."""
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    return None if isinstance(value, float) and math.isnan(value) else value


class MetricsLog:
    """``OUT/metrics.jsonl`` (one JSON object per log line) plus the ``report_to`` trackers."""

    def __init__(self, out_dir: Path, accelerator: Accelerator):
        self.path = Path(out_dir) / LOG_FILE
        self.accelerator = accelerator

    def open(self, fresh: bool, after_step: int = 0) -> None:
        """Start the log: empty it (fresh run) or drop lines past ``after_step`` (resume)."""
        if not self.accelerator.is_main_process:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        keep = [] if fresh else [r for r in self.records() if r["step"] <= after_step]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in keep))

    def write(self, step: int, epoch: float, split: str, metrics: dict[str, float]) -> None:
        record = {"step": step, "epoch": epoch, "split": split,
                  **{k: _clean(v) for k, v in metrics.items()}}
        if self.accelerator.is_main_process:
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(record) + "\n")
        scalars = {f"{split}/{k}": v for k, v in metrics.items() if not math.isnan(v)}
        self.accelerator.log(scalars, step=step)

    def records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def first(self, split: str) -> dict[str, Any]:
        """The first logged record of ``split`` (e.g. the held-out eval before training)."""
        return next((r for r in self.records() if r["split"] == split), {})


def project_config(out_dir: Path) -> Any:
    """accelerate's project folders of a training: ``OUT`` and the trackers' ``OUT/logs``."""
    from accelerate.utils import ProjectConfiguration

    return ProjectConfiguration(project_dir=str(out_dir), logging_dir=str(Path(out_dir) / "logs"))


def flat_config(config: BaseModel) -> dict[str, Any]:
    """The settings as flat scalars (``data.max_prompt_length``...), as trackers want them."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        elif isinstance(value, (int, float, str, bool)):
            out[prefix] = value
        else:
            out[prefix] = json.dumps(value)

    walk("", config.model_dump(mode="json"))
    return out


def _resume_key(config: BaseModel) -> dict[str, Any]:
    return {k: v for k, v in config.model_dump(mode="json").items() if k not in _RESUMABLE}


def save(accelerator: Accelerator, out_dir: Path, state: TrainState, config: TrainingSettings
         ) -> Path:
    """Write a checkpoint of the current step (every process takes part); keep the newest
    ``save_total_limit`` ones."""
    root = Path(out_dir) / "checkpoints"
    path = root / f"step-{state.step:08d}"
    accelerator.save_state(str(path))
    if accelerator.is_main_process:
        payload = {**asdict(state), "config": {**_resume_key(config),
                                               "processes": accelerator.num_processes}}
        (path / STATE_FILE).write_text(json.dumps(payload, indent=2) + "\n")
        complete = sorted(p.parent for p in root.glob(f"step-*/{STATE_FILE}"))
        for old in complete[:-config.save_total_limit]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return path


def find(out_dir: Path, resume: bool | str | Path) -> Path:
    """The checkpoint to resume from: the newest complete one, or the folder given.

    Raises:
        StageError: no complete checkpoint there.
    """
    if resume is True:
        found = sorted(Path(out_dir).glob(f"checkpoints/step-*/{STATE_FILE}"))
        if not found:
            raise StageError(f"--resume: no complete checkpoint in {Path(out_dir) / 'checkpoints'}"
                             "; train without --resume, or set save_steps to write checkpoints")
        return found[-1].parent
    path = Path(str(resume))
    if not (path / STATE_FILE).exists():
        raise StageError(f"--resume {path}: not a complete checkpoint (no {STATE_FILE})")
    return path


def check_compatible(path: Path, config: BaseModel) -> None:
    """Fail (before any model loads) if ``config`` changes what the checkpoint trained with.

    Raises:
        ConfigError: naming each setting that differs, old and new value.
    """
    saved = json.loads((path / STATE_FILE).read_text())
    now = _resume_key(config)
    # a setting added after the checkpoint was written ran at its default there
    defaults = _resume_key(type(config).model_construct())
    saved["config"] = {**{k: v for k, v in defaults.items() if k in now}, **saved["config"]}
    if "processes" in saved["config"]:  # the global batch and each process's RNG state
        from grouppref.train.engine.distributed import process_state

        now["processes"] = process_state().num_processes
    changed = sorted(k for k in set(now) | set(saved["config"])
                     if now.get(k) != saved["config"].get(k))
    if changed:
        detail = ", ".join(f"{k}: {saved['config'].get(k)!r} -> {now.get(k)!r}" for k in changed)
        raise ConfigError(f"--resume from {path}: settings differ from the checkpoint ({detail}); "
                          f"only {sorted(_RESUMABLE)} may change on resume (and not the "
                          "number of processes)")


def load(accelerator: Accelerator, path: Path, config: BaseModel, scheduler: Any = None) -> TrainState:
    """Restore model, optimizer, scheduler, RNG and step from ``path``; with ``scheduler``, the
    learning rate is then re-fitted to the schedule of this run (:func:`refit_schedule`).

    Raises:
        ConfigError: a setting that shapes the optimisation differs from the checkpoint's.
    """
    check_compatible(path, config)
    saved = json.loads((path / STATE_FILE).read_text())
    accelerator.load_state(str(path))
    if scheduler is not None:
        refit_schedule(scheduler)
    return TrainState(step=saved["step"], epoch=saved["epoch"],
                      batch_in_epoch=saved["batch_in_epoch"])


def refit_schedule(scheduler: Any) -> None:
    """Set each parameter group's rate to what this run's schedule gives at the restored step.

    The optimizer state restores the rate the checkpoint's run would use next, computed from
    *its* total steps; a resume with another ``max_steps`` / ``epochs`` has another schedule
    (linear, cosine: ``lr_t = base_lr · λ(t)`` with ``λ`` built from the total), and without
    this the first update after the resume would use the old rate (0 at the old end of a
    linear decay). Identical to the restored rate when the total did not change. Only for
    ``LambdaLR`` schedules (every ``get_scheduler`` kind); others are left as restored."""
    from torch.optim.lr_scheduler import LambdaLR

    if not isinstance(scheduler, LambdaLR):
        return
    rates = [base * fn(scheduler.last_epoch)
             for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)]
    for group, rate in zip(scheduler.optimizer.param_groups, rates, strict=True):
        group["lr"] = rate
    scheduler._last_lr = rates  # what get_last_lr() reports (torch keeps it there)


class ProgressBar:
    """A rich bar over optimizer steps on the main process, showing loss and pair accuracy."""

    def __init__(self, accelerator: Accelerator, total: int, start: int):
        self.progress = stage_progress(disable=not accelerator.is_main_process)
        self.progress.start()
        self.task = self.progress.add_task("train", total=total, completed=start, unit="steps")

    def update(self, step: int, metrics: dict[str, float]) -> None:
        extra = ""
        if metrics:
            extra = (f"loss {metrics.get('loss', math.nan):.4f} "
                     f"acc {metrics.get('pair_accuracy', math.nan):.3f}")
        self.progress.update(self.task, completed=step, extra=extra)

    def close(self) -> None:
        self.progress.stop()


def progress_bar(accelerator: Accelerator, total: int, start: int) -> ProgressBar:
    return ProgressBar(accelerator, total, start)
