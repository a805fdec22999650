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
used), and ``GROUPPREF_ARGILLA_BCRYPT_ROUNDS`` (see :func:`_patch_password_checks`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

ROUNDS_ENV = "GROUPPREF_ARGILLA_BCRYPT_ROUNDS"
STOCK_LOGIN_ENV = "GROUPPREF_ARGILLA_STOCK_LOGIN"  # benchmarks only: argilla-server's own login


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


def _patch_password_checks() -> None:
    """Logins that never stall the server.

    argilla-server 2.8 checks a password with bcrypt inside its async login handler, on the
    event loop of its single uvicorn worker: 0.3 s of CPU each at bcrypt's default cost 12,
    during which no other request is served (20 annotators signing in at once: every request
    waits ~6 s). Here, in the pinned server's own module:

    - ``authenticate_user`` hands its database connection back after reading the user and
      runs bcrypt in a pool of ``os.cpu_count()`` threads (bcrypt releases the GIL), so the
      event loop goes on serving, and checks run in parallel on every core;
    - ``hash_password`` uses cost ``$GROUPPREF_ARGILLA_BCRYPT_ROUNDS`` (default 10, OWASP's
      minimum for bcrypt: 0.07 s per check), and a successful login whose stored hash has
      another cost rehashes it, so older accounts converge to the configured cost;
    - an unknown username is checked against a dummy hash of the same cost (as Argilla does),
      so the answer time does not tell which usernames exist.

    ``$GROUPPREF_ARGILLA_STOCK_LOGIN=1`` leaves argilla-server's code as it is (for the
    benchmark that compares both).
    """
    if os.environ.get(STOCK_LOGIN_ENV) == "1":
        return
    import bcrypt
    from argilla_server.contexts import accounts

    rounds = int(os.environ.get(ROUNDS_ENV, "10"))
    pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="bcrypt")

    def hash_password(password: str) -> str:
        return bcrypt.hashpw(password.encode("utf-8"), bcrypt.gensalt(rounds)).decode("utf-8")

    dummy_hash = hash_password("no such user")

    async def authenticate_user(db: Any, username: str, password: str) -> Any:
        user = await accounts.get_user_by_username(db, username)
        stored = user.password_hash if user is not None else dummy_hash
        await db.commit()  # end the read: the pooled connection goes back during bcrypt
        loop = asyncio.get_running_loop()
        ok = await loop.run_in_executor(pool, accounts.verify_password, password, stored)
        if user is None or not ok:
            return None
        if bcrypt_cost(stored) != rounds:
            new_hash = await loop.run_in_executor(pool, hash_password, password)
            await user.update(db, password_hash=new_hash)
        return user

    accounts.hash_password = hash_password  # create_user / update_user look it up here
    accounts.authenticate_user = authenticate_user  # the /api/v1/token handler calls this


def bcrypt_cost(password_hash: str) -> int | None:
    """The cost of a ``$2b$12$...`` hash (None when it is not bcrypt's format)."""
    parts = password_hash.split("$")
    return int(parts[2]) if len(parts) > 3 and parts[2].isdigit() else None


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
    _patch_password_checks()
    import sql_search_engine  # noqa: F401  (registers ARGILLA_SEARCH_ENGINE=sql)

    if args.command == "server":
        _setup()
        _server(args.host, args.port)
    else:
        _worker()


if __name__ == "__main__":
    main(sys.argv[1:])
