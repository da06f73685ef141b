"""Plain-text tables and JSON for the commands' output."""

from __future__ import annotations

import difflib
import hashlib
import json
import sys
import textwrap
from collections.abc import Callable, Iterable, Sequence
from typing import Any


def _one_line(cell: Any) -> str:
    """A cell on one line: a text with line breaks (an SSH error's own lines) keeps them as " / ", so no row of a table
    is ever split by its content. A list or tuple (the parts of a reason) is its parts joined by "; "."""
    if isinstance(cell, (list, tuple)):
        return "; ".join(_one_line(part) for part in cell)
    text = "" if cell is None else str(cell)
    return " / ".join(part.strip() for part in text.splitlines() if part.strip()) if "\n" in text or "\r" in text else text


one_line = _one_line  # a text as one line of output, its own line breaks as " / "


def _parts(cell: Any) -> list[str]:
    """The parts of a wrapped cell, each on lines of its own: a list's items, or a text's "; "-joined parts."""
    if isinstance(cell, (list, tuple)):
        return [_one_line(part) for part in cell] or [""]
    text = _one_line(cell)
    return text.split("; ") if text else [""]


# The narrowest a wrapped last column gets (with `width`), however wide the columns before it are.
MIN_WRAP = 40


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], wrap: int | None = None, width: int | None = None) -> str:
    """Columns aligned; every cell on one line. With `wrap`, the last column (a reason) is wrapped at that width:
    its continuation lines start under it, and a "; "-joined reason starts each part on a line of its own. With
    `width`, the same, `wrap` chosen so that a line is at most `width` wide (the last column at least MIN_WRAP)."""
    given = [list(row) for row in rows]
    rows = [[_one_line(c) for c in row] for row in given]
    if width is not None and headers:
        before = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers[:-1])]
        wrap = max(MIN_WRAP, width - sum(before) - 2 * len(before))
    if wrap is None:
        widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
        line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()  # noqa: E731
        return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])
    wrapped = [_wrapped(_parts(g[-1]), wrap) if g else [""] for g in given]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers[:-1])]
    widths.append(max([len(headers[-1])] + [len(part) for parts in wrapped for part in parts]))
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()  # noqa: E731
    out = [line(headers), line(["-" * w for w in widths])]
    for row, parts in zip(rows, wrapped, strict=True):
        out.append(line([*row[:-1], parts[0]]))
        out += [line([""] * (len(headers) - 1) + [part]) for part in parts[1:]]
    return "\n".join(out)


def _wrapped(parts: list[str], width: int) -> list[str]:
    """Each part from the start of a line, wrapped at `width`, its continuation lines indented by two; "; " ends all
    but the last."""
    lines = []
    for i, part in enumerate(parts):
        lines += textwrap.wrap(part + (";" if i < len(parts) - 1 else ""), width, break_on_hyphens=False,
                               subsequent_indent="  ") or [""]
    return lines


def grouped(rows: Iterable[Sequence[Any]], compact: Callable[[list[str]], str | None]) -> list[list[Any]]:
    """Rows that differ only in their first cell (the host) as one row, the hosts named by `compact` (as validate
    names them: gpu-[01:04]); in the order each outcome first appears. Where `compact` gives None (the hosts do not
    fold into a short name), that outcome keeps a row per host."""
    groups: dict[tuple, tuple[list[Any], list[str]]] = {}
    for row in rows:
        cells = [c if isinstance(c, (list, tuple)) else _one_line(c) for c in row[1:]]  # a reason's parts stay parts
        groups.setdefault(tuple(_one_line(c) for c in row[1:]), (cells, []))[1].append(str(row[0]))
    out: list[list[Any]] = []
    for rest, hosts in groups.values():
        name = hosts[0] if len(hosts) == 1 else compact(hosts)
        out += [[name, *rest]] if name is not None else [[host, *rest] for host in hosts]
    return out


def emit_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


# A changed file longer than this is named with its digests, not diffed line by line: the NIC program is 500-odd
# lines, the same on every host, and `render --json` holds its text.
LONG_FILE_LINES = 120


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _diff_texts(diff: dict[str, Any]) -> tuple[str, str]:
    """An Ansible diff entry's before and after as text: a mapping (a module's state) as `key: value` lines."""
    before, after = diff.get("before", ""), diff.get("after", "")
    if isinstance(before, dict) or isinstance(after, dict):
        before = "\n".join(f"{k}: {v}" for k, v in (before or {}).items()) + "\n"
        after = "\n".join(f"{k}: {v}" for k, v in (after or {}).items()) + "\n"
    return str(before or ""), str(after or "")


def diff_summary(diffs: list[dict[str, Any]]) -> str:
    """A change's diff entries in a few words, for a plan read without --diff: the lines added and removed, or
    "new, N lines"; '' when the change has no diff (a service started, a package installed)."""
    added = removed = 0
    new = True
    for diff in diffs:
        if "prepared" in diff:
            new = False
            body = str(diff["prepared"]).splitlines()
            added += sum(1 for line in body if line.startswith("+") and not line.startswith("+++"))
            removed += sum(1 for line in body if line.startswith("-") and not line.startswith("---"))
            continue
        before, after = _diff_texts(diff)
        new = new and not before
        for line in difflib.ndiff(before.splitlines(), after.splitlines()):
            added += line.startswith("+ ")
            removed += line.startswith("- ")
    if not diffs or not (added or removed):
        return ""
    return f"new, {added} line(s)" if new else f"+{added} -{removed} line(s)"


def unified_diff(diff: dict[str, Any]) -> str:
    """One Ansible diff entry (before/after with headers) as a unified diff; a long file as one line saying it is
    updated (or new), with its sha256 before and after."""
    if "prepared" in diff:
        return str(diff["prepared"])
    before, after = diff.get("before", ""), diff.get("after", "")
    if isinstance(before, str) and isinstance(after, str) and max(before.count("\n"), after.count("\n")) > LONG_FILE_LINES:
        path = diff.get("before_header") or diff.get("after_header") or "file"
        lines = after.count("\n")
        if not before:
            return f"{path}: new (sha256 {_digest(after)}, {lines} lines)\n"
        return f"{path}: updated (sha256 {_digest(before)} -> {_digest(after)}, {lines} lines)\n"
    before, after = _diff_texts(diff)
    lines = difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                 fromfile=diff.get("before_header", "before"), tofile=diff.get("after_header", "after"))
    return "".join(lines)
