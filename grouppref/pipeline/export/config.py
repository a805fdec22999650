"""Settings of the ``export`` stage."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from grouppref.runs.hashing import sha256_text
from grouppref.runs.stage import StageSpec

STAGE = "export"


INPUT_STAGE = "validate"


STAGE_VERSION = "1"


SPLITS = ("train", "test")


class ExportConfig(BaseModel):
    """Settings of the ``export`` stage (exactly one of ``to_dir``, ``parquet``, ``hub``)."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["groups", "trl-pairs"] = Field(
        default="groups", description="'groups': one row per group (ValidatedGroup); "
        "'trl-pairs': TRL's prompt/chosen/rejected rows, one per consensus pair, with weight.")
    to_dir: str | None = Field(default=None, description="Write a DatasetDict with "
                               "save_to_disk and a README.md card into this directory.")
    parquet: str | None = Field(default=None, description="Write one Parquet file with a "
                                "'split' column (the card goes beside it as FILE.md).")
    hub: str | None = Field(default=None, description="Push to this Hub dataset repo "
                            "(owner/name); the token comes from HF_TOKEN or `hf auth login`.")
    dry_run: bool = Field(default=False, description="With hub: write the exact files the "
                          "push would upload into a local folder instead of pushing.")
    dry_run_dir: str | None = Field(default=None, description="Folder of the dry run "
                                    "(default RUN/export/dry-run).")
    pairs: Literal["consensus", "best_worst"] = Field(
        default="consensus", description="trl-pairs: every consensus pair, or only the best vs "
        "the worst candidate of each group (DPO's classic pairs).")
    min_weight: float = Field(default=0.0, ge=0.0, le=1.0,
                              description="trl-pairs: leave out pairs with a smaller weight.")
    chat: Literal["auto", "always"] = Field(
        default="auto", description="trl-pairs: 'auto' writes chat turns when any prompt is "
        "chat (text prompts become one user turn), else plain strings; 'always' writes chat.")
    license: str = Field(default="other", description="License id for the dataset card.")
    pretty_name: str | None = Field(default=None, description="Title of the dataset card.")
    private: bool = Field(default=True, description="Hub: create the repo as private.")
    max_shard_size: str = Field(default="500MB",
                                description="Hub: largest Parquet shard (e.g. 500MB).")

    @model_validator(mode="after")
    def _one_target(self) -> ExportConfig:
        options = {"to_dir": "--to", "parquet": "--parquet", "hub": "--hub"}
        given = [option for field, option in options.items() if getattr(self, field)]
        if len(given) != 1:
            raise ValueError("give exactly one of --to, --parquet, --hub "
                             f"(got {', '.join(given) or 'none'})")
        if (self.dry_run or self.dry_run_dir) and not self.hub:
            raise ValueError("--dry-run only goes with --hub REPO")
        return self

    def stage_name(self) -> str:
        """Its folder in the run, one per target: ``export/<target>-<name>-<hash>``."""
        where = self.hub or self.to_dir or self.parquet or ""
        base = re.sub(r"[^\w.-]+", "-", Path(where).name or where).strip("-.") or "export"
        return f"{STAGE}/{self.target}-{base}-{sha256_text(where)[:6]}"

    @property
    def target(self) -> str:
        if self.hub:
            return "hub-dry-run" if self.dry_run else "hub"
        return "dir" if self.to_dir else "parquet"


def _reads(config: ExportConfig) -> tuple[str, ...]:
    return (INPUT_STAGE,)


EXPORT = StageSpec(
    name=STAGE, config=ExportConfig, entry="grouppref.pipeline.export.stage:run_export",
    summary="Export RUN/validate to a folder, Parquet or the Hub (RUN/export/<target>).", reads=_reads)
