"""Exception types of grouppref.

All subclass ``ValueError`` so callers that only know the standard library still catch them.
The CLI turns every ``GroupPrefError`` into one line on stderr and exit code 2.
"""

from __future__ import annotations


class GroupPrefError(ValueError):
    """Base class: a problem the user can fix (bad input, bad config, missing model)."""


class InputFileError(GroupPrefError):
    """A whole input file cannot be used: missing, unreadable, wrong format or empty."""


class ConfigError(GroupPrefError):
    """A configuration value is invalid; the message names the key and the allowed values."""


class RowError(GroupPrefError):
    """One input row is invalid. Carries where it came from so it can become a reject.

    Args:
        reason (str): what is wrong and, where possible, how to fix it.
        field (str | None): the offending field or column.
        source (str | None): the file (or dataset) the row came from.
        row (int | None): 1-based row number in ``source``.
        group_id (str | None): the group the row belongs to, when known.
    """

    def __init__(
        self,
        reason: str,
        *,
        field: str | None = None,
        source: str | None = None,
        row: int | None = None,
        group_id: str | None = None,
    ) -> None:
        self.reason = reason
        self.field = field
        self.source = source
        self.row = row
        self.group_id = group_id
        super().__init__(self.one_line())

    def one_line(self) -> str:
        where = ", ".join(
            part
            for part in (
                self.source,
                f"row {self.row}" if self.row is not None else None,
                f"field {self.field!r}" if self.field else None,
            )
            if part
        )
        return f"{where}: {self.reason}" if where else self.reason


class StageError(GroupPrefError):
    """A stage cannot run (its input stage is missing or incomplete, or a resume is unsafe)."""
