"""Pass 2, the L3 storage mount: what a VAST or NetApp mount needs, NFS options on the wrong kind, VAST's
remoteports and nconnect."""

from __future__ import annotations

import ipaddress
import math

from hicachectl.model import PREFIX
from hicachectl.rules.findings import rule


def remote_port_count(spec: str | None) -> int | None:
    """Count VAST `remoteports`: 'a-b' ranges joined by '~'; None for 'dns' or unparsable."""
    if not spec or spec == "dns":
        return None
    total = 0
    for part in spec.split("~"):
        first, _, last = part.partition("-")
        try:
            low = ipaddress.ip_address(first)
            high = ipaddress.ip_address(last) if last else low
        except ValueError:
            return None
        if int(high) < int(low):
            return None
        total += int(high) - int(low) + 1
    return total


@rule
def _storage(d, out):
    kind = d.storage_type
    if kind in ("vast", "netapp"):
        for name in ("storage_server", "storage_export"):
            if not getattr(d, name):
                out.error(PREFIX + name, "storage-required", f"is required for a {kind} mount.", f"set {PREFIX + name}.")
        if not d.cache_dir:
            out.error("hicache_cache_dir", "storage-required", f"a {kind} mount needs a mount point.", "set hicache_cache_dir.")
    if kind == "netapp":
        if d.storage_nconnect is not None:
            out.error("hicache_storage_nconnect", "pnfs-nconnect",
                      "NetApp pNFS and session trunking do not work properly together with nconnect (ONTAP docs).",
                      "remove hicache_storage_nconnect; pNFS spreads I/O over the data LIFs itself.")
        if d.storage_remoteports or d.storage_localports:
            out.error("hicache_storage_remoteports", "vast-only-option", "remoteports/localports are options of the VAST NFS driver.", "remove them for NetApp.")
        if d.storage_rsize is not None and d.storage_rsize > 65536:
            out.warn("hicache_storage_rsize", "netapp-rdma-rsize", f"{d.storage_rsize}: ONTAP reports unstable performance above 64 KiB over RDMA.", "use 65536.")
    if kind == "local" and (d.storage_nconnect or d.storage_remoteports or d.storage_localports):
        out.error("hicache_storage_type", "nfs-option-on-local", "NFS options are set but the L3 tier is local.", "remove them, or set hicache_storage_type: vast or netapp.")
    if kind == "vast":
        _vast(d, out)


def _vast(d, out):
    ports = remote_port_count(d.storage_remoteports)
    if d.storage_remoteports and d.storage_remoteports != "dns" and ports is None:
        out.error("hicache_storage_remoteports", "remoteports-syntax", f"{d.storage_remoteports!r} is not 'dns' or IP ranges like 172.16.0.1-172.16.0.8~172.16.1.1-172.16.1.8.",
                  "fix the ranges.")
    if d.storage_localports and not d.storage_remoteports:
        out.error("hicache_storage_localports", "localports-needs-remoteports", "localports only applies to a multipath mount.", "set hicache_storage_remoteports too.")
    nconnect = d.storage_nconnect
    if nconnect is None:
        return
    if nconnect < 1:
        out.error("hicache_storage_nconnect", "range", f"{nconnect} must be at least 1.", "use e.g. 8.")
        return
    if ports and nconnect % ports:
        out.warn("hicache_storage_nconnect", "nconnect-ports", f"{nconnect} connections over {ports} remote ports load them unevenly.",
                 f"use a multiple of {ports}, e.g. {max(ports, round(nconnect / ports) * ports)}.")
    if d.storage_link_gbps:
        per_100g = d.storage_link_gbps / 100
        low, high = max(1, math.floor(2 * per_100g)), max(8, math.ceil(8 * per_100g))
        if nconnect < low:
            out.warn("hicache_storage_nconnect", "nconnect-link", f"{nconnect} is below VAST's RDMA guidance of 2 per 100 Gb/s ({low} for {d.storage_link_gbps} Gb/s).", f"use at least {low}.")
        elif nconnect > high:
            out.warn("hicache_storage_nconnect", "nconnect-link", f"{nconnect} is above even VAST's TCP guidance of 8 per 100 Gb/s ({high} for {d.storage_link_gbps} Gb/s).", f"use at most {high}.")
