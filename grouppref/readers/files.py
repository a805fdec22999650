"""Where a reader's bytes come from: compressed data files and folders of data files.

* A data file may be compressed as a whole, as ``datasets`` reads them: ``.gz`` (gzip),
  ``.bz2``, ``.xz`` and ``.zst`` (zstandard, with the optional ``zstandard`` package). The
  format is the suffix before the compression's (``pairs.jsonl.gz`` is JSON Lines). A file
  that does not decompress stops with one line (exit code 2) naming the fix.
* A folder that is not a ``save_to_disk`` folder is a folder of data files, resolved by
  ``datasets``' own rules, as the Hub resolves a repository: the YAML ``configs`` of its
  ``README.md``, else split names in the file names (``data/train-00000-of-00001.parquet``,
  ``test.jsonl``, ...). Resolving only names files; our readers read them.
"""

from __future__ import annotations

import bz2
import gzip
import importlib.util
import lzma
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, cast

from grouppref.errors import InputFileError

COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")
ZSTD_FIX = ("`pip install zstandard` (the optional package datasets also uses), or decompress "
            "it first: `zstd -d FILE`")


def format_suffix(path: Path) -> str:
    """The suffix that names the format: ``.jsonl`` for ``pairs.jsonl`` and ``pairs.jsonl.gz``."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in COMPRESSIONS:
        suffixes = suffixes[:-1]
    return suffixes[-1] if suffixes else ""


def _compression(path: Path) -> str | None:
    suffix = path.suffix.lower()
    return suffix if suffix in COMPRESSIONS else None


def _zstd_open(path: Path) -> IO[bytes]:
    if importlib.util.find_spec("zstandard") is None:
        raise InputFileError(f"{path}: a zstandard-compressed file needs {ZSTD_FIX}")
    import zstandard  # type: ignore[import-not-found]  # optional, untyped

    stream: IO[bytes] = zstandard.open(path, "rb")
    return stream


# the standard library's readers (binary file objects, though not typing.IO subclasses)
_OPENERS: dict[str, Callable[[Path], IO[bytes]]] = {
    ".gz": lambda p: cast(IO[bytes], gzip.open(p, "rb")),
    ".bz2": lambda p: cast(IO[bytes], bz2.open(p, "rb")),
    ".xz": lambda p: cast(IO[bytes], lzma.open(p, "rb"))}


def _decompress_errors() -> tuple[type[BaseException], ...]:
    errors: tuple[type[BaseException], ...] = (OSError, EOFError, lzma.LZMAError)
    if importlib.util.find_spec("zstandard") is not None:
        import zstandard

        errors += (zstandard.ZstdError,)
    return errors


@contextmanager
def open_binary(path: Path) -> Iterator[IO[bytes]]:
    """The file's bytes, decompressed when its name ends in a compression suffix.

    Raises:
        InputFileError: the file does not decompress (named with the reason), or it is
            zstandard-compressed and ``zstandard`` is not installed.
    """
    kind = _compression(path)
    if kind is None:
        with path.open("rb") as fh:
            yield fh
        return
    try:
        stream = _zstd_open(path) if kind == ".zst" else _OPENERS[kind](path)
        with stream:
            yield stream
    except _decompress_errors() as e:
        raise InputFileError(f"{path}: cannot decompress it as {kind} ({e}); check that the "
                             f"file is complete and its suffix names its compression") from e


def read_bytes(path: Path) -> bytes:
    """All of the file's bytes, decompressed (see :func:`open_binary`)."""
    with open_binary(path) as fh:
        return fh.read()


def folder_files(path: Path) -> dict[str, list[str]]:
    """The data files of a folder by split, as ``datasets`` and the Hub resolve them.

    Raises:
        InputFileError: the folder holds no data file ``datasets`` recognises.
    """
    import datasets

    try:
        files = datasets.load_dataset_builder(str(path)).config.data_files or {}
    except (datasets.exceptions.DatasetsError, OSError, ValueError) as e:
        raise InputFileError(f"{path}: not a dataset folder grouppref can read (a save_to_disk "
                             f"folder, or Parquet/JSON Lines/CSV files named by split, such as "
                             f"data/train-00000-of-00001.parquet, with an optional README.md): "
                             f"{e}") from e
    return {str(split): [str(f) for f in names] for split, names in files.items()}
