"""The container_runtime role's plan: which runtime and units, and why containers cannot get the GPUs here."""

from __future__ import annotations

import dataclasses
from typing import Any

from hicachectl.config.deployment import Deployment
from hicachectl.plans import host_limits, launch
from hicachectl.plans.plan import has_tool


@dataclasses.dataclass(frozen=True, kw_only=True)
class RuntimePlan:
    runtime: str | None
    service: str | None
    strict: bool
    restart: bool
    missing: str  # why containers cannot get the GPUs here ('' when they can, or without facts)
    # The runtime's units to run and enable (with Docker: containerd.service, then docker.service); () for podman.
    units: tuple[str, ...] = ()


def runtime_plan(d: Deployment, facts: dict[str, Any] | None = None) -> RuntimePlan:
    runtime = d.container_runtime if launch.in_container(d) else None
    missing = ""
    if runtime and facts is not None:
        if not has_tool(facts, runtime):
            missing = f"{runtime} is not installed on this host"
        elif not has_tool(facts, "nvidia-ctk"):
            missing = "the NVIDIA container toolkit (nvidia-ctk) is not installed, so containers cannot see the GPUs"
    units = tuple(reversed(host_limits.runtime_services(d))) if runtime == "docker" else ()
    return RuntimePlan(
        runtime=runtime,
        service=host_limits.runtime_service(d),
        strict=bool(d.strict),
        restart=bool(d.limits_restart_runtime),
        missing=missing,
        units=units,
    )
