"""Judge what a host has (facts read by the hicache_host_facts module) against its deployment.

Every item is reported, judged against what the inventory *needs*, whatever hicache_strict says: an item
the inventory does not need is "not needed" (never "missing"); a needed item the host lacks is missing
and *required*. Strictness only decides what a deploy does with a required missing item: fail the host
(strict) or carry on with one gap per item (the host is degraded). doctor exits 1 for any of them.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from hicachectl import storage
from hicachectl.rules.tiers import host_pool_ranks

OK, MISSING, WARN, INFO, NOT_NEEDED = "ok", "missing", "warn", "info", "not needed"
NOT_CHECKED = "not checked"  # the host cannot tell yet (e.g. the VAST driver's version before sunrpc is loaded)
SUPPORTED_OS = {("debian", "12"), ("ubuntu", "22.04"), ("ubuntu", "24.04"), ("rhel", "9"), ("rocky", "9"), ("almalinux", "9")}
ANSIBLE_WINDOW = ((2, 19), (2, 21))
MELLANOX_VENDOR = "0x15b3"
EXIT_OK, EXIT_MISSING, EXIT_UNCHECKED = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class Check:
    item: str
    status: str
    detail: str
    required: bool = False  # the inventory needs this item (independent of hicache_strict)

    @property
    def blocking(self) -> bool:
        return self.required and self.status == MISSING


def connectx_interfaces(facts: dict[str, Any]) -> list[dict[str, Any]]:
    return [i for i in facts.get("interfaces", []) if i.get("driver") == "mlx5_core" or i.get("pci_vendor") == MELLANOX_VENDOR]


def kernel_module(facts, name) -> dict[str, bool]:
    """A kernel module as hicache_host_facts reports it: loaded, and available to modprobe."""
    return facts.get("kernel_modules", {}).get(name, {"loaded": False, "available": False})


def nfs_client(facts) -> tuple[bool, str]:
    if not facts.get("tools", {}).get("mount.nfs"):
        return False, "mount.nfs is not installed (package nfs-common / nfs-utils)"
    if "nfs" in facts.get("filesystems", []) or "nfs4" in facts.get("filesystems", []) or kernel_module(facts, "nfs")["available"]:
        return True, "mount.nfs and the kernel's NFS client"
    return False, f"kernel {facts.get('kernel')} has no NFS client (no nfs in /proc/filesystems, no nfs module)"


def rdma_transport(facts) -> tuple[bool, str]:
    module = kernel_module(facts, "rpcrdma")
    if module["available"]:
        return True, "rpcrdma " + ("loaded" if module["loaded"] else "available")
    return False, "no rpcrdma module for this kernel (NFS over RDMA needs it; MOFED or the distribution's kernel provides it)"


def uses_rdma(d) -> bool:
    """Whether the L3 mount runs over RDMA (the last proto= option wins, as mount.nfs reads them)."""
    mount = storage.mount(d) if storage.is_nfs(d) else None
    protos = [o.partition("=")[2] for o in (mount.options if mount else ()) if o.startswith("proto=")]
    return bool(protos) and protos[-1] in ("rdma", "rdma6")


def local_device(facts, d) -> tuple[bool, str]:
    """A local tier's block device: UUID=/LABEL=/PARTUUID=/PARTLABEL= must name a device of this host."""
    source = d.storage_device
    if not storage.is_device_id(source):
        return True, f"{source} (the mount itself tells whether it is there)"
    resolved = storage.resolve_source(source, facts.get("block_ids") or {})
    if resolved is None:
        return False, f"no block device with {source} on this host (none in /dev/disk/by-{storage.device_id_kind(source)})"
    return True, f"{source} is {resolved}"


def can_mount(facts, d) -> tuple[bool, str]:
    """Whether this host can perform the L3 mount now, and if not, why. A local tier needs no NFS client."""
    if not storage.is_nfs(d):
        return local_device(facts, d) if d.storage_device else (True, "a plain directory")
    ok, why = nfs_client(facts)
    if not ok:
        return False, why
    # The stock kernel refuses the VAST driver's options outright ("nfs: Unknown parameter 'localports'"): say why
    # instead of trying (the preflight role's vastnfs item fails the host first in a whole run).
    needs = vastnfs_needed_for(d)
    if needs:
        present, state = vastnfs_present(facts)
        if not present:
            return False, f"this mount needs the VAST NFS driver for {needs}: {state}"
    if uses_rdma(d):
        return rdma_transport(facts)
    return True, why


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:2] if p.isdigit())


# The vastnfs release that introduced (or first made safe) each option the L3 mount may carry, from vastnfs'
# docs/src/ChangeLog.md and docs/src/usage/mount-params.md (benjarvis/vastnfs v4.0.33).
VASTNFS_OPTION_VERSIONS = (
    ("spread_reads", (4, 0, 16), "ChangeLog 4.0.16 adds spread_reads and spread_writes"),
    ("spread_writes", (4, 0, 16), "ChangeLog 4.0.16 adds spread_reads and spread_writes"),
    ("localports=<interface names>", (4, 0, 22), "ChangeLog 4.0.22: network device names in localports="),
    ("localports_failover", (4, 0, 23), "ChangeLog 4.0.23 fixes localports_failover, broken before"),
    ("relmtime", (4, 0, 25), "ChangeLog 4.0.25 adds relmtime"),
    ("noextend", (4, 0, 26), "ChangeLog 4.0.26 adds noextend"),
    ("optlockflush", (4, 0, 26), "ChangeLog 4.0.26 adds optlockflush"),
    ("remoteports=dns", (4, 0, 29), "mount-params.md: do not use remoteports=dns before 4.0.29"),
    ("remoteports=dns without nconnect", (4, 0, 30), "ChangeLog 4.0.30 fixes the mount failure with remoteports=dns and no nconnect"),
    ("mdconnect", (4, 0, 33), "ChangeLog 4.0.33 adds mdconnect"),
    ("nosharetransport", (4, 0, 33), "ChangeLog 4.0.33 adds nosharetransport and sharetransport"),
    ("sharetransport", (4, 0, 33), "ChangeLog 4.0.33 adds nosharetransport and sharetransport"),
)


def vastnfs_version_tuple(text: str | None) -> tuple[int, int, int] | None:
    """nfs_bundle_version as the packages set it (vastnfs build-deb.sh / build-rpm.sh: "<version>-vastdata<OFED>"); None for
    a development build ("dev", build-info.h) or anything else without a leading x.y.z."""
    match = re.match(r"v?(\d+)\.(\d+)\.(\d+)", (text or "").strip())
    return tuple(int(g) for g in match.groups()) if match else None


def vastnfs_options_used(d) -> list[str]:
    """The VAST driver's version-gated options this host's mount uses, named as in VASTNFS_OPTION_VERSIONS."""
    if d.storage_type != "vast":
        return []
    mount = storage.mount(d)
    keys = {o.partition("=")[0]: o.partition("=")[2] for o in mount.options}
    used = [name for name, _, _ in VASTNFS_OPTION_VERSIONS if "=" not in name and " " not in name and name in keys]
    if keys.get("remoteports") == "dns":
        used.append("remoteports=dns")
        if "nconnect" not in keys:
            used.append("remoteports=dns without nconnect")
    if any(not storage._looks_like_ip(p) for p in (keys.get("localports") or "").split("~") if p and "-" not in p):
        used.append("localports=<interface names>")
    return used


def vastnfs_needed_for(d) -> str | None:
    """Why the mount needs the VAST NFS driver, or None: multipath (remoteports, with localports: storage.mount adds
    localports only with remoteports), nconnect above the stock kernel's 16 (fs/nfs/fs_context.c NFS_MAX_CONNECTIONS;
    vastnfs allows 64), or another of the driver's own options."""
    if d.storage_type != "vast":
        return None
    reasons = []
    if d.storage_remoteports:
        reasons.append("VAST multipath (remoteports, localports)")
    if d.storage_nconnect and d.storage_nconnect > 16:
        reasons.append(f"nconnect={d.storage_nconnect} (the stock kernel allows at most 16)")
    # the driver's own options, as VASTNFS_OPTION_VERSIONS names them from its sources (localports is said above)
    own = [name for name in vastnfs_options_used(d) if not name.startswith(("remoteports", "localports"))]
    if own:
        reasons.append(", ".join(own))
    return " and ".join(reasons) or None


def vastnfs_present(facts) -> tuple[bool, str]:
    """The VAST NFS driver, loaded (its sunrpc shows nfs_bundle_version) or installed and not loaded yet (modinfo of the
    sunrpc that modprobe would load lists the parameter; hicache_host_facts' vastnfs_installed): before the first mount
    sunrpc is often not loaded at all (vastnfs docs/src/monitoring/version.md)."""
    version = facts.get("vastnfs_version")
    if version:
        return True, f"vastnfs {version} loaded"
    installed = facts.get("vastnfs_installed")
    if installed and kernel_module(facts, "sunrpc")["loaded"]:
        # Installed without a reboot: the kernel's own sunrpc stays loaded (nfs-common's rpc_pipefs loads it at boot),
        # and neither the mount nor modprobe swaps it; the driver's options then fail with the kernel's raw error.
        return False, ("vastnfs is installed, but the kernel's own sunrpc is loaded (no nfs_bundle_version in /sys/module/sunrpc): "
                       "reboot, or run `vastnfs-ctl reload` (vastnfs docs/src/usage/vastnfs-ctl.md), before the first mount")
    if installed:
        return True, "vastnfs installed (modinfo sunrpc lists nfs_bundle_version), not loaded yet: the mount loads it"
    if installed is None:
        return False, "the VAST NFS driver is not loaded, and without modinfo this host cannot tell whether it is installed"
    return False, "the VAST NFS driver is neither loaded nor installed (the sunrpc module modprobe would load is the kernel's)"


def vastnfs_version_check(facts, d) -> Check | None:
    """The loaded driver's version against the options of this mount that need a newer one. Needs the loaded version:
    installed but not loaded, or a build without a version, is "not checked", with why."""
    used = vastnfs_options_used(d)
    if not used or not (facts.get("vastnfs_version") or facts.get("vastnfs_installed")):
        return None  # nothing gated, or no driver at all (the vastnfs item says so)
    gates = [(name, low, why) for name, low, why in VASTNFS_OPTION_VERSIONS if name in used]
    wanted = ", ".join(f"{name} {'.'.join(map(str, low))}+" for name, low, _ in gates)
    version = facts.get("vastnfs_version")
    if not version:
        return Check("vastnfs_version", NOT_CHECKED, f"vastnfs is installed but sunrpc is not loaded, so its version is unknown before the "
                                                    f"first mount (this mount needs {wanted}); `modprobe sunrpc` and run doctor again to check it",
                     required=True)
    loaded = vastnfs_version_tuple(version)
    if loaded is None:
        return Check("vastnfs_version", NOT_CHECKED, f"vastnfs {version} names no x.y.z release (this mount needs {wanted})", required=True)
    old = [f"{name} needs {'.'.join(map(str, low))}+ ({why})" for name, low, why in gates if loaded < low]
    if old:
        return Check("vastnfs_version", MISSING, f"vastnfs {version} is too old: " + "; ".join(old), required=True)
    return Check("vastnfs_version", OK, f"vastnfs {version} has every option of this mount ({wanted})", required=True)


def needs(d) -> dict[str, str | None]:
    """What the inventory needs of a host: item -> why (None: not needed, and why not is in not_needed_why)."""
    nfs, rdma, container = storage.is_nfs(d), uses_rdma(d), d.container_runtime != "none"
    tier = f"the {d.storage_type} L3 tier"
    return {
        "gpus": "an SGLang server",
        "connectx": tier if nfs else None,
        "rdma": f"{tier} over proto=rdma" if rdma else None,
        "nfs_client": tier if nfs else None,
        "rpcrdma": f"{tier} over proto=rdma" if rdma else None,
        "vastnfs": vastnfs_needed_for(d),
        "l3_device": "the local L3 device" if not nfs and d.storage_device else None,
        "container_runtime": f"the server's {d.container_runtime} container" if container else None,
        "nvidia_container_toolkit": "GPUs in the server's container" if container else None,
    }


def _not_needed_why(item: str, d) -> str:
    if item in ("connectx", "nfs_client"):
        return f"not needed: the L3 tier is {d.storage_type}"
    if item in ("rdma", "rpcrdma"):
        return "not needed: " + (f"the L3 tier is {d.storage_type}" if not storage.is_nfs(d) else "the mount does not use proto=rdma")
    if item == "vastnfs":
        return "not needed: no VAST multipath (remoteports) and nconnect at most 16"
    if item == "l3_device":
        return "not needed: the L3 tier is a plain directory"
    return "not needed: hicache_container_runtime is none (start.sh runs on the host)"


def _judged(item: str, found: bool, detail: str, needed: dict[str, str | None], d) -> Check:
    why = needed[item]
    if why is None:
        return Check(item, NOT_NEEDED, f"{_not_needed_why(item, d)} (host: {detail})")
    return Check(item, OK if found else MISSING, detail if found else f"{detail} (needed for {why})", required=True)


def runtime_check(facts: dict[str, Any], d) -> Check:
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


def judge(facts: dict[str, Any], d, ansible_version: str | None = None) -> list[Check]:
    """Every item, judged against what the inventory needs; hicache_strict plays no part."""
    needed = needs(d)
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
    checks.append(_judged("gpus", bool(gpus.get("count")), f"{gpus.get('count')} GPU(s)" if gpus.get("count") else (gpus.get("error") or "nvidia-smi not found"), needed, d))
    cx = connectx_interfaces(facts)
    checks.append(_judged("connectx", bool(cx), ", ".join(i["name"] for i in cx) if cx else "no mlx5_core / 0x15b3 interface", needed, d))
    rdma = facts.get("rdma_devices", [])
    checks.append(_judged("rdma", bool(rdma), ", ".join(rdma) if rdma else "no device in /sys/class/infiniband", needed, d))
    checks.append(_judged("nfs_client", *nfs_client(facts), needed, d))
    checks.append(_judged("rpcrdma", *rdma_transport(facts), needed, d))
    checks.append(_judged("vastnfs", *vastnfs_present(facts), needed, d))
    if needed["vastnfs"]:
        gated = vastnfs_version_check(facts, d)
        if gated is not None:
            checks.append(gated)
    if needed["l3_device"]:
        checks.append(_judged("l3_device", *local_device(facts, d), needed, d))
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
    tools = facts.get("tools", {})
    toolkit = tools.get("nvidia-ctk") or tools.get("nvidia-container-runtime")
    checks.append(_judged("nvidia_container_toolkit", bool(toolkit), toolkit or "nvidia-ctk not found", needed, d))
    return checks


def report(facts: dict[str, Any], d, ansible_version: str | None = None) -> dict[str, Any]:
    """One host's judgement: every check, what the inventory needs and the host lacks, and the strictness
    that decides whether a deploy fails on it (doctor does not ask)."""
    checks = judge(facts, d, ansible_version)
    return {"checks": [dataclasses.asdict(c) | {"blocking": c.blocking} for c in checks],
            "required_missing": [f"{c.item}: {c.detail}" for c in checks if c.blocking],
            "warnings": [f"{c.item}: {c.detail}" for c in checks if c.status == WARN],
            "not_checked": [f"{c.item}: {c.detail}" for c in checks if c.status == NOT_CHECKED],
            "strict": bool(d.strict)}


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
