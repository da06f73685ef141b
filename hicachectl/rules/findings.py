"""What a check reports: a `Finding`, the collector the rules write to, and pass 2's rule registry.

Each rule of pass 2 is a function (deployment, collector) registered with `@rule`; `check_deployment` runs
them in the order they were registered, which is the order their findings come out in (the package's
`__init__` imports the rule modules in that order).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from hicachectl.config.deployment import Deployment
from hicachectl.rules.output import compact_hosts

ERROR, WARNING = "error", "warning"


@dataclasses.dataclass(frozen=True)
class Finding:
    level: str
    host: str
    variable: str
    rule: str
    message: str
    fix: str

    def format(self, inventory: str = "", hosts: list[str] | None = None) -> str:
        """One line; with `hosts` (group_findings), the same finding on all of them, named compactly."""
        where = f"inventory {inventory}, " if inventory else ""
        who = f"host {self.host}" if not hosts or len(hosts) < 2 else f"{len(hosts)} hosts {compact_hosts(hosts)}"
        return (f"{self.level.upper()} [{self.rule}] {where}{who}, {self.variable}: "
                f"{self.message} Fix: {self.fix}")

    def key(self) -> tuple[str, str, str, str, str]:
        """What makes two hosts' findings the same finding."""
        return self.level, self.variable, self.rule, self.message, self.fix

    def as_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


class _Collector:
    def __init__(self, host: str):
        self.host = host
        self.findings: list[Finding] = []

    def error(self, variable: str, rule: str, message: str, fix: str) -> None:
        self.findings.append(Finding(ERROR, self.host, variable, rule, message, fix))

    def warn(self, variable: str, rule: str, message: str, fix: str) -> None:
        self.findings.append(Finding(WARNING, self.host, variable, rule, message, fix))


def has_errors(findings: Iterable[Finding]) -> bool:
    return any(f.level == ERROR for f in findings)


_RULES: list[Callable[[Any, _Collector], None]] = []


def rule(fn: Callable[[Any, _Collector], None]) -> Callable[[Any, _Collector], None]:
    _RULES.append(fn)
    return fn


def check_deployment(d: Deployment) -> list[Finding]:
    out = _Collector(d.inventory_host)
    for fn in _RULES:
        fn(d, out)
    return out.findings


def group_findings(findings: Iterable[Finding]) -> list[tuple[Finding, list[str]]]:
    """The same finding on many hosts once: (the first host's finding, every host that has it), in order of first
    appearance. `Finding.format(inventory, hosts)` prints a group on one line."""
    groups: dict[tuple, tuple[Finding, list[str]]] = {}
    for finding in findings:
        group = groups.setdefault(finding.key(), (finding, []))
        if finding.host not in group[1]:
            group[1].append(finding.host)
    return list(groups.values())
