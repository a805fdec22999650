"""Settings of ``grouppref sweep`` and the search space syntax (docs/sweep.md).

A dimension is given by its dotted key and a spec, the same on the command line
(``--param lr=loguniform:1e-6:1e-4``, ``--param k=2,4,8``) and in the config file
(``params: {lr: "loguniform:1e-6:1e-4", k: [2, 4, 8]}``). Keys: ``k`` (group size: each
training group subsampled to k candidates), ``budget`` (the budget's amount, see ``budget``), or
any field of the ``train`` settings (``lr``, ``loss``, ``data.max_response_length``). Specs:
a comma list (or a YAML list) of values, ``loguniform:LOW:HIGH``, ``uniform:LOW:HIGH`` or
``int:LOW:HIGH``. Nothing here imports torch or optuna.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from grouppref.config import validate
from grouppref.runs.stage import StageSpec
from grouppref.schemas import MAX_K, MIN_K
from grouppref.train.settings.policy import TrainConfig

Scalar = bool | int | float | str
SPECIAL = {"k": "group size", "budget": "the budget's amount"}
RANGES = ("loguniform", "uniform", "int")


@dataclass(frozen=True)
class Dimension:
    """One swept setting: ``choices`` or a range ``kind`` ``low``..``high``."""

    key: str
    choices: tuple[Scalar, ...] = ()
    kind: str = "choice"  # choice | loguniform | uniform | int
    low: float = 0.0
    high: float = 0.0

    @property
    def is_choice(self) -> bool:
        return self.kind == "choice"


def _value(text: str) -> Scalar:
    """One value of a comma list, read as YAML (``2`` an int, ``1e-5`` a float, ``gspo`` text)."""
    text = text.strip()
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str) and text.lower().replace(".", "", 1).replace("e-", "", 1).replace(
            "e+", "", 1).isdigit():
        return float(text)  # YAML 1.1 reads 1e-5 as text
    return value if isinstance(value, bool | int | float | str) else text


def parse_dimension(key: str, spec: Any) -> Dimension:
    """The :class:`Dimension` of ``key`` from a spec (text or a list of values).

    Raises:
        ValueError: an unknown key, an empty list, or a range that does not parse.
    """
    check_key(key)
    if isinstance(spec, list | tuple):
        values = tuple(_value(str(v)) if isinstance(v, str) else v for v in spec)
    elif isinstance(spec, str) and spec.split(":", 1)[0] in RANGES:
        kind, *bounds = spec.split(":")
        try:
            low, high = (float(b) for b in bounds)
        except ValueError:
            raise ValueError(f"{key}: {spec!r} is not {kind}:LOW:HIGH") from None
        if not low < high or (kind == "loguniform" and low <= 0):
            raise ValueError(f"{key}: {spec!r} needs LOW < HIGH (and LOW > 0 for loguniform)")
        return Dimension(key=key, kind=kind, low=low, high=high)
    elif isinstance(spec, bool | int | float | str):
        values = tuple(_value(v) for v in str(spec).split(",") if v.strip()) if isinstance(
            spec, str) else (spec,)
    else:
        raise ValueError(f"{key}: give a list of values or a range, not {spec!r}")
    if not values:
        raise ValueError(f"{key}: no values")
    if len(set(map(repr, values))) != len(values):
        raise ValueError(f"{key}: a value appears twice in {list(values)}")
    if key == "k":
        bad = [v for v in values if not isinstance(v, int) or not MIN_K <= v <= MAX_K]
        if bad:
            raise ValueError(f"k: group sizes are integers {MIN_K}..{MAX_K}, not {bad}")
    return Dimension(key=key, choices=values)


def check_key(key: str) -> None:
    """Raise ``ValueError`` unless ``key`` is ``k``, ``budget`` or a TrainConfig field path."""
    if key in SPECIAL:
        return
    model: Any = TrainConfig
    parts = key.split(".")
    for i, part in enumerate(parts):
        fields = getattr(model, "model_fields", None)
        if fields is None or part not in fields:
            raise ValueError(f"unknown key {key!r}: use k, budget or a train setting (e.g. lr, "
                             "loss, data.max_response_length)")
        annotation = fields[part].annotation
        inner = [a for a in getattr(annotation, "__args__", (annotation,)) if a is not type(None)]
        model = inner[0] if i < len(parts) - 1 and inner else None


def parse_param(text: str) -> tuple[str, str]:
    """``KEY=SPEC`` of ``--param``."""
    key, eq, spec = text.partition("=")
    if not eq or not key.strip() or not spec.strip():
        raise ValueError(f"--param {text!r}: expected KEY=SPEC, e.g. k=2,4,8 or "
                         "lr=loguniform:1e-6:1e-4")
    return key.strip(), spec.strip()


class SweepConfig(BaseModel):
    """Settings of ``grouppref sweep``: the search space, the engine and the budget."""

    model_config = ConfigDict(extra="forbid")

    params: dict[str, str | list[Scalar]] = Field(
        default_factory=dict, description="The search space, KEY=SPEC per dimension: KEY is k "
        "(group size), budget (the budget's amount) or a train setting by its dotted key (lr, "
        "loss, data.max_response_length); SPEC a comma list (k=2,4,8) or a range "
        "(loguniform:1e-6:1e-4, uniform:0.05:0.5, int:1:8).")
    sampler: Literal["grid", "random", "tpe"] = Field(
        default="grid", description="Optuna sampler: grid (every combination; lists only), "
        "random or tpe.")
    trials: int | None = Field(
        default=None, ge=1, description="Trials in all, over every worker (default: the grid's "
        "size with the grid sampler, else 10).")
    seeds: int = Field(default=1, ge=1, le=50, description="Training seeds per setting (seed, "
                       "seed+1, ...); each seed also draws its own k-subsample. The summary "
                       "gives each setting's mean and interval over them.")
    seed: int = Field(default=0, description="The first training seed and the sampler's seed.")
    budget: Literal["steps", "tokens", "annotation"] = Field(
        default="steps", description="What every trial gets the same of: optimizer steps, "
        "trained tokens (prompt + candidate tokens), or annotation cost (a group of k costs k "
        "reads to rank: a trial trains its epochs on amount // k groups).")
    amount: int | None = Field(
        default=None, ge=1, description="The budget per seed: steps (default 20), tokens or "
        "reads (both required).")
    metric: str = Field(default="pair_accuracy", description="Held-out metric of the train "
                        "stage's final evaluation to optimise (pair_accuracy, margin, "
                        "logp_pair_accuracy, kl, ...).")
    direction: Literal["maximize", "minimize"] = Field(
        default="maximize", description="Whether a larger or a smaller metric is better.")
    evals: int = Field(default=2, ge=1, description="Held-out evaluations per seed before the "
                       "final one: the intermediate values the pruner compares.")
    pruner: Literal["median", "none"] = Field(
        default="median", description="median: stop a trial whose intermediate held-out "
        "metric is worse than the median of earlier trials at the same evaluation; none.")
    startup_trials: int = Field(default=2, ge=0, description="Finished trials before the "
                                "median pruner prunes.")
    storage: str | None = Field(
        default=None, description="Optuna storage URL: default sqlite:///DIR/study.db (one "
        "machine; resumes after a kill); postgresql://USER:PASS@HOST/DB lets several machines "
        "run workers on one study.")
    study: str | None = Field(default=None, description="Study name (default: sweep- and the "
                              "sweep's cache key, so another search space is another study).")
    keep_models: bool = Field(default=False, description="Keep each trial's model folder "
                              "(default: only its metrics are kept).")
    train: TrainConfig = Field(default_factory=TrainConfig, description="The base train "
                               "settings every trial starts from (the swept keys override "
                               "them): a train config file, or --set train.KEY=VALUE.")

    @field_validator("params")
    @classmethod
    def _space_parses(cls, params: dict[str, Any]) -> dict[str, Any]:
        for key, spec in params.items():
            parse_dimension(key, spec)
        return params

    @model_validator(mode="after")
    def _consistent(self) -> SweepConfig:
        if self.budget != "steps" and self.amount is None and "budget" not in self.params:
            raise ValueError(f"budget {self.budget!r} needs amount (or a swept 'budget')")
        if self.sampler == "grid" and any(not d.is_choice for d in self.dimensions()):
            raise ValueError("the grid sampler takes lists of values only; use random or tpe "
                             "for ranges")
        return self

    def dimensions(self) -> list[Dimension]:
        """The search space, in key order."""
        return [parse_dimension(k, v) for k, v in sorted(self.params.items())]

    def grid_size(self) -> int:
        size = 1
        for d in self.dimensions():
            size *= len(d.choices) if d.is_choice else 0
        return size

    def total_trials(self) -> int:
        """``trials``, else the grid's size (grid) or 10."""
        if self.trials is not None:
            return self.trials
        return self.grid_size() if self.sampler == "grid" else 10

    def default_amount(self) -> int:
        return self.amount if self.amount is not None else 20


def set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    """``data[a][b] = value`` for ``a.b`` (sections made as needed)."""
    *path, last = dotted.split(".")
    node = data
    for part in path:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value


def trial_train_config(base: TrainConfig, params: dict[str, Any]) -> TrainConfig:
    """``base`` with the swept train settings of ``params`` (``k`` and ``budget`` left out).

    Raises:
        ConfigError: the combination is not a valid train config (one line per problem).
    """
    data = base.model_dump(mode="json")
    for key, value in params.items():
        if key not in ("k", "budget"):
            set_dotted(data, key, value)
    return validate(TrainConfig, data, "trial")


SWEEP = StageSpec(name="sweep", config=SweepConfig,
                  summary="Sweep group size and training settings on RUN/validate "
                  "(RUN/sweep: summary, plot, best.yaml).", reads=lambda config: ("validate",))
