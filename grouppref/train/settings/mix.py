"""Training on a schedule of label sources: the human-to-automatic curriculum (``--mix``).

A training group's *source* is ``human`` when the rankings its consensus was fitted on
include one by an annotator of a human kind (``human_kinds``: by default ``human`` and
``simulated``, the simulated panel standing in for people), else ``auto`` (reward models,
rules, LLM judges only). :class:`MixConfig` is the typed setting (torch-free: the CLI builds its option from
it); :class:`~grouppref.train.policy.mix_sampler.MixSampler` draws each micro-batch's groups
so that the sources' shares follow the schedule.

Schedule syntax (one string; ``SOURCE=SHARE`` pairs separated by commas, a source left out
has share 0, every point's shares sum to 1):

* ``human=0.5,auto=0.5``: constant shares;
* ``human=0.8,auto=0.2 -> human=0,auto=1``: linear over training, the first point at the
  first optimizer update, the last at the last one; more ``->`` points are spaced evenly;
* ``human=1 @0; human=0.5,auto=0.5 @100; auto=1 @200``: by optimizer steps (``@S``: the
  update made after S updates), linear between points, the last point's shares after it.
  The first point is ``@0`` and steps increase; a jump is two points one step apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from grouppref.schemas.records import AnnotatorKind

Source = Literal["human", "auto"]
SOURCES: tuple[Source, ...] = get_args(Source)
DEFAULT_HUMAN_KINDS: tuple[AnnotatorKind, ...] = ("human", "simulated")
MIX_METRICS = tuple(f"mix_{s}" for s in SOURCES) + tuple(f"mix_target_{s}" for s in SOURCES)
SUM_TOLERANCE = 1e-6
K = TypeVar("K", bound=str)  # a share's key: a source, or a name the parser read


class MixPoint(BaseModel):
    """One point of a schedule: each source's share of a batch, and where it applies."""

    model_config = ConfigDict(extra="forbid")

    shares: dict[Source, float] = Field(description="Share of each batch per source (a "
                                        "source left out: 0); they sum to 1.")
    step: int | None = Field(default=None, ge=0, description="Optimizer updates done when "
                             "this point applies (by-steps form); unset: spaced evenly over "
                             "training (linear form).")

    @field_validator("shares")
    @classmethod
    def _sum_to_one(cls, shares: dict[str, float]) -> dict[Source, float]:
        return checked_shares(shares)


def checked_shares(shares: Mapping[str, float], where: str = "") -> dict[Source, float]:
    """Every source's share (0 where left out).

    Raises:
        ValueError: a share outside [0, 1], or shares that do not sum to 1.
    """
    bad = {k: v for k, v in shares.items() if not 0.0 <= v <= 1.0}
    if bad:
        raise ValueError(f"{where}shares must lie in [0, 1], got {_show(bad)}")
    full = {s: float(shares.get(s, 0.0)) for s in SOURCES}
    if abs(sum(full.values()) - 1.0) > SUM_TOLERANCE:
        raise ValueError(f"{where}shares {_show(full)} sum to {sum(full.values()):g}, not 1; "
                         "make each point's shares add up to 1, e.g. human=0.8,auto=0.2")
    return full


def _show(shares: Mapping[K, float]) -> str:
    return ",".join(f"{k}={v:g}" for k, v in shares.items())


def parse_schedule(text: str) -> list[dict[str, Any]]:
    """``'human=0.8,auto=0.2 -> auto=1'`` or ``'human=1 @0; auto=1 @50'`` -> point dicts
    (validated by :class:`MixPoint`).

    Raises:
        ValueError: the two forms mixed, a pair that is not ``SOURCE=SHARE``, an unknown
            source, a share or step that is not a number.
    """
    by_steps, linear = ";" in text or "@" in text, "->" in text
    if by_steps and linear:
        raise ValueError(f"{text!r} mixes the linear form ('->') and the by-steps form "
                         "('@STEP', ';'); use one")
    parts = [p.strip() for p in text.split(";" if by_steps else "->")]
    return [_parse_point(p, by_steps) for p in parts if p or not by_steps]


def _parse_point(part: str, by_steps: bool) -> dict[str, Any]:
    spec, at, step = part.partition("@")
    point: dict[str, Any] = {"shares": {}}
    if by_steps:
        if not at or not step.strip().isdigit():
            raise ValueError(f"point {part!r}: the by-steps form gives every point its step, "
                             "e.g. 'human=1,auto=0 @0; human=0,auto=1 @100'")
        point["step"] = int(step)
    for pair in (p.strip() for p in spec.split(",")):
        name, eq, value = pair.partition("=")
        name = name.strip()
        if not eq:
            raise ValueError(f"{pair!r} is not SOURCE=SHARE (e.g. human=0.8)")
        if name not in SOURCES:
            raise ValueError(f"unknown source {name!r}; the sources are {', '.join(SOURCES)}")
        try:
            point["shares"][name] = float(value)
        except ValueError:
            raise ValueError(f"{pair!r}: the share {value.strip()!r} is not a number") from None
    checked_shares(point["shares"], where=f"point {part!r}: ")
    return point


class MixConfig(BaseModel):
    """Mix training groups by label source on a schedule (docs/train.md, "Mixing label
    sources")."""

    model_config = ConfigDict(extra="forbid")

    schedule: list[MixPoint] = Field(
        min_length=1, description="Shares of label sources per batch over training: "
        "'human=0.5,auto=0.5' (constant), 'human=0.8,auto=0.2 -> human=0,auto=1' (linear "
        "over training) or 'human=1 @0; human=0.5,auto=0.5 @100; auto=1 @200' (by optimizer "
        "steps, linear between points). Sources: human (a consensus with a ranking by a "
        "human kind), auto (the rest); each point sums to 1.")
    human_kinds: list[AnnotatorKind] = Field(
        default_factory=lambda: list(DEFAULT_HUMAN_KINDS), min_length=1,
        description="Annotator kinds that make a group's source 'human' (default: human and "
        "simulated, the simulated panel standing in for people).")

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, data: Any) -> Any:
        return {"schedule": data} if isinstance(data, str) else data  # mix: "SCHEDULE"

    @field_validator("schedule", mode="before")
    @classmethod
    def _parse(cls, value: Any) -> Any:
        return parse_schedule(value) if isinstance(value, str) else value

    @field_validator("schedule")
    @classmethod
    def _steps_consistent(cls, points: list[MixPoint]) -> list[MixPoint]:
        steps = [p.step for p in points]
        if any(s is None for s in steps) and any(s is not None for s in steps):
            raise ValueError("give every point a step (@S) or none")
        if steps[0] is not None:
            if steps[0] != 0:
                raise ValueError(f"the first point is at step {steps[0]}; start at @0")
            if any(b <= a for a, b in zip(steps, steps[1:], strict=False)):  # type: ignore[operator]
                raise ValueError(f"steps {steps} must increase")
        return points

    def shares_at(self, step: float, total_steps: int) -> dict[Source, float]:
        """Scheduled shares for the update made after ``step`` updates of ``total_steps``."""
        points = self.schedule
        if len(points) == 1:
            return dict(points[0].shares)
        if points[0].step is None:
            x = min(step / max(total_steps - 1, 1), 1.0) * (len(points) - 1)
            at = [float(i) for i in range(len(points))]
        else:
            x, at = float(step), [float(p.step or 0) for p in points]
        if x >= at[-1]:
            return dict(points[-1].shares)
        i = max(j for j in range(len(at)) if at[j] <= x)
        f = (x - at[i]) / (at[i + 1] - at[i])
        a, b = points[i].shares, points[i + 1].shares
        return {s: a[s] + f * (b[s] - a[s]) for s in SOURCES}

    def max_share(self, source: Source) -> float:
        """Largest share ``source`` gets anywhere (points are the extremes of a
        piecewise-linear schedule)."""
        return max(p.shares[source] for p in self.schedule)

    def source_of(self, kinds: Sequence[str]) -> Source:
        """``human`` when one of ``kinds`` (a group's consensus kinds) is a human kind."""
        return "human" if set(kinds) & set(self.human_kinds) else "auto"

    def describe(self) -> str:
        """The schedule in its command-line syntax."""
        if self.schedule[0].step is None:
            return " -> ".join(_show(p.shares) for p in self.schedule)
        return "; ".join(f"{_show(p.shares)} @{p.step}" for p in self.schedule)


