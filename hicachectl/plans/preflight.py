"""Judge what a host has (facts read by the hicache_host_facts module) against its deployment.

Every item is reported, judged against what the inventory *needs*, whatever hicache_strict says: an item
the inventory does not need is "not needed" (never "missing"); a needed item the host lacks is missing
and *required*. Strictness only decides what a deploy does with a required missing item: fail the host
(strict) or carry on with one gap per item (the host is degraded). doctor exits 1 for any of them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hicachectl.config.deployment import Deployment, uses_uring
from hicachectl.plans import storage
from hicachectl.plans.plan import INFO, MISSING, NOT_CHECKED, NOT_NEEDED, OK, WARN, Check
from hicachectl.rules.tiers import host_pool_ranks

SUPPORTED_OS = {("debian", "12"), ("ubuntu", "22.04"), ("ubuntu", "24.04"), ("rhel", "9"), ("rocky", "9"), ("almalinux", "9")}
ANSIBLE_WINDOW = ((2, 19), (2, 21))
MELLANOX_VENDOR = "0x15b3"
EXIT_OK, EXIT_MISSING, EXIT_UNCHECKED = 0, 1, 2


def connectx_interfaces(facts: dict[str, Any]) -> list[dict[str, Any]]:
    return [i for i in facts.get("interfaces", []) if i.get("driver") == "mlx5_core" or i.get("pci_vendor") == MELLANOX_VENDOR]


def needs(d: Deployment) -> dict[str, str | None]:
    """What the inventory needs of a host: item -> why (None: not needed, and why not is in not_needed_why)."""
    nfs, rdma, container = storage.is_nfs(d), storage.uses_rdma(d), d.container_runtime != "none"
    tier = f"the {d.storage_type} L3 tier"
    return {
        "gpus": "an SGLang server",
        "connectx": tier if nfs else None,
        "rdma": f"{tier} over proto=rdma" if rdma else None,
        "nfs_client": tier if nfs else None,
        "rpcrdma": f"{tier} over proto=rdma" if rdma else None,
        "vastnfs": storage.vastnfs_needed_for(d),
        "l3_device": "the local L3 device" if not nfs and d.storage_device else None,
        "container_runtime": f"the server's {d.container_runtime} container" if container else None,
        "nvidia_container_toolkit": "GPUs in the server's container" if container else None,
    }


def _not_needed_why(item: str, d: Deployment) -> str:
    if item in ("connectx", "nfs_client"):
        return f"not needed: the L3 tier is {d.storage_type}"
    if item in ("rdma", "rpcrdma"):
        return "not needed: " + (f"the L3 tier is {d.storage_type}" if not storage.is_nfs(d) else "the mount does not use proto=rdma")
    if item == "vastnfs":
        return "not needed: no VAST multipath (remoteports) and nconnect at most 16"
    if item == "l3_device":
        return "not needed: the L3 tier is a plain directory"
    return "not needed: hicache_container_runtime is none (start.sh runs on the host)"


def _judged(item: str, found: bool, detail: str, needed: dict[str, str | None], d: Deployment) -> Check:
    why = needed[item]
    if why is None:
        return Check(item, NOT_NEEDED, f"{_not_needed_why(item, d)} (host: {detail})")
    return Check(item, OK if found else MISSING, detail if found else f"{detail} (needed for {why})", required=True)


def runtime_check(facts: dict[str, Any], d: Deployment) -> Check:
    runtime = d.container_runtime
    needed = needs(d)
    if runtime == "none":
        return Check("container_runtime", NOT_NEEDED, _not_needed_why("container_runtime", d))
    client = facts.get("tools", {}).get(runtime)
    engine = (facts.get("runtime_engines") or {}).get(runtime) or {}
    if not client:
        return _judged("container_runtime", False, f"{runtime} not found", needed, d)
    if engine.get("answers") is False:
        return _judged("container_runtime", False, f"{client} is there, but its engine does not answer ({engine.get('detail') or 'no reason given'})", needed, d)
    return _judged("container_runtime", True, f"{client}" + (f", engine {engine['detail']}" if engine.get("detail") else ""), needed, d)


# Docker's default seccomp profile allowed io_uring_setup/enter/register from 20.10 (moby#39415) and blocks them again
# from 25.0 (moby#46762, "seccomp: block io_uring_* syscalls in default profile"); docs/docker-vm.md shows both on a VM.
DOCKER_BLOCKS_URING = (25, 0)


def uring_seccomp_check(facts: dict[str, Any], d: Deployment) -> Check | None:
    """Whether NIXL's io_uring, asked for by the inventory, is allowed in the server's container: a matter of the host's
    Docker engine, so judged here with its version and not by validate, which cannot know it. None where the question
    does not arise (no io_uring asked, another runtime, a seccomp profile given) or the engine's version is not known."""
    if not uses_uring(d) or d.container_runtime != "docker" or d.container_seccomp:
        return None
    engine = (facts.get("runtime_engines") or {}).get("docker") or {}
    version = _version(str(engine.get("detail") or "")) if engine.get("answers") else ()
    if len(version) < 2:
        return None
    shown = str(engine["detail"])
    if version >= DOCKER_BLOCKS_URING:
        return Check("io_uring", WARN, f"Docker {shown}'s default seccomp profile blocks io_uring (moby#46762, from 25.0): NIXL cannot "
                                       "create its io_uring backend and the deploy falls back to posix_aio; to keep io_uring, set "
                                       "hicache_container_seccomp to a profile that allows io_uring_setup/enter/register (or unconfined)")
    return Check("io_uring", OK, f"Docker {shown}'s default seccomp profile allows io_uring (20.10 to 24; blocked from 25.0)")


def host_checks(facts: dict[str, Any]) -> list[Check]:
    """What every host of the toolkit is judged on, a server's or a router's: its OS, kernel and Python."""
    os_info = facts.get("os", {})
    os_key = (os_info.get("id"), str(os_info.get("version_id", "")).split(".")[0] if os_info.get("id") in ("rhel", "rocky", "almalinux") else os_info.get("version_id"))
    python_ok = _version(facts.get("python", "0")) >= (3, 8)
    return [Check("os", OK if os_key in SUPPORTED_OS else WARN,
                  f"{os_info.get('pretty') or os_info.get('id')}" + ("" if os_key in SUPPORTED_OS else " (not a tested release: Debian 12, Ubuntu 22.04/24.04, RHEL 9)")),
            Check("kernel", INFO, str(facts.get("kernel"))),
            Check("python", OK if python_ok else MISSING, f"{facts.get('python')} on the host (Ansible needs 3.8+)", required=True)]


def judge(facts: dict[str, Any], d: Deployment, ansible_version: str | None = None) -> list[Check]:
    """Every item, judged against what the inventory needs; hicache_strict plays no part."""
    needed = needs(d)
    checks: list[Check] = host_checks(facts)
    if ansible_version:
        low, high = ANSIBLE_WINDOW
        in_window = low <= _version(ansible_version) <= high
        checks.append(Check("ansible", OK if in_window else MISSING,
                            f"ansible-core {ansible_version} on the controller (tested {low[0]}.{low[1]}-{high[0]}.{high[1]})", required=True))
    gpus = facts.get("gpus", {})
    checks.append(_judged("gpus", bool(gpus.get("count")), f"{gpus.get('count')} GPU(s)" if gpus.get("count") else (gpus.get("error") or "nvidia-smi not found"), needed, d))
    cx = connectx_interfaces(facts)
    checks.append(_judged("connectx", bool(cx), ", ".join(i["name"] for i in cx) if cx else "no mlx5_core / 0x15b3 interface", needed, d))
    rdma = facts.get("rdma_devices", [])
    checks.append(_judged("rdma", bool(rdma), ", ".join(rdma) if rdma else "no device in /sys/class/infiniband", needed, d))
    checks.append(_judged("nfs_client", *storage.nfs_client(facts), needed, d))
    checks.append(_judged("rpcrdma", *storage.rdma_transport(facts), needed, d))
    checks.append(_judged("vastnfs", *storage.vastnfs_present(facts), needed, d))
    if needed["vastnfs"]:
        gated = storage.vastnfs_version_check(facts, d)
        if gated is not None:
            checks.append(gated)
    if needed["l3_device"]:
        checks.append(_judged("l3_device", *storage.local_device(facts, d), needed, d))
    disk = facts.get("disk", {})
    enough = (disk.get("free_gb") or 0) >= d.preflight_min_free_gb
    checks.append(Check("disk", OK if enough else MISSING, f"{disk.get('free_gb')} GB free at {disk.get('path')} (want {d.preflight_min_free_gb})", required=True))
    mem = facts.get("mem_total_gb")
    if d.size_gb:
        ranks, how = host_pool_ranks(d)  # validate's rule: --hicache-size is per rank
        pool = d.size_gb * ranks
        fits = mem is not None and mem >= pool + d.host_ram_headroom_gb
        checks.append(Check("host_ram", OK if fits else MISSING,
                            f"{mem} GB RAM for a {pool} GB host pool ({d.size_gb} GB x {how}) + {d.host_ram_headroom_gb} GB headroom",
                            required=True))
    else:
        checks.append(Check("host_ram", INFO, f"{mem} GB RAM (host pool sized by ratio)"))
    checks.append(runtime_check(facts, d))
    uring = uring_seccomp_check(facts, d)
    if uring is not None:
        checks.append(uring)
    tools = facts.get("tools", {})
    toolkit = tools.get("nvidia-ctk") or tools.get("nvidia-container-runtime")
    checks.append(_judged("nvidia_container_toolkit", bool(toolkit), toolkit or "nvidia-ctk not found", needed, d))
    return checks


def report(facts: dict[str, Any], d: Deployment, ansible_version: str | None = None) -> dict[str, Any]:
    """One host's judgement: every check, what the inventory needs and the host lacks, and the strictness
    that decides whether a deploy fails on it (doctor does not ask)."""
    return summary(judge(facts, d, ansible_version), strict=bool(d.strict))


def summary(checks: list[Check], *, strict: bool) -> dict[str, Any]:
    """The report of a host's checks, as doctor and the preflight role read it."""
    return {"checks": [dataclasses.asdict(c) | {"blocking": c.blocking} for c in checks],
            "required_missing": [f"{c.item}: {c.detail}" for c in checks if c.blocking],
            "warnings": [f"{c.item}: {c.detail}" for c in checks if c.status == WARN],
            "not_checked": [f"{c.item}: {c.detail}" for c in checks if c.status == NOT_CHECKED],
            "strict": strict}


def host_status(host_report: dict[str, Any] | None) -> str:
    """doctor's word for one host: 'ok', 'missing' (a required item) or 'not checked' (no report)."""
    if host_report is None:
        return "not checked"
    return "missing" if host_report.get("required_missing") else "ok"


def doctor_exit_code(reports: dict[str, dict[str, Any] | None]) -> int:
    """2 when a host could not be checked, else 1 when a host lacks a required item, else 0 (DeepOps)."""
    statuses = {host_status(r) for r in reports.values()}
    if "not checked" in statuses:
        return EXIT_UNCHECKED
    return EXIT_MISSING if "missing" in statuses else EXIT_OK


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:2] if p.isdigit())
