"""Prometheus text from SGLang's /metrics: sums of the series verify and bench read (reference §7)."""

from __future__ import annotations

import re
from collections.abc import Callable

BACKUPED = "sglang:backuped_tokens_total"
STORAGE_HITS = "sglang:storage_prefetch_hit_tokens_total"
CACHED = "sglang:cached_tokens_total"
BACKUP_DROPPED = "sglang:hicache_backup_dropped_tokens_total"
PREFETCH_UNFULFILLED = "sglang:storage_prefetch_unfulfilled_tokens_total"

_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> list[tuple[str, dict[str, str], float]]:
    samples = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or line.startswith("#"):
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        samples.append((match["name"], dict(_LABEL.findall(match["labels"] or "")), value))
    return samples


def total(text: str | None, name: str, **labels: str) -> float | None:
    """Sum of a metric's series that carry `labels`; None when the metric is absent.

    Storage metrics are reported by every TP rank; only rank 0 is counted so a token is counted once.
    """
    if not text:
        return None
    found = [(lab, value) for metric, lab, value in parse(text)
             if metric == name and all(lab.get(k) == v for k, v in labels.items())]
    if not found:
        return None
    if any("tp_rank" in lab for lab, _ in found):
        found = [(lab, value) for lab, value in found if lab.get("tp_rank", "0") == "0"]
    return sum(value for _, value in found)


def delta(after: str | None, before: str | None, read: Callable[[str | None], float | None]) -> float | None:
    """How much `read` grew between two /metrics texts; None when the later one lacks the metric."""
    a, b = read(after), read(before)
    return None if a is None else a - (b or 0)


def storage_hits(text: str | None) -> float | None:
    """Tokens served from L3: the scheduler's storage-sourced cached tokens, else the prefetch hits."""
    value = total(text, CACHED, cache_source="storage")
    return value if value is not None else total(text, STORAGE_HITS)
