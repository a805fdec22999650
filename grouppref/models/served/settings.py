"""How grouppref reaches an OpenAI-compatible inference server (vLLM, SGLang, TGI, llama.cpp,
Ollama, a hosted API): the settings shared by ``generate`` and the ``judge`` ranker, the API key
read from an environment variable, and how a server is named in records and reports.

Light on purpose (pydantic only): config modules import it, and ``--help`` must stay fast.

Secrets: the settings hold only the *name* of the environment variable with the key
(``api_key_env``); :func:`read_api_key` reads the key when a client is built and it is kept
only in that client's request headers. A base URL with credentials in it is refused.

Cache keys: ``base_url`` and ``server_params`` change what a server returns, so they are part
of a stage's cache key; the knobs that only change how fast or how patiently grouppref asks
(``api_key_env``, ``concurrency``, ``request_timeout``, ``max_retries``) are
``Field(exclude=True)``: changing them never re-runs a finished stage.
"""

from __future__ import annotations

import os
import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from grouppref.errors import ConfigError

ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
JsonValue = Any  # a JSON value (YAML/--set/--server-param parse to these)
# which server's own samplers to switch off (grouppref.models.served.protocol.NEUTRAL_SAMPLING):
# auto = the kind GET /models names, a kind to force it, off = none
NeutralSampling = Literal["auto", "llama.cpp", "vllm", "sglang", "off"]


def check_base_url(url: str) -> str:
    """``url`` without a trailing slash, after checking it is ``http(s)://host[:port][/path]``.

    Raises:
        ValueError: another scheme, no host, or credentials in the URL (the key belongs in an
            environment variable: ``api_key_env``).

    Example:
        >>> check_base_url("http://127.0.0.1:8000/v1/")
        'http://127.0.0.1:8000/v1'
    """
    url = url.strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"base URL {url!r} must look like http://HOST:PORT/v1")
    if parts.username or parts.password:
        raise ValueError(f"base URL of host {parts.hostname!r} holds credentials; put the key in "
                         "an environment variable and name it with api_key_env")
    if parts.fragment:
        raise ValueError(f"base URL {url!r} has a #fragment; leave it out")
    return url.rstrip("/")


def server_label(url: str) -> str:
    """A short name of a server for ids and tables: ``host:port/path`` (no scheme, no query).

    Example:
        >>> server_label("http://127.0.0.1:8000/v1")
        '127.0.0.1:8000/v1'
    """
    parts = urlsplit(url)
    return f"{parts.netloc}{parts.path}".rstrip("/")


def read_api_key(env_name: str | None) -> str | None:
    """The API key held by environment variable ``env_name`` (None when no variable is named).

    Raises:
        ConfigError: the variable is named but not set, or empty.
    """
    if env_name is None:
        return None
    key = os.environ.get(env_name, "")
    if not key.strip():
        raise ConfigError(f"api_key_env {env_name!r}: the environment variable {env_name} is not "
                          f"set (export {env_name}=... before running)")
    return key.strip()


class ServerSettings(BaseModel):
    """Where an OpenAI-compatible server is and how to talk to it."""

    model_config = ConfigDict(extra="forbid")

    base_url: str | None = Field(default=None, description="OpenAI base URL of the server, "
                                 "usually ending in /v1, e.g. http://127.0.0.1:8000/v1.")
    api_key_env: str | None = Field(default=None, exclude=True, pattern=ENV_NAME,
                                    description="Name of the environment variable that holds "
                                    "the API key (the key is never written anywhere).")
    concurrency: int = Field(default=8, ge=1, le=1024, exclude=True, description="Requests in "
                             "flight to each server at once.")
    request_timeout: float = Field(default=600.0, gt=0, exclude=True, description="Seconds to "
                                   "wait for one answer before it counts as failed (and is retried).")
    max_retries: int = Field(default=5, ge=0, le=50, exclude=True, description="Retries of a "
                             "request answered 429 or 5xx, timed out or dropped (exponential "
                             "backoff with jitter, Retry-After honoured).")
    server_params: dict[str, JsonValue] = Field(
        default_factory=dict, description="Extra fields merged last into every request body "
        "(null removes a field), e.g. for llama.cpp {repeat_penalty: 1.0, top_k: 0, min_p: 0.0} "
        "so that it samples with temperature and top_p alone.")

    @field_validator("base_url")
    @classmethod
    def _url(cls, url: str | None) -> str | None:
        return None if url is None else check_base_url(url)

    @field_validator("server_params")
    @classmethod
    def _params(cls, params: dict[str, JsonValue]) -> dict[str, JsonValue]:
        reserved = sorted(set(params) & RESERVED_FIELDS)
        if reserved:
            raise ValueError(f"server_params may not set {reserved}: grouppref sets them itself "
                             "(use the matching setting, e.g. max_new_tokens, seed)")
        if isinstance(grammar := params.get("grammar"), str):  # llama.cpp's GBNF
            from grouppref.models.served.grammar import GrammarError, check_grammar

            try:
                check_grammar(grammar)
            except GrammarError as e:
                raise ValueError(f"server_params grammar: {e} (llama.cpp's GBNF; a grammar its "
                                 "parser refuses crashes llama-cpp-python's server)") from e
        return params


# request fields grouppref decides itself (what is asked, and the per-candidate seed)
RESERVED_FIELDS = frozenset({"model", "messages", "prompt", "seed", "n", "stream", "echo"})


def parse_server_param(spec: str) -> tuple[str, JsonValue]:
    """``--server-param KEY=VALUE`` with VALUE read as YAML (``top_k=0``, ``stop=[a, b]``).

    Raises:
        ConfigError: not ``KEY=VALUE`` or a value that does not parse.
    """
    import yaml

    key, eq, raw = spec.partition("=")
    if not eq or not re.fullmatch(r"[A-Za-z_][\w.-]*", key.strip()):
        raise ConfigError(f"--server-param {spec!r}: expected KEY=VALUE, e.g. repeat_penalty=1.0")
    try:
        return key.strip(), yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"--server-param {spec!r}: the value is not valid YAML") from e
