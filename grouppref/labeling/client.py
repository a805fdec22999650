"""A small REST client for Argilla 2.x: credentials, retries with backoff, one-line errors.

Why not the ``argilla`` SDK here: every SDK settings object (``rg.TextField``,
``rg.IntegerMetadataProperty``, ...) needs a live client even to be *constructed*, and the SDK's
ranking suggestions drop the ``rank`` of each item (so ties cannot be suggested). grouppref
talks to the same documented REST endpoints the SDK uses (``/api/v1/...``) through one
``httpx.Client``; the round-trip test reads the datasets back with the SDK to check they are
what the SDK itself would build.

Credentials come from, in order: arguments, the environment (``ARGILLA_API_URL`` /
``ARGILLA_API_KEY``), or the embedded server (``grouppref label serve``: its run file gives the
URL, its 0600 credentials file the owner's key). The API key is never printed.

Example:
    >>> creds = resolve_credentials()                      # doctest: +SKIP
    >>> with connect(creds) as client:                      # doctest: +SKIP
    ...     print(client.me["username"])
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from grouppref.errors import ConfigError, GroupPrefError

ENV_URL = "ARGILLA_API_URL"
ENV_KEY = "ARGILLA_API_KEY"
_RETRY_STATUS = (502, 503, 504)
_PAGE = 1000  # the server's maximum page size for record listings


class ArgillaConnectionError(GroupPrefError):
    """The Argilla server cannot be reached, refused the key, or answered with an error."""


class ClientSettings(BaseModel):
    """How grouppref talks to Argilla (runtime only: never part of a stage's cache key)."""

    model_config = ConfigDict(extra="forbid")

    timeout: float = Field(default=60.0, gt=0, description="Seconds to wait for one request.")
    retries: int = Field(default=4, ge=0, le=20,
                         description="Retries of a request after a connection error "
                         "(and, for idempotent requests, after 502/503/504).")
    backoff: float = Field(default=0.5, ge=0, description="First wait between retries in "
                           "seconds; doubled after every retry.")


class ArgillaCredentials(BaseModel):
    """Where the server is and the API key to use; ``source`` says where they came from."""

    model_config = ConfigDict(extra="forbid")

    api_url: str
    api_key: SecretStr
    source: str = Field(description="Where the key came from (for error messages).")
    workspace: str | None = Field(default=None, description="The embedded server's workspace.")


def embedded_credentials(state_dir: Path | None = None) -> tuple[str, str, str, str]:
    """URL, owner API key, workspace and credentials path of the embedded server.

    Raises:
        ConfigError: no embedded server runs on ``state_dir`` (default: its default state dir).
    """
    from grouppref.labeling.server import embedded as server
    from grouppref.labeling.server.credentials import CREDENTIALS_FILE, load_credentials

    state = (state_dir or server.default_state_dir()).expanduser().resolve()
    url = server.running_url(state)
    path = state / CREDENTIALS_FILE
    found = load_credentials(path)
    return url, found.owner.api_key, found.workspace, str(path)


def resolve_credentials(api_url: str | None = None, api_key: str | None = None,
                        state_dir: Path | None = None) -> ArgillaCredentials:
    """The Argilla URL and API key, by this rule (the first that applies wins):

    1. ``state_dir``: the embedded server started there (its URL, owner key and workspace);
       it overrides ``ARGILLA_API_URL`` / ``ARGILLA_API_KEY``;
    2. ``api_url`` (else ``ARGILLA_API_URL``) with ``api_key`` (else ``ARGILLA_API_KEY``);
       without a key, the URL must be the default embedded server's, whose owner key is used;
    3. the embedded server on its default state directory.

    ``api_url`` and ``state_dir`` together name two servers: an error, never a silent choice.

    Args:
        api_url (str | None): server URL, e.g. ``http://127.0.0.1:6900``.
        api_key (str | None): API key (an owner or admin key to push and pull).
        state_dir (Path | None): the embedded server's state directory.

    Raises:
        ConfigError: both ``api_url`` and ``state_dir``; no key for a URL; no server at all.
    """
    if api_url and state_dir is not None:
        raise ConfigError(f"--api-url {api_url} and --state-dir {state_dir} both name a server; "
                          "pass --api-url (with $ARGILLA_API_KEY) for any Argilla, or "
                          "--state-dir for the embedded server started there")
    if state_dir is not None:
        return _embedded(state_dir)
    url = api_url or os.environ.get(ENV_URL)
    key = api_key or os.environ.get(ENV_KEY)
    if url and key:
        return ArgillaCredentials(api_url=url.rstrip("/"), api_key=SecretStr(key),
                                  source="arguments" if api_key else "environment")
    try:
        found = _embedded(None)
    except ConfigError as e:
        missing = " and ".join(n for n, v in ((ENV_URL, url), (ENV_KEY, key)) if not v)
        raise ConfigError(f"no Argilla server configured: set {missing} for your Argilla, or "
                          f"start the embedded one ({e})") from e
    if url and url.rstrip("/") != found.api_url:
        where = "--api-url" if api_url else ENV_URL
        raise ConfigError(f"{where} {url} has no API key: set {ENV_KEY} to an owner or admin "
                          "key of that Argilla")
    return found


def _embedded(state_dir: Path | None) -> ArgillaCredentials:
    url, key, workspace, path = embedded_credentials(state_dir)
    return ArgillaCredentials(api_url=url, api_key=SecretStr(key), source=path,
                              workspace=workspace)


def _is_json(response: httpx.Response) -> bool:
    return "json" in response.headers.get("content-type", "")


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    detail = body.get("detail", body) if isinstance(body, dict) else body
    if isinstance(detail, dict):
        params = detail.get("params") or {}
        errors = params.get("errors")
        if isinstance(errors, list) and errors:
            first = errors[0]
            where = ".".join(str(x) for x in first.get("loc", []))
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            return f"{where}: {first.get('msg')}{more}"
        detail = params.get("message") or params.get("detail") or detail
    return " ".join(str(detail).split())[:500]


class ArgillaClient:
    """REST calls to one Argilla server with retries and backoff; use :func:`connect`.

    Connection errors (nothing was sent, or the connection dropped) are retried ``retries``
    times, waiting ``backoff * 2**attempt`` seconds; 502/503/504 are retried for idempotent
    requests only (GET, PUT, DELETE), so a create is never sent twice.
    """

    def __init__(self, credentials: ArgillaCredentials, settings: ClientSettings | None = None):
        self.credentials = credentials
        self.settings = settings or ClientSettings()
        self.http = httpx.Client(
            base_url=credentials.api_url, timeout=self.settings.timeout,
            headers={"X-Argilla-Api-Key": credentials.api_key.get_secret_value()},
        )
        self.me: dict[str, Any] = {}
        self.retried = 0  # how many retries this client needed (reported by push)

    def __enter__(self) -> ArgillaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, *, json_body: Any = None,
                params: dict[str, Any] | None = None, allow: tuple[int, ...] = ()) -> Any:
        """Send one request; returns the decoded JSON body (``None`` for an allowed error).

        Raises:
            ArgillaConnectionError: unreachable after the retries, wrong key, no permission, or
                any other error answer (the message holds the server's detail).
        """
        idempotent = method.upper() in ("GET", "PUT", "DELETE")
        attempt = 0
        while True:
            try:
                response = self.http.request(method, path, json=json_body, params=params)
            except httpx.TransportError as e:
                retry = isinstance(e, httpx.ConnectError) or idempotent
                if not retry or attempt >= self.settings.retries:
                    what = "cannot reach" if isinstance(e, httpx.ConnectError) else \
                        "lost the connection to"
                    raise ArgillaConnectionError(
                        f"{what} Argilla at {self.credentials.api_url} "
                        f"({type(e).__name__}: {e or 'no detail'}) after {attempt + 1} "
                        f"attempt(s); is the server running? (`grouppref label serve`, or set "
                        f"{ENV_URL})") from e
            else:
                if response.status_code in allow:
                    return None
                if response.status_code in _RETRY_STATUS and idempotent and \
                        attempt < self.settings.retries:
                    pass  # fall through to the backoff below
                else:
                    return self._answer(method, path, response)
            time.sleep(self.settings.backoff * 2**attempt)
            attempt += 1
            self.retried += 1

    def _answer(self, method: str, path: str, response: httpx.Response) -> Any:
        status = response.status_code
        where = f"{method} {path}"
        if status < 400:
            if not response.content:
                return None
            try:
                return response.json()
            except ValueError:
                raise self._not_argilla(where, response) from None
        if status == 401:
            raise ArgillaConnectionError(
                f"Argilla at {self.credentials.api_url} refused the API key from "
                f"{self.credentials.source} (401); check {ENV_KEY}")
        if status == 403:
            role = self.me.get("role", "unknown")
            raise ArgillaConnectionError(
                f"Argilla user {self.me.get('username', '?')!r} (role {role}) may not do "
                f"{where} (403); use an owner or admin API key")
        if not _is_json(response):
            raise self._not_argilla(where, response)
        raise ArgillaConnectionError(f"Argilla answered {status} to {where}: {_detail(response)}")

    def _not_argilla(self, where: str, response: httpx.Response) -> ArgillaConnectionError:
        kind = response.headers.get("content-type", "no content type").split(";")[0]
        return ArgillaConnectionError(
            f"{self.credentials.api_url} does not answer like an Argilla 2.x server ({where}: "
            f"HTTP {response.status_code}, {kind}); check --api-url / {ENV_URL}")

    def require_manager(self, action: str) -> None:
        """Refuse an annotator's key up front (annotators may not list records or users).

        Raises:
            ArgillaConnectionError: the key belongs to an annotator.
        """
        if self.me.get("role") == "annotator":
            raise ArgillaConnectionError(
                f"this key belongs to an annotator ({self.me.get('username')!r}); {action} "
                "needs an owner or admin key")

    # -- lookups shared by push / pull / status ---------------------------------------------
    def workspace_id(self, name: str, create: bool = False) -> str:
        """The id of workspace ``name``; created when missing and ``create`` (owner only)."""
        for ws in self.request("GET", "/api/v1/me/workspaces")["items"]:
            if ws["name"] == name:
                return str(ws["id"])
        if not create:
            raise ConfigError(f"Argilla workspace {name!r} does not exist (or user "
                              f"{self.me.get('username')!r} is not a member); pass --workspace")
        return str(self.request("POST", "/api/v1/workspaces", json_body={"name": name})["id"])

    def find_dataset(self, name: str, workspace_id: str) -> dict[str, Any] | None:
        """The dataset ``name`` in the workspace, or ``None``."""
        found = self.request("GET", "/api/v1/me/datasets",
                             params={"name": name, "workspace_id": workspace_id})["items"]
        return found[0] if found else None

    def iter_records(self, dataset_id: str, include: tuple[str, ...] = ("responses",),
                     page: int = _PAGE) -> Iterator[dict[str, Any]]:
        """Every record of a dataset (owner/admin listing, read from the database)."""
        offset = 0
        while True:
            params: dict[str, Any] = {"offset": offset, "limit": page}
            if include:
                params["include"] = list(include)
            body = self.request("GET", f"/api/v1/datasets/{dataset_id}/records", params=params)
            items = body["items"]
            yield from items
            offset += len(items)
            if not items or offset >= body.get("total", offset):
                return

    def usernames(self, user_ids: set[str], workspace_id: str) -> dict[str, str]:
        """Map user ids to usernames (owners list all users; admins their workspace's)."""
        if not user_ids:
            return {}
        body = self.request("GET", "/api/v1/users", allow=(403,))
        if body is None:
            body = self.request("GET", f"/api/v1/workspaces/{workspace_id}/users")
        names = {str(u["id"]): u["username"] for u in body["items"]}
        return {uid: names.get(uid, uid) for uid in user_ids}


def connect(credentials: ArgillaCredentials, settings: ClientSettings | None = None) -> ArgillaClient:
    """A client whose key was checked against the server (``GET /api/v1/me``).

    Raises:
        ArgillaConnectionError: the server is unreachable or refuses the key.
    """
    client = ArgillaClient(credentials, settings)
    try:
        me = client.request("GET", "/api/v1/me", allow=(404,))
        if not isinstance(me, dict) or not {"username", "role"} <= me.keys():
            raise ArgillaConnectionError(
                f"{credentials.api_url} does not answer like an Argilla 2.x server (GET "
                f"/api/v1/me: {'not found' if me is None else 'no user'}); check --api-url / "
                f"{ENV_URL}")
        client.me = me
    except BaseException:
        client.close()
        raise
    return client
