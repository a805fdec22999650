"""Layout ``oasst``: OpenAssistant oasst1 / oasst2, as a message table or as message trees.

The published schemas: the table (the Hub's parquet, ``*.messages.jsonl``) has one row per
message: ``message_id``, ``parent_id`` (null for a tree's first prompt), ``user_id``,
``created_date``, ``text``, ``role`` (``prompter`` or ``assistant``), ``lang``,
``review_count``, ``review_result``, ``deleted``, ``rank`` (among the replies to one message,
0 the best; null when not ranked), ``synthetic``, ``model_name``, ``detoxify``,
``message_tree_id``, ``tree_state``, ``emojis`` and ``labels``. The tree export
(``*.trees.jsonl``) has one tree per line: ``message_tree_id``, ``tree_state``, ``origin`` and
``prompt``, the first message with the fields above and ``replies``, a list of messages,
recursively.

A message may come before its parent, so the whole table is read first (pass 1, the shared
row driver, which only records messages) and the groups are built after (pass 2). Every
prompter message with at least two usable ranked assistant replies is a group: its prompt is
the conversation from the tree's first prompt to it (chat messages: prompter -> user), its
candidates those replies (``model_name`` kept for synthetic ones), and its ranking one vote
by annotator ``oasst`` (kind ``human``: the rank is a consensus of many crowd rankers), rank
0 best. A message is usable when it is not deleted and passed review (``review_result``
true); a reply also needs a rank. A conversation with an unusable message is left out.

Every message is in a group (prompt turn or candidate) or a reject with its reason: a table
row as a row-reject, a message of a tree as a part-reject (field: its path, e.g.
``prompt.replies[1]``), and a tree with no group at all as one row-reject; the stats count
the messages and why the others were left out (``left_out``). ``--lang`` keeps the groups
whose prompter message has one of the languages.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from grouppref.errors import RowError
from grouppref.pipeline.imports.layouts.build import finish
from grouppref.pipeline.imports.layouts.raw_groups import (
    Collected,
    Context,
    Grouper,
    Imported,
    Response,
    Vote,
    collect_rows,
)
from grouppref.readers.rows import Row, maybe_json
from grouppref.schemas import Reject

DEFAULTS: dict[str, Any] = {"mapping": {"prompt_id": "message_id"}, "kind": "human"}
ROLES = {"prompter": "user", "assistant": "assistant"}
METADATA = ("lang", "message_tree_id")


@dataclass
class Message:
    """One message as read, from a table row or a node of a tree (``where``: its path)."""

    id: str
    parent: str | None
    role: str
    text: Any
    rank: int | None
    deleted: bool
    review: bool | None
    lang: str | None
    model: str | None
    tree: str | None
    row: int
    where: str | None = None

    def at(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name


def is_tree(row: dict[str, Any]) -> bool:
    """A tree export line (``message_tree_id`` and a ``prompt``, no ``message_id``)."""
    return "message_tree_id" in row and "prompt" in row and "message_id" not in row


def _optional(node: dict[str, Any], name: str, kind: type | tuple[type, ...], number: int,
              ctx: Context, where: str) -> Any:
    value = node.get(name)
    if value is None or isinstance(value, kind):
        return value
    names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
    raise ctx.fail(f"{name} must be {names} or null, got {type(value).__name__}", number, where)


def _rank(value: Any, number: int, ctx: Context, where: str) -> int | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None  # NaN: a null rank read through pandas
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value) \
            or value < 0:
        raise ctx.fail(f"rank must be a whole number >= 0 (0 = best) or null, got {value!r}",
                       number, where)
    return int(value)


def parse(node: dict[str, Any], number: int, ctx: Context, where: str | None = None,
          parent: str | None = None, tree: str | None = None) -> Message:
    """One message of a row or a tree node (``parent``/``tree``: from the enclosing tree).

    Raises:
        RowError: an id, role or flag of the wrong kind, naming the field.
    """
    at = f"{where}." if where else ""
    mid = node.get("message_id")
    if not isinstance(mid, str) or not mid.strip():
        raise ctx.fail(f"message_id must be a non-empty string, got {mid!r}", number,
                       f"{at}message_id")
    role = node.get("role")
    if role not in ROLES:
        raise ctx.fail(f"role must be 'prompter' or 'assistant', got {role!r}", number,
                       f"{at}role")
    if where is None or parent is None:
        parent = _optional(node, "parent_id", str, number, ctx, f"{at}parent_id")
    deleted = _optional(node, "deleted", bool, number, ctx, f"{at}deleted")
    tree_id = tree or _optional(node, "message_tree_id", str, number, ctx,
                                f"{at}message_tree_id")
    return Message(
        id=mid, parent=parent, role=role, text=node.get("text"),
        rank=_rank(node.get("rank"), number, ctx, f"{at}rank"), deleted=bool(deleted),
        review=_optional(node, "review_result", bool, number, ctx, f"{at}review_result"),
        lang=_optional(node, "lang", str, number, ctx, f"{at}lang"),
        model=_optional(node, "model_name", str, number, ctx, f"{at}model_name"),
        tree=tree_id, row=number, where=where)


class Table:
    """Pass 1: every message by id, in the order read, and the rows that were trees."""

    def __init__(self) -> None:
        self.messages: dict[str, Message] = {}
        self.tree_rows: dict[int, str] = {}  # row -> message_tree_id

    def add_row(self, row: dict[str, Any], number: int, ctx: Context, grouper: Grouper,
                rejects: list[Reject]) -> None:
        """The row driver's callback: a table row or a whole tree into the table."""
        if is_tree(row):
            self._add_tree(row, number, ctx, rejects)
        else:
            self._add(parse(row, number, ctx), ctx)

    def _add(self, msg: Message, ctx: Context) -> None:
        seen = self.messages.get(msg.id)
        if seen is not None:
            place = f"row {seen.row}" + (f" ({seen.where})" if seen.where else "")
            raise ctx.fail(f"message_id {msg.id!r} already read at {place}", msg.row,
                           msg.at("message_id"))
        self.messages[msg.id] = msg

    def _add_tree(self, row: dict[str, Any], number: int, ctx: Context,
                  rejects: list[Reject]) -> None:
        tree = row.get("message_tree_id")
        root = maybe_json(row.get("prompt"))
        if not isinstance(tree, str) or not isinstance(root, dict):
            raise ctx.fail("a tree needs message_tree_id (a string) and prompt (its first "
                           f"message, an object with replies); got {type(tree).__name__} / "
                           f"{type(root).__name__}", number, "prompt")
        self.tree_rows[number] = tree
        stack: list[tuple[Any, str, str | None]] = [(root, "prompt", None)]
        while stack:
            node, where, parent = stack.pop()
            try:
                if not isinstance(node, dict):
                    raise ctx.fail(f"a message must be an object, got {type(node).__name__}",
                                   number, where)
                msg = parse(node, number, ctx, where, parent, tree)
                self._add(msg, ctx)
            except RowError as err:
                rejects.append(ctx.reject(f"{err.reason}; this message and its replies are "
                                          "left out", number, err.field))
                continue
            replies = maybe_json(node.get("replies")) or []
            if not isinstance(replies, list):
                rejects.append(ctx.reject(f"replies must be a list, got "
                                          f"{type(replies).__name__}; none read", number,
                                          f"{where}.replies"))
                replies = []
            stack += [(child, f"{where}.replies[{i}]", msg.id)
                      for i, child in reversed(list(enumerate(replies)))]


Why = tuple[str, str, str]  # (cause counted in the stats, reason, field)


def _unusable(msg: Message) -> Why | None:
    if msg.deleted:
        return "deleted", "deleted message (deleted: true)", msg.at("deleted")
    if msg.review is False:
        return "failed_review", "failed review (review_result: false)", msg.at("review_result")
    if msg.review is None:
        return "unreviewed", "not reviewed (review_result: null)", msg.at("review_result")
    return None


def _language(msg: Message, ctx: Context) -> Why | None:
    langs = {x.casefold() for x in ctx.config.langs}
    if langs and (msg.lang or "").casefold() not in langs:
        return ("language", f"language {msg.lang!r} not kept (--lang "
                f"{' '.join(ctx.config.langs)})", msg.at("lang"))
    return None


class Builder:
    """Pass 2: the groups of a table, and why each message in none of them was left out."""

    def __init__(self, table: Table, ctx: Context):
        self.table, self.ctx = table, ctx
        self.children: dict[str, list[Message]] = {}
        for msg in table.messages.values():
            if msg.parent is not None:
                self.children.setdefault(msg.parent, []).append(msg)
        self.used: set[str] = set()
        self.why: dict[str, Why] = {}

    def ranked(self, msg: Message) -> list[Message]:
        """The usable ranked assistant replies to ``msg``."""
        return [r for r in self.children.get(msg.id, []) if r.role == "assistant"
                and r.rank is not None and _unusable(r) is None]

    def chain(self, msg: Message) -> list[Message]:
        """The conversation from the tree's first prompt to ``msg``.

        Raises:
            RowError: a message of it is missing or unusable, it loops, or does not start
                with a prompter message.
        """
        out = [msg]
        while out[-1].parent is not None:
            parent = self.table.messages.get(out[-1].parent)
            if parent is None:
                raise self.ctx.fail(f"incomplete conversation: parent message "
                                    f"{out[-1].parent!r} is not in the file", msg.row,
                                    out[-1].at("parent_id"))
            if parent in out:
                raise self.ctx.fail(f"message {parent.id!r} is its own ancestor (parent_id "
                                    "loop)", msg.row, msg.at("parent_id"))
            problem = _unusable(parent)
            if problem is not None:
                raise self.ctx.fail(f"its conversation has a left-out message ({parent.id}: "
                                    f"{problem[1]})", msg.row, msg.at("parent_id"))
            out.append(parent)
        if out[-1].role != "prompter":
            raise self.ctx.fail("the conversation must start with a prompter message", msg.row,
                                out[-1].at("role"))
        return out[::-1]

    def group(self, msg: Message, grouper: Grouper) -> None:
        """``msg``'s group, when it has two usable ranked replies (else nothing)."""
        replies = self.ranked(msg)
        if len(replies) < 2 or _unusable(msg) is not None:
            return
        if (problem := _language(msg, self.ctx)) is not None:
            self.why[msg.id] = problem
            return
        try:
            chain = self.chain(msg)
        except RowError as err:
            self.why[msg.id] = ("incomplete_conversation", err.reason, err.field or "")
            return
        turns = [{"role": ROLES[m.role], "content": m.text} for m in chain]
        fields = {self.ctx.mapping.prompt_id or "message_id": msg.id, "lang": msg.lang,
                  "message_tree_id": msg.tree}
        try:
            group = grouper.group(self.ctx.prompt(fields, msg.row, messages=turns,
                                                  extra=METADATA), msg.row)
        except RowError as err:
            self.why[msg.id] = ("prompt_rejected", err.reason, err.field or msg.at("text"))
            return
        first = len(group.responses)
        group.responses += [Response(r.text, r.model, r.row, r.at("text")) for r in replies]
        group.votes.append(Vote(annotator=group.next_annotator(self.ctx.annotator),
                                scores={first + i: -float(r.rank or 0)
                                        for i, r in enumerate(replies)}, row=msg.row))
        self.used.update(m.id for m in chain)
        self.used.update(r.id for r in replies)

    def left_out(self, msg: Message) -> Why:
        """Why ``msg`` is in no group."""
        if msg.id in self.why:
            return self.why[msg.id]
        problem = _language(msg, self.ctx) or _unusable(msg)
        if problem is not None:
            return problem
        if msg.role == "prompter":
            n = len(self.ranked(msg))
            return ("too_few_ranked", f"prompter message with {n} usable ranked "
                    f"repl{'y' if n == 1 else 'ies'}; a group needs 2", msg.at("message_id"))
        if msg.rank is None:
            return "unranked", "unranked reply (rank: null)", msg.at("rank")
        parent = self.table.messages.get(msg.parent or "")
        if parent is None:
            return ("incomplete_conversation", f"its prompt (message {msg.parent!r}) is not "
                    "in the file",
                    msg.at("parent_id"))
        if parent.role != "prompter":
            return ("not_a_reply", f"its parent (message {parent.id}) is not a prompter "
                    "message: only replies to a prompt are candidates", msg.at("parent_id"))
        if parent.id in self.why:
            cause, reason, _ = self.why[parent.id]
            return cause, f"its prompt (message {parent.id}) was left out: {reason}", \
                msg.at("parent_id")
        cause, reason, _ = self.left_out(parent)  # a prompter: no deeper recursion
        return cause, f"its prompt (message {parent.id}) is in no group: {reason}", \
            msg.at("parent_id")


def _rejects(builder: Builder, ctx: Context, out: Collected) -> Counter[str]:
    """A reject for every message in no group; the count of each cause."""
    causes: Counter[str] = Counter()
    per_tree: dict[int, Counter[str]] = {row: Counter() for row in builder.table.tree_rows}
    used_rows = {m.row for m in builder.table.messages.values() if m.id in builder.used}
    for msg in builder.table.messages.values():
        if msg.id in builder.used:
            continue
        cause, reason, field = builder.left_out(msg)
        causes[cause] += 1
        if msg.where is None:
            out.rejects.append(ctx.reject(reason, msg.row, field, scope="row"))
        elif msg.row in used_rows:
            out.rejects.append(ctx.reject(reason, msg.row, field))
        else:
            per_tree[msg.row][cause] += 1
    for row, counted in per_tree.items():
        if row not in used_rows:
            what = ", ".join(f"{n} {c}" for c, n in counted.most_common()) or "none read"
            out.rejects.append(ctx.reject(
                f"no group in tree {builder.table.tree_rows[row]!r}: no prompter message with "
                f"2 usable ranked replies (messages left out: {what})", row, "prompt",
                scope="row"))
    return causes


def read(rows: Iterable[tuple[int, Row]], ctx: Context) -> Imported:
    """Rows (messages or trees, any order) -> one group per ranked prompter message."""
    table = Table()
    out = collect_rows(rows, ctx, table.add_row, merge=False)  # pass 1: the messages
    builder = Builder(table, ctx)
    grouper = Grouper(ctx, merge=True)
    for msg in table.messages.values():  # pass 2: the groups, in the order read
        if msg.role == "prompter":
            builder.group(msg, grouper)
    grouper.collected(out)
    causes = _rejects(builder, ctx, out)
    imported = finish(out, ctx)
    imported.stats["messages"] = len(table.messages)
    imported.stats["left_out"] = dict(sorted(causes.items()))
    return imported
