"""The sweep on Optuna: one trial is one setting of the search space, trained once per seed by
:func:`grouppref.train.policy.trainer.train` (the train stage's own loop and held-out evaluation) on
the data's groups, the training ones subsampled to k candidates (:mod:`.subsample`).

The study lives in Optuna's RDB storage: ``sqlite:///DIR/study.db`` by default (one machine;
a rerun resumes: finished trials stay, an interrupted one runs again), or any URL such as
``postgresql://...``, where several worker processes on several machines share one study (a
worker that dies is noticed by its missed heartbeats and its trial runs again). The median
pruner compares the n-th held-out evaluation of a trial with the earlier trials' n-th.
"""

from __future__ import annotations

import math
import random
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grouppref.config import redact_credentials
from grouppref.errors import ConfigError
from grouppref.runs.hashing import canonical_json, sha256_text
from grouppref.schemas import ValidatedGroup
from grouppref.schemas.sweep import SweepSummary
from grouppref.sweep.config import Dimension, SweepConfig, trial_train_config
from grouppref.sweep.subsample import subsample_group
from grouppref.train.settings.policy import TrainConfig

STRIDE = 1000  # intermediate step of seed s's n-th held-out evaluation: s * STRIDE + n
Progress = Callable[[str], None]
# settings that describe the engine, not what a trial measures: not in the cache key
_NOT_KEYED = {"storage", "study", "keep_models", "trials"}


def sweep_key(config: SweepConfig, data_fingerprint: str) -> str:
    """The sweep's cache key: the data's fingerprint and everything a trial's value depends on
    (the search space, the base train settings, the budget, seeds, metric)."""
    settings = config.model_dump(mode="json", exclude=_NOT_KEYED)
    return sha256_text(canonical_json({"data": data_fingerprint, "sweep": settings}))


def one_line(e: BaseException) -> str:
    """An exception as one line (type and first line of its message), credentials removed."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return redact_credentials(f"{type(e).__name__}: {text}" if text else type(e).__name__)


@dataclass
class Plan:
    """What one seed of a trial trains: its groups and steps, and what they cost."""

    groups: list[ValidatedGroup]
    steps: int
    tokens: int
    reads: int
    train_groups: int


def _group_tokens(groups: list[ValidatedGroup], config: TrainConfig) -> list[int]:
    """Prompt + candidate tokens of each trainable group, as the loss reads them."""
    from grouppref.models.loading import load_tokenizer
    from grouppref.train.data.tokenize import tokenize_groups
    from grouppref.train.objective.candidates import trim_for_loss

    tokenizer = load_tokenizer(config.model, padding_side="right")
    tokenized, _ = tokenize_groups(groups, tokenizer, config.data, stage="train")
    out = []
    for g in tokenized:
        g = trim_for_loss(g, config.loss)
        out.append(len(g.prompt_ids) + sum(len(c) for c in g.cand_ids))
    return out


def plan_seed(groups: list[ValidatedGroup], config: TrainConfig, k: int | None, seed: int,
              budget: str, amount: int) -> Plan:
    """The groups (training ones subsampled to ``k``, held-out ones whole) and the steps of one
    seed under the budget: ``steps`` = ``amount`` optimizer steps; ``tokens``: the steps whose
    batches hold about ``amount`` tokens; ``annotation``: the training groups whose ranking
    costs ``amount`` reads in all (k per group, drawn in a seeded order), for the config's
    epochs.

    Raises:
        ConfigError: no training group, or a budget that buys none.
    """
    train = [subsample_group(g, k, seed) if k else g for g in groups if g.split != "test"]
    held = [g for g in groups if g.split == "test"]
    if not train:
        raise ConfigError("no training groups (every group is in the test split)")
    if budget == "annotation":
        order = list(train)
        random.Random(f"reads:{seed}").shuffle(order)
        chosen, reads = [], 0
        for g in order:
            if reads + g.k > amount:
                break
            chosen.append(g)
            reads += g.k
        if len(chosen) < 1:
            raise ConfigError(f"an annotation budget of {amount} reads buys no group of "
                              f"{order[0].k}")
        train = chosen
    per_step = config.batch_size * config.grad_accum
    tokens = _group_tokens(train, config)
    mean = sum(tokens) / max(1, len(tokens))
    if budget == "steps":
        steps = amount
    elif budget == "tokens":
        steps = max(1, round(amount / max(1.0, mean * per_step)))
    else:
        steps = config.epochs * math.ceil(math.ceil(len(train) / config.batch_size)
                                          / config.grad_accum)
    return Plan(groups=train + held, steps=steps, tokens=round(steps * per_step * mean),
                reads=sum(g.k for g in train), train_groups=len(train))


def _distribution(d: Dimension) -> Any:
    import optuna

    if d.kind == "int":
        return optuna.distributions.IntDistribution(int(d.low), int(d.high))
    return optuna.distributions.FloatDistribution(d.low, d.high, log=d.kind == "loguniform")


def suggest(trial: Any, dims: list[Dimension]) -> dict[str, Any]:
    """The trial's value of each dimension."""
    out: dict[str, Any] = {}
    for d in dims:
        if d.is_choice:
            out[d.key] = trial.suggest_categorical(d.key, list(d.choices))
        elif d.kind == "int":
            out[d.key] = trial.suggest_int(d.key, int(d.low), int(d.high))
        else:
            out[d.key] = trial.suggest_float(d.key, d.low, d.high, log=d.kind == "loguniform")
    return out


class Sweep:
    """One worker of a sweep (module docstring); :meth:`run` runs trials until the study has
    its ``total`` (or this worker ran ``max_trials``) and returns the summary."""

    def __init__(self, config: SweepConfig, groups: list[ValidatedGroup], data_fingerprint: str,
                 out_dir: Path, progress: Progress = lambda _: None) -> None:
        self.config, self.groups, self.out = config, groups, Path(out_dir)
        self.key = sweep_key(config, data_fingerprint)
        self.dims = config.dimensions()
        self.total = config.total_trials()
        self.progress = progress
        self.out.mkdir(parents=True, exist_ok=True)
        self.url = config.storage or f"sqlite:///{(self.out / 'study.db').resolve()}"
        self.name = config.study or f"sweep-{self.key[:12]}"
        self.seeds = [config.seed + i for i in range(config.seeds)]
        self.best: float | None = None

    # -- the study ------------------------------------------------------------------------
    def _storage(self) -> Any:
        import optuna

        if self.url.startswith("sqlite"):
            return optuna.storages.RDBStorage(
                self.url, engine_kwargs={"connect_args": {"timeout": 60}})
        with warnings.catch_warnings():  # heartbeats are "experimental" since Optuna 2.8
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(
                _driver_url(self.url), heartbeat_interval=10, grace_period=60,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                    max_retry=1))

    def _sampler(self) -> Any:
        import optuna

        if self.config.sampler == "grid":
            return optuna.samplers.GridSampler({d.key: list(d.choices) for d in self.dims},
                                               seed=self.config.seed)
        if self.config.sampler == "random":
            return optuna.samplers.RandomSampler(seed=self.config.seed)
        return optuna.samplers.TPESampler(seed=self.config.seed)

    def _pruner(self) -> Any:
        import optuna

        if self.config.pruner == "none":
            return optuna.pruners.NopPruner()
        return optuna.pruners.MedianPruner(n_startup_trials=self.config.startup_trials,
                                           n_warmup_steps=1)

    def open_study(self) -> Any:
        """Create or load the study (its search space and key in its user attributes).

        Raises:
            ConfigError: optuna is not installed, the storage cannot be opened, or the study
                of that name holds another sweep.
        """
        import importlib.util

        if importlib.util.find_spec("optuna") is None:
            raise ConfigError("grouppref sweep runs on Optuna: pip install 'grouppref[sweep]' "
                              "(or pip install optuna)")
        import optuna

        optuna.logging.set_verbosity(optuna.logging.ERROR)  # our own lines say it
        for attempt in range(4):
            try:
                study = optuna.create_study(
                    storage=self._storage(), sampler=self._sampler(), pruner=self._pruner(),
                    study_name=self.name, direction=self.config.direction, load_if_exists=True)
                break
            except Exception as e:  # a bad URL, a missing driver, an unreachable server
                # workers starting at once race to create the schema: the loser sees a duplicate
                # row (IntegrityError) or, on PostgreSQL, a table created under it ("relation
                # alembic_version already exists", DuplicateTable); the next try loads it
                if attempt < 3 and _lost_schema_race(e):
                    time.sleep(1.0 + attempt)
                    continue
                raise ConfigError(f"cannot open the study at {redact_credentials(self.url)}: "
                                  f"{one_line(e)}") from e
        attrs = study.user_attrs
        if "key" not in attrs:
            study.set_user_attr("key", self.key)
            study.set_user_attr("space", self.config.params)
        elif attrs["key"] != self.key:
            raise ConfigError(f"study {self.name!r} holds another sweep (key "
                              f"{attrs['key'][:12]}, this one {self.key[:12]}): pass another "
                              "--study, or another --out")
        return study

    def _requeue_interrupted(self, study: Any) -> None:
        """A trial still running in a SQLite study belongs to a sweep that was killed (one
        machine): it is marked interrupted; every interrupted trial (killed, or stopped with
        Ctrl-C) is queued again once, so a rerun runs it."""
        from optuna.trial import TrialState

        storage = study._storage
        trials = study.get_trials(deepcopy=False)
        if self.url.startswith("sqlite"):
            for t in trials:
                if t.state == TrialState.RUNNING:
                    storage.set_trial_user_attr(t._trial_id, "interrupted", True)
                    storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
            trials = study.get_trials(deepcopy=False)
        retried = ({t.user_attrs.get("retry_of") for t in trials}  # ours, and Optuna's
                   | {t.system_attrs.get("failed_trial") for t in trials})
        for t in trials:
            if (t.state == TrialState.FAIL and "error" not in t.user_attrs
                    and t.number not in retried and t.params):
                study.enqueue_trial(t.params, user_attrs={"retry_of": t.number})
                self.progress(f"trial {t.number} was interrupted: queued again")

    def done(self, study: Any) -> int:
        """Trials that count towards ``total``: complete, pruned, or failed with a reason (not
        a grid point drawn twice)."""
        from optuna.trial import TrialState

        return sum((t.state in (TrialState.COMPLETE, TrialState.PRUNED)
                    or (t.state == TrialState.FAIL and "error" in t.user_attrs))
                   and "duplicate_of" not in t.user_attrs
                   for t in study.get_trials(deepcopy=False))

    @staticmethod
    def _twin(trial: Any, params: dict[str, Any]) -> int | None:
        """An earlier trial of the same grid point that measures (or measured) it."""
        from optuna.trial import TrialState

        for t in trial.study.get_trials(deepcopy=False, states=(
                TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)):
            if (t.number < trial.number and t.params == params
                    and "duplicate_of" not in t.user_attrs):
                return t.number
        return None

    # -- one trial ------------------------------------------------------------------------
    def objective(self, trial: Any) -> float:
        import optuna

        from grouppref.train.policy.trainer import train

        params = suggest(trial, self.dims)
        if self.config.sampler == "grid" and (twin := self._twin(trial, params)) is not None:
            # workers that draw at once, or one that starts while the last point still runs,
            # may get a grid point another trial has: that trial measures it
            trial.set_user_attr("duplicate_of", twin)
            raise optuna.TrialPruned(f"the same grid point as trial {twin}")
        shown = " ".join(f"{k}={_short(v)}" for k, v in params.items())
        self.progress(f"trial {trial.number} ({self.done(trial.study) + 1} of {self.total}) "
                      f"started: {shown or '(base settings)'}")
        t0 = time.perf_counter()
        try:
            base = trial_train_config(self.config.train, params)
            k = params.get("k")
            amount = int(params.get("budget", self.config.default_amount()))
            values: list[float] = []
            for si, seed in enumerate(self.seeds):
                plan = plan_seed(self.groups, base, k, seed, self.config.budget, amount)
                config = base.model_copy(update={
                    "seed": seed, "max_steps": plan.steps,
                    "eval_steps": max(1, math.ceil(plan.steps / self.config.evals))})
                trial.set_user_attr("steps", plan.steps)
                trial.set_user_attr("tokens", plan.tokens)
                trial.set_user_attr("reads", plan.reads)
                trial.set_user_attr("groups", plan.train_groups)
                where = self.out / "trials" / f"{trial.number:04d}" / f"seed-{seed}"
                counter = iter(range(si * STRIDE, (si + 1) * STRIDE))

                def on_eval(step: int, metrics: dict[str, float], counter: Any = counter) -> None:
                    value = metrics.get(self.config.metric)
                    if value is None or value != value:
                        return
                    n = next(counter)
                    trial.report(float(value), n)
                    trial.set_user_attr("last_intermediate", float(value))
                    if n % STRIDE > 0 and trial.should_prune():
                        raise optuna.TrialPruned(f"held-out {self.config.metric} {value:.4g} "
                                                 f"at step {step} is below the median")

                try:
                    result = train(config, plan.groups, where,
                                   reference_cache=self.out / "reference", on_eval=on_eval)
                finally:
                    if not self.config.keep_models:
                        _drop_model(where)
                value = result.stats.eval.get(self.config.metric)
                if value is None:
                    raise ConfigError(
                        f"no held-out {self.config.metric!r} (held-out metrics: "
                        f"{sorted(result.stats.eval) or 'none: the data has no test split'})")
                values.append(float(value))
                trial.set_user_attr("seed_values", values)
        except optuna.TrialPruned:
            trial.set_user_attr("seconds", round(time.perf_counter() - t0, 3))
            raise
        except Exception as e:
            trial.set_user_attr("error", one_line(e))
            trial.set_user_attr("seconds", round(time.perf_counter() - t0, 3))
            raise
        trial.set_user_attr("seconds", round(time.perf_counter() - t0, 3))
        return sum(values) / len(values)

    def _after(self, study: Any, trial: Any) -> None:
        from optuna.trial import TrialState

        done = self.done(study)
        if trial.state == TrialState.COMPLETE:
            value = float(trial.value)
            better = (self.best is None or (value > self.best if self.config.direction ==
                                            "maximize" else value < self.best))
            self.best = value if better else self.best
            what = f"{self.config.metric} {value:.4g}"
        elif "duplicate_of" in trial.user_attrs:
            self.progress(f"trial {trial.number} skipped: the same grid point as trial "
                          f"{trial.user_attrs['duplicate_of']}")
            if done >= self.total:
                study.stop()
            return
        elif trial.state == TrialState.PRUNED:
            what = f"pruned at {trial.user_attrs.get('last_intermediate', float('nan')):.4g}"
        else:
            what = f"failed: {trial.user_attrs.get('error', 'interrupted')}"
        best = "" if self.best is None else f"; best so far {self.best:.4g}"
        self.progress(f"trial {trial.number} finished ({done} of {self.total}): {what}{best}")
        if done >= self.total:
            study.stop()

    # -- the worker -----------------------------------------------------------------------
    def run(self, max_trials: int | None = None) -> SweepSummary:
        """Run trials (at most ``max_trials`` in this call) until the study has ``total``;
        write the summary files into the sweep's folder and return the summary."""
        from grouppref.sweep.summary import summarize, write_outputs

        study = self.open_study()
        self._requeue_interrupted(study)
        completed = [t.value for t in study.trials
                     if t.value is not None and t.state.name == "COMPLETE"]
        if completed:
            self.best = (max if self.config.direction == "maximize" else min)(completed)
        todo = self.total - self.done(study)
        left: int | None = todo
        if max_trials is not None:
            left = min(todo, max_trials)
        elif self.config.sampler == "grid":
            left = None if todo > 0 else 0  # the grid sampler stops when every point ran
        self.progress(f"study {self.name} at {redact_credentials(self.url)}: "
                      f"{self.done(study)} of {self.total} trials done")
        if left is None or left > 0:
            study.optimize(self.objective, n_trials=left, catch=(Exception,),
                           callbacks=[self._after], gc_after_trial=True)
        summary = summarize(study, self)
        write_outputs(summary, self, self.out)
        return summary


def _lost_schema_race(e: Exception) -> bool:
    """Whether opening the storage failed only because another worker created the study's
    tables or rows at the same moment (worth a retry), not for a bad URL or server."""
    text = type(e).__name__ + repr(e)
    return ("IntegrityError" in text or "DuplicateTable" in text
            or "UniqueViolation" in text or "already exists" in text)


def _driver_url(url: str) -> str:
    """``postgresql://`` through psycopg 3 when psycopg2 (SQLAlchemy's default) is missing."""
    import importlib.util

    if url.startswith("postgresql://") and importlib.util.find_spec("psycopg2") is None \
            and importlib.util.find_spec("psycopg") is not None:
        return "postgresql+psycopg://" + url.removeprefix("postgresql://")
    return url


def _drop_model(where: Path) -> None:
    """Remove a trial's model, tokenizer and checkpoints; keep its metrics."""
    if not where.is_dir():
        return
    for path in where.iterdir():
        if path.name in ("metrics.json", "metrics.jsonl"):
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
