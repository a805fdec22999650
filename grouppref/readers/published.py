"""Datasets as grouppref publishes them, read back: every container and format ``export`` writes
(and the same layouts made elsewhere), as rows or records.

Containers (:func:`open_published`), decided from what is on disk, never by asking the Hub:

* a folder saved with ``save_to_disk`` (``export --to``): every split it holds;
* a folder in the Hub's layout: ``README.md`` whose YAML ``configs`` map splits to files and
  ``data/<split>-*.parquet`` (``export --hub --dry-run``, a cloned Hub repo), or files named by
  split (``train.parquet``, ``test.parquet``: ``export --parquet DIR``); the files of each
  split are resolved by ``datasets``' own rules (the card's ``configs``, split names) and read
  by our readers, not ``load_dataset``, whose cache of a local folder can return an earlier
  export;
* one file (``.parquet``, ``.jsonl``, ``.json``, ``.csv``): its split is the row's ``split``
  column, else the file name (``test.parquet``, ``test-00000-of-00001.parquet``), else the one
  split named by the card beside it (``FILE.md``), else ``train``;
* a Hub dataset id ``owner/name``, only when nothing local goes by that name (see
  :func:`is_local`): a path is never looked up on the Hub.

Formats (:func:`detect_format`, from the columns):

* ``groups``: ``ValidatedGroup`` rows (``export --format groups``);
* ``trl-pairs``: TRL's preference rows ``prompt``/``chosen``/``rejected`` (strings, or chat turns:
  one assistant turn per answer, or the conversation repeating the prompt's turns; without
  ``prompt``, TRL's implicit prompt), optionally ``p``, ``weight``, ``group_id``,
  ``chosen_id``, ``rejected_id`` (``export --format trl-pairs``). Each row is read as a group of
  K=2 (:func:`grouppref.readers.pairs.pair_group`) whose one pair is chosen > rejected with
  the row's ``p`` and ``weight`` (1 and 1 when absent), flagged ``from_pair``;
* ``annotated``: ``AnnotatedGroup`` rows (candidates and rankings, no aggregate yet).

Split names other than train/test map to ours: test/validation/eval/dev (and names starting
with them, e.g. ``test_prefs``) are held out (``test``), every other name is ``train``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from grouppref.errors import InputFileError, RowError
from grouppref.readers.files import folder_files
from grouppref.readers.pairs import pair_group
from grouppref.readers.rows import HUB_ID, SUFFIXES, iter_rows, maybe_json, to_reject
from grouppref.runs.hashing import fingerprint_file, sha256_text
from grouppref.schemas import (
    AnnotatedGroup,
    Reject,
    ValidatedGroup,
    to_row,
)

Format = Literal["groups", "trl-pairs", "annotated"]
_HELD_OUT = re.compile(r"^(test|validation|valid|eval|dev)([-_.\d]|$)", re.IGNORECASE)


@dataclass
class Row:
    """One row of a published dataset: the split it came from and its number in that split."""

    split: str
    number: int
    data: dict[str, Any]
    json_form: bool = False  # from a text file: dict fields are objects, not JSON strings
    file: str | None = None  # the data file it came from, when the source has several


@dataclass
class Published:
    """A published dataset opened: its rows by split, its format and its fingerprint."""

    source: str
    format: Format
    rows: list[Row]
    fingerprint: str
    rejects: list[Reject] = field(default_factory=list)  # rows that could not be read at all

    def where(self, row: Row) -> str:
        """How a reject names the place of ``row``: its file (or the source) and its split."""
        return f"{row.file or self.source} ({row.split})"


@dataclass
class PublishedGroups:
    """Records read from a published dataset, the rows that could not be used, and its identity."""

    source: str
    format: Format
    groups: list[Any]
    rejects: list[Reject]
    rows: int
    fingerprint: str


# -- where ----------------------------------------------------------------------------------
def is_local(text: str) -> bool:
    """True when ``text`` names a local file or folder (existing or not), False for a Hub id.

    Local: anything that exists, starts with ``.``, ``/`` or ``~``, ends in a data file suffix,
    has other than two path parts, or whose first part is a local folder (``runs/demo``).
    """
    path = Path(text).expanduser()
    if path.exists() or text.startswith((".", "/", "~")) or text.endswith(SUFFIXES):
        return True
    parts = Path(text).parts
    return len(parts) != 2 or Path(parts[0]).is_dir()


def held_out(split: str) -> bool:
    """Whether a split name means held-out data (test, validation, eval, dev, test_prefs, ...)."""
    return bool(_HELD_OUT.match(split))


def our_split(split: str) -> Literal["train", "test"]:
    return "test" if held_out(split) else "train"


# -- containers -----------------------------------------------------------------------------
def _datasets_error() -> tuple[type[Exception], ...]:
    import datasets

    return (datasets.exceptions.DatasetsError, OSError, ValueError, ConnectionError)


def _dataset_rows(loaded: Any) -> Iterator[tuple[str, Any]]:
    """``(split, dataset)`` of a loaded ``Dataset`` or ``DatasetDict``."""
    import datasets

    if isinstance(loaded, datasets.DatasetDict | dict):
        yield from loaded.items()
    else:
        yield "train", loaded


def _open_folder(path: Path, stage: str) -> tuple[list[Row], list[Reject]]:
    """A ``save_to_disk`` folder, or data files per split as ``datasets`` (and the Hub) find
    them: the README's ``configs``, else split names in the file names. The files are read
    here, not through ``load_dataset``, whose cache of a local folder can hand back an earlier
    export of the same name."""
    import datasets

    if (path / "dataset_dict.json").exists() or (path / "state.json").exists():
        try:
            return _rows_of(_dataset_rows(datasets.load_from_disk(str(path)))), []
        except _datasets_error() as e:
            raise InputFileError(f"{path}: cannot load the saved dataset ({e})") from e
    files = folder_files(path)
    rows: list[Row] = []
    rejects: list[Reject] = []
    for split, names in files.items():
        for name in names:
            got, bad = _open_file(Path(name), stage, split)
            rows += got
            rejects += bad
    return rows, rejects


def _card_split(path: Path) -> str | None:
    """The one split the dataset card beside ``path`` (``FILE.md``) names, if it names one."""
    card = path.with_suffix(".md")
    if not card.exists():
        return None
    from huggingface_hub.repocard import metadata_load

    try:
        meta = metadata_load(card) or {}
    except (ValueError, OSError):
        return None
    info = meta.get("dataset_info")
    splits = info.get("splits") if isinstance(info, dict) else None
    names = [s.get("name") for s in splits or [] if isinstance(s, dict)]
    return names[0] if len(names) == 1 and isinstance(names[0], str) else None


def file_split(path: Path) -> str:
    """The split a single file holds when its rows do not say: from its name, its card, else
    ``train``."""
    stem = path.name.split(".")[0]
    for name in ("train", "test", "validation", "valid", "eval", "dev"):
        if re.match(rf"^{name}([-_\d]|$)", stem, re.IGNORECASE):
            return name
    return _card_split(path) or "train"


def _open_file(path: Path, stage: str, split: str | None = None
               ) -> tuple[list[Row], list[Reject]]:
    """The rows of one data file; ``split`` when the folder's layout says it, else
    :func:`file_split`; a row's own ``split`` column wins."""
    split = split or file_split(path)
    json_form = path.suffix != ".parquet"
    rows: list[Row] = []
    rejects: list[Reject] = []
    for number, row in iter_rows(path):
        if isinstance(row, RowError):
            rejects.append(to_reject(stage, row))
        else:
            given = row.get("split")
            rows.append(Row(given if isinstance(given, str) and given else split, number, row,
                            json_form, str(path)))
    return rows, rejects


def _rows_of(parts: Iterable[tuple[str, Any]]) -> list[Row]:
    out = []
    for split, ds in parts:
        for number, row in enumerate(ds, start=1):
            given = row.get("split")
            out.append(Row(given if isinstance(given, str) and given else split, number, row))
    return out


def detect_format(columns: Iterable[str], source: str) -> Format:
    """The format of rows with these columns.

    Raises:
        InputFileError: neither groups, TRL pairs nor annotated groups.
    """
    cols = set(columns)
    if {"candidates", "consensus", "pairs"} <= cols:
        return "groups"
    if {"chosen", "rejected"} <= cols:  # without a prompt: TRL's implicit prompt
        return "trl-pairs"
    if {"candidates", "rankings"} <= cols:
        return "annotated"
    raise InputFileError(
        f"{source}: neither grouppref groups (group_id, candidates, consensus, pairs) nor TRL "
        f"pairs ([prompt,] chosen, rejected); its columns are {sorted(cols)} (other layouts: "
        f"`grouppref import` reads them, docs/import.md)")


def open_published(source: str | Path, stage: str = "read") -> Published:
    """Open a published dataset (see the module docstring for what is accepted).

    Raises:
        InputFileError: nothing is there, the folder or file cannot be read, it holds no rows,
            or its columns are of no known format.
    """
    text = str(source)
    path = Path(text).expanduser()
    rejects: list[Reject] = []
    if not is_local(text):
        if not HUB_ID.match(text):
            raise InputFileError(f"{text}: no such file or folder, and not a Hub id owner/name")
        import datasets

        try:
            rows = _rows_of(_dataset_rows(datasets.load_dataset(text)))
        except _datasets_error() as e:
            raise InputFileError(f"{text}: no such local file or folder, and the Hub dataset "
                                 f"cannot be loaded ({e})") from e
        fingerprint = sha256_text(f"hub:{text}")
    elif not path.exists():
        raise InputFileError(f"{text}: no such file or folder")
    else:
        rows, rejects = _open_folder(path, stage) if path.is_dir() else _open_file(path, stage)
        fingerprint = fingerprint_file(path)
    if not rows:
        raise InputFileError(f"{text}: no rows" + (f" ({rejects[0].reason})" if rejects else ""))
    columns = {c for row in rows[:50] for c in row.data}
    return Published(source=text, format=detect_format(columns, text), rows=rows,
                     fingerprint=fingerprint, rejects=rejects)


# -- rows -> records --------------------------------------------------------------------------
def arrow_form(row: Row, model: type[BaseModel]) -> dict[str, Any]:
    """The row as the run store keeps it (dict fields as JSON text). A row from a text file
    holds them as objects: it is validated in that form and converted; if that fails it is
    returned as it is, so the stage reading it reports the problem."""
    if not row.json_form:
        return row.data
    try:
        return to_row(model.model_validate({k: maybe_json(v) for k, v in row.data.items()}))
    except (ValidationError, ValueError, TypeError):
        return row.data


def _reason(e: Exception) -> tuple[str, str | None]:
    if isinstance(e, ValidationError):
        first = e.errors()[0]
        loc = ".".join(str(x) for x in first["loc"]) or None
        return first["msg"].removeprefix("Value error, "), loc
    return str(e), None


def _reject(published: Published, row: Row, stage: str, e: Exception) -> Reject:
    reason, loc = _reason(e)
    gid = row.data.get("group_id")
    return Reject(stage=stage, reason=reason, source=published.where(row), row=row.number,
                  group_id=gid if isinstance(gid, str) else None, field=loc)


def validated_rows(published: Published, stage: str) -> tuple[list[dict[str, Any]], list[Reject]]:
    """Rows in the form ``RUN/aggregate`` keeps (``ValidatedGroup`` Arrow rows) for the validate
    stage, which checks them itself; TRL pair rows become K=2 groups (a row that cannot is a
    reject here)."""
    if published.format == "annotated":
        raise InputFileError(f"{published.source}: annotated groups without an aggregate (no "
                             "consensus or pairs); aggregate them first: `grouppref aggregate "
                             f"RUN --source {published.source}`")
    rows: list[dict[str, Any]] = []
    rejects = list(published.rejects)
    for row in published.rows:
        if published.format == "groups":
            data = arrow_form(row, ValidatedGroup)
            rows.append(data if data.get("split") else {**data, "split": our_split(row.split)})
            continue
        try:
            rows.append(to_row(pair_group(row.data, our_split(row.split))))
        except (ValidationError, ValueError, TypeError) as e:
            rejects.append(_reject(published, row, stage, e))
    return rows, rejects


def annotated_rows(published: Published) -> list[dict[str, Any]]:
    """Rows holding groups with their rankings, for the aggregate stage (which checks each
    group and each ranking itself).

    Raises:
        InputFileError: TRL pairs, which hold aggregated pairs and no rankings.
    """
    if published.format == "trl-pairs":
        raise InputFileError(
            f"{published.source}: TRL pairs hold already aggregated pairs and no rankings to "
            f"aggregate; validate them as they are (`grouppref validate RUN --source "
            f"{published.source}`), or import them as rankings (`grouppref import "
            f"{published.source} --layout pairs`)")
    return [arrow_form(row, AnnotatedGroup) for row in published.rows]


def read_validated(source: str | Path, stage: str = "train") -> PublishedGroups:
    """``ValidatedGroup`` records of a published dataset (groups, or TRL pairs as K=2 groups),
    each with its split; a row that is not a valid group becomes a reject.

    Raises:
        InputFileError: see :func:`open_published`; annotated groups (not yet aggregated).
    """
    from grouppref.schemas import from_row

    published = open_published(source, stage)
    if published.format == "annotated":
        validated_rows(published, stage)  # raises with the advice
    groups: list[ValidatedGroup] = []
    rejects = list(published.rejects)
    for row in published.rows:
        try:
            if published.format == "trl-pairs":
                group = pair_group(row.data, our_split(row.split))
            else:
                group = from_row(ValidatedGroup, arrow_form(row, ValidatedGroup))
                if group.split is None:
                    group = group.model_copy(update={"split": our_split(row.split)})
            groups.append(group)
        except (ValidationError, ValueError, TypeError) as e:
            rejects.append(_reject(published, row, stage, e))
    return PublishedGroups(source=published.source, format=published.format, groups=groups,
                           rejects=rejects, rows=len(published.rows) + len(published.rejects),
                           fingerprint=published.fingerprint)
