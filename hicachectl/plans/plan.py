"""What every role's plan shares: the plan as Ansible keeps it, the host facts' tools and modules, a check's outcome.

Each role asks for its plan once (a hicache filter of the collection, plugins/filter/hicache.py), keeps it with
set_fact, shows it at -v, and its tasks only apply it. A plan depends only on the host's deployment (its checked
variables) and, where the answer depends on the host, on the host facts (hicache_host_facts, read up front, not per task):
whether systemd runs the host, whether the container runtime or the hub client is installed. The plans themselves are
in the module named like their role (plans/storage.py, plans/sglang_server.py, ...).
"""

from __future__ import annotations

import dataclasses
from typing import Any


def as_fact(plan: Any) -> dict[str, Any]:
    """The plan as Ansible keeps it (set_fact): plain dicts and lists. A part computed only on request (a verdict,
    the local image) is absent when not requested, so a task cannot mistake it for an empty answer."""
    optional = {f.name for f in dataclasses.fields(plan) if f.default is None}
    return {k: v for k, v in dataclasses.asdict(plan).items() if not (k in optional and v is None)}


def has_tool(facts: dict[str, Any] | None, name: str | None) -> bool:
    return bool(name) and bool((facts or {}).get("tools", {}).get(name))


OK, MISSING, WARN, INFO, NOT_NEEDED = "ok", "missing", "warn", "info", "not needed"


NOT_CHECKED = "not checked"  # the host cannot tell yet (e.g. the VAST driver's version before sunrpc is loaded)


@dataclasses.dataclass(frozen=True)
class Check:
    item: str
    status: str
    detail: str
    required: bool = False  # the inventory needs this item (independent of hicache_strict)

    @property
    def blocking(self) -> bool:
        return self.required and self.status == MISSING


def kernel_module(facts, name) -> dict[str, bool]:
    """A kernel module as hicache_host_facts reports it: loaded, and available to modprobe."""
    return facts.get("kernel_modules", {}).get(name, {"loaded": False, "available": False})
