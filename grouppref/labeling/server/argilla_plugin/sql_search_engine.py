"""argilla-server search engine over Argilla's own SQL tables (no Elasticsearch).

Imported by the launcher (``launch.py``) in argilla-server's virtual environment before the
app or the worker starts; it registers itself as ``ARGILLA_SEARCH_ENGINE=sql``.

How it departs from the Elasticsearch engine: there is no index. Every query reads the
records, responses, suggestions and vectors tables, so the index-maintenance methods are
no-ops and a search always sees committed data. Structural filters (dataset, record
properties, response status per user) run in SQL; JSON-valued ones (metadata, suggestions,
response values), text queries and the per-user shuffle run in Python over the rows SQL
selected. Similarity search is brute force. Meant for local labeling (up to ~10^5 records
per dataset); use Elasticsearch beyond.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
from collections import defaultdict
from typing import Any
from uuid import UUID

import sql_matching as m
from argilla_server.enums import ResponseStatus, ResponseStatusFilter, SimilarityOrder
from argilla_server.models import (
    Dataset,
    MetadataProperty,
    Record,
    Response,
    Suggestion,
    User,
    Vector,
    VectorSettings,
)
from argilla_server.search_engine.base import (
    AndFilter,
    FloatMetadataMetrics,
    IntegerMetadataMetrics,
    MetadataMetrics,
    Order,
    RangeFilter,
    RecordFilterScope,
    ResponseFilterScope,
    SearchEngine,
    SearchResponseItem,
    SearchResponses,
    TermsFilter,
    TermsMetrics,
    TextQuery,
)
from argilla_server.settings import settings
from sql_rows import RowLoader
from sqlalchemy import exists, func, or_, select, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

ENGINE_NAME = "sql"
_SESSIONS: dict[tuple[int, int], async_sessionmaker[AsyncSession]] = {}


def AsyncSessionLocal() -> AsyncSession:  # noqa: N802  (mirrors argilla_server.database)
    """A session on the engine's own connection pool.

    Not argilla-server's pool: a search request holds one of those connections while it
    calls us, so sharing it lets 15 concurrent searches wait on each other forever (pool
    deadlock). One pool per process and event loop (rq runs each job in a fresh loop).
    """
    key = (os.getpid(), id(asyncio.get_running_loop()))
    if key not in _SESSIONS:
        if settings.database_is_sqlite:
            args = {"connect_args": {"timeout": settings.database_sqlite_timeout},
                    "pool_size": 8, "max_overflow": 24, "pool_timeout": 120}
        else:
            args = {"pool_size": 5, "max_overflow": 10, "pool_timeout": 120}
        engine = create_async_engine(settings.database_url, **args)
        _SESSIONS[key] = async_sessionmaker(bind=engine, expire_on_commit=False)
    return _SESSIONS[key]()


def _flatten(filter_: Any) -> list[TermsFilter | RangeFilter]:
    """The leaves of a filter tree (Argilla only builds conjunctions)."""
    if filter_ is None:
        return []
    if isinstance(filter_, AndFilter):
        return [leaf for f in filter_.filters for leaf in _flatten(f)]
    return [filter_]


def _as_datetime(value: Any) -> dt.datetime:
    """A range bound on a date property: ISO string or epoch milliseconds (naive UTC)."""
    if isinstance(value, str):
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    else:
        parsed = dt.datetime.fromtimestamp(float(value) / 1000, tz=dt.timezone.utc)
    return parsed.astimezone(dt.timezone.utc).replace(tzinfo=None) if parsed.tzinfo else parsed


def _record_conditions(leaf: TermsFilter | RangeFilter) -> list[Any]:
    """SQL conditions for a filter on a record property (id, external_id, status, dates)."""
    column = getattr(Record, leaf.scope.property)
    if isinstance(leaf, TermsFilter):
        if leaf.scope.property == "id":
            return [column.in_([UUID(str(v)) for v in leaf.values])]
        return [column.in_(list(leaf.values))]
    conditions = []
    convert = _as_datetime if leaf.scope.property in ("inserted_at", "updated_at") else (lambda v: v)
    if leaf.ge is not None:
        conditions.append(column >= convert(leaf.ge))
    if leaf.le is not None:
        conditions.append(column <= convert(leaf.le))
    return conditions


def _response_status_conditions(leaf: TermsFilter) -> list[Any]:
    """SQL conditions for the response-status filter; pending means "no response", from the
    scope's user when it has one (the annotator's own queue) or from anyone otherwise."""
    responses = select(Response.id).where(Response.record_id == Record.id)
    if leaf.scope.user is not None:
        responses = responses.where(Response.user_id == leaf.scope.user.id)
    others = [ResponseStatus(v) for v in leaf.values if v != ResponseStatusFilter.pending]
    conditions = []
    if any(v == ResponseStatusFilter.pending for v in leaf.values):
        conditions.append(~exists(responses))
    if others:
        conditions.append(exists(responses.where(Response.status.in_(others))))
    return [or_(*conditions)] if len(conditions) > 1 else conditions


@SearchEngine.register(engine_name=ENGINE_NAME)
class SQLSearchEngine(SearchEngine):
    """Argilla's ``SearchEngine`` over its SQL tables. ``new_instance``/``close`` run on every
    request and cost nothing: sessions come from one pool per process (``AsyncSessionLocal``)."""

    @classmethod
    async def new_instance(cls) -> SQLSearchEngine:
        return cls()

    async def close(self) -> None:
        return None

    async def ping(self) -> bool:
        try:
            async with AsyncSessionLocal() as db:
                await db.execute(text("SELECT 1"))
        except (SQLAlchemyError, OSError):
            return False
        return True

    async def info(self) -> dict[str, Any]:
        async with AsyncSessionLocal() as db:
            assert db.bind is not None  # the session factory binds every session to the engine
            dialect = db.bind.dialect.name
        return {"engine": ENGINE_NAME, "database": dialect, "version": {"number": "1"}}

    # The tables are the index: nothing to maintain.
    async def create_index(self, dataset: Dataset) -> None:
        return None

    async def delete_index(self, dataset: Dataset) -> None:
        return None

    async def configure_metadata_property(self, dataset: Dataset, metadata_property: Any) -> None:
        return None

    async def configure_index_vectors(self, vector_settings: VectorSettings) -> None:
        return None

    async def index_records(self, dataset: Dataset, records: Any) -> None:
        return None

    async def partial_record_update(self, record: Record, **update: Any) -> None:
        return None

    async def delete_records(self, dataset: Dataset, records: Any) -> None:
        return None

    async def update_record_response(self, response: Response) -> None:
        return None

    async def delete_record_response(self, response: Response) -> None:
        return None

    async def update_record_suggestion(self, suggestion: Suggestion) -> None:
        return None

    async def delete_record_suggestion(self, suggestion: Suggestion) -> None:
        return None

    async def get_dataset_progress(self, dataset: Dataset) -> dict[str, Any]:
        if dataset.is_draft:
            return {}
        async with AsyncSessionLocal() as db:
            rows = (await db.execute(
                select(Record.status, func.count()).where(Record.dataset_id == dataset.id)
                .group_by(Record.status))).all()
        counts = {str(getattr(status, "value", status)): n for status, n in rows}
        return {"total": sum(counts.values()), **counts}

    async def get_dataset_user_progress(self, dataset: Dataset, user: User) -> dict[str, Any]:
        if dataset.is_draft:
            return {}
        async with AsyncSessionLocal() as db:
            rows = (await db.execute(
                select(Response.status, func.count()).join(Record, Record.id == Response.record_id)
                .where(Record.dataset_id == dataset.id, Response.user_id == user.id)
                .group_by(Response.status))).all()
        counts = {str(getattr(status, "value", status)): n for status, n in rows}
        return {"total": sum(counts.values()), **counts}

    async def compute_metrics_for(self, metadata_property: MetadataProperty) -> MetadataMetrics:
        async with AsyncSessionLocal() as db:
            metadata = (await db.execute(
                select(Record.metadata_).where(Record.dataset_id == metadata_property.dataset_id)
            )).scalars().all()
        values = [v for md in metadata if md for v in m.flat(md.get(metadata_property.name))]
        kind = str(getattr(metadata_property.type, "value", metadata_property.type))
        if kind == "terms":
            counts: dict[str, int] = defaultdict(int)
            for v in values:
                counts[m.term_text(v)] += 1
            ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
            return TermsMetrics(total=len(values),
                                values=[TermsMetrics.TermCount(term=t, count=c) for t, c in ordered])
        numbers = [n for n in (m.as_number(v) for v in values) if n is not None]
        if kind == "integer":
            numbers_i = [int(n) for n in numbers]
            return IntegerMetadataMetrics(min=min(numbers_i, default=None),
                                          max=max(numbers_i, default=None))
        return FloatMetadataMetrics(min=min(numbers, default=None), max=max(numbers, default=None))

    async def search(self, dataset: Dataset, query: TextQuery | str | None = None,
                     filter: Any = None, sort: list[Order] | None = None, offset: int = 0,
                     limit: int = 100, user_id: Any = None) -> SearchResponses:
        async with AsyncSessionLocal() as db:
            scored, fast_total = await self._matching(db, dataset, query, filter, sort, user_id,
                                                      window=(offset, limit))
            if fast_total is not None:
                return SearchResponses(items=scored, total=fast_total)
            ordered = await self._order(db, dataset, scored, sort, user_id, query is not None)
        page = ordered[offset:offset + limit]
        return SearchResponses(items=page, total=len(ordered))

    async def _matching(self, db: Any, dataset: Dataset, query: TextQuery | str | None,
                        filter_: Any, sort: list[Order] | None, user_id: Any,
                        window: tuple[int, int] | None,
                        ) -> tuple[list[SearchResponseItem], int | None]:
        """Records matching the query and filters, as (items, None); or, given a page
        ``window`` (offset, limit) that SQL alone can filter, order and cut, the page and the
        total (the fast path)."""
        conditions: list[Any] = [Record.dataset_id == dataset.id]
        in_python: list[TermsFilter | RangeFilter] = []
        for leaf in _flatten(filter_):
            scope = leaf.scope
            if isinstance(scope, RecordFilterScope):
                conditions.extend(_record_conditions(leaf))
            elif (isinstance(scope, ResponseFilterScope) and scope.question is None
                  and scope.property == "status" and isinstance(leaf, TermsFilter)):
                conditions.extend(_response_status_conditions(leaf))
            elif isinstance(scope, ResponseFilterScope) and scope.question is None:
                raise ValueError(f"cannot filter on response scope {scope}")
            else:
                in_python.append(leaf)
        sql_sort = all(isinstance(o.scope, RecordFilterScope) for o in sort or [])
        if (window is not None and not in_python and query is None and sql_sort
                and (user_id is None or sort)):
            return await self._sql_page(db, conditions, sort or [], *window)
        ids = (await db.execute(select(Record.id).where(*conditions)
                                .order_by(Record.inserted_at, Record.id))).scalars().all()
        rows = RowLoader(db, dataset.id, ids)
        keep = [await rows.filter_matches(leaf) for leaf in in_python]
        survivors = [i for i in ids if all(i in k for k in keep)]
        if query is None:
            return [SearchResponseItem(record_id=i, score=1.0) for i in survivors], None
        text_query = TextQuery(q=query) if isinstance(query, str) else query
        texts = await rows.texts(survivors, text_query.field)
        scored = [(i, m.text_score(text_query.q, texts.get(i, ""))) for i in survivors]
        return [SearchResponseItem(record_id=i, score=s) for i, s in scored if s is not None], None

    async def _sql_page(self, db: Any, conditions: list[Any], sort: list[Order], offset: int,
                        limit: int) -> tuple[list[SearchResponseItem], int]:
        order_by = []
        for order in sort:
            column = getattr(Record, order.scope.property)
            order_by.append(column.desc() if order.order == "desc" else column.asc())
        stmt = (select(Record.id).where(*conditions)
                .order_by(*order_by, Record.inserted_at, Record.id).offset(offset).limit(limit))
        ids = (await db.execute(stmt)).scalars().all()
        total = (await db.execute(select(func.count()).select_from(Record).where(*conditions))
                 ).scalar_one()
        return [SearchResponseItem(record_id=i, score=1.0) for i in ids], total

    async def _order(self, db: Any, dataset: Dataset, items: list[SearchResponseItem],
                     sort: list[Order] | None, user_id: Any,
                     has_text: bool) -> list[SearchResponseItem]:
        """Sort as Elasticsearch would: explicit sort keys; else text score (desc) then the
        user's shuffle; else the user's shuffle; else insertion order (already)."""
        by_id = {item.record_id: item for item in items}
        ids = list(by_id)
        if sort:
            rows = RowLoader(db, dataset.id, ids)
            keys = [(await rows.sort_key(order), order.order == "desc") for order in sort]
            ids = m.sort_ids(ids, keys)
        else:
            keys = []
            if has_text:
                keys.append((lambda i: by_id[i].score, True))
            if user_id is not None:
                keys.append((lambda i: m.user_shuffle_key(user_id, i), False))
            ids = m.sort_ids(ids, keys) if keys else ids
        return [by_id[i] for i in ids]

    async def similarity_search(self, dataset: Dataset, vector_settings: VectorSettings,
                                value: list[float] | None = None, record: Record | None = None,
                                query: TextQuery | str | None = None, filter: Any = None,
                                max_results: int = 100,
                                order: SimilarityOrder = SimilarityOrder.most_similar,
                                threshold: float | None = None) -> SearchResponses:
        if bool(value) == bool(record):
            raise ValueError("Must provide either vector value or record to compute the similarity search")
        async with AsyncSessionLocal() as db:
            if record is not None:
                value = (await db.execute(select(Vector.value).where(
                    Vector.record_id == record.id,
                    Vector.vector_settings_id == vector_settings.id))).scalar_one_or_none()
                if not value:
                    raise ValueError("Cannot find a vector value to apply with provided info")
            candidates = None
            if filter is not None or query is not None:
                found, _ = await self._matching(db, dataset, query, filter, None, None, None)
                candidates = {item.record_id for item in found}
            vectors = (await db.execute(select(Vector.record_id, Vector.value).where(
                Vector.vector_settings_id == vector_settings.id))).all()
        sign = -1.0 if order == SimilarityOrder.least_similar else 1.0
        scored = []
        for record_id, vector in vectors:
            if record is not None and record_id == record.id:
                continue
            if candidates is not None and record_id not in candidates:
                continue
            # Elasticsearch's cosine score: (1 + cos) / 2, in [0, 1]
            scored.append(((1.0 + sign * m.cosine(value, vector)) / 2.0, record_id))
        scored.sort(key=lambda pair: (-pair[0], str(pair[1])))
        top = scored[:max_results]
        items = [SearchResponseItem(record_id=i, score=s) for s, i in top
                 if threshold is None or s >= threshold]
        return SearchResponses(items=items, total=len(top))

