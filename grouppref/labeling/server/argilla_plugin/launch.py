"""Launcher run by argilla-server's own Python: ``python launch.py server|worker``.

This file is executed by path (never imported by grouppref), so its directory, which holds
only the search-engine plugin, is first on ``sys.path``. It imports the plugin before
argilla-server's app or worker starts, so ``ARGILLA_SEARCH_ENGINE=sql`` resolves.

``server`` first migrates the database and makes sure the owner exists (in the same process,
to import argilla-server once: the slowest part of a start), then serves.

Settings come from the environment that ``grouppref.labeling.server.embedded`` prepares:
``ARGILLA_DATABASE_URL``, ``ARGILLA_REDIS_URL``, ``ARGILLA_AUTH_SECRET_KEY``, ... and, for
the setup step, ``GROUPPREF_OWNER_USERNAME``, ``GROUPPREF_OWNER_PASSWORD``,
``GROUPPREF_OWNER_API_KEY`` and ``GROUPPREF_WORKSPACE`` (removed from the environment once
used).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys


def _setup() -> None:
    """Migrate the database to head, then make sure the workspace and the owner exist with
    the credentials grouppref keeps (the credentials file is the source of truth)."""
    from alembic import command
    from alembic.config import Config
    from argilla_server.database import ALEMBIC_CONFIG_FILE, database_url_sync
    from argilla_server.settings import settings

    if settings.database_is_sqlite:
        # WAL: readers (searches) never wait for the writer; set once, stored in the file
        import sqlalchemy

        engine = sqlalchemy.create_engine(database_url_sync())
        with engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA journal_mode=WAL")
        engine.dispose()
    command.upgrade(Config(ALEMBIC_CONFIG_FILE), "head")
    # alembic's env.py ran logging.fileConfig, which disables every existing logger,
    # argilla's error logger included: turn them back on for the server
    for logger in logging.Logger.manager.loggerDict.values():
        if isinstance(logger, logging.Logger):
            logger.disabled = False
    asyncio.run(_ensure_owner())


async def _ensure_owner() -> None:
    import argilla_server.database as database
    from argilla_server.contexts import accounts
    from argilla_server.database import AsyncSessionLocal
    from argilla_server.models import User, UserRole, Workspace, WorkspaceUser

    username = os.environ.pop("GROUPPREF_OWNER_USERNAME")
    password = os.environ.pop("GROUPPREF_OWNER_PASSWORD")
    api_key = os.environ.pop("GROUPPREF_OWNER_API_KEY")
    workspace_name = os.environ.pop("GROUPPREF_WORKSPACE")
    async with AsyncSessionLocal() as db:
        workspace = await Workspace.get_by(db, name=workspace_name)
        if workspace is None:
            workspace = await accounts.create_workspace(db, {"name": workspace_name})
        user = await User.get_by(db, username=username)
        if user is None:
            user = await User.create(db, first_name=username, last_name=None, username=username,
                                     role=UserRole.owner, api_key=api_key,
                                     password_hash=accounts.hash_password(password))
        elif user.api_key != api_key or not accounts.verify_password(password, user.password_hash):
            await user.update(db, api_key=api_key, password_hash=accounts.hash_password(password))
        if await WorkspaceUser.get_by(db, workspace_id=workspace.id, user_id=user.id) is None:
            await WorkspaceUser.create(db, workspace_id=workspace.id, user_id=user.id)
    # pooled asyncpg connections belong to this event loop; uvicorn runs another one
    await database.async_engine.dispose()


def _server(host: str, port: int) -> None:
    import uvicorn

    uvicorn.run("argilla_server:app", host=host, port=port, access_log=False,
                log_level=os.environ.get("GROUPPREF_ARGILLA_LOG_LEVEL", "warning"))


def _worker() -> None:
    from argilla_server.jobs.queues import DEFAULT_QUEUE, HIGH_QUEUE, REDIS_CONNECTION
    from rq import Worker

    Worker([HIGH_QUEUE, DEFAULT_QUEUE], connection=REDIS_CONNECTION).work()


def _widen_sqlite_pool() -> None:
    """Give SQLite a connection pool as wide as PostgreSQL's (argilla-server leaves
    SQLAlchemy's 5 + 10, which 20 concurrent annotators exhaust while SQLite serialises
    their writes). Swaps the engine behind argilla-server's session factory; nothing has
    connected yet."""
    import argilla_server.database as database
    from argilla_server.settings import settings
    from sqlalchemy.ext.asyncio import create_async_engine

    if not settings.database_is_sqlite:
        return
    engine = create_async_engine(settings.database_url, pool_size=24, max_overflow=48,
                                 pool_timeout=120, **settings.database_engine_args)
    database.async_engine = engine
    database.AsyncSessionLocal.configure(bind=engine)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="launch.py", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    server = sub.add_parser("server", help="migrate, create the owner, run the HTTP server")
    server.add_argument("--host", required=True)
    server.add_argument("--port", type=int, required=True)
    sub.add_parser("worker", help="run the rq worker for argilla-server's jobs")
    args = parser.parse_args(argv)

    _widen_sqlite_pool()
    import sql_search_engine  # noqa: F401  (registers ARGILLA_SEARCH_ENGINE=sql)

    if args.command == "server":
        _setup()
        _server(args.host, args.port)
    else:
        _worker()


if __name__ == "__main__":
    main(sys.argv[1:])
