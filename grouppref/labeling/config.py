"""Settings of labeling in Argilla: the dataset of a run (push, pull, status) and the ``label``
stage of ``grouppref run``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from grouppref.labeling.dataset import RATIONALE, DatasetSpec, is_chat
from grouppref.runs.stage import StageSpec
from grouppref.runs.store import RunStore

SOURCE_STAGES = ("rank", "generate")


LABEL_STAGE = "label"


DEFAULT_WORKSPACE = "grouppref"  # also the embedded server's default workspace


MAX_BATCH = 500  # the server's limit for one bulk upsert


AUDIT_SHARE = 0.2  # default audit share of --select uncertain (docs/evidence.md, issue 18)


SourceStage = Literal["rank", "generate", "simulate"]


Uncertainty = Literal["bt_posterior", "kendall_w", "rm_margin"]


class TargetConfig(BaseModel):
    """Which Argilla dataset belongs to a run (shared by push, pull and status)."""

    model_config = ConfigDict(extra="forbid")

    dataset: str | None = Field(default=None, min_length=1, max_length=190, description=(
        "Base name of the run's Argilla datasets, one per group size k: '<name>-k<k>'; "
        "default 'grouppref-<run directory name>'."))
    workspace: str = Field(default=DEFAULT_WORKSPACE, description="Argilla workspace of the dataset "
                           "(created on push when missing and the key is an owner's).")
    source_stage: SourceStage | None = Field(default=None, description="Stage whose groups "
                                             "are labelled; default: the latest complete of "
                                             "rank and generate.")

    def dataset_name(self, store: RunStore) -> str:
        return self.dataset or f"grouppref-{store.name}"


def _spec_help(name: str) -> str:
    """The description of ``DatasetSpec.name``, which a push setting extends."""
    return DatasetSpec.model_fields[name].description or ""


class PushConfig(TargetConfig):
    """Settings of ``label push``."""

    min_submitted: int | None = Field(default=None, ge=1, description=_spec_help(
        "min_submitted") + " Default: an existing dataset's value, else 1.")
    rationale: bool | None = Field(default=None, description=_spec_help(
        "rationale") + " Default: as an existing dataset has it, else yes.")
    use_markdown: bool = Field(default=False, description=DatasetSpec.model_fields[
        "use_markdown"].description)
    guidelines: str | None = Field(default=None, description="Annotation guidelines (text); "
                                   "default: grouppref's ranking guidelines.")
    suggest_from: str | None = Field(default=None, description="Annotator id of the automatic "
                                     "ranking shown as suggestion; default: the ensemble "
                                     "ranking when a group has one, else its first automatic "
                                     "ranking.")
    batch_size: int = Field(default=100, ge=1, le=MAX_BATCH,
                            description="Records per bulk upsert request.")
    select: Literal["all", "uncertain", "random"] = Field(default="all", description=(
        "Which groups go to people: all of them, the --budget groups whose automatic rankings "
        "are least certain (see --uncertainty), or --budget groups drawn at random (--seed)."))
    budget: int | None = Field(default=None, ge=1, description="Groups to send with --select "
                               "uncertain or random.")
    uncertainty: Uncertainty = Field(default="bt_posterior", description=(
        "With --select uncertain: bt_posterior (expected share of wrongly ordered pairs under "
        "the Bradley-Terry posterior of the automatic rankings), kendall_w (1 - Kendall's W "
        "between automatic rankers) or rm_margin (smallest gap between a reward model's "
        "scores)."))
    audit_share: float | None = Field(default=None, ge=0.0, le=1.0, description=(
        "With --select uncertain: this share of the budget is drawn uniformly at random from "
        "all groups (--seed) as audit groups, the rest are the most uncertain of the others. "
        "Records say which (metadata selection: audit or uncertain), and the aggregate judges "
        "the reliability of an annotator who saw uncertain groups on its audit groups only "
        "(the hardest groups make anyone look unreliable). Default: "
        f"{AUDIT_SHARE:g} with --select uncertain, none otherwise. 0: no audit groups; "
        "those annotators are then judged on the hardest groups (biased low)."))
    seed: int = Field(default=0, description="Seed of --select random (and of the order among "
                      "equally uncertain groups, and of the audit draw).")

    @model_validator(mode="after")
    def _budget_with_select(self) -> PushConfig:
        if self.select == "all" and self.budget is not None:
            raise ValueError(f"budget {self.budget} needs select 'uncertain' or 'random' "
                             "(select 'all' sends every group); add --select uncertain")
        if self.select != "all" and self.budget is None:
            raise ValueError(f"select {self.select!r} needs a budget: the number of groups "
                             "to send, e.g. --budget 100")
        if self.audit_share and self.select != "uncertain":
            raise ValueError(f"audit_share {self.audit_share:g} needs select 'uncertain' (a "
                             f"select {self.select!r} push is already uniform); add --select "
                             "uncertain or drop --audit-share")
        if self.audit_share is None:  # resolved here, so the run records the share used
            self.audit_share = AUDIT_SHARE if self.select == "uncertain" else 0.0
        return self

    def spec(self, k: int, chat: bool, existing: dict[str, Any] | None = None,
             fields: list[dict[str, Any]] | None = None) -> DatasetSpec:
        """The spec of the size-``k`` dataset; unset choices follow the existing dataset
        (``existing``: its :func:`schema_summary`; ``fields``: its fields, whose prompt may
        already be a ChatField, which plain prompts fit too)."""
        extra = {"guidelines": self.guidelines} if self.guidelines else {}
        min_submitted = self.min_submitted or (existing or {}).get("min_submitted") or 1
        rationale = self.rationale
        if rationale is None:
            rationale = existing is None or RATIONALE in existing["questions"]
        return DatasetSpec(k=k, chat=chat or is_chat(fields or []), min_submitted=min_submitted,
                           rationale=rationale, use_markdown=self.use_markdown, **extra)


class PullConfig(TargetConfig):
    """Settings of ``label pull`` (the dataset, workspace and input stage)."""


class LabelRunConfig(BaseModel):
    """Human labeling inside a run: push, wait for enough submitted rankings, pull."""

    model_config = ConfigDict(extra="forbid")

    push: PushConfig = Field(default_factory=PushConfig, description="Dataset, workspace, "
                             "source stage and push settings (the pull reads the same dataset).")
    min_rankings: int = Field(default=1, ge=1, description="Submitted human rankings a group "
                              "needs before the run goes on (also the dataset's min_submitted "
                              "when push.min_submitted is unset).")
    min_groups: float = Field(default=1.0, gt=0.0, le=1.0, description="Share of the groups "
                              "that must have min_rankings before the run goes on.")
    api_url: str | None = Field(default=None, description="Argilla URL; its API key comes from "
                                "$ARGILLA_API_KEY (default: $ARGILLA_API_URL, else the embedded "
                                "server's URL and owner key).")
    state_dir: str | None = Field(default=None, description="State directory of the embedded "
                                  "server to use (default: its default state directory).")
    poll_seconds: float = Field(default=30.0, gt=0, description="With --wait: seconds between "
                                "progress checks.")

    @model_validator(mode="after")
    def _one_server(self) -> LabelRunConfig:
        if self.api_url and self.state_dir:
            raise ValueError("api_url and state_dir both name a server; give api_url (any "
                             "Argilla, key from $ARGILLA_API_KEY) or state_dir (the embedded "
                             "server started there)")
        return self


def _reads(config: LabelRunConfig) -> tuple[str, ...]:
    return (config.push.source_stage,) if config.push.source_stage else SOURCE_STAGES


LABEL = StageSpec(
    name=LABEL_STAGE, config=LabelRunConfig,
    summary="Push to Argilla, wait for human rankings, pull them into RUN/label.", reads=_reads)
