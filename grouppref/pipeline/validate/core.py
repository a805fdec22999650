"""The validate stage's core: checks and the train/test split of typed groups, no run store.

:func:`validate_groups` is the stage on records: ``Sequence[ValidatedGroup]`` and a
:class:`~grouppref.pipeline.validate.config.ValidateConfig` in, a :class:`Validated` (the
groups that pass with their split set, a reject for each that fails, per-check counts and the
summary) out. :class:`Checks` is the same one group at a time, for the ``validate`` stage
(:mod:`grouppref.pipeline.validate.stage`), which parses raw rows itself (its ``schema``
check) and writes the rows that pass as they are.

Checks after the schema, in order (the first that fails names the row's reject):
``duplicate_prompt`` (an earlier group has the same prompt; not for groups made of TRL
pairs), ``too_few_pairs`` (fewer than ``min_pairs``), ``flagged`` (a flag of
``reject_flags``); then, over all rows, ``conflicting_contents`` (rows sharing a group id with
other contents: all rejected) and ``duplicate_group_id`` (the later rows of the same contents).

The split is a pure function of (seed, prompt): ``u = sha256(seed, key)[:8] / 2**64`` and the
row goes to ``test`` when ``u < test_fraction`` (:func:`split_of`).
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from grouppref.pipeline.validate.config import STAGE, ValidateConfig
from grouppref.readers.pairs import FROM_PAIR
from grouppref.runs.hashing import canonical_json
from grouppref.schemas import Reject, ValidatedGroup, normalise_text
from grouppref.schemas.records import prompt_content_key, prompt_display_text

CHECKS = ("schema", "conflicting_contents", "duplicate_group_id", "duplicate_prompt",
          "too_few_pairs", "flagged")


def split_of(key: str, seed: int, test_fraction: float) -> Literal["train", "test"]:
    """The split of a prompt: ``test`` iff ``sha256(seed, key)[:8] / 2**64 < test_fraction``."""
    digest = hashlib.sha256(f"{seed}\x1f{key}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2.0**64
    return "test" if u < test_fraction else "train"


def split_key(group: ValidatedGroup, split_by: str) -> str:
    """The text whose hash decides the split of ``group`` (see :class:`ValidateConfig`)."""
    return split_key_of(group.prompt.text, group.prompt.turns(), split_by)


def split_key_of(text: str | None, turns: Sequence[tuple[str, str]] | None,
                 split_by: str, content_key: str | None = None) -> str:
    """:func:`split_key` of a prompt's ``text`` or chat ``turns`` (role, content);
    ``content_key``: its content key, when the caller has it already."""
    if split_by == "prompt_text":
        return normalise_text(prompt_display_text(text, turns))
    return prompt_content_key(text, turns) if content_key is None else content_key


def _contents(group: ValidatedGroup) -> tuple[str, str]:
    prompt = canonical_json(group.prompt.model_dump(mode="json"))
    candidates = canonical_json([c.model_dump(mode="json") for c in group.candidates])
    return prompt, candidates


@dataclass(frozen=True)
class RowInfo:
    """What the checks keep of a valid group (not the group itself, to stay small)."""

    split: Literal["train", "test"]
    key: str
    pairs: int
    annotators: int
    kendall_w: float | None
    noise: float | None
    flags: tuple[str, ...]


@dataclass(frozen=True)
class GroupFacts:
    """What the checks read of one valid group: its id, its prompt (as the key the split
    hashes, :func:`split_key_of`, and as its content key), its pair count, agreement and
    flags, and (only for a group id that repeats) its contents to compare."""

    group_id: str
    split_key: str
    prompt_key: str
    pairs: int
    annotators: int
    kendall_w: float | None
    noise: float | None
    flags: tuple[str, ...]
    contents: tuple[str, str] | None = None

    @classmethod
    def of(cls, group: ValidatedGroup, split_by: str, repeated: bool) -> GroupFacts:
        """The facts of a record (``repeated``: its group id occurs in more than one row)."""
        turns = group.prompt.turns()
        key = prompt_content_key(group.prompt.text, turns)
        return cls(group_id=group.group_id,
                   split_key=split_key_of(group.prompt.text, turns, split_by, key),
                   prompt_key=key,
                   pairs=len(group.pairs), annotators=group.agreement.num_annotators,
                   kendall_w=group.agreement.kendall_w, noise=group.agreement.noise,
                   flags=tuple(group.flags), contents=_contents(group) if repeated else None)


class Checks:
    """The checks of every group, added one at a time in input order (row numbers from 1);
    only keys are kept (not the groups), so a pass over a large dataset stays small. Call
    :meth:`finish_groups` after the last group, then read :meth:`accepted`, ``rejects``,
    ``info`` (each accepted row's split) and :meth:`summary`."""

    def __init__(self, config: ValidateConfig, source: str, repeated: set[str]) -> None:
        self.config = config
        self.source = source
        # group ids that occur more than once in the input: the contents compared between
        # rows of one id are made only for these
        self.repeated = repeated
        self.rejects: dict[int, tuple[str, Reject]] = {}  # row -> (check, reject)
        self.info: dict[int, RowInfo] = {}
        self.by_group: dict[str, list[tuple[int, tuple[str, str] | None]]] = defaultdict(list)
        self.first_prompt: dict[str, tuple[int, str]] = {}
        self.rows = 0

    def _reject(self, check: str, number: int, group_id: str | None, reason: str,
                field: str | None = None) -> None:
        self.rejects[number] = (check, Reject(stage=STAGE, reason=f"{check}: {reason}",
                                              source=self.source, row=number,
                                              group_id=group_id, field=field))

    def add_schema_failure(self, number: int, reject: Reject) -> None:
        """Row ``number`` is no valid group (the ``schema`` check, made by the caller)."""
        self.rows += 1
        self.rejects[number] = ("schema", reject)

    def add(self, number: int, parsed: ValidatedGroup) -> None:
        """Check the valid group of row ``number`` against the rows before it."""
        self.add_facts(number, GroupFacts.of(parsed, self.config.split_by,
                                             parsed.group_id in self.repeated))

    def add_facts(self, number: int, facts: GroupFacts) -> None:
        """:meth:`add` of a valid group given by its facts (``contents`` set when its group id
        is one of ``repeated``)."""
        self.rows += 1
        gid, cfg = facts.group_id, self.config
        split_sha = _sha(facts.split_key)
        prompt_sha = split_sha if facts.prompt_key == facts.split_key else _sha(facts.prompt_key)
        self.info[number] = RowInfo(
            split=split_of(facts.split_key, cfg.seed, cfg.test_fraction),
            key=split_sha, pairs=facts.pairs, annotators=facts.annotators,
            kendall_w=facts.kendall_w, noise=facts.noise, flags=facts.flags)
        self.by_group[gid].append((number, facts.contents))
        first = self.first_prompt.setdefault(prompt_sha, (number, gid))
        if first[1] != gid and FROM_PAIR not in facts.flags:
            self._reject("duplicate_prompt", number, gid,
                         f"same prompt as group {first[1]!r} at row {first[0]}", "prompt")
        elif facts.pairs < cfg.min_pairs:
            self._reject("too_few_pairs", number, gid, f"{facts.pairs} pair preferences, "
                         f"fewer than min_pairs={cfg.min_pairs}", "pairs")
        elif hit := sorted(set(facts.flags) & set(cfg.reject_flags)):
            self._reject("flagged", number, gid, f"flagged {', '.join(hit)} (reject_flags)",
                         "flags")

    def finish_groups(self) -> None:
        """Group-id checks need every row: conflicts reject all rows, duplicates the later ones."""
        for gid, rows in self.by_group.items():
            if len(rows) < 2:
                continue
            made = [c for _, c in rows if c is not None]
            if len(made) != len(rows):
                raise AssertionError(f"group id {gid!r} repeats but was not given as repeated")
            first_row, first_contents = rows[0][0], made[0]
            differ = [c for c in made[1:] if c != first_contents]
            if differ:
                numbers = [n for n, _ in rows]
                parts = {"prompt" if c[0] != first_contents[0] else "candidates" for c in differ}
                for number, _ in rows:
                    self._reject("conflicting_contents", number, gid,
                                 f"rows {numbers} share this group id but differ in "
                                 f"{' and '.join(sorted(parts))}; keep one and re-run aggregate",
                                 "group_id")
            else:
                for number, _ in rows[1:]:
                    self._reject("duplicate_group_id", number, gid,
                                 f"duplicate group id, first at row {first_row}", "group_id")

    def accepted(self) -> list[int]:
        return [n for n in range(1, self.rows + 1) if n not in self.rejects]

    def summary(self) -> dict[str, Any]:
        """Split sizes, prompt overlap, agreement and flags of the accepted rows."""
        kept = [self.info[n] for n in self.accepted()]
        splits = {s: {"groups": sum(i.split == s for i in kept),
                      "pairs": sum(i.pairs for i in kept if i.split == s)}
                  for s in ("train", "test")}
        keys = {s: {i.key for i in kept if i.split == s} for s in ("train", "test")}
        w = [i.kendall_w for i in kept if i.kendall_w is not None]
        noise = [i.noise for i in kept if i.noise is not None]
        flags = Counter(f for i in kept for f in i.flags)
        return {
            "splits": splits,
            "prompt_overlap": len(keys["train"] & keys["test"]),
            "agreement": {"mean_kendall_w": _mean(w), "mean_noise": _mean(noise),
                          "mean_annotators": _mean([float(i.annotators) for i in kept])},
            "flags": dict(sorted(flags.items())),
        }


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 6) if values else None


@dataclass(frozen=True)
class Validated:
    """What :func:`validate_groups` makes: the groups that pass, in input order with their
    split set; a reject for each that fails (in input order, ``reason`` starting with the
    check's name); failed groups per check (:data:`CHECKS`); and the summary (``splits``:
    groups and pairs per split, ``prompt_overlap``, ``agreement``, ``flags`` of the kept)."""

    groups: list[ValidatedGroup]
    rejects: list[Reject]
    checks: dict[str, int]
    summary: dict[str, Any]


def validate_groups(groups: Sequence[ValidatedGroup], config: ValidateConfig, *,
                    source: str = "groups") -> Validated:
    """Check ``groups`` (``groups[i]`` is row ``i + 1``; ``source`` goes into the rejects) and
    split the ones that pass, as the ``validate`` stage does with the rows it reads."""
    counts = Counter(g.group_id for g in groups)
    checks = Checks(config, source, {gid for gid, n in counts.items() if n > 1})
    for number, group in enumerate(groups, start=1):
        checks.add(number, group)
    checks.finish_groups()
    failed = [checks.rejects[n] for n in sorted(checks.rejects)]
    per_check = Counter(check for check, _ in failed)
    kept = [groups[n - 1].model_copy(update={"split": checks.info[n].split})
            for n in checks.accepted()]
    return Validated(groups=kept, rejects=[r for _, r in failed],
                     checks={c: per_check.get(c, 0) for c in CHECKS}, summary=checks.summary())
