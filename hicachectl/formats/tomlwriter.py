"""Write the subset of TOML a backend config needs: tables of strings, numbers, booleans and lists.

Python reads TOML (tomllib) but cannot write it; a tested 40-line writer beats a new dependency.
"""

from __future__ import annotations

import re
from typing import Any

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


class TomlError(ValueError):
    pass


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _string(text: str) -> str:
    """A TOML basic string: quote, backslash and control characters (DEL included) escaped."""
    out = []
    for char in text:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04X}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else _string(key)


def _value(value: Any, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v, where) for v in value) + "]"
    raise TomlError(f"{where}: {type(value).__name__} values cannot be written to TOML")


def dumps(data: dict, _path: tuple[str, ...] = ()) -> str:
    scalars = {k: v for k, v in data.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    lines = [f"{_key(k)} = {_value(v, '.'.join(_path + (k,)))}" for k, v in scalars.items()]
    out = "\n".join(lines) + ("\n" if lines else "")
    for key, table in tables.items():
        path = _path + (key,)
        body = dumps(table, path)
        has_scalars = any(not isinstance(v, dict) for v in table.values())
        header = f"[{'.'.join(_key(p) for p in path)}]\n" if has_scalars or not table else ""
        out += ("\n" if out else "") + header + body
    return out
