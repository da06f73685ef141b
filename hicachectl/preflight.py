"""Judge what a host has (facts read by the hicache_host_facts module) against its deployment.

Every item is reported; an item is *required* only when the inventory depends on it and asks for
`hicache_strict`, so a machine without GPUs or RDMA (a laptop, CI) can still run the roles, which
then skip the hardware steps with a named reason.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hicachectl import storage

OK, MISSING, WARN, INFO = "ok", "missing", "warn", "info"
SUPPORTED_OS = {("debian", "12"), ("ubuntu", "22.04"), ("ubuntu", "24.04"), ("rhel", "9"), ("rocky", "9"), ("almalinux", "9")}
ANSIBLE_WINDOW = ((2, 19), (2, 21))
MELLANOX_VENDOR = "0x15b3"


@dataclasses.dataclass(frozen=True)
class Check:
    item: str
    status: str
    detail: str
    required: bool = False

    @property
    def blocking(self) -> bool:
        return self.required and self.status == MISSING


def connectx_interfaces(facts: dict[str, Any]) -> list[dict[str, Any]]:
    return [i for i in facts.get("interfaces", []) if i.get("driver") == "mlx5_core" or i.get("pci_vendor") == MELLANOX_VENDOR]


def _module(facts, name) -> dict[str, bool]:
    return facts.get("kernel_modules", {}).get(name, {"loaded": False, "available": False})


def nfs_client(facts) -> tuple[bool, str]:
    if not facts.get("tools", {}).get("mount.nfs"):
        return False, "mount.nfs is not installed (package nfs-common / nfs-utils)"
    if "nfs" in facts.get("filesystems", []) or "nfs4" in facts.get("filesystems", []) or _module(facts, "nfs")["available"]:
        return True, "mount.nfs and the kernel's NFS client"
    return False, f"kernel {facts.get('kernel')} has no NFS client (no nfs in /proc/filesystems, no nfs module)"


def rdma_transport(facts) -> tuple[bool, str]:
    module = _module(facts, "rpcrdma")
    if module["available"]:
        return True, "rpcrdma " + ("loaded" if module["loaded"] else "available")
    return False, "no rpcrdma module for this kernel (NFS over RDMA needs it; MOFED or the distribution's kernel provides it)"


def can_mount(facts, d) -> tuple[bool, str]:
    """Whether this host can perform the L3 mount now, and if not, why."""
    ok, why = nfs_client(facts)
    if not ok:
        return False, why
    if "proto=rdma" in (storage.mount(d).options if storage.mount(d) else ()):
        return rdma_transport(facts)
    return True, why


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:2] if p.isdigit())


def runtime_check(facts: dict[str, Any], runtime: str, strict: bool) -> Check:
    if runtime == "none":
        return Check("container_runtime", INFO, "none: start.sh runs on the host itself")
    client = facts.get("tools", {}).get(runtime)
    engine = (facts.get("runtime_engines") or {}).get(runtime) or {}
    if not client:
        return Check("container_runtime", MISSING, f"{runtime} not found", required=strict)
    if engine.get("answers") is False:
        return Check("container_runtime", MISSING, f"{client} is there, but its engine does not answer ({engine.get('detail') or 'no reason given'})",
                     required=strict)
    return Check("container_runtime", OK, f"{client}" + (f", engine {engine['detail']}" if engine.get("detail") else ""))


def judge(facts: dict[str, Any], d, ansible_version: str | None = None) -> list[Check]:
    strict = bool(d.strict)
    nfs = storage.is_nfs(d)
    checks: list[Check] = []
    os_info = facts.get("os", {})
    os_key = (os_info.get("id"), str(os_info.get("version_id", "")).split(".")[0] if os_info.get("id") in ("rhel", "rocky", "almalinux") else os_info.get("version_id"))
    checks.append(Check("os", OK if os_key in SUPPORTED_OS else WARN,
                        f"{os_info.get('pretty') or os_info.get('id')}" + ("" if os_key in SUPPORTED_OS else " (not a tested release: Debian 12, Ubuntu 22.04/24.04, RHEL 9)")))
    checks.append(Check("kernel", INFO, str(facts.get("kernel"))))
    python_ok = _version(facts.get("python", "0")) >= (3, 8)
    checks.append(Check("python", OK if python_ok else MISSING, f"{facts.get('python')} on the host (Ansible needs 3.8+)", required=True))
    if ansible_version:
        low, high = ANSIBLE_WINDOW
        in_window = low <= _version(ansible_version) <= high
        checks.append(Check("ansible", OK if in_window else MISSING,
                            f"ansible-core {ansible_version} on the controller (tested {low[0]}.{low[1]}-{high[0]}.{high[1]})", required=True))
    gpus = facts.get("gpus", {})
    checks.append(Check("gpus", OK if gpus.get("count") else MISSING,
                        f"{gpus.get('count')} GPU(s)" if gpus.get("count") else (gpus.get("error") or "nvidia-smi not found"), required=strict))
    cx = connectx_interfaces(facts)
    checks.append(Check("connectx", OK if cx else MISSING, ", ".join(i["name"] for i in cx) if cx else "no mlx5_core / 0x15b3 interface",
                        required=strict and nfs))
    rdma = facts.get("rdma_devices", [])
    checks.append(Check("rdma", OK if rdma else MISSING, ", ".join(rdma) if rdma else "no device in /sys/class/infiniband", required=strict and nfs))
    ok, why = nfs_client(facts)
    checks.append(Check("nfs_client", OK if ok else MISSING, why, required=strict and nfs))
    ok, why = rdma_transport(facts)
    checks.append(Check("rpcrdma", OK if ok else MISSING, why, required=strict and nfs))
    if d.storage_type == "vast" and d.storage_remoteports:
        version = facts.get("vastnfs_version")
        checks.append(Check("vastnfs", OK if version else MISSING,
                            f"vastnfs {version}" if version else "the VAST NFS driver is not loaded (remoteports/localports need it)", required=strict))
    disk = facts.get("disk", {})
    enough = (disk.get("free_gb") or 0) >= d.preflight_min_free_gb
    checks.append(Check("disk", OK if enough else MISSING, f"{disk.get('free_gb')} GB free at {disk.get('path')} (want {d.preflight_min_free_gb})", required=strict))
    mem = facts.get("mem_total_gb")
    if d.size_gb:
        pool = d.size_gb * (d.tp_size or 1)
        fits = mem is not None and mem >= pool + d.host_ram_headroom_gb
        checks.append(Check("host_ram", OK if fits else MISSING,
                            f"{mem} GB RAM for a {pool} GB host pool + {d.host_ram_headroom_gb} GB headroom", required=strict))
    else:
        checks.append(Check("host_ram", INFO, f"{mem} GB RAM (host pool sized by ratio)"))
    checks.append(runtime_check(facts, d.container_runtime, strict))
    toolkit = facts.get("tools", {}).get("nvidia-ctk") or facts.get("tools", {}).get("nvidia-container-runtime")
    checks.append(Check("nvidia_container_toolkit", OK if toolkit else MISSING, toolkit or "nvidia-ctk not found", required=strict))
    return checks


def report(facts: dict[str, Any], d, ansible_version: str | None = None) -> dict[str, Any]:
    checks = judge(facts, d, ansible_version)
    return {"checks": [dataclasses.asdict(c) | {"blocking": c.blocking} for c in checks],
            "gaps": [f"{c.item}: {c.detail}" for c in checks if c.status in (MISSING, WARN)],
            "required_missing": [f"{c.item}: {c.detail}" for c in checks if c.blocking]}
