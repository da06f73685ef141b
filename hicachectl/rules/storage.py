"""Pass 2, the L3 storage mount: what a VAST or NetApp mount needs, NFS options on the wrong kind, VAST's
remoteports and nconnect."""

from __future__ import annotations

import math

from hicachectl.config.deployment import PREFIX, Deployment
from hicachectl.rules.findings import rule

# The stock kernel's NFS client refuses nconnect above 16 (fs/nfs/fs_context.c, NFS_MAX_CONNECTIONS 16); vastnfs raises
# the bound to 64 and refuses more (vastnfs bundle/fs/nfs/fs_context.c, NFS_MAX_CONNECTIONS 64, Opt_nconnect).
KERNEL_MAX_NCONNECT = 16
VASTNFS_MAX_NCONNECT = 64
# ONTAP accepts at most 16 nconnect connections per mount (NetApp ONTAP docs; /work/shared/reference/host-tuning.md).
ONTAP_MAX_NCONNECT = 16


def remote_port_count(spec: str | None) -> int | None:
    """How many addresses VAST `remoteports` names; None for 'dns' or a list hoststate.port_ranges cannot read."""
    from hicachectl.formats.portlist import port_ranges

    ranges = port_ranges(spec)
    return None if ranges is None else sum(high - low + 1 for low, high in ranges)


@rule
def _storage(d: Deployment, out):
    kind = d.storage_type
    if kind in ("vast", "netapp"):
        for name in ("storage_server", "storage_export"):
            if not getattr(d, name):
                out.error(PREFIX + name, "storage-required", f"is required for a {kind} mount.", f"set {PREFIX + name}.")
        if not d.cache_dir:
            out.error("hicache_cache_dir", "storage-required", f"a {kind} mount needs a mount point.", "set hicache_cache_dir.")
    if kind == "netapp":
        _netapp_nconnect(d, out)
        if d.storage_remoteports or d.storage_localports:
            out.error("hicache_storage_remoteports", "vast-only-option", "remoteports/localports are options of the VAST NFS driver.", "remove them for NetApp.")
        if d.storage_rsize is not None and d.storage_rsize > 65536:
            out.warn("hicache_storage_rsize", "netapp-rdma-rsize", f"{d.storage_rsize}: ONTAP reports unstable performance above 64 KiB over RDMA.", "use 65536.")
    if kind == "local" and (d.storage_nconnect or d.storage_remoteports or d.storage_localports):
        out.error("hicache_storage_type", "nfs-option-on-local", "NFS options are set but the L3 tier is local.", "remove them, or set hicache_storage_type: vast or netapp.")
    if kind == "vast":
        _vast(d, out)


def trunking_option(options) -> str | None:
    """The option that turns on NFSv4.1 session trunking (the kernel's max_connect=, fs/nfs/fs_context.c Opt_max_connect),
    as given in hicache_storage_options; None: no trunking."""
    for option in map(str, options or ()):
        key, _, value = option.partition("=")
        if key.strip() == "max_connect" and value.strip() not in ("", "1"):
            return option
    return None


def _netapp_nconnect(d: Deployment, out):
    """ONTAP's pNFS docs (pnfs/pnfs-plan-concept.adoc): pNFS works with nconnect or with session trunking, not with both at
    once; ONTAP allows up to 16 connections."""
    nconnect = d.storage_nconnect
    if nconnect is None:
        return
    trunking = trunking_option(d.storage_options)
    if trunking:
        out.error("hicache_storage_nconnect", "pnfs-nconnect-trunking",
                  f"nconnect={nconnect} together with session trunking ({trunking} in hicache_storage_options): ONTAP's pNFS works with one or the other, not both.",
                  f"remove hicache_storage_nconnect, or remove {trunking} from hicache_storage_options.")
    if nconnect > ONTAP_MAX_NCONNECT:
        out.error("hicache_storage_nconnect", "range", f"{nconnect}: ONTAP allows at most {ONTAP_MAX_NCONNECT} nconnect connections.",
                  f"use at most {ONTAP_MAX_NCONNECT}.")


def _vast(d: Deployment, out):
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
    if nconnect > VASTNFS_MAX_NCONNECT:
        out.error("hicache_storage_nconnect", "range",
                  f"{nconnect}: the VAST NFS driver refuses nconnect above {VASTNFS_MAX_NCONNECT} (the stock kernel above {KERNEL_MAX_NCONNECT}); the mount would fail.",
                  f"use at most {VASTNFS_MAX_NCONNECT}.")
        return
    # nconnect below the number of remote ports is documented usage: the driver picks a sub-range of them (vastnfs
    # docs/src/usage/mount-params.md, "Multipath mount examples", remoteports_offset): only an uneven spread above it warns.
    if ports and nconnect > ports and nconnect % ports:
        out.warn("hicache_storage_nconnect", "nconnect-ports", f"{nconnect} connections over {ports} remote ports load them unevenly.",
                 f"use a multiple of {ports}, e.g. {max(ports, round(nconnect / ports) * ports)}.")
    if d.storage_link_gbps:
        per_100g = d.storage_link_gbps / 100
        low, high = max(1, math.floor(2 * per_100g)), max(8, math.ceil(8 * per_100g))
        if nconnect < low:
            out.warn("hicache_storage_nconnect", "nconnect-link", f"{nconnect} is below VAST's RDMA guidance of 2 per 100 Gb/s ({low} for {d.storage_link_gbps} Gb/s).", f"use at least {low}.")
        elif nconnect > high:
            out.warn("hicache_storage_nconnect", "nconnect-link", f"{nconnect} is above even VAST's TCP guidance of 8 per 100 Gb/s ({high} for {d.storage_link_gbps} Gb/s).", f"use at most {high}.")


@rule
def _ecn_required_alone(d: Deployment, out):
    """hicache_nic_ecn_required fails a port without a per-priority ECN switch, for the priorities the inventory asks
    ECN on; with none asked (the default leaves ECN to the firmware) it requires nothing, which its owner did not mean."""
    if d.nic_ecn_required and not d.nic_ecn_priorities:
        out.warn("hicache_nic_ecn_required", "ecn-required-alone", "is true but hicache_nic_ecn_priorities is empty: no ECN is set "
                 "or checked, so nothing is required.", "list the priorities to switch ECN on in hicache_nic_ecn_priorities (e.g. [3]), "
                 "or drop hicache_nic_ecn_required.")


@rule
def _roce_priority(d: Deployment, out):
    """NFS over RDMA carries RDMA-CM's default ToS, which nic_tuning sets to hicache_nic_roce_dscp << 2 (xprtrdma sets
    none). With trust dscp the port's default dscp2prio map sends DSCP d to priority d >> 3 (mlx5: the firmware's
    default map; mlnx_qos prints it), so that priority must be the lossless one: with PFC and ECN elsewhere, the
    storage traffic runs on a priority that is neither paused nor marked."""
    if d.storage_type not in ("vast", "netapp") or d.nic_qos_trust != "dscp" or d.nic_roce_dscp is None:
        return
    priority = d.nic_roce_dscp >> 3
    for variable, priorities, what in (("hicache_nic_pfc_priorities", d.nic_pfc_priorities, "PFC"),
                                       ("hicache_nic_ecn_priorities", d.nic_ecn_priorities, "ECN")):
        if priorities and priority not in priorities:
            out.warn(variable, "roce-priority", f"{list(priorities)} leaves out priority {priority}, where NFS over RDMA runs "
                     f"(hicache_nic_roce_dscp {d.nic_roce_dscp} >> 3 with trust dscp): its traffic gets no {what}.",
                     f"add {priority} to {variable}, or set hicache_nic_roce_dscp to a DSCP of a priority listed there "
                     "(unless the switch team's dscp2prio map differs from the default).")
