"""Quoting for the line-oriented formats the toolkit writes: a shell word, a systemd unit's value and word.

A value that reaches such a file is refused by validation or escaped here for that format."""

from __future__ import annotations

import re
import shlex


def shell_word(word: str) -> str:
    return shlex.quote(str(word))


def _one_line(text: str) -> str:
    """The rules refuse line breaks and control characters in every value; one reaching a unit is a bug, never written."""
    if any(ord(c) < 32 or ord(c) == 127 or c in "\x85\u2028\u2029" for c in text):
        raise ValueError(f"{text!r} cannot be written on one line of a systemd unit")
    return text


def unit_value(value) -> str:
    """A value of a systemd unit setting that is not split into words (Description=, After=): specifiers escaped."""
    return _one_line(str(value)).replace("%", "%%")


_UNIT_PLAIN_WORD = re.compile(r"[A-Za-z0-9/._+:=@,-]+")


def unit_word(word) -> str:
    """One word of a setting systemd splits into words (Exec*=, RequiresMountsFor=): specifiers (%), variables ($),
    quotes and backslashes escaped, so systemd reads back exactly `word`."""
    text = _one_line(str(word)).replace("%", "%%")
    if _UNIT_PLAIN_WORD.fullmatch(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$") + '"'
