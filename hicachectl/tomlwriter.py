"""Write the subset of TOML a backend config needs: tables of strings, numbers, booleans and lists.

Python reads TOML (tomllib) but cannot write it; a tested 40-line writer beats a new dependency.
"""

from __future__ import annotations

import json
import re
from typing import Any

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


class TomlError(ValueError):
    pass


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key)


def _value(value: Any, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a valid TOML basic string
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
