"""The L3 namespaces of an inventory: its tiers, the namespaces its servers use, what `hicachectl l3` shows and
what `--prune` may remove. No I/O: a tier's directory is listed on one of its hosts by the module
hicache_l3_namespaces (playbooks/l3.yml), whose answer `rows` and `prunable` read.

A tier is the storage one or more servers write their pages to: the hosts that give the same hicache_l3_share
(one export mounted on each), or a host alone. It is listed once, read on one of its hosts.

What may be pruned, and why it is safe (each directory kept says why):
* only a direct subdirectory of the tier's directory whose name has the form `auto` derives
  (namespace.is_derived: the model's slug, '-', 12 hex digits); a literal namespace (hicache_l3_namespace: NAME)
  and any other directory (`models`, `backup`, lost+found...) are never removed: they may be anything;
* never the tier's directory, never the pages of a server with hicache_l3_namespace off: the files directly in it
  and, for the nixl backend, its 256 bucket directories `00`..`ff` (SGLang's nixl_routing.py), listed together as
  "(no namespace)";
* never a namespace any server of the inventory uses, whatever --limit says (and a namespace in use on another
  tier is kept too: two hosts may mount one export without saying so), nor one a server RUNS (its deployed.json,
  read on every server of the inventory: an inventory edited and not yet deployed still runs the old config);
  on a tier one of whose servers could not be checked (unreachable, an unreadable deployed.json) nothing is;
* never a directory that is, holds or lies inside an inventory server's hicache_model_dir, hicache_base_dir or
  hicache_cfg_dir (compared as normalised paths; the module compares the resolved ones again on the host);
* never a namespace with a page written less than --min-age hours ago (a server of another inventory, or one
  just started, may still use it), nor one the module could not read entirely or that is or holds a mount point.
The module checks the form, the namespaces in use and running, the paths, the mount points and the age again on
the host before it removes anything.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime
import json
import posixpath
import re
from collections.abc import Iterable, Mapping
from typing import Any

from hicachectl.config import namespace, schema
from hicachectl.config.deployment import Deployment

# The form of a namespace directory's name: the domain of hicache_l3_namespace (the module carries a copy).
NAME_FORM = re.compile(schema.BY_NAME["hicache_l3_namespace"].domain.pattern)
# The bucket directories the nixl backend writes its pages into when the namespace is off (SGLang's nixl_routing.py).
BUCKET_FORM = re.compile(r"[0-9a-f]{2}")
NO_NAMESPACE = "(no namespace)"
# A row's state.
IN_USE, IN_USE_ELSEWHERE, RUNNING, UNUSED, NOT_A_NAMESPACE, TOP_LEVEL = (
    "in use", "in use on another tier", "running", "unused", "not a namespace", "top level")
OFF_WARNING = "pages of a changed config (KV dtype, TP layout, memory layout) would be read as valid (rule l3-namespace-off)"
# The directories of a server that are never removed, nor anything holding them or inside them.
PROTECTED = (("model_dir", "hicache_model_dir"), ("base_dir", "hicache_base_dir"), ("cfg_dir", "hicache_cfg_dir"))


def is_namespace_name(name: str) -> bool:
    return bool(NAME_FORM.fullmatch(name))


def is_bucket(name: str) -> bool:
    return bool(BUCKET_FORM.fullmatch(name))


def listable(d: Deployment) -> bool:
    """Whether the server's pages are files under hicache_cache_dir on its host (file and nixl backends)."""
    return namespace.host_dir(d) is not None


@dataclasses.dataclass(frozen=True)
class Tier:
    name: str  # the hicache_l3_share, or the host's name
    shared: bool
    hosts: tuple[str, ...]  # the servers writing to it, inventory order
    root: str  # hicache_cache_dir of its first host: the directory that holds the namespaces
    off_hosts: tuple[str, ...] = ()  # servers writing directly into root (hicache_l3_namespace: off)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def tiers(deployments: Mapping[str, Any]) -> tuple[list[Tier], dict[str, str]]:
    """The tiers of these servers, and the servers left out with why (no L3 tier, or pages not in files)."""
    groups: dict[str, list[str]] = {}
    left_out: dict[str, str] = {}
    for host, d in deployments.items():
        if d is None:
            left_out[host] = "invalid variables"
        elif d.storage_backend is None:
            left_out[host] = "no L3 tier (hicache_storage_backend unset)"
        elif not listable(d):
            left_out[host] = (f"the {d.storage_backend} backend keeps its pages in its own store (key_namespace "
                              f"{namespace.of(d) or 'unset'}), not in files on the host: not listed")
        else:
            groups.setdefault(d.l3_share or host, []).append(host)
    out = []
    for name, hosts in groups.items():
        first = deployments[hosts[0]]
        out.append(Tier(name=name, shared=bool(first.l3_share), hosts=tuple(hosts), root=first.cache_dir,
                        off_hosts=tuple(h for h in hosts if namespace.of(deployments[h]) is None)))
    return out, left_out


def in_use(deployments: Mapping[str, Any]) -> dict[str, list[str]]:
    """namespace -> the servers that use it, over every server given (give the whole inventory, not --limit's)."""
    used: dict[str, list[str]] = {}
    for host, d in deployments.items():
        name = namespace.of(d) if d is not None else None
        if name:
            used.setdefault(name, []).append(host)
    return used


def protected(deployments: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(normalised path, variable, host) of every server's hicache_model_dir, hicache_base_dir and hicache_cfg_dir:
    never removed, nor a directory holding one or inside one."""
    out = []
    for host, d in deployments.items():
        for field, variable in PROTECTED:
            value = getattr(d, field, None) if d is not None else None
            if value:
                out.append((posixpath.normpath(str(value)), variable, host))
    return out


def protection(path: str, paths: Iterable[tuple[str, str, str]]) -> str:
    """Why the directory `path` must not be removed for the protected `paths`, or ''."""
    target = posixpath.normpath(path)
    for where, variable, host in paths:
        if target == where:
            return f"it is {variable} of {host}"
        if where == "/" or target.startswith(where.rstrip("/") + "/"):
            return f"it lies inside {variable} of {host} ({where})"
        if target == "/" or where.startswith(target.rstrip("/") + "/"):
            return f"it holds {variable} of {host} ({where})"
    return ""


def running(reports: Mapping[str, Any]) -> tuple[dict[str, list[str]], dict[str, str]]:
    """What the servers run, from each server's deployed.json as the l3 playbook read it: (namespace -> the servers
    running it, server -> why what it runs is unknown). A report is {"exists", "content" (base64), "error"}; a
    server without one (unreachable, not reached) or whose file cannot be read or does not name its namespace is
    unknown; one without the file ran nothing."""
    names: dict[str, list[str]] = {}
    unknown: dict[str, str] = {}
    for host, report in reports.items():
        if isinstance(report, str):  # why it was not read
            unknown[host] = report
            continue
        if not isinstance(report, Mapping):
            unknown[host] = "its deployed.json was not read (not reached)"
            continue
        if report.get("error"):
            unknown[host] = f"its deployed.json could not be read: {report['error']}"
            continue
        if not report.get("exists"):
            continue  # it ran nothing
        try:
            record = json.loads(base64.b64decode(report.get("content") or "", validate=True))
        except (binascii.Error, ValueError) as exc:
            unknown[host] = f"its deployed.json is not JSON ({exc})"
            continue
        if not isinstance(record, dict) or "l3_namespace" not in record:
            unknown[host] = ("its deployed.json does not name the L3 namespace it writes (written by an older "
                             "hicache-deploy): deploy again, then prune")
            continue
        if record["l3_namespace"]:
            names.setdefault(str(record["l3_namespace"]), []).append(host)
    return names, unknown


def when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.datetime.fromtimestamp(float(epoch), datetime.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


@dataclasses.dataclass(frozen=True)
class Row:
    tier: str
    namespace: str
    bytes: int
    pages: int
    last_use: float | None  # newest mtime of its files: the last page written
    state: str  # IN_USE, IN_USE_ELSEWHERE, RUNNING, UNUSED, NOT_A_NAMESPACE, TOP_LEVEL
    used_by: tuple[str, ...] = ()
    prune: bool = False  # --prune removes it
    why_kept: str = ""  # an unused directory --prune leaves: why
    last_read: float | None = None  # newest atime after its file's last write: the last read recorded (see HEADERS)

    def cells(self) -> list[str]:
        who = ", ".join(self.used_by) if self.used_by else ""
        state = {IN_USE: who, IN_USE_ELSEWHERE: f"{who} (another tier)",
                 RUNNING: f"{who} (running it: deployed.json; the inventory now says another)",
                 UNUSED: "unused" + (" - kept: " + self.why_kept if self.why_kept else ""),
                 NOT_A_NAMESPACE: "not a namespace: never pruned", TOP_LEVEL: "pages without a namespace (off): never pruned"}[self.state]
        return [self.tier, self.namespace, size(self.bytes), str(self.pages), when(self.last_use), when(self.last_read), state]

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "used_by": list(self.used_by), "last_use": when(self.last_use) if self.last_use else None,
                "last_read": when(self.last_read) if self.last_read else None}


# The last read is the newest atime later than its file's mtime (none: written, never read since). The filesystem holding
# the files records it: relatime (the default) the first read after a write, then one a day; noatime none; on NFS the
# server's export filesystem, and a client's reads from its own page cache never reach it. SGLang never sets a page's times.
HEADERS = ["tier", "namespace", "size", "pages", "last use (newest page written)", "last read (atime since written)", "used by"]


def age(minutes: float) -> str:
    return f"{int(minutes)} min" if minutes < 120 else f"{minutes / 60:.1f} h"


def rows(tier: Tier, listing: Mapping[str, Any], used: Mapping[str, list[str]], *,
         runs: Mapping[str, list[str]] | None = None, unchecked: Mapping[str, str] | None = None,
         paths: Iterable[tuple[str, str, str]] = (), min_age: float = 0.0, now: float | None = None) -> list[Row]:
    """The rows of one tier from its listing (the module's answer); each says whether --prune removes it.

    used: namespace -> servers of the inventory using it; runs: namespace -> servers running it (deployed.json);
    unchecked: the tier's servers whose running config is unknown (then nothing is pruned); paths: protected();
    min_age: seconds since the last page written below which a namespace is kept; now: the epoch time of the listing.
    """
    runs, unchecked = runs or {}, dict(unchecked or {})
    paths = list(paths)
    out = []
    top = dict(listing.get("top") or {})
    bucket_files = bucket_pages = bucket_bytes = 0
    bucket_newest = bucket_read = None
    for entry in listing.get("entries", []):
        name = entry["name"]
        if is_bucket(name):  # the nixl backend's pages without a namespace
            bucket_files += int(entry.get("files", 0))
            bucket_pages += pages_of(entry)
            bucket_bytes += int(entry.get("bytes", 0))
            if entry.get("newest") is not None:
                bucket_newest = entry["newest"] if bucket_newest is None else max(bucket_newest, entry["newest"])
            if entry.get("newest_read") is not None:
                bucket_read = entry["newest_read"] if bucket_read is None else max(bucket_read, entry["newest_read"])
            continue
        users = tuple(used.get(name, ()))
        here = tuple(h for h in users if h in tier.hosts)
        common = dict(tier=tier.name, namespace=name, bytes=int(entry.get("bytes", 0)), pages=pages_of(entry),
                      last_use=entry.get("newest"), last_read=entry.get("newest_read"))
        if not is_namespace_name(name):
            out.append(Row(**common, state=NOT_A_NAMESPACE))
        elif users:
            out.append(Row(**common, state=IN_USE if here else IN_USE_ELSEWHERE, used_by=here or users))
        elif runs.get(name):
            out.append(Row(**common, state=RUNNING, used_by=tuple(runs[name])))
        else:
            why = kept(tier, entry, paths, unchecked, min_age, now)
            out.append(Row(**common, state=UNUSED, why_kept=why, prune=not why))
    files = int(top.get("files") or 0) + bucket_files
    if files:
        pages = pages_of(top) + bucket_pages
        newest = [t for t in (top.get("newest"), bucket_newest) if t is not None]
        read = [t for t in (top.get("newest_read"), bucket_read) if t is not None]
        out.append(Row(tier=tier.name, namespace=NO_NAMESPACE, bytes=int(top.get("bytes") or 0) + bucket_bytes, pages=pages,
                       last_use=max(newest) if newest else None, state=TOP_LEVEL, used_by=tier.off_hosts, last_read=max(read) if read else None))
    return out


def pages_of(entry: Mapping[str, Any]) -> int:
    """Pages, not files, of a listing's entry: SGLang writes a file per page, rank and (nixl, page_first) k/v part; the
    module counts the distinct page keys. A listing without the count (an older module) gives files."""
    return int(entry["pages"] if entry.get("pages") is not None else entry.get("files") or 0)


def kept(tier: Tier, entry: Mapping[str, Any], paths: list, unchecked: Mapping[str, str], min_age: float, now: float | None) -> str:
    """Why an unused namespace directory is not pruned, or ''."""
    name = entry["name"]
    if not namespace.is_derived(name):
        return "not a name auto derives (a literal namespace, or another directory): never pruned; remove it by hand once unused"
    where = protection(posixpath.join(tier.root, name), paths)
    if where:
        return f"{where}: never pruned"
    if unchecked:
        return ("not checked what " + ", ".join(f"{h} runs ({why})" for h, why in unchecked.items())
                + ": a server not checked may write here")
    if entry.get("errors"):
        return f"{entry['errors']} entr(y/ies) could not be read"
    if entry.get("mounts"):
        return "it is or holds a mount point: never pruned"
    newest = entry.get("newest")
    if min_age > 0 and newest is not None and now is not None and now - float(newest) < min_age:
        return f"written {age(max(0.0, now - float(newest)) / 60)} ago: a server may still use it"
    return ""


def budget(tier: Tier, deployments: Mapping[str, Any], all_rows: Iterable[Row], fs: Mapping[str, int] | None) -> dict[str, Any] | None:
    """The tier's budget as `l3` shows it: the bytes, the free-space floor, the host that collects it, each namespace's
    share in bytes (the collector's own quotas) and fill, the tier's fill; None when the tier has no budget."""
    from hicachectl.plans import l3_collector

    first = deployments[tier.hosts[0]]
    if not l3_collector.budgeted(first):
        return None
    config = l3_collector.config(tier.hosts[0], deployments)
    shares = {name: spec["share_pct"] for name, spec in config["namespaces"].items()}
    quota = l3_collector.program().quotas(config["budget_bytes"], shares)
    held = {r.namespace: r.bytes for r in all_rows}
    total = sum(held.values())
    spaces = {}
    for name, spec in config["namespaces"].items():
        shown = name or NO_NAMESPACE
        spaces[shown] = {"share_pct": spec["share_pct"], "quota_bytes": quota.get(name, 0), "bytes": held.get(shown, 0),
                         "fill": round(held.get(shown, 0) / quota[name], 4) if quota.get(name) else None}
    return {"budget_bytes": config["budget_bytes"], "free_floor_pct": config["free_floor_pct"],
            "collector": l3_collector.members(tier.hosts[0], deployments)[0], "bytes": total,
            "fill": round(total / config["budget_bytes"], 4), "namespaces": spaces,
            "fs_size": (fs or {}).get("size"), "fs_free": (fs or {}).get("free")}


def prunable(all_rows: Iterable[Row]) -> list[Row]:
    return [r for r in all_rows if r.prune]


def reader_order(tier: Tier, limited: Iterable[str]) -> list[str]:
    """The hosts of a tier that may read it, in the order they are tried (the first reachable one reads it)."""
    allowed = set(limited)
    return [h for h in tier.hosts if h in allowed]


def describe(d: Deployment) -> str:
    """`validate`'s line for a server: `L3 namespace: NAME (model ..., KV dtype ..., page size ...)`, or the warning."""
    if d.storage_backend is None:
        return "L3 namespace: none (no L3 tier: hicache_storage_backend unset)"
    name = namespace.of(d)
    if name is None:
        return f"L3 namespace: off (pages directly in {d.cache_dir or 'the backend'}): {OFF_WARNING}"
    parts = ", ".join(f"{words} {value}" for words, value in namespace.components(d).items())
    how = "" if d.l3_namespace in (None, namespace.AUTO) else "set by hicache_l3_namespace; keep it in step with "
    where = namespace.host_dir(d) or "the backend's key_namespace"
    return f"L3 namespace: {name} ({how}{parts}) at {where}"


def is_off(d: Deployment) -> bool:
    return d is not None and d.storage_backend is not None and namespace.of(d) is None
