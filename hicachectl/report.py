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
    is ever split by its content."""
    text = "" if cell is None else str(cell)
    return " / ".join(part.strip() for part in text.splitlines() if part.strip()) if "\n" in text or "\r" in text else text


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], wrap: int | None = None) -> str:
    """Columns aligned; every cell on one line. With `wrap`, the last column (a reason) is wrapped at that width:
    its continuation lines start under it, and a "; "-joined reason starts each part on a line of its own."""
    rows = [[_one_line(c) for c in row] for row in rows]
    if wrap is None:
        widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
        line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()  # noqa: E731
        return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])
    wrapped = [_wrapped(r[-1], wrap) if r else [""] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers[:-1])]
    widths.append(max([len(headers[-1])] + [len(part) for parts in wrapped for part in parts]))
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()  # noqa: E731
    out = [line(headers), line(["-" * w for w in widths])]
    for row, parts in zip(rows, wrapped, strict=True):
        out.append(line([*row[:-1], parts[0]]))
        out += [line([""] * (len(headers) - 1) + [part]) for part in parts[1:]]
    return "\n".join(out)


def _wrapped(text: str, width: int) -> list[str]:
    parts = [p for p in text.split("; ")] if text else [""]
    lines = []
    for i, part in enumerate(parts):
        lines += textwrap.wrap(part + (";" if i < len(parts) - 1 else ""), width, break_on_hyphens=False,
                               subsequent_indent="  ") or [""]
    return lines


def grouped(rows: Iterable[Sequence[Any]], compact: Callable[[list[str]], str]) -> list[list[Any]]:
    """Rows that differ only in their first cell (the host) as one row, the hosts named by `compact` (as validate
    names them: gpu-[01:04]); in the order each outcome first appears."""
    groups: dict[tuple, list[str]] = {}
    for row in rows:
        groups.setdefault(tuple(_one_line(c) for c in row[1:]), []).append(str(row[0]))
    return [[compact(hosts), *rest] for rest, hosts in groups.items()]


def emit_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


# A changed file longer than this is named with its digests, not diffed line by line: the NIC program is 500-odd
# lines, the same on every host, and `render --json` holds its text.
LONG_FILE_LINES = 120


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


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
    if isinstance(before, dict) or isinstance(after, dict):
        before = "\n".join(f"{k}: {v}" for k, v in (before or {}).items()) + "\n"
        after = "\n".join(f"{k}: {v}" for k, v in (after or {}).items()) + "\n"
    lines = difflib.unified_diff(str(before).splitlines(keepends=True), str(after).splitlines(keepends=True),
                                 fromfile=diff.get("before_header", "before"), tofile=diff.get("after_header", "after"))
    return "".join(lines)
