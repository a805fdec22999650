"""Record schemas (docs/data-format.md) and their Arrow mapping."""

from grouppref.schemas.arrow import features_for, from_dataset, from_row, to_dataset, to_row
from grouppref.schemas.records import (
    MAX_K,
    MIN_K,
    RECORD_TYPES,
    Agreement,
    AnnotatedGroup,
    Annotator,
    Candidate,
    CandidateGroup,
    CandidateSource,
    ChatMessage,
    PairPreference,
    Prompt,
    Ranking,
    Record,
    Reject,
    ValidatedGroup,
    check_tiers,
    group_id_of,
    make_candidate_id,
    make_group_id,
    normalise_text,
)

__all__ = [
    "MAX_K", "MIN_K", "RECORD_TYPES", "Agreement", "AnnotatedGroup", "Annotator", "Candidate",
    "CandidateGroup", "CandidateSource", "ChatMessage", "PairPreference", "Prompt", "Ranking",
    "Record", "Reject", "ValidatedGroup", "check_tiers", "features_for", "from_dataset",
    "from_row", "group_id_of", "make_candidate_id", "make_group_id", "normalise_text", "to_dataset", "to_row",
]
