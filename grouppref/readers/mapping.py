"""Which input columns hold which fields: the mapping every reader takes (settings only)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DuplicateIds = Literal["reject_later", "reject_all"]


class ColumnMapping(BaseModel):
    """Which input columns hold which prompt fields. A ``None`` column is not read."""

    model_config = ConfigDict(extra="forbid")

    prompt_id: str | None = Field(default="prompt_id", description="Column with the prompt id "
                                  "(a content hash is used when the row has no such column).")
    text: str | None = Field(default="prompt", description="Column with a plain-text prompt.")
    messages: str | None = Field(default="messages", description="Column with chat turns "
                                 "(a list of {role, content}; JSON text in CSV).")
    reference: str | None = Field(default="reference", description="Column with the reference "
                                  "answer (optional).")
    metadata: str | None = Field(default="metadata", description="Column with a metadata object "
                                 "(str/int/float/bool values; JSON text in CSV).")
    metadata_columns: list[str] = Field(default_factory=list,
                                        description="Further columns copied into metadata.")
    responses: str = Field(default="responses", description="Import: column with a list of "
                           "responses (strings or {text, model}) in one-row-per-prompt files.")
    response: str = Field(default="response", description="Import: column with one response in "
                          "one-row-per-response files (rows sharing a prompt form a group).")
    duplicate_ids: DuplicateIds = Field(default="reject_later", description="Two rows with one "
                                        "prompt_id but different prompts: reject the later row "
                                        "(reject_later) or both (reject_all). Never two records "
                                        "with one id.")
