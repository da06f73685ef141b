"""The L3 tier's mount: source, options and the fstab line, from one host's deployment. No I/O."""

from __future__ import annotations

import dataclasses

NFS_RDMA_PORT = 20049
NETAPP_RDMA_MAX_RSIZE = 65536  # ONTAP: above 64 KiB, NFS over RDMA performs unstably


@dataclasses.dataclass(frozen=True)
class Mount:
    source: str
    point: str
    fstype: str
    options: tuple[str, ...]

    @property
    def fstab_line(self) -> str:
        dump_pass = "0 2" if self.fstype not in ("nfs", "nfs4") else "0 0"
        return f"{self.source} {self.point} {self.fstype} {','.join(self.options)} {dump_pass}"


def _boot_safety(d) -> list[str]:
    """A storage outage must never block boot: wait for the network, give up after a timeout."""
    return ["_netdev", "nofail", f"x-systemd.mount-timeout={d.storage_mount_timeout}"]


def mount(d) -> Mount | None:
    """The mount for the host's L3 directory; None when the local tier is a plain directory."""
    extra = [str(o) for o in d.storage_options]
    if d.storage_type == "vast":
        options = ["vers=3", "proto=rdma", f"port={NFS_RDMA_PORT}"]
        if d.storage_nconnect:
            options.append(f"nconnect={d.storage_nconnect}")
        if d.storage_remoteports:
            options.append(f"remoteports={d.storage_remoteports}")
            if d.storage_localports:
                options.append("localports=" + "~".join(map(str, d.storage_localports)))
            options += ["spread_reads", "spread_writes"]
        if d.storage_rsize:
            options += [f"rsize={d.storage_rsize}", f"wsize={d.storage_rsize}"]
        return Mount(f"{d.storage_server}:{d.storage_export}", d.cache_dir, "nfs", tuple(options + extra + _boot_safety(d)))
    if d.storage_type == "netapp":
        rsize = d.storage_rsize or NETAPP_RDMA_MAX_RSIZE
        options = ["vers=4.1", "proto=rdma", f"port={NFS_RDMA_PORT}", f"rsize={rsize}", f"wsize={rsize}"]
        return Mount(f"{d.storage_server}:{d.storage_export}", d.cache_dir, "nfs", tuple(options + extra + _boot_safety(d)))
    if d.storage_device and d.cache_dir:
        return Mount(d.storage_device, d.cache_dir, d.storage_fstype, tuple(["defaults"] + extra + _boot_safety(d)[1:]))
    return None


def is_nfs(d) -> bool:
    return d.storage_type in ("vast", "netapp")


# fstab's ways of naming a block device by what is on it, and where udev links them (/dev/disk/by-*).
DEVICE_IDS = {"UUID": "uuid", "LABEL": "label", "PARTUUID": "partuuid", "PARTLABEL": "partlabel"}


def is_device_id(source: str | None) -> bool:
    return bool(source) and source.partition("=")[0] in DEVICE_IDS and "=" in source


def device_id_kind(source: str) -> str:
    return DEVICE_IDS[source.partition("=")[0]]


def resolve_source(source: str, block_ids: dict[str, str]) -> str | None:
    """The device a mount source names on a host: UUID=/LABEL=/PARTUUID=/PARTLABEL= through the host's
    /dev/disk/by-* links (hicache_host_facts' block_ids), anything else as written. None: no such device."""
    if not is_device_id(source):
        return source
    kind, _, value = source.partition("=")
    return block_ids.get(f"{kind}={value.strip(chr(34))}")


def nfsrahead_conf(d) -> str:
    """nfs-utils' nfsrahead reads this (via the udev rule it ships) each time an NFS bdi appears."""
    return f"# Managed by hicache-deploy: NFS read-ahead for the L3 tier.\n[nfsrahead]\nnfs={d.storage_read_ahead_kb}\nnfs4={d.storage_read_ahead_kb}\n"


def sunrpc_modprobe_conf(d) -> str:
    slots = d.storage_sunrpc_slots
    return f"# Managed by hicache-deploy.\noptions sunrpc tcp_slot_table_entries={slots} tcp_max_slot_table_entries={slots}\n"


def rp_filter_sysctls(d) -> dict[str, str]:
    """localports multipath needs reverse-path filtering off on every local port (VAST KB)."""
    if d.storage_type != "vast" or not d.storage_localports:
        return {}
    keys = {"net.ipv4.conf.all.rp_filter": "0"}
    for port in d.storage_localports:
        if not _looks_like_ip(str(port)):
            keys[f"net.ipv4.conf.{port}.rp_filter"] = "0"
    return keys


def _looks_like_ip(text: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False
