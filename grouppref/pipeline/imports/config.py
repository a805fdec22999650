"""Settings of the ``import`` stage (``grouppref import``) and of ``generate --import``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from grouppref.readers.mapping import ColumnMapping
from grouppref.runs.stage import StageSpec
from grouppref.schemas import MAX_K, MIN_K
from grouppref.schemas.records import AnnotatorKind

STAGE = "import"


STAGE_VERSION = "1"


CANDIDATES_STAGE = "generate"  # `generate --import`: candidates only, into RUN/generate


CANDIDATES_VERSION = "import-2"


Layout = Literal["auto", "groups", "responses", "ultrafeedback", "nectar", "helpsteer2",
                 "scores", "pairs", "hh", "oasst", "helpsteer3", "arena"]


LAYOUTS: tuple[str, ...] = ("groups", "responses", "ultrafeedback", "nectar", "helpsteer2",
                            "scores", "pairs", "hh", "oasst", "helpsteer3", "arena")


class ImportConfig(BaseModel):
    """Settings of ``grouppref import`` (and of ``generate --import``, which keeps the
    candidates only). Fields left out take the layout's defaults (docs/import.md)."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field(description="File (JSONL/JSON/CSV/Parquet), saved dataset or Hub id "
                        "to import.")
    layout: Layout = Field(default="auto", description="How rows map to groups and rankings: "
                           "groups (grouppref's own), responses (candidates only), "
                           "ultrafeedback, nectar, helpsteer2, scores, pairs, hh, oasst, "
                           "helpsteer3, arena; auto: "
                           "told from the first row's columns.")
    split: str = Field(default="train", description="Split to read from a dataset with splits.")
    mapping: ColumnMapping = Field(default_factory=ColumnMapping,
                                   description="Which columns hold the prompt and responses "
                                   "(layout defaults for the ones not given).")
    text_key: str | None = Field(default=None, description="Key of the text in each response "
                                 "object (default: 'response' for ultrafeedback, 'answer' for "
                                 "nectar, 'text' otherwise).")
    model_key: str = Field(default="model", description="Key of the model name in each "
                           "response object.")
    rank_key: str = Field(default="rank", description="nectar: key of each answer's rank "
                          "(1 = best).")
    scores: list[str] = Field(default_factory=list, description="Score fields that become "
                              "rankings, one each, the field name as annotator id: "
                              "ultrafeedback aspects and/or overall_score / fine-grained_score "
                              "(default: the 4 aspects), helpsteer2 attributes (default: "
                              "helpfulness, correctness, coherence), the scores layout's "
                              "columns (required there).")
    lower_is_better: bool = Field(default=False, description="Scores: a lower value is better "
                                  "(e.g. a rank).")
    missing: list[str] = Field(default_factory=lambda: ["N/A", ""], description="Score values "
                               "meaning 'not rated' (as are null and NaN): that candidate is "
                               "left out of that ranking (a partial ranking).")
    group_by: str | None = Field(default=None, description="scores/helpsteer2: column whose "
                                 "equal values form one group (default: the prompt).")
    chosen: str = Field(default="chosen", description="pairs/hh: column of the preferred "
                        "response (a string or chat messages).")
    rejected: str = Field(default="rejected", description="pairs/hh: column of the other "
                          "response.")
    score_chosen: str = Field(default="score_chosen", description="pairs: column of the "
                              "chosen response's score, kept with the ranking when present.")
    score_rejected: str = Field(default="score_rejected", description="pairs: column of the "
                                "rejected response's score.")
    annotator: str | None = Field(default=None, description="Annotator id of the rankings of "
                                  "nectar, pairs, hh and oasst, the prefix of helpsteer3's "
                                  "('<id>#1', ...) and the arena's when a row has no judge "
                                  "(default: the layout name; a prompt's second pair is "
                                  "'<id>#2', ...).")
    annotator_kind: AnnotatorKind | None = Field(default=None, description="Kind of the "
                                                 "imported annotators (default: llm_judge for "
                                                 "ultrafeedback and nectar, human otherwise).")
    langs: list[str] = Field(default_factory=list, description="oasst, helpsteer3, arena: "
                             "keep only these languages (oasst's 'lang', e.g. en; HelpSteer3's "
                             "and the Arena's 'language', e.g. english, English; case ignored; "
                             "repeatable); default: every language.")
    transcripts: bool = Field(default=True, description="Read 'Human: / Assistant:' "
                              "transcripts (nectar, hh) and HelpSteer2's '<extra_id_1>' turns "
                              "as chat messages.")
    oversize: Literal["split", "reject"] = Field(default="split", description=f"A group of "
                                                 f"more than {MAX_K} distinct responses: split "
                                                 "it into groups of at most that many "
                                                 "(rankings kept, partial) or reject it.")
    min_k: int = Field(default=MIN_K, ge=MIN_K, le=MAX_K, description="Fewest distinct "
                       "candidates a group may keep; groups with fewer go to rejects.")
    shard_size: int = Field(default=5000, ge=1, description="Groups per output shard.")
    workers: int = Field(default=0, ge=0, le=64, exclude=True, description="Processes that "
                         "read a large JSONL file of a layout of one row per group (nectar, "
                         "ultrafeedback), a part each (0: one per CPU core, at most 8; 1: one "
                         "process). The result is the same for any number.")

    @model_validator(mode="after")
    def _scores_given(self) -> ImportConfig:
        if self.layout == "scores" and not self.scores:
            raise ValueError("layout 'scores' needs the score columns: give --score COLUMN "
                             "(repeatable)")
        return self


def _reads(config: ImportConfig) -> tuple[str, ...]:
    return ()


IMPORT = StageSpec(
    name=STAGE, config=ImportConfig,
    summary="Import groups with their rankings (or candidates only) into RUN/import.",
    reads=_reads)


IMPORT_CANDIDATES = StageSpec(
    name=CANDIDATES_STAGE, config=ImportConfig,
    summary="Import candidates made elsewhere into RUN/generate (generate --import).",
    reads=_reads)
