"""Settings of the ``export`` stage."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from grouppref.runs.hashing import sha256_text
from grouppref.runs.stage import StageSpec

STAGE = "export"


INPUT_STAGE = "validate"


STAGE_VERSION = "1"


SPLITS = ("train", "test")


def hub_license(value: str) -> str:
    """A license as the Hub's card metadata writes it: ``other``, or one SPDX id, lowercase.

    Raises:
        ValueError: not a single SPDX license id (``packaging``'s SPDX list).
    """
    from packaging.licenses import InvalidLicenseExpression, canonicalize_license_expression

    text = value.strip()
    if text.lower() == "other":
        return "other"
    try:
        canonical = canonicalize_license_expression(text)
    except InvalidLicenseExpression as e:
        raise ValueError(f"license {value!r} is not an SPDX license id (e.g. cc-by-4.0, "
                         "apache-2.0, mit); for another license give 'other' with "
                         "license_name") from e
    if " " in canonical:
        raise ValueError(f"license {value!r}: give one SPDX id, not an expression")
    return canonical.lower()


class ExportConfig(BaseModel):
    """Settings of the ``export`` stage (exactly one of ``to_dir``, ``parquet``, ``hub``)."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["groups", "trl-pairs"] = Field(
        default="groups", description="'groups': one row per group (ValidatedGroup); "
        "'trl-pairs': TRL's prompt/chosen/rejected rows, one per consensus pair, with weight.")
    to_dir: str | None = Field(default=None, description="Write a DatasetDict with "
                               "save_to_disk and a README.md card into this directory.")
    parquet: str | None = Field(default=None, description="Write Parquet, one file per split "
                                "(the Hugging Face convention): a folder DIR gets "
                                "DIR/train.parquet, DIR/test.parquet and the card DIR/README.md; "
                                "a name ending in .parquet holds the one split --split names "
                                "(the card goes beside it as FILE.md).")
    split: Literal["train", "test"] | None = Field(default=None, description="Export only this "
                                                   "split (default: every split).")
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
    license: str | None = Field(default=None, description="License of the dataset card: an "
                                "SPDX id (e.g. cc-by-4.0, apache-2.0, mit), or 'other' with "
                                "license_name (default: none given).")
    license_name: str | None = Field(default=None, description="With license 'other': a short "
                                     "slug naming the license (e.g. my-org-data-license).")
    license_link: str | None = Field(default=None, description="With license 'other': a URL "
                                     "or a file of the repo holding the license text.")
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
        if self.parquet and self.parquet.endswith(".parquet") and self.split is None:
            raise ValueError(f"--parquet {self.parquet}: a .parquet file holds one split; add "
                             "--split train or --split test, or give a folder (one file per "
                             "split)")
        return self

    @field_validator("license")
    @classmethod
    def _spdx(cls, value: str | None) -> str | None:
        return None if value is None else hub_license(value)

    @model_validator(mode="after")
    def _license_name(self) -> ExportConfig:
        if self.license == "other" and not self.license_name:
            raise ValueError("--license other needs --license-name (a slug naming the license), "
                             "or give an SPDX id such as cc-by-4.0")
        if self.license != "other" and (self.license_name or self.license_link):
            raise ValueError("--license-name / --license-link go with --license other only")
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
    name=STAGE, config=ExportConfig,
    summary="Export RUN/validate to a folder, Parquet or the Hub (RUN/export/<target>).", reads=_reads)
