"""Parse live host state and compare it with what the inventory asks for. Pure functions on text.

Formats: /proc/<pid>/mountinfo and /proc/<pid>/limits per proc(5); `ethtool -g` as ethtool prints it.
"""

from __future__ import annotations

import dataclasses
import re


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

    Only options the kernel reports back are compared (vers, proto, port, nconnect, remoteports,
    rsize/wsize); fstab-only options (_netdev, nofail, x-systemd.*) never show in mountinfo.
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
    for option in expected_options:
        key, _, value = option.partition("=")
        if key.startswith(("_", "x-systemd")) or key in ("nofail", "defaults", "spread_reads", "spread_writes", "localports"):
            continue
        if key == "vers":  # vers=4.1 must match exactly; vers=3 matches any 3.x the kernel reports
            live_vers = live.get("vers") or ""
            if (live_vers if "." in value else live_vers.split(".")[0]) != value:
                problems.append(f"vers={live.get('vers')}, expected {value}")
        elif key not in live:
            problems.append(f"{key} is not in effect (expected {option})")
        elif value and live[key] != value:
            problems.append(f"{key}={live[key]}, expected {value}")
    return problems


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


def parse_ethtool_rings(text: str) -> dict[str, dict[str, int]]:
    """`ethtool -g IF` -> {'max': {'RX': 8192, ...}, 'current': {...}}; 'n/a' values are left out."""
    out: dict[str, dict[str, int]] = {"max": {}, "current": {}}
    section = None
    for line in text.splitlines():
        if line.startswith("Pre-set maximums"):
            section = "max"
        elif line.startswith("Current hardware settings"):
            section = "current"
        elif section and ":" in line:
            key, _, value = line.partition(":")
            value = value.strip()
            if value.isdigit():
                out[section][key.strip()] = int(value)
    return out


def nic_verdict(report: dict, asked: bool) -> dict[str, list[str]]:
    """Judge hicache-nic-tuning's JSON report (--check-json): what fails the host and what is a gap.

    `asked`: the inventory needs ConnectX ports (an NFS tier) or names ports (hicache_nic_interfaces).
    On a host with a ConnectX port, anything the program cannot do or read is a failure, as is a named port
    that is absent. A host without any ConnectX port lacks the hardware entirely: what is asked of it is a
    gap (a failure under hicache_strict); when nothing is asked there is nothing to tune.
    `changes`: what still differs from the inventory (a failure once the role has applied it).
    """
    reasons = [f"{u['what']}: {u['reason']}" for u in report.get("unavailable", [])]
    failures = [f"{f['what']}: {f['reason']}" for f in report.get("failed", [])]
    changes = [c["what"] for c in report.get("changes", [])]
    if report.get("connectx"):
        return {"failures": failures + reasons, "gaps": [], "changes": changes}
    if not asked and not report.get("interfaces"):
        return {"failures": failures, "gaps": [], "changes": changes}
    return {"failures": failures, "gaps": reasons, "changes": changes}
