"""Settings of the ``report`` stage."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from grouppref.runs.stage import StageSpec

STAGE = "report"


class ReportConfig(BaseModel):
    """Settings of the ``report`` stage."""

    model_config = ConfigDict(extra="forbid")

    output: str | None = Field(default=None, description="HTML file to write (default: "
                               "RUN/report/report.html).")
    title: str | None = Field(default=None, description="Page title (default: the run name).")
    max_reject_reasons: int = Field(default=5, ge=0, description="Most common reject reasons "
                                    "shown per stage.")

REPORT = StageSpec(
    name=STAGE, config=ReportConfig,
    summary="Render the run's HTML report into RUN/report.")
