"""Accounts on an embedded Argilla: the rules for names and passwords, and ``create_user``.

Which rule comes from where (docs/labeling.md repeats this):

- password: 8 to 100 characters: argilla-server's own limits (``USER_PASSWORD_MIN_LENGTH`` /
  ``USER_PASSWORD_MAX_LENGTH``); the server answers 422 otherwise, so grouppref checks them
  first and names the fix.
- username: letters, digits, ``-`` and ``_``, starting with a letter or a digit. This is the
  rule argilla-server enforced before 2.x (``^(?!-|_)[A-Za-z0-9-_]+$``); 2.8 only requires
  a non-empty name, which lets through names with spaces or slashes that cannot be an
  annotator id (and so every ranking such a user submits would be refused at pull). The
  256-character cap is grouppref's limit on annotator ids.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import httpx

from grouppref.errors import ConfigError
from grouppref.labeling.server import credentials as creds

Role = Literal["annotator", "admin", "owner"]
USERNAME_RULE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,255}")
PASSWORD_MIN, PASSWORD_MAX = 8, 100  # argilla-server's USER_PASSWORD_MIN/MAX_LENGTH


def check_username(username: str) -> None:
    """Raises ConfigError when ``username`` breaks the rule in the module docstring."""
    if not USERNAME_RULE.fullmatch(username):
        raise ConfigError(f"username {username!r}: use only letters, digits, '-' and '_', "
                          "starting with a letter or a digit, at most 256 characters "
                          "(Argilla's username rule)")


def check_password(password: str) -> None:
    """Raises ConfigError when ``password`` is outside Argilla's 8-100 characters."""
    if not PASSWORD_MIN <= len(password) <= PASSWORD_MAX:
        raise ConfigError(f"the password has {len(password)} characters; Argilla requires "
                          f"{PASSWORD_MIN} to {PASSWORD_MAX}: give a longer one, or leave out "
                          "--password-stdin to have one generated")


def _refusal(username: str, url: str, response: httpx.Response) -> ConfigError:
    """One line for the server's refusal, with the advice that fits it."""
    try:
        body = response.json()
    except ValueError:
        body = {}
    detail = body.get("detail") if isinstance(body, dict) else None
    if response.status_code == 409 or "not unique" in str(detail):
        return ConfigError(f"Argilla at {url} already has a user {username!r}; pick another "
                           "name")
    errors = detail if isinstance(detail, list) else (
        (detail.get("params") or {}).get("errors") if isinstance(detail, dict) else None)
    if errors:  # 422: [{"loc": [..., "password"], "msg": "String should have at least 8 ..."}]
        first = errors[0]
        where = str((first.get("loc") or ["?"])[-1])
        return ConfigError(f"Argilla at {url} refused the account {username!r}: {where}: "
                           f"{first.get('msg')}")
    text = " ".join(str(detail or response.reason_phrase).split())[:300]
    return ConfigError(f"Argilla at {url} refused the account {username!r} (HTTP "
                       f"{response.status_code}): {text}")


def create_user(url: str, credentials_path: Path, username: str, role: Role = "annotator",
                password: str | None = None) -> tuple[str, str, str]:
    """Create ``username`` through the REST API as the owner, add it to the workspace and
    store its secrets in the credentials file. Returns ``(username, password, api_key)``.

    Raises:
        ConfigError: the name or password breaks a rule (module docstring), the name is
            taken, or the server refused the account (its reason, on one line).
    """
    check_username(username)
    if password is not None:
        check_password(password)
    c = creds.load_credentials(credentials_path)
    password = password or creds.new_password()
    with httpx.Client(base_url=url, headers={"X-Argilla-Api-Key": c.owner.api_key},
                      timeout=30) as http:
        r = http.post("/api/v1/users", json={"first_name": username, "username": username,
                                              "role": role, "password": password})
        if not r.is_success:
            raise _refusal(username, url, r)
        user = r.json()
        workspaces = http.get("/api/v1/me/workspaces").raise_for_status().json()["items"]
        ws = next((w for w in workspaces if w["name"] == c.workspace), None)
        if ws is None:
            raise ConfigError(f"workspace {c.workspace!r} not found at {url}; restart the "
                              "server with `grouppref label serve` to recreate it")
        http.post(f"/api/v1/workspaces/{ws['id']}/users",
                  json={"user_id": user["id"]}).raise_for_status()
    with creds.locked(credentials_path):
        c = creds.load_credentials(credentials_path)
        c.users[username] = creds.Account(role=role, password=password, api_key=user["api_key"])
        creds.save_credentials(credentials_path, c)
    return username, password, user["api_key"]
