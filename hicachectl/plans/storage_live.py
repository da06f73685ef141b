"""The L3 mount as the host has it: mountinfo, mountstats, vastnfs' multipath transports and pNFS layouts, read and
judged against the storage role's plan (plans/storage.py). Pure functions on text; `mount_state` is the one judge the
role calls (through the hicache_mount_state filter).

Formats: /proc/<pid>/mountinfo and /proc/self/mountstats per proc(5) and fs/nfs/super.c; vastnfs' debugfs stats.
"""

from __future__ import annotations

import dataclasses
import re

from hicachectl.formats.portlist import expand_ports
from hicachectl.plans.storage import vastnfs_version_tuple


@dataclasses.dataclass(frozen=True)
class MountEntry:
    mount_id: int
    parent_id: int
    major_minor: str
    root: str
    mount_point: str
    mount_options: tuple[str, ...]
    fstype: str
    source: str
    super_options: tuple[str, ...]

    def option_map(self) -> dict[str, str | None]:
        """Per-mount and superblock options; NFS reports vers/proto/nconnect among the latter."""
        out: dict[str, str | None] = {}
        for option in self.mount_options + self.super_options:
            key, _, value = option.partition("=")
            out[key] = value if _ else None
        return out


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (\\040 ...)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[MountEntry]:
    entries = []
    for line in text.splitlines():
        if not line.strip():
            continue
        left, sep, right = line.partition(" - ")
        if not sep:
            raise ValueError(f"not a mountinfo line (no ' - ' separator): {line!r}")
        fields = left.split()
        fstype, source, super_options = (right.split(" ", 2) + ["", ""])[:3]
        entries.append(MountEntry(
            mount_id=int(fields[0]), parent_id=int(fields[1]), major_minor=fields[2], root=_unescape(fields[3]),
            mount_point=_unescape(fields[4]), mount_options=tuple(fields[5].split(",")), fstype=fstype,
            source=_unescape(source), super_options=tuple(o for o in super_options.split(",") if o)))
    return entries


def mount_at(entries: list[MountEntry], path: str) -> MountEntry | None:
    """What is mounted at `path` now: the last mount on it wins (it hides the ones below)."""
    found = [e for e in entries if e.mount_point == path.rstrip("/") or (path == "/" and e.mount_point == "/")]
    return found[-1] if found else None


def bdi_read_ahead_path(entry: MountEntry) -> str:
    """NFS has no block device; its read-ahead lives on the backing device info named by major:minor."""
    return f"/sys/class/bdi/{entry.major_minor}/read_ahead_kb"


def compare_mount(entry: MountEntry | None, expected_options: tuple[str, ...], expected_source: str, fstype: str,
                  resolved_source: str | None = None) -> list[str]:
    """What differs between the live mount and the wanted one; [] when it matches.

    Only options the kernel reports back are compared: fstab-only options (_netdev, nofail, x-systemd.*) never show
    in mountinfo, an NFS option the kernel does not print back is named by nfs_unechoed_options (not checked), and
    the VAST driver's own (remoteports, localports, spread_*) show depending on its version: vastnfs_option_checks
    judges them.
    mountinfo names a device, never UUID=/LABEL=: `resolved_source` is the device the wanted source
    names on the host (storage.resolve_source); the live source may be either.
    """
    if entry is None:
        return ["not mounted"]
    problems = []
    if entry.source not in (expected_source, resolved_source):
        shown = expected_source if resolved_source in (None, expected_source) else f"{expected_source} ({resolved_source})"
        problems.append(f"source is {entry.source}, expected {shown}")
    if fstype == "nfs" and entry.fstype not in ("nfs", "nfs4"):
        problems.append(f"filesystem is {entry.fstype}, expected NFS")
    elif fstype not in ("nfs", "nfs4") and entry.fstype != fstype:
        problems.append(f"filesystem is {entry.fstype}, expected {fstype}")
    live = entry.option_map()
    unechoed = {o for o, _ in _nfs_unechoed(expected_options)} if fstype == "nfs" else set()
    for option in expected_options:
        key, _, value = option.partition("=")
        if _judged_elsewhere(key) or option in unechoed:
            continue
        if fstype == "nfs":
            key, value = _NFS_ALIASES.get(key, key), _NFS_VALUE_ALIASES.get(option, value)
        if key == "actimeo":  # the kernel prints the four times it sets, each only where it is not the default
            problems += [p for k, default in NFS_AC_DEFAULTS.items() if value != default and (p := _option_problem(live, k, value))]
            continue
        if key == "vers":  # vers=4.1 must match exactly; vers=3 matches any 3.x the kernel reports
            live_vers = live.get("vers") or ""
            if (live_vers if "." in value else live_vers.split(".")[0]) != value:
                problems.append(f"vers={live.get('vers')}, expected {value}")
        elif (problem := _option_problem(live, key, value, option)):
            problems.append(problem)
    return problems


def _judged_elsewhere(key: str) -> bool:
    """fstab-only options never show in mountinfo; the VAST driver's own are judged by vastnfs_option_checks (what it
    shows depends on its version)."""
    return key.startswith(("_", "x-systemd")) or key in ("nofail", "defaults") or key in VASTNFS_SHOWN_OPTIONS


def _option_problem(live: dict[str, str | None], key: str, value: str, option: str | None = None) -> str | None:
    if key not in live:
        return f"{key} is not in effect (expected {option or f'{key}={value}'})"
    if value and live[key] != value:
        return f"{key}={live[key]}, expected {value}"
    return None


# What the kernel prints back of an NFS mount: fs/nfs/super.c nfs_show_mount_options and nfs_show_options (vers, rsize,
# wsize, bsize, namlen, the attribute cache times where not the default, hard/soft/softerr and the nfs_info flags,
# proto, nconnect, max_connect, port, timeo, retrans, sec, xprtsec, the mountd options (NFSv3) or clientaddr (NFSv4),
# fsc, migration, lookupcache, local_lock, addr), and the VFS's own flags (fs/proc_namespace.c show_mnt_opts and
# show_sb_opts). Anything else an fstab line may carry (bg, retry, intr, actimeo's neighbours at their defaults, ...) is
# taken by mount.nfs or the kernel without a trace in mountinfo: not checked, never "not in effect".
NFS_ECHOED_OPTIONS = frozenset({
    "vers", "rsize", "wsize", "bsize", "namlen", "acregmin", "acregmax", "acdirmin", "acdirmax", "hard", "soft", "softerr",
    "posix", "nocto", "noac", "nolock", "noacl", "nordirplus", "nosharecache", "noresvport", "proto", "nconnect",
    "max_connect", "port", "timeo", "retrans", "sec", "xprtsec", "mountaddr", "mountvers", "mountport", "mountproto",
    "clientaddr", "fsc", "migration", "lookupcache", "local_lock", "addr", "actimeo",
    "ro", "rw", "sync", "dirsync", "nosuid", "nodev", "noexec", "noatime", "nodiratime", "relatime", "lazytime"})
# include/linux/nfs_fs.h NFS_DEF_ACREGMIN/ACREGMAX/ACDIRMIN/ACDIRMAX (seconds): printed only where different.
NFS_AC_DEFAULTS = {"acregmin": "3", "acregmax": "60", "acdirmin": "30", "acdirmax": "60"}
_NFS_ALIASES = {"nfsvers": "vers"}  # fs/nfs/fs_context.c: nfsvers= is vers=
_NFS_VALUE_ALIASES = {"lookupcache=positive": "pos"}  # nfs_show_mount_options prints lookupcache=pos


def _nfs_unechoed(expected_options: tuple[str, ...]) -> list[tuple[str, str]]:
    """(option, why) for each wanted NFS option mountinfo cannot show, so it cannot be compared there."""
    out = []
    split = [(option, _NFS_ALIASES.get(option.partition("=")[0], option.partition("=")[0]), option.partition("=")[2])
             for option in expected_options]
    vers = next((value for _, key, value in split if key == "vers"), "")
    for option, key, value in split:
        if _judged_elsewhere(key):
            continue
        if key not in NFS_ECHOED_OPTIONS:
            out.append((option, "the NFS client does not print it back in mountinfo"))
        elif NFS_AC_DEFAULTS.get(key) == value or (key == "lookupcache" and value == "all"):
            out.append((option, "the kernel's default, which mountinfo does not print"))
        elif key == "port" and vers.startswith("4") and value == "2049":
            out.append((option, "the NFSv4 default port, which mountinfo does not print"))
        elif key == "max_connect" and (not vers.startswith("4") or value in ("0", "1")):
            out.append((option, "mountinfo prints max_connect only above 1 on NFSv4"))
    return out


def nfs_unechoed_options(expected_options: tuple[str, ...], fstype: str) -> list[str]:
    """What compare_mount leaves out of an NFS mount, and why: notes for "not checked"."""
    if fstype != "nfs":
        return []
    return [f"mount option {option}: not checked, {why}" for option, why in _nfs_unechoed(expected_options)]


# vastnfs shows its own mount options in mountinfo from 4.0.30 on (docs/src/ChangeLog.md 4.0.30: "Show the extra mount
# options in the output of mount for existing mounts (except: NFSv4.1 remoteports mode)"); they come from
# nfs_show_mount_options in vastnfs bundle/fs/nfs/super.c: localports= and remoteports= through nfs_show_portgroup,
# then spread_reads and spread_writes as flags.
VASTNFS_SHOWN_OPTIONS = ("remoteports", "localports", "spread_reads", "spread_writes")
VASTNFS_SHOWS_OPTIONS_FROM = (4, 0, 30)


def vastnfs_option_checks(entry: MountEntry | None, expected_options: tuple[str, ...],
                          vastnfs_version: str | None) -> tuple[list[str], list[str]]:
    """The VAST driver's options of the wanted mount against what the live mount shows: (problems, not checked).

    `vastnfs_version`: the loaded driver's nfs_bundle_version. Before 4.0.30 the driver shows none of them, and with
    no version known nothing tells whether it would: those are "not checked", never a failure."""
    wanted = [o for o in expected_options if o.partition("=")[0] in VASTNFS_SHOWN_OPTIONS]
    if entry is None or not wanted:
        return [], []
    names = ", ".join(o.partition("=")[0] for o in wanted)
    version = vastnfs_version_tuple(vastnfs_version)
    if version is None:
        why = f"the VAST driver's version is {'unknown' if not vastnfs_version else repr(vastnfs_version)}"
        return [], [f"{names}: {why}, and only 4.0.30 and later show them in mountinfo"]
    if version < VASTNFS_SHOWS_OPTIONS_FROM:
        return [], [f"{names}: vastnfs {vastnfs_version} does not show its own options in mountinfo (4.0.30 and later do)"]
    live = entry.option_map()
    vers = live.get("vers") or ""
    problems, unchecked = [], []
    for option in wanted:
        key, _, value = option.partition("=")
        if key in ("spread_reads", "spread_writes"):
            if key not in live:
                problems.append(f"{key} is not in effect")
            continue
        if key == "remoteports" and vers.startswith("4"):
            unchecked.append("remoteports: vastnfs does not show it for NFSv4.1 remoteports mode (ChangeLog 4.0.30)")
            continue
        if key not in live:
            problems.append(f"{key} is not in effect (expected {option})")
            continue
        if value == "dns" or live[key] == "dns":
            if value != live[key]:
                problems.append(f"{key}={live[key]}, expected {value}")
            continue
        expected, shown = expand_ports(value), expand_ports(live[key] or "")
        if expected is None:  # localports by interface name: the driver shows the addresses it resolved
            unchecked.append(f"{key}={value}: named interfaces, shown by the driver as the addresses it resolved ({live[key]})")
        elif shown is None or set(shown) != set(expected):
            problems.append(f"{key}={live[key]}, expected {value}")
    return problems, unchecked


@dataclasses.dataclass(frozen=True)
class MountStats:
    """One mount of /proc/self/mountstats (fs/proc_namespace.c show_vfsstat, then fs/nfs/super.c nfs_show_stats)."""
    device: str
    mount_point: str
    fstype: str
    sunrpc_id: str | None  # vastnfs with expose_id_in_mountstats=1 (bundle/net/sunrpc/stats.c rpc_clnt_show_stats), hex
    pnfs: str | None  # NFSv4: the layout driver in use (",pnfs=LAYOUT_NFSV4_1_FILES") or "not configured"
    # per-op statistics: {name: (ops, errors)}; errors None where the kernel prints no error count (before om_error_status)
    ops: dict[str, tuple[int, int | None]] = dataclasses.field(default_factory=dict)
    age: int | None = None  # seconds since the mount (fs/nfs/super.c nfs_show_stats: (jiffies - nfss->mount_time) / HZ)
    # each transport of the mount's RPC client: (netid, connect count), the count None where the transport prints none
    xprts: tuple[tuple[str, int | None], ...] = ()


# net/sunrpc/stats.c _print_name ("\t%12s: ") and _print_rpc_iostats: ops ntrans timeouts bytes_sent bytes_recv queue rtt
# execute, then errors (om_error_status: tasks that ended with a negative status, an NFS error of the reply included).
_PER_OP = re.compile(r"^([A-Z0-9_]+): ((?:\d+ ){7}\d+(?: \d+)?)$")
# `\txprt:\t<netid> ...`, one line per transport (net/sunrpc/stats.c rpc_clnt_show_stats, through each transport's
# print_stats): rdma (net/sunrpc/xprtrdma/transport.c xprt_rdma_print_stats) and tcp (net/sunrpc/xprtsock.c
# xs_tcp_print_stats) print the port, bind_count, then connect_count, the count of connections made (xprt_rdma_connect_worker
# adds one per connection established); udp prints no connect count.
_CONNECT_COUNT_AT = {"rdma": 2, "tcp": 2}


def parse_mountstats(text: str) -> list[MountStats]:
    out: list[MountStats] = []
    current: dict | None = None
    for line in text.splitlines():
        header = re.match(r"^device (\S+) mounted on (\S+) with fstype (\S+)", line)
        if header:
            if current:
                out.append(MountStats(**current))
            current = {"device": _unescape(header.group(1)), "mount_point": _unescape(header.group(2)), "fstype": header.group(3),
                       "sunrpc_id": None, "pnfs": None, "ops": {}, "age": None, "xprts": ()}
            per_op = False
            continue
        if current is None:
            continue
        stripped = line.strip()
        if stripped == "per-op statistics":
            per_op = True
        elif per_op and (counted := _PER_OP.match(stripped)):
            numbers = counted.group(2).split()
            current["ops"].setdefault(counted.group(1), (int(numbers[0]), int(numbers[8]) if len(numbers) > 8 else None))
        elif stripped.startswith("age:") and stripped[4:].strip().isdigit():
            current["age"] = int(stripped[4:].strip())
        elif stripped.startswith("xprt:") and len(stripped.split()) > 1:
            netid, numbers = stripped.split()[1], stripped.split()[2:]
            at = _CONNECT_COUNT_AT.get(netid)
            count = int(numbers[at]) if at is not None and len(numbers) > at and numbers[at].isdigit() else None
            current["xprts"] = (*current["xprts"], (netid, count))
        elif stripped.startswith("sunrpc-id:") and current["sunrpc_id"] is None:
            current["sunrpc_id"] = stripped.partition(":")[2].strip() or None
        elif stripped.startswith("nfsv4:"):
            match = re.search(r",pnfs=([^,]*)", stripped)
            current["pnfs"] = match.group(1).strip() if match else None
    if current:
        out.append(MountStats(**current))
    return out


def mountstats_at(stats: list[MountStats], path: str) -> MountStats | None:
    found = [m for m in stats if m.mount_point == path.rstrip("/")]
    return found[-1] if found else None


def tos_fix(point: str) -> str:
    return f"remount {point} (with no other mount of the same server left, so that its transports are made anew) or restart the host"


def roce_tos_in_effect(effect: dict | None) -> tuple[list[str], list[str]]:
    """Whether the RDMA transports of the storage server's NFS mounts (the L3 tier's) carry the RDMA-CM default ToS the
    NIC program set: (not in effect, not checked), each naming the RDMA port and the mount.

    `effect`: the program's `roce_tos_effect` (roles/nic_tuning/files/hicache-nic-tuning, tos_effect), read at one moment:
    the /proc/self/mountstats lines of the server's mounts now (`mountstats`: "" none mounted, None unread), and per RDMA
    port whose ToS is as wanted a stamp: `seconds_ago` the program set it (None: not set by it since the boot), and the
    same lines read just after (`mountstats`: "" none mounted then, None unknown).
    RDMA-CM reads the default ToS when a connection resolves its route (drivers/infiniband/core/cma.c,
    cma_resolve_iboe_route), and xprtrdma resolves the route anew for each connection (net/sunrpc/xprtrdma/verbs.c,
    rpcrdma_xprt_connect -> rpcrdma_ep_create -> rpcrdma_create_id: rdma_create_id, rdma_resolve_addr,
    rdma_resolve_route); xprt_rdma_connect_worker counts each connection established (transport.c, connect_count). So a
    mount's transports carry the ToS when they connected after it was set:
    - the mount was not there when it was set (not in the lines then), or was mounted again since: its age now (seconds
      since the mount, truncated: fs/nfs/super.c nfs_show_stats) is below its age then plus the seconds since (2 s for
      the two truncations), or, with no lines then, below the seconds since;
    - else each RDMA transport's connect count is above its count then (it connected again since).
    Otherwise the ToS is set, not yet in effect. Two mounts of one server may share one NFS client and its transports
    (fs/nfs/client.c, nfs_get_client), which a remount of the tier alone then keeps: the fix names it."""
    if not effect:
        return [], []
    if effect.get("mountstats") is None:
        return [], [f"RoCE ToS on the mounts of {effect.get('server')}: /proc/self/mountstats was not read, so whether their transports "
                    "carry the ToS is not known"]
    not_in_effect, not_checked = [], []
    mounts = parse_mountstats(effect["mountstats"])
    for now in mounts:
        rdma = [count for netid, count in now.xprts if netid == "rdma"]
        if not rdma or mountstats_at(mounts, now.mount_point) is not now:
            continue  # not over RDMA (the RoCE ToS does not apply), or hidden by a later mount on the same point
        point = now.mount_point
        for stamp in effect.get("stamps") or []:
            what, ago = stamp["what"], stamp.get("seconds_ago")
            if ago is None:
                not_checked.append(f"{what}: as wanted, but not set by hicache-nic-tuning since the boot (set by another tool, or by an "
                                   f"earlier release), so whether the transports of {point} carry it is not known; to be sure: {tos_fix(point)}")
                continue
            if now.age is None:
                not_checked.append(f"{what}: {point} shows no age in /proc/self/mountstats, so whether its transports carry the ToS is not known")
                continue
            then_text = stamp.get("mountstats")
            then = mountstats_at(parse_mountstats(then_text), point) if then_text else None
            if then_text is not None and then is None:
                predates = now.age >= ago + 2  # not mounted when it was set: only a contradicting age says otherwise
            elif then is not None and then.age is not None:
                predates = now.age + 2 >= then.age + ago
            else:
                predates = now.age + 1 >= ago
            if not predates:
                continue  # mounted after the ToS was set: its transports connected after it
            before = [count for netid, count in then.xprts if netid == "rdma"] if then is not None else []
            # transport by transport, in the order the kernel lists them (the client's transport switch); another count: unknown
            again = ([a is not None and b is not None and a > b for a, b in zip(rdma, before, strict=True)] if len(before) == len(rdma)
                     else [False] * len(rdma))
            if all(again):
                continue  # every transport connected again since
            not_in_effect.append(f"{what}: set, not yet in effect on {point}: {again.count(False)} of its {len(rdma)} RDMA transports "
                                 f"connected before the ToS was set ({ago:.0f} s ago; the mount is {now.age} s old) and not since, so "
                                 f"they keep the ToS they had (RDMA-CM reads it when a connection is made): {tos_fix(point)}")
    return not_in_effect, not_checked


def rpc_clnt_stats_path(sunrpc_id: str) -> str:
    """vastnfs docs/src/monitoring/transports.md; the directory is named in hex (net/sunrpc/debugfs.c, "%x")."""
    return f"/sys/kernel/debug/sunrpc/rpc_clnt/{sunrpc_id}/stats"


@dataclasses.dataclass(frozen=True)
class Transport:
    local: str | None
    remote: str
    states: tuple[str, ...]

    @property
    def connected(self) -> bool:
        return "CONNECTED" in self.states


def parse_rpc_clnt_stats(text: str) -> list[Transport]:
    """vastnfs' per-transport lines in debugfs rpc_clnt/<id>/stats (bundle/net/sunrpc/stats.c do_print_stats):
    after each `xprt:` line, `\t\t[<local> -> ]<remote>, state: <FLAG> ...`."""
    out = []
    for line in text.splitlines():
        match = re.match(r"^\s+(?:(\S+) -> )?(\S+), state:(.*)$", line)
        if match:
            out.append(Transport(match.group(1), match.group(2), tuple(match.group(3).split())))
    return out


def multipath_checks(transports: list[Transport], expected_options: tuple[str, ...]) -> tuple[list[str], list[str], list[str]]:
    """Each local -> remote path of a VAST multipath mount: (problems, not checked, passed).

    Without noidlexprt the driver disconnects idle transports (docs/src/usage/mount-params.md, noidlexprt), so a path not
    connected right now proves nothing: "not checked". With it, every path must be connected. A path to an address
    outside remoteports, or a localports address no transport uses, is a failure either way."""
    options = {o.partition("=")[0]: o.partition("=")[2] for o in expected_options}
    keep_connected = "noidlexprt" in options
    if not transports:
        return ["no transport in the mount's rpc_clnt stats"], [], []
    problems, unchecked, passed = [], [], []
    remotes = expand_ports(options.get("remoteports", "")) if options.get("remoteports") not in (None, "dns") else None
    for t in transports:
        path = f"{t.local or '(any local address)'} -> {t.remote}"
        if remotes is not None and t.remote not in remotes:
            problems.append(f"{path} goes to an address outside remoteports={options['remoteports']}")
        elif t.connected:
            passed.append(f"{path} connected")
        elif keep_connected:
            problems.append(f"{path} is not connected (state: {' '.join(t.states) or 'none'}), with noidlexprt")
        else:
            unchecked.append(f"{path} is not connected now (state: {' '.join(t.states) or 'none'}); the driver disconnects idle "
                             "transports unless noidlexprt, so this proves no fault")
    locals_wanted = expand_ports(options.get("localports", "")) if options.get("localports") else None
    if locals_wanted:
        unused = [a for a in locals_wanted if a not in {t.local for t in transports}]
        if unused:
            problems.append(f"no transport from localports {', '.join(unused)}")
    return problems, unchecked, passed


def pnfs_checks(stats: MountStats | None, expected_options: tuple[str, ...]) -> tuple[list[str], list[str], list[str]]:
    """pNFS in use on an NFSv4.1 mount: the layout driver mountstats names (fs/nfs/super.c show_pnfs; the files layout
    ONTAP grants is LAYOUT_NFSV4_1_FILES, fs/nfs/filelayout/filelayout.c). (problems, not checked, passed)."""
    vers = next((o.partition("=")[2] for o in expected_options if o.startswith("vers=")), "")
    if not vers.startswith("4.") or vers == "4.0":
        return [], [], []
    if stats is None:
        return [], ["pNFS: the mount is not in /proc/self/mountstats"], []
    if not stats.pnfs or stats.pnfs == "not configured":
        return [], [f"pNFS: the server granted no layout (pnfs={stats.pnfs or 'absent'}); I/O goes through the metadata server only "
                    "(on ONTAP: vserver nfs modify -v4.1-pnfs enabled)"], []
    # The layout driver is set from the server's fs_layout_types; a layout is granted per file by LAYOUTGET, which the
    # client sends at I/O: only a LAYOUTGET that did not fail shows pNFS really in use.
    layoutget = stats.ops.get("LAYOUTGET")
    if layoutget is None or layoutget[1] is None:
        return [], [f"pNFS: layout driver {stats.pnfs}, but mountstats shows no LAYOUTGET count with its errors, so no granted layout is seen"], []
    sent, failed = layoutget
    if sent == 0:
        return [], [f"pNFS: layout driver {stats.pnfs}, but no I/O has asked for a layout yet (LAYOUTGET 0); verify after I/O "
                    "(verify --l3 writes through the tier)"], []
    if sent <= failed:
        return [], [f"pNFS: the server refused every layout (LAYOUTGET {sent}, {failed} failed); I/O goes through the metadata server only"], []
    return [], [], [f"pNFS in use ({stats.pnfs}: {sent - failed} of {sent} LAYOUTGET granted)"]


def mount_state(mountinfo_text, plan, vastnfs_version=None, mountstats_text=None, rpc_clnt_stats_text=None):
    """The live L3 mount at the plan's mount point: problems ([] = as wanted), what could not be checked and why
    (`not_checked`), what was proven (`passed`), and its read-ahead file.

    `vastnfs_version`: the loaded VAST driver's nfs_bundle_version (its own options show in mountinfo from 4.0.30 on);
    `mountstats_text` (/proc/self/mountstats): pNFS in use on an NFSv4.1 mount, and the vastnfs sunrpc-id whose debugfs
    stats (`rpc_clnt_stats_path`) list each multipath transport; `rpc_clnt_stats_text`: that file, read."""
    mount = plan.get("mount")
    empty = {"mounted": False, "problems": [], "not_checked": [], "passed": [], "read_ahead_path": None, "rpc_clnt_stats_path": None}
    if not mount:
        return empty
    entry = mount_at(parse_mountinfo(mountinfo_text), mount["point"])
    options = tuple(mount["options"].split(","))
    problems = compare_mount(entry, options, mount["source"], mount["fstype"], mount.get("resolved_source"))
    vast_problems, not_checked = vastnfs_option_checks(entry, options, vastnfs_version)
    if entry is not None:
        not_checked = nfs_unechoed_options(options, mount["fstype"]) + not_checked
    problems, passed, stats_path = problems + vast_problems, [], None
    if entry is not None:  # a transport bound to a local address the host does not hold never connects
        problems += [f"localports {port}: no interface of this host has that address or name" for port in plan.get("unknown_localports") or []]
    if entry is not None and mountstats_text is not None:
        stats = mountstats_at(parse_mountstats(mountstats_text), mount["point"])
        more = pnfs_checks(stats, options)
        if any(o.startswith("remoteports=") for o in options):
            if stats is None or not stats.sunrpc_id:
                more = (more[0], more[1] + ["multipath paths: /proc/self/mountstats shows no sunrpc-id (the VAST driver shows it with "
                                            "/sys/module/sunrpc/parameters/expose_id_in_mountstats set, which the storage role sets "
                                            "after the mount)"], more[2])
            else:
                stats_path = rpc_clnt_stats_path(stats.sunrpc_id)
                if rpc_clnt_stats_text is None:
                    more = (more[0], more[1] + [f"multipath paths: {stats_path} was not read (debugfs not mounted, or not root)"], more[2])
                else:
                    paths = multipath_checks(parse_rpc_clnt_stats(rpc_clnt_stats_text), options)
                    more = (more[0] + paths[0], more[1] + paths[1], more[2] + paths[2])
        problems, not_checked, passed = problems + more[0], not_checked + more[1], passed + more[2]
    return {"mounted": entry is not None, "problems": problems, "not_checked": not_checked, "passed": passed,
            "read_ahead_path": bdi_read_ahead_path(entry) if entry is not None else None,
            "rpc_clnt_stats_path": stats_path}
