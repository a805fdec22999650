"""Helpers shared by the CLI modules: option help taken from the settings' own descriptions."""

from __future__ import annotations

from pydantic import BaseModel


def help_of(model: type[BaseModel], field: str) -> str:
    """The ``Field(description=...)`` of ``model.field``: the one help string, reused by the CLI."""
    description = model.model_fields[field].description
    if not description:
        raise KeyError(f"{model.__name__}.{field} has no description; add Field(description=...)")
    return description
