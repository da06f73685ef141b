"""The host_limits role's plan: pinned host memory (memlock) for sessions and the container runtime's units, and
sysctls; and the judgement of the limits the host's processes run with (/proc/<pid>/limits, parsed here). No I/O."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from hicachectl.config.deployment import Deployment

LIMITS_FILE = "/etc/security/limits.d/90-hicache-memlock.conf"
SYSCTL_FILE = "/etc/sysctl.d/90-hicache.conf"
DROPIN_NAME = "90-hicache-memlock.conf"


def _field(value) -> str:
    """A value written into a line of limits.conf, a drop-in or sysctl.d: the rules refuse anything but one line of
    printable text first (the catalogue's domains); one that gets here anyway is a bug, never written."""
    text = str(value)
    if not text.strip() or any(ord(c) < 32 or ord(c) == 127 or c in "\x85\u2028\u2029" for c in text):
        raise ValueError(f"{text!r} cannot be written as one field of a line")
    return text


def limits_conf(d: Deployment) -> str:
    value = _field(d.limits_memlock)
    if value != "unlimited" and not value.isdigit():
        raise ValueError(f"memlock {value!r} is neither unlimited nor a number of KiB")
    # pam_limits' wildcard does not apply to root, and the servers run as root.
    return ("# Managed by hicache-deploy: HiCache pins its host pool (cudaHostRegister).\n"
            + "".join(f"{who} {kind} memlock {value}\n" for who in ("*", "root") for kind in ("soft", "hard")))


# With Docker a container's processes are not dockerd's children: dockerd asks containerd (containerd.service, its own
# unit in Debian's docker.io and containerd packages) to create the container; containerd starts
# containerd-shim-runc-v2 (containerd runtime/v2/shim), which runs runc, which starts the container's init. They
# inherit containerd's rlimits wherever the container's own spec sets none (moby daemon/oci_linux.go puts only the
# --ulimit values and the daemon's default-ulimits in the spec). So the memlock limit goes on both units:
# tests/vm/test_vm_docker.py shows on a real Docker 20.10 that a container started without --ulimit memlock gets
# containerd.service's limit, not docker.service's.
CONTAINERD_SERVICE = "containerd.service"


def runtime_service(d: Deployment) -> str | None:
    """The container runtime's own daemon unit (the server's unit is ordered after it)."""
    if d.limits_runtime_service:
        return d.limits_runtime_service
    return "docker.service" if d.container_runtime == "docker" else None  # podman has no daemon


# The runtime units hicache-deploy has ever given its memlock drop-in (DROPIN_NAME): a host that leaves Docker loses them.
KNOWN_RUNTIME_SERVICES = ("docker.service", CONTAINERD_SERVICE)


def stale_dropins(d: Deployment) -> tuple[str, ...]:
    """This toolkit's memlock drop-ins on the runtime units this deployment does not use (left by an earlier one with
    Docker): removed. A drop-in on a unit named by an earlier hicache_limits_runtime_service stays (not known here)."""
    used = set(runtime_services(d))
    return tuple(f"/etc/systemd/system/{s}.d/{DROPIN_NAME}" for s in KNOWN_RUNTIME_SERVICES if s not in used)


def runtime_services(d: Deployment) -> tuple[str, ...]:
    """Every unit whose memlock limit a container's processes can inherit: the runtime's daemon and, with Docker,
    containerd.service, the parent of every container's shim."""
    service = runtime_service(d)
    if service is None:
        return ()
    if d.container_runtime == "docker" and service != CONTAINERD_SERVICE:
        return (service, CONTAINERD_SERVICE)
    return (service,)


def server_sets_memlock(d: Deployment) -> bool:
    """The server's container sets its own memlock (`--ulimit memlock=` in run.sh/serve.sh, the documents' -1): its spec
    then holds RLIMIT_MEMLOCK and the runtime units' limit does not reach the server (moby daemon/oci_linux.go)."""
    from hicachectl.plans import launch

    return launch.in_container(d) and "memlock" in (d.container_ulimits or {})


def systemd_memlock(d: Deployment) -> str:
    """LimitMEMLOCK as `systemctl show` prints it."""
    return "infinity" if d.limits_memlock == "unlimited" else str(int(d.limits_memlock) * 1024)


def proc_memlock(d: Deployment) -> str:
    """"Max locked memory" as /proc/<pid>/limits prints it (soft and hard alike): unlimited, or bytes."""
    return "unlimited" if d.limits_memlock == "unlimited" else str(int(d.limits_memlock) * 1024)


def runtime_dropin(d: Deployment) -> str:
    return f"# Managed by hicache-deploy: containers inherit the runtime's memlock limit.\n[Service]\nLimitMEMLOCK={systemd_memlock(d)}\n"


def sysctl_conf(d: Deployment) -> str | None:
    if not d.host_sysctls:
        return None
    return "# Managed by hicache-deploy.\n" + "".join(f"{_field(k)} = {_field(v)}\n" for k, v in d.host_sysctls.items())


def runtime_unit_findings(plan: dict, units: dict[str, dict]) -> list[dict]:
    """What the runtime units' memlock says, from the host facts' `units` (hicache_host_facts: each unit's LoadState,
    MainPID, LimitMEMLOCK and, while it runs, the text of its /proc/<MainPID>/limits) and the role's plan (LimitsPlan
    as a fact): one finding per unit of the plan's `services` that is not as wanted, each {unit, reason, tolerated,
    stale, note}. `stale`: the unit runs without the limit (its process started before the drop-in), so a restart
    would give it; a failure when the role may restart it (it should have), else a gap, or only a `note` where the
    server's container sets its own memlock (server_sets_memlock). A unit the facts do not hold is not installed."""
    findings = []
    for unit in plan["services"]:
        properties = units.get(unit) or {}
        load, pid, configured = properties.get("LoadState", ""), properties.get("MainPID", "0"), properties.get("LimitMEMLOCK", "")
        soft, hard = parse_limits(properties.get("limits", "")).get(LIMIT_NAMES["memlock"], ("", ""))
        if load != "loaded":
            findings.append({"unit": unit, "stale": False, "tolerated": True, "note": False,
                             "reason": f"{unit} is not installed on this host, so its LimitMEMLOCK cannot be checked (the drop-in applies once it is)"})
        elif configured != plan["memlock"]:
            findings.append({"unit": unit, "stale": False, "tolerated": False, "note": False,
                             "reason": f"{unit}: LimitMEMLOCK={configured}, wanted {plan['memlock']}"})
        elif pid.isdigit() and int(pid) > 0 and (soft != plan["proc_memlock"] or hard != plan["proc_memlock"]):
            hint = "" if plan["restart"] else "; its LimitMEMLOCK applies once it restarts: restart it, or set hicache_limits_restart_runtime: true"
            reason = f"{unit} (pid {pid}) runs with memlock {soft}/{hard} (soft/hard), wanted {plan['proc_memlock']}{hint}"
            # The server's own --ulimit memlock decides the server's limit: a unit still running without the limit holds
            # back only containers started without one. Said (a note), not a gap of this host (restarted when allowed).
            note = bool(plan.get("server_sets_memlock")) and not plan["restart"]
            if note:
                reason += " (the server sets its own with --ulimit memlock, so this holds back only containers started without one)"
            findings.append({"unit": unit, "stale": True, "tolerated": not plan["restart"], "note": note, "reason": reason})
    return findings


@dataclasses.dataclass(frozen=True, kw_only=True)
class LimitsPlan:
    limits_file: str
    limits_conf: str
    service: str | None  # the container runtime's systemd service, None when the server runs on the host
    dropin_dir: str | None
    dropin_file: str | None
    dropin: str | None
    memlock: str  # LimitMEMLOCK as systemd shows it
    restart: bool
    sysctl_file: str
    sysctl_conf: str | None
    sysctls: dict[str, Any]
    strict: bool
    # Every unit a container's processes inherit memlock from (with Docker: docker.service and containerd.service,
    # runtime_services), each with its drop-in; the checks read each one's running process.
    services: tuple[str, ...] = ()
    proc_memlock: str = "unlimited"  # "Max locked memory" as /proc/<pid>/limits shows it
    files: tuple[dict[str, Any], ...] = ()  # everything the role writes, in one round trip (hicache_files)
    directories: tuple[dict[str, Any], ...] = ()
    server_sets_memlock: bool = False  # the server's container has its own --ulimit memlock (server_sets_memlock)
    absent: tuple[str, ...] = ()  # the drop-ins of runtime units this deployment does not use (stale_dropins): removed


def limits_plan(d: Deployment) -> LimitsPlan:
    service = runtime_service(d)
    services = runtime_services(d)
    dropin_dir = f"/etc/systemd/system/{service}.d" if service else None
    dropin = runtime_dropin(d)
    sysctls = sysctl_conf(d)
    root = {"owner": "root", "group": "root"}
    files = [{"path": LIMITS_FILE, "content": limits_conf(d), "mode": "0644", **root, "label": "limits"}]
    files += [{"path": f"/etc/systemd/system/{s}.d/{DROPIN_NAME}", "content": dropin, "mode": "0644", **root, "label": f"dropin {s}"}
              for s in services]
    if sysctls is not None:
        files.append({"path": SYSCTL_FILE, "content": sysctls, "mode": "0644", **root, "label": "sysctl"})
    return LimitsPlan(
        limits_file=LIMITS_FILE,
        limits_conf=limits_conf(d),
        service=service,
        dropin_dir=dropin_dir,
        dropin_file=f"{dropin_dir}/{DROPIN_NAME}" if service else None,
        dropin=dropin,
        memlock=systemd_memlock(d),
        restart=bool(d.limits_restart_runtime),
        sysctl_file=SYSCTL_FILE,
        sysctl_conf=sysctls,
        sysctls=dict(d.host_sysctls),
        strict=bool(d.strict),
        services=services,
        proc_memlock=proc_memlock(d),
        files=tuple(files),
        directories=tuple({"path": f"/etc/systemd/system/{s}.d", "mode": "0755", **root} for s in services),
        server_sets_memlock=server_sets_memlock(d),
        absent=stale_dropins(d),
    )


LIMIT_NAMES = {"memlock": "Max locked memory", "nofile": "Max open files", "stack": "Max stack size"}


def parse_limits(text: str) -> dict[str, tuple[str, str]]:
    """`/proc/<pid>/limits` -> {'Max locked memory': (soft, hard)}; values as printed ('unlimited' or a number)."""
    out = {}
    for line in text.splitlines()[1:]:
        match = re.match(r"^(.+?)\s{2,}(\S+)\s+(\S+)(?:\s+\S+)?\s*$", line)
        if match:
            out[match.group(1).strip()] = (match.group(2), match.group(3))
    return out


def memlock_ok(limits: dict[str, tuple[str, str]], wanted: str) -> bool:
    """`wanted` is 'unlimited' or KiB (as limits.conf takes it); /proc shows bytes."""
    soft, _hard = limits.get(LIMIT_NAMES["memlock"], ("", ""))
    if wanted == "unlimited":
        return soft == "unlimited"
    return soft == "unlimited" or (soft.isdigit() and int(soft) >= int(wanted) * 1024)
