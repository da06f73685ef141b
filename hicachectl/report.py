"""Plain-text tables and JSON for the commands' output."""

from __future__ import annotations

import difflib
import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    rows = [[("" if c is None else str(c)) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def emit_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


def unified_diff(diff: dict[str, Any]) -> str:
    """One Ansible diff entry (before/after with headers) as a unified diff."""
    if "prepared" in diff:
        return str(diff["prepared"])
    before, after = diff.get("before", ""), diff.get("after", "")
    if isinstance(before, dict) or isinstance(after, dict):
        before = "\n".join(f"{k}: {v}" for k, v in (before or {}).items()) + "\n"
        after = "\n".join(f"{k}: {v}" for k, v in (after or {}).items()) + "\n"
    lines = difflib.unified_diff(str(before).splitlines(keepends=True), str(after).splitlines(keepends=True),
                                 fromfile=diff.get("before_header", "before"), tofile=diff.get("after_header", "after"))
    return "".join(lines)
