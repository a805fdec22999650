"""Typed reports of ``label push``'s active selection (``RUN/label/selection.json`` and the
push stage's stats): which groups went to people and why. Split from
:mod:`grouppref.schemas.reports` (same rules: the reader validates, never reads by key)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SelectionRole = Literal["uncertain", "audit", "random", "all"]


class _Report(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- label push: active selection -----------------------------------------------------------------
class SelectedGroup(_Report):
    """One group a push sent to people, with the uncertainty it was chosen by."""

    group_id: str
    uncertainty: float | None = Field(description="The criterion's value (larger: less "
                                      "certain); none for a random selection.")
    role: SelectionRole | None = Field(
        default=None, description="Why it was sent: the most uncertain, a uniform audit draw "
        "(--audit-share), a random draw, or every group (None: recorded before roles; the "
        "pushed record's metadata `selection` says the same).")


class LabelSelection(_Report):
    """Which groups ``label push`` sent and why (``RUN/label/selection.json``, and the
    ``selection`` of the push stage's stats)."""

    select: Literal["all", "uncertain", "random"]
    uncertainty: str | None = Field(default=None, description="The criterion of --select "
                                    "uncertain: kendall_w, bt_posterior or rm_margin.")
    measure: str | None = Field(default=None, description="What the uncertainty value is.")
    budget: int | None = Field(default=None, description="Groups asked for (none: all).")
    seed: int = Field(default=0, description="Seed of the random draw (random) or of the "
                      "order among equal uncertainties and the audit draw (uncertain).")
    audit_share: float = Field(default=0.0, description="Share of the budget drawn uniformly "
                               "from all groups as audit groups (uncertain).")
    source_stage: str
    dataset: str | None = Field(default=None, description="Base name of the Argilla datasets "
                                "the groups went to (set by the push).")
    groups: int = Field(description="Groups of the source stage.")
    selected: list[SelectedGroup] = Field(default_factory=list, description="The groups sent, "
                                          "most uncertain first (all of them for select=all).")
    threshold: float | None = Field(default=None, description="Uncertainty of the last group "
                                    "sent for its uncertainty (uncertain).")
    rest_mean: float | None = Field(default=None, description="Mean uncertainty of the groups "
                                    "not sent (uncertain).")

    @property
    def ids(self) -> list[str]:
        return [g.group_id for g in self.selected]
