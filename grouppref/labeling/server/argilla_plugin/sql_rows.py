"""Loads the JSON-valued parts of a dataset's records for the SQL search engine.

Everything is read per dataset (never ``IN (<thousands of ids>)``, which SQLite caps) and
cached for the duration of one search.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import sql_matching as m
from argilla_server.models import Field, Question, Record, Response, Suggestion
from argilla_server.search_engine.base import (
    MetadataFilterScope,
    Order,
    RangeFilter,
    RecordFilterScope,
    ResponseFilterScope,
    SuggestionFilterScope,
    TermsFilter,
)
from sqlalchemy import select


def _plain(value: Any) -> Any:
    """Enum members as their values (suggestion type, response status)."""
    return getattr(value, "value", value)


class RowLoader:
    """Per-search access to metadata, suggestions, responses and field texts.

    Args:
        db (AsyncSession): argilla-server's session.
        dataset_id (UUID): the dataset searched.
        ids (Sequence[UUID]): the candidate records (already filtered in SQL).
    """

    def __init__(self, db: Any, dataset_id: Any, ids: Sequence[Any]) -> None:
        self.db = db
        self.dataset_id = dataset_id
        self.ids = set(ids)
        self._metadata: dict[Any, dict[str, Any]] | None = None
        self._responses: list[tuple[Any, Any, Any, dict[str, Any]]] | None = None

    async def metadata(self) -> dict[Any, dict[str, Any]]:
        if self._metadata is None:
            rows = await self.db.execute(select(Record.id, Record.metadata_)
                                         .where(Record.dataset_id == self.dataset_id))
            self._metadata = {i: md or {} for i, md in rows.all() if i in self.ids}
        return self._metadata

    async def suggestions(self, question: str, prop: str) -> dict[Any, Any]:
        """``record id -> suggestion[prop]`` for one question (``value/score/agent/type``)."""
        column = getattr(Suggestion, prop)
        rows = await self.db.execute(
            select(Suggestion.record_id, column).join(Question, Question.id == Suggestion.question_id)
            .where(Question.dataset_id == self.dataset_id, Question.name == question))
        return {i: _plain(v) for i, v in rows.all() if i in self.ids}

    async def responses(self) -> list[tuple[Any, Any, Any, dict[str, Any]]]:
        """``(record id, user id, status, values)`` of every response in the dataset."""
        if self._responses is None:
            rows = await self.db.execute(
                select(Response.record_id, Response.user_id, Response.status, Response.values)
                .join(Record, Record.id == Response.record_id)
                .where(Record.dataset_id == self.dataset_id))
            self._responses = [(r, u, _plain(s), v or {}) for r, u, s, v in rows.all()
                               if r in self.ids]
        return self._responses

    async def response_values(self, scope: ResponseFilterScope) -> dict[Any, list[Any]]:
        """``record id -> [answer to scope.question, ...]`` (only the scope user's if set)."""
        out: dict[Any, list[Any]] = defaultdict(list)
        for record_id, user_id, status, values in await self.responses():
            if scope.user is not None and user_id != scope.user.id:
                continue
            if scope.question is None:
                out[record_id].append(status)
            else:
                answer = values.get(scope.question)
                if isinstance(answer, dict) and answer.get("value") is not None:
                    out[record_id].append(answer["value"])
        return out

    async def values_for(self, scope: Any) -> dict[Any, Any]:
        """``record id -> value`` of the property a filter or sort scope names."""
        if isinstance(scope, MetadataFilterScope):
            md = await self.metadata()
            return {i: d.get(scope.metadata_property) for i, d in md.items()}
        if isinstance(scope, SuggestionFilterScope):
            return await self.suggestions(scope.question, scope.property or "value")
        if isinstance(scope, ResponseFilterScope):
            return dict(await self.response_values(scope))
        if isinstance(scope, RecordFilterScope):
            column = getattr(Record, scope.property)
            rows = await self.db.execute(select(Record.id, column)
                                         .where(Record.dataset_id == self.dataset_id))
            return {i: _sortable(_plain(v)) for i, v in rows.all() if i in self.ids}
        raise ValueError(f"cannot search on scope {scope}")

    async def filter_matches(self, leaf: TermsFilter | RangeFilter) -> set[Any]:
        """The candidate records a terms or range filter keeps."""
        values = await self.values_for(leaf.scope)
        if isinstance(leaf, TermsFilter):
            return {i for i, v in values.items() if m.terms_match(v, leaf.values)}
        ge = None if leaf.ge is None else float(leaf.ge)
        le = None if leaf.le is None else float(leaf.le)
        return {i for i, v in values.items() if m.range_match(v, ge, le)}

    async def sort_key(self, order: Order) -> Callable[[Any], Any]:
        """A key function ``record id -> sort value or None`` for one sort order."""
        values = await self.values_for(order.scope)
        descending = order.order == "desc"
        if isinstance(order.scope, ResponseFilterScope) and order.scope.question is not None:
            # Elasticsearch's nested sort with mode "avg" over the (user's) answers
            averages = {}
            for i, answers in values.items():
                numbers = [n for n in (m.as_number(a) for a in m.flat(answers)) if n is not None]
                averages[i] = sum(numbers) / len(numbers) if numbers else None
            return lambda i: averages.get(i)
        return lambda i: m.sort_value(values.get(i), descending)

    async def texts(self, ids: Sequence[Any], field: str | None) -> dict[Any, str]:
        """``record id -> searchable text`` of one field, or of every text-like field."""
        rows = await self.db.execute(select(Field.name, Field.settings)
                                     .where(Field.dataset_id == self.dataset_id))
        searchable = [name for name, settings in rows.all()
                      if (settings or {}).get("type") in ("text", "chat", "custom")]
        names = [field] if field else searchable
        wanted = set(ids)
        records = await self.db.execute(select(Record.id, Record.fields)
                                        .where(Record.dataset_id == self.dataset_id))
        return {i: " \n ".join(m.searchable_text((fields or {}).get(n)) for n in names)
                for i, fields in records.all() if i in wanted}


def _sortable(value: Any) -> Any:
    """Dates sort as timestamps; ids and texts as strings."""
    if hasattr(value, "timestamp"):
        return value.timestamp()
    return value if isinstance(value, (int, float, str)) or value is None else str(value)

