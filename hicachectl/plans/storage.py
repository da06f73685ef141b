"""The storage role's plan: the L3 tier's mount (source, options, the fstab line), the sysctls, nfsrahead and
modules-load files, what this host can mount and why not (NFS client, rpcrdma, a device), and the vastnfs gates (the
driver and the release each option needs). No I/O: the host's live state is judged in plans/storage_live.py."""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import shlex
from typing import Any

from hicachectl.config.deployment import Deployment
from hicachectl.plans.plan import MISSING, NOT_CHECKED, OK, Check, kernel_module

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


def _boot_safety(d: Deployment) -> list[str]:
    """A storage outage must never block boot: wait for the network, give up after a timeout."""
    return ["_netdev", "nofail", f"x-systemd.mount-timeout={d.storage_mount_timeout}"]


def rdma_netid(server: str | None) -> str:
    """The RDMA transport's netid for this server: xprtrdma registers "rdma" for IPv4 and "rdma6" for IPv6
    (net/sunrpc/xprtrdma/transport.c, xprt_rdma's netid list), and mount.nfs picks the address family from proto=, so an
    IPv6 server (in brackets, as hicache_storage_server takes it) needs proto=rdma6 (ONTAP docs, nfs-rdma). A host name
    keeps proto=rdma: the mount then uses the name's IPv4 address; a name that resolves to IPv6 only needs
    proto=rdma6 in hicache_storage_options (the last proto= wins)."""
    address = (server or "").strip()
    if address.startswith("[") and address.endswith("]"):
        address = address[1:-1]
    try:
        return "rdma6" if ipaddress.ip_address(address).version == 6 else "rdma"
    except ValueError:
        return "rdma"


def mount(d: Deployment) -> Mount | None:
    """The mount for the host's L3 directory; None when the local tier is a plain directory."""
    extra = [str(o) for o in d.storage_options]
    if d.storage_type == "vast":
        options = ["vers=3", f"proto={rdma_netid(d.storage_server)}", f"port={NFS_RDMA_PORT}"]
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
        options = ["vers=4.1", f"proto={rdma_netid(d.storage_server)}", f"port={NFS_RDMA_PORT}", f"rsize={rsize}", f"wsize={rsize}"]
        if d.storage_nconnect:  # with pNFS, where session trunking is not used (rules/storage.py refuses the two together)
            options.append(f"nconnect={d.storage_nconnect}")
        return Mount(f"{d.storage_server}:{d.storage_export}", d.cache_dir, "nfs", tuple(options + extra + _boot_safety(d)))
    if d.storage_device and d.cache_dir:
        return Mount(d.storage_device, d.cache_dir, d.storage_fstype, tuple(["defaults"] + extra + _boot_safety(d)[1:]))
    return None


def is_nfs(d: Deployment) -> bool:
    return d.storage_type in ("vast", "netapp")


def mount_point(d: Deployment) -> str | None:
    """Where mount() mounts the L3 tier (hicache_cache_dir), None when the tier is a plain directory; reads only what
    decides that, so a role that needs the point (the server's unit) does not read the mount's options."""
    return d.cache_dir if d.cache_dir and (is_nfs(d) or d.storage_device) else None


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


def nfsrahead_conf(d: Deployment) -> str:
    """nfs-utils' nfsrahead reads this (via the udev rule it ships) each time an NFS bdi appears."""
    return f"# Managed by hicache-deploy: NFS read-ahead for the L3 tier.\n[nfsrahead]\nnfs={d.storage_read_ahead_kb}\nnfs4={d.storage_read_ahead_kb}\n"


# Written by the storage role before the mount, kept by it ever after (an older role wrote TCP slot options here).
OLD_SUNRPC_MODPROBE_FILE = "/etc/modprobe.d/hicache-sunrpc.conf"
MODULES_LOAD_FILE = "/etc/modules-load.d/hicache-rpcrdma.conf"
SYSCTL_FILE = "/etc/sysctl.d/90-hicache-storage.conf"


def modules_load_conf(d: Deployment) -> str | None:
    """xprtrdma registers its sysctls (sunrpc.rdma_*) only once rpcrdma is loaded (net/sunrpc/xprtrdma/transport.c,
    xprt_rdma_init); systemd-sysctl.service runs after systemd-modules-load.service, so loading it at boot makes the
    persisted slot table count land before any mount. None: nothing to load."""
    if not uses_rdma(d) or d.storage_sunrpc_slots is None:
        return None
    return "# Managed by hicache-deploy: NFS over RDMA; loaded at boot so that sunrpc.rdma_slot_table_entries applies.\nrpcrdma\n"


def sunrpc_sysctls(d: Deployment) -> dict[str, str]:
    """NFS over RDMA takes its RPC slots from xprtrdma's table (sunrpc.rdma_slot_table_entries, 4-256, default 128),
    read when a transport is created, i.e. at mount time. The tcp_*slot_table_entries knobs apply to TCP mounts only,
    and lowering tcp_max_slot_table_entries below the kernel's 65536 only harms them: this role never sets them."""
    if not uses_rdma(d) or d.storage_sunrpc_slots is None:
        return {}
    return {"sunrpc.rdma_slot_table_entries": str(d.storage_sunrpc_slots)}


def sysctl_key(*parts: str) -> str:
    """A sysctl name for sysctl.d and for /proc/sys, in slash form: sysctl.d(5) keeps dots inside a name whose first
    separator is a slash, so a VLAN such as ens1f0.100 stays one path component (net/ipv4/conf/ens1f0.100/rp_filter)."""
    return "/".join(parts)


def multipath_interfaces(d: Deployment, facts: dict | None) -> tuple[list[str], list[str]]:
    """The local interfaces behind localports: names as given, addresses through the host facts' interfaces.
    Returns (interfaces, localports whose interface this host does not show: an address none of its interfaces holds,
    or a name it has no interface of; without host facts, none)."""
    by_address, present = {}, set()
    for nic in (facts or {}).get("interfaces") or []:
        present.add(nic["name"])
        for address in nic.get("addresses") or []:
            by_address[address] = nic["name"]
    names, unknown = [], []
    for port in map(str, d.storage_localports or []):
        name = by_address.get(port) if _looks_like_ip(port) else port
        if name is None or (present and name not in present):
            unknown.append(port)
        if name is not None and name not in names:  # a name is kept (its sysctl.d line applies once the port appears)
            names.append(name)
    return names, unknown


def rp_filter_sysctls(d: Deployment, facts: dict | None = None) -> dict[str, str]:
    """localports multipath needs reverse-path filtering off on each local port (VAST KB). The kernel filters with
    the larger of conf/all and conf/<interface> (Documentation/networking/ip-sysctl.rst, rp_filter), so both must be 0
    for the storage ports; every other interface keeps the filtering it had, by raising its own value (and conf/default,
    for interfaces that appear later) to what conf/all gave it before."""
    if d.storage_type != "vast" or not d.storage_localports:
        return {}
    ports, _ = multipath_interfaces(d, facts)
    keys = {sysctl_key("net", "ipv4", "conf", "all", "rp_filter"): "0"}
    for port in ports:
        keys[sysctl_key("net", "ipv4", "conf", port, "rp_filter")] = "0"
    current = (facts or {}).get("rp_filter") or {}
    # Once conf/all is 0 (this role's own doing) the host no longer shows the filtering it had: the raises an earlier
    # run wrote to SYSCTL_FILE say it, and are kept, so that a second run writes the same file (idempotence).
    raised = {name: value for name, value in _written_rp_filter(facts).items() if name not in ("all", "lo") and name not in ports and value > 0}
    floor = max([_int(current.get("all")), *raised.values()])
    if floor:
        for name, value in sorted(current.items()):
            if name in ("all", "lo") or name in ports:
                continue
            if _int(value) < floor or name in raised:
                keys[sysctl_key("net", "ipv4", "conf", name, "rp_filter")] = str(max(floor, raised.get(name, 0)))
    return keys


_WRITTEN_RP_FILTER = re.compile(r"^net/ipv4/conf/([^/\s]+)/rp_filter\s*=\s*([0-9]+)\s*$", re.MULTILINE)


def _written_rp_filter(facts: dict | None) -> dict[str, int]:
    """The rp_filter values SYSCTL_FILE holds now (the host facts read it: reads.files), by interface."""
    text = ((facts or {}).get("files") or {}).get(SYSCTL_FILE) or ""
    return {name: int(value) for name, value in _WRITTEN_RP_FILTER.findall(text)}


def _int(text) -> int:
    try:
        return int(str(text).strip())
    except ValueError:
        return 0


# The kernel's own TCP slot tables (net/sunrpc/xprtsock.c: xprt_tcp_slot_table_entries = RPC_MIN_SLOT_TABLE,
# xprt_max_tcp_slot_table_entries = RPC_MAX_SLOT_TABLE; include/linux/sunrpc/xprt.h: 2 and RPC_MAX_SLOT_TABLE_LIMIT, 65536).
KERNEL_TCP_SLOTS = {"tcp_slot_table_entries": "2", "tcp_max_slot_table_entries": "65536"}
_OLD_SUNRPC_OPTION = re.compile(r"\b(tcp_slot_table_entries|tcp_max_slot_table_entries)=")


def restored_tcp_slots(facts: dict | None) -> dict[str, str]:
    """0.1.0 wrote `options sunrpc tcp_slot_table_entries=128 tcp_max_slot_table_entries=128` to OLD_SUNRPC_MODPROBE_FILE
    and set them live. Removing the file restores the kernel's values only at sunrpc's next load (a reboot), so while
    the host facts still find the file, the role gives each value it named back to the kernel's default, live (the
    sysctls sunrpc.tcp_*slot_table_entries), before removing it; nothing is persisted: the default needs no file."""
    text = ((facts or {}).get("files") or {}).get(OLD_SUNRPC_MODPROBE_FILE)
    if not text:
        return {}
    return {f"sunrpc.{key}": KERNEL_TCP_SLOTS[key] for key in dict.fromkeys(_OLD_SUNRPC_OPTION.findall(text))}


# vastnfs' sunrpc shows each mount's sunrpc-id in /proc/self/mountstats only with this parameter set (bundle/net/sunrpc/
# stats.c: module_param_named(expose_id_in_mountstats, ..., bool, 0644), default false; docs/src/monitoring/transports.md
# sets it after boot): without the id, verify cannot find the mount's transports in debugfs (rpc_clnt/<id>/stats).
VASTNFS_MODPROBE_FILE = "/etc/modprobe.d/hicache-vastnfs.conf"
EXPOSE_ID_PARAMETER = "/sys/module/sunrpc/parameters/expose_id_in_mountstats"


def shows_multipath_paths(d: Deployment) -> bool:
    """VAST multipath (remoteports): a mount only vastnfs' client makes (vastnfs_needed_for; where the driver
    is missing, preflight says the host cannot mount), so its sunrpc is the one that takes the parameter."""
    return bool(d.storage_type == "vast" and d.storage_remoteports)


def vastnfs_conf(d: Deployment) -> str | None:
    """modprobe.d options for vastnfs' sunrpc, applied when the mount (or a boot) loads it; None: nothing to persist."""
    if not shows_multipath_paths(d):
        return None
    return ("# Managed by hicache-deploy: vastnfs shows each mount's sunrpc-id in /proc/self/mountstats, so that verify\n"
            "# finds the mount's multipath transports (debugfs sunrpc/rpc_clnt/<id>/stats).\noptions sunrpc expose_id_in_mountstats=1\n")


def vastnfs_values(d: Deployment) -> dict[str, str]:
    """The same, live (a bool parameter reads back as Y), set once the mount has loaded vastnfs' sunrpc."""
    return {EXPOSE_ID_PARAMETER: "Y"} if shows_multipath_paths(d) else {}


def sysctl_conf(sysctls: dict[str, str]) -> str | None:
    if not sysctls:
        return None
    lines = ["# Managed by hicache-deploy: the L3 tier's kernel values (NFS over RDMA slots, multipath reverse-path filtering)."]
    return "\n".join(lines + [f"{key} = {value}" for key, value in sysctls.items()]) + "\n"


NFSRAHEAD_FILE = "/etc/nfs.conf.d/hicache-readahead.conf"
# Where nfs-utils has no nfsrahead (before 2.6.2: Ubuntu 22.04's 2.6.1), the toolkit's own udev rule and program set
# the L3 mount's read-ahead when its bdi appears: that mount's only, where nfsrahead's setting is host-wide.
READ_AHEAD_RULE_FILE = "/etc/udev/rules.d/90-hicache-l3-readahead.rules"
READ_AHEAD_PROGRAM = "/usr/local/libexec/hicache-l3-readahead"


def own_read_ahead_rule(d: Deployment, facts: dict | None) -> bool:
    """The toolkit's own read-ahead rule: an NFS tier with a read-ahead, on a host read to have no nfsrahead (a host not
    read, as `render` plans it, is taken to have it: what nfs-utils gives since 2.6.2)."""
    tools = (facts or {}).get("tools")
    return is_nfs(d) and d.storage_read_ahead_kb is not None and tools is not None and not tools.get("nfsrahead")


def read_ahead_rule_text() -> str:
    # The bdi of an NFS mount has an anonymous device number (major 0); only such bdis run the program.
    return ("# Managed by hicache-deploy: the L3 tier's NFS read-ahead, where nfs-utils (before 2.6.2) sets none.\n"
            f'SUBSYSTEM=="bdi", ACTION=="add", KERNEL=="0:*", PROGRAM="{READ_AHEAD_PROGRAM} %k", ATTR{{read_ahead_kb}}="%c"\n')


def read_ahead_program_text(d: Deployment) -> str:
    """udev runs it with a new bdi's MAJ:MIN, before the mount that made the bdi shows in mountinfo: it waits (up to 10 s,
    as nfsrahead does) for a mount with that device, prints the read-ahead when it is the L3 mount, and exits 1 at once
    when it is another mount (the rule then sets nothing)."""
    point = mount(d).point
    return f"""#!/bin/sh
# Managed by hicache-deploy: the read-ahead of the L3 tier's NFS mount ({point}), run by {READ_AHEAD_RULE_FILE}.
i=0
while [ "$i" -lt 50 ]; do
    awk -v dev="$1" -v point={shlex.quote(point)} '$3 == dev {{ found = ($5 == point) ? 1 : 2 }} END {{ exit found ? found - 1 : 3 }}' /proc/self/mountinfo
    case $? in
        0) echo {int(d.storage_read_ahead_kb)}; exit 0 ;;
        1) exit 1 ;;
    esac
    i=$((i + 1))
    sleep 0.2
done
exit 1
"""


def host_files(d: Deployment, sysctls: dict[str, str], facts: dict | None = None) -> tuple[list[dict[str, str]], list[dict[str, str]], list[str]]:
    """What the storage role persists before any mount, as hicache_files takes it: the directories and files it keeps
    (root's, 0755 and 0644) and the files it removes (its own that this tier does not need, and what older releases wrote)."""
    own_rule = own_read_ahead_rule(d, facts)
    wanted = {NFSRAHEAD_FILE: nfsrahead_conf(d) if is_nfs(d) and d.storage_read_ahead_kb is not None else None,
              MODULES_LOAD_FILE: modules_load_conf(d), SYSCTL_FILE: sysctl_conf(sysctls), VASTNFS_MODPROBE_FILE: vastnfs_conf(d),
              READ_AHEAD_RULE_FILE: read_ahead_rule_text() if own_rule else None,
              READ_AHEAD_PROGRAM: read_ahead_program_text(d) if own_rule else None}
    files = [{"path": path, "content": content, "owner": "root", "group": "root", "mode": "0755" if path == READ_AHEAD_PROGRAM else "0644"}
             for path, content in wanted.items() if content is not None]
    directories = [{"path": path, "owner": "root", "group": "root", "mode": "0755"}
                   for path in dict.fromkeys(f["path"].rsplit("/", 1)[0] for f in files)]
    # Whether the host has nfsrahead is known only once it was read: a plan without facts (`render`) neither writes nor
    # removes the toolkit's own rule, which render names among what the roles may leave (host_files.server_host_files).
    unknown = set() if (facts or {}).get("tools") is not None else {READ_AHEAD_RULE_FILE, READ_AHEAD_PROGRAM}
    absent = [path for path, content in wanted.items() if content is None and path not in unknown] + [OLD_SUNRPC_MODPROBE_FILE]
    return directories, files, absent


def _looks_like_ip(text: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


def read_ahead_persistence(facts: dict | None, own_rule: bool = False) -> tuple[bool, str]:
    """No mount option sets NFS read-ahead: nfs-utils' udev rule runs nfsrahead (tools/nfsrahead/) each time an NFS
    bdi appears, and nfsrahead reads the [nfsrahead] section this role writes. So the value survives a remount or a
    reboot only where nfsrahead, a udev rule that runs it, and a running udevd are all there. nfsrahead came with
    nfs-utils 2.6.2 (tag nfs-utils-2-6-2, 2022-08; its rule /usr/lib/udev/rules.d/99-nfs.rules runs
    /usr/libexec/nfsrahead %k for every bdi): Debian 12's nfs-common has it, as RHEL 8's and 9's backports do
    (nfs-utils-2.3.3-54.el8, 2.5.4-17.el9); Ubuntu 22.04's 2.6.1 does not. Its [nfsrahead] section has one value
    per NFS version (nfs, nfs4), so the value is host-wide: every NFS mount of the host gets it."""
    if facts is None:
        return False, "the host was not read"
    if own_rule:  # no nfsrahead here: the toolkit's own rule does its work for the L3 mount alone
        if facts.get("udevd_running"):
            return True, f"no nfsrahead (nfs-utils before 2.6.2): {READ_AHEAD_RULE_FILE} runs {READ_AHEAD_PROGRAM} for the L3 mount"
        return False, "read-ahead is set on the live mount only, not persistent across a remount or a reboot: no running udevd (systemd-udevd)"
    nfsrahead = (facts.get("tools") or {}).get("nfsrahead")
    rule = facts.get("nfsrahead_udev_rule")
    missing = [what for what, present in (
        ("nfsrahead (nfs-utils 2.6.2 or newer, or a distribution's backport: not Ubuntu 22.04's 2.6.1)", nfsrahead),
        ("a udev rule that runs it (nfs-utils' 99-nfs.rules)", rule),
        ("a running udevd (systemd-udevd)", facts.get("udevd_running"))) if not present]
    if missing:
        return False, "read-ahead is set on the live mount only, not persistent across a remount or a reboot: no " + ", no ".join(missing)
    return True, f"nfsrahead {nfsrahead} through {rule}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class MountPlan:
    source: str
    point: str
    fstype: str
    options: str
    fstab_line: str
    resolved_source: str | None  # the device a UUID=/LABEL= source names on this host (what mountinfo shows)


@dataclasses.dataclass(frozen=True, kw_only=True)
class StoragePlan:
    cache_dir: str | None
    owner: str
    group: str
    mode: str
    mount: MountPlan | None
    can_mount: bool
    cannot_mount_reason: str  # why this host cannot mount it (no NFS client, no rpcrdma, no device)
    strict: bool
    nfs: bool
    read_ahead_kb: int | None
    read_ahead_persistent: bool  # nfsrahead, its udev rule and udevd are there (read_ahead_persistence)
    read_ahead_not_persistent_reason: str
    nfsrahead_conf: str
    modules_load_conf: str | None  # rpcrdma loaded at boot, so that the persisted sunrpc.rdma_* values apply
    load_rpcrdma: bool  # this run loads rpcrdma before the mount (it is not loaded yet)
    after_rpcrdma: list[str]  # sysctls that exist only once rpcrdma is loaded: a dry run cannot read them before
    sysctls: dict[str, Any]  # live and persisted (sysctl.d), set before the mount: RDMA slots, multipath rp_filter
    sysctl_conf: str | None
    restored_sysctls: dict[str, str]  # live only, before the files: the kernel's TCP slot tables an older release lowered
    vastnfs_values: dict[str, str]  # live, after the mount (it loads vastnfs' sunrpc): expose_id_in_mountstats
    unknown_localports: list[str]  # localports addresses no interface of this host holds
    directories: list[dict[str, str]]  # what the role persists before the mount (hicache_files' arguments)
    files: list[dict[str, str]]
    absent: list[str]  # what it removes: its own files this tier does not need, and what older releases wrote


def storage_plan(d: Deployment, facts: dict[str, Any]) -> StoragePlan:
    the_mount = mount(d)
    mountable, why = can_mount(facts, d) if the_mount else (True, "")
    nfs = is_nfs(d)
    persistent, not_persistent = read_ahead_persistence(facts, own_read_ahead_rule(d, facts)) if nfs else (True, "")
    rdma_sysctls = sunrpc_sysctls(d)
    sysctls = {**rdma_sysctls, **rp_filter_sysctls(d, facts)}
    directories, files, absent = host_files(d, sysctls, facts)
    modules_load = modules_load_conf(d)
    load_rpcrdma = bool(modules_load and the_mount and mountable and not kernel_module(facts, "rpcrdma")["loaded"])
    return StoragePlan(
        cache_dir=d.cache_dir,
        owner=d.cache_owner,
        group=d.cache_group,
        mode=d.cache_mode,
        mount=None if the_mount is None else MountPlan(
            source=the_mount.source,
            point=the_mount.point,
            fstype=the_mount.fstype,
            options=",".join(the_mount.options),
            fstab_line=the_mount.fstab_line,
            resolved_source=resolve_source(the_mount.source, facts.get("block_ids") or {}),
        ),
        can_mount=mountable,
        cannot_mount_reason=why,
        strict=bool(d.strict),
        nfs=nfs,
        read_ahead_kb=d.storage_read_ahead_kb,
        read_ahead_persistent=persistent,
        read_ahead_not_persistent_reason=not_persistent,
        nfsrahead_conf=nfsrahead_conf(d),
        modules_load_conf=modules_load,
        load_rpcrdma=load_rpcrdma,
        after_rpcrdma=sorted(rdma_sysctls) if load_rpcrdma else [],
        sysctls=sysctls,
        sysctl_conf=sysctl_conf(sysctls),
        restored_sysctls=restored_tcp_slots(facts),
        vastnfs_values=vastnfs_values(d),
        unknown_localports=multipath_interfaces(d, facts)[1] if d.storage_localports else [],
        directories=directories,
        files=files,
        absent=absent,
    )


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


def local_device(facts, d: Deployment) -> tuple[bool, str]:
    """A local tier's block device: UUID=/LABEL=/PARTUUID=/PARTLABEL= must name a device of this host."""
    source = d.storage_device
    if not is_device_id(source):
        return True, f"{source} (the mount itself tells whether it is there)"
    resolved = resolve_source(source, facts.get("block_ids") or {})
    if resolved is None:
        return False, f"no block device with {source} on this host (none in /dev/disk/by-{device_id_kind(source)})"
    return True, f"{source} is {resolved}"


def can_mount(facts, d: Deployment) -> tuple[bool, str]:
    """Whether this host can perform the L3 mount now, and if not, why. A local tier needs no NFS client."""
    if not is_nfs(d):
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


def vastnfs_options_used(d: Deployment) -> list[str]:
    """The VAST driver's version-gated options this host's mount uses, named as in VASTNFS_OPTION_VERSIONS."""
    if d.storage_type != "vast":
        return []
    keys = {o.partition("=")[0]: o.partition("=")[2] for o in mount(d).options}
    used = [name for name, _, _ in VASTNFS_OPTION_VERSIONS if "=" not in name and " " not in name and name in keys]
    if keys.get("remoteports") == "dns":
        used.append("remoteports=dns")
        if "nconnect" not in keys:
            used.append("remoteports=dns without nconnect")
    if any(not _looks_like_ip(p) for p in (keys.get("localports") or "").split("~") if p and "-" not in p):
        used.append("localports=<interface names>")
    return used


def vastnfs_needed_for(d: Deployment) -> str | None:
    """Why the mount needs the VAST NFS driver, or None: multipath (remoteports, with localports: mount adds
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


def vastnfs_version_check(facts, d: Deployment) -> Check | None:
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


def uses_rdma(d: Deployment) -> bool:
    """Whether the L3 mount runs over RDMA (the last proto= option wins, as mount.nfs reads them)."""
    the_mount = mount(d) if is_nfs(d) else None
    protos = [o.partition("=")[2] for o in (the_mount.options if the_mount else ()) if o.startswith("proto=")]
    return bool(protos) and protos[-1] in ("rdma", "rdma6")
