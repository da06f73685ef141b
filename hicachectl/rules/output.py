"""Fleet-sized output: the same finding on many hosts once, and host names folded into numbered runs."""

from __future__ import annotations

import re
from collections.abc import Iterable

_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def compact_hosts(hosts: Iterable[str], limit: int = 6) -> str:
    """Host names, numbered runs folded as Ansible writes them (b200-[01:16]); beyond `limit` parts, a count of the rest."""
    parts: list[str] = []
    runs: list[tuple[str, int, int, int]] = []  # prefix, width, first, last
    for name in hosts:
        match = _NUMBERED.match(name)
        if match:
            prefix, digits = match.groups()
            width, number = len(digits), int(digits)
            if runs and runs[-1][0] == prefix and runs[-1][1] == width and runs[-1][3] + 1 == number:
                runs[-1] = (prefix, width, runs[-1][2], number)
                continue
            runs.append((prefix, width, number, number))
            parts.append(f"\0{len(runs) - 1}")
        else:
            parts.append(name)

    def shown(part: str) -> str:
        if not part.startswith("\0"):
            return part
        prefix, width, first, last = runs[int(part[1:])]
        if first == last:
            return f"{prefix}{first:0{width}d}"
        return f"{prefix}[{first:0{width}d}:{last:0{width}d}]"

    text = ", ".join(shown(p) for p in parts[:limit])
    return text + (f" and {len(parts) - limit} more" if len(parts) > limit else "")
