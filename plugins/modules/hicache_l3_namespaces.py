#!/usr/bin/python
# Copyright: hicache-deploy developers
# SPDX-License-Identifier: Apache-2.0
"""The L3 namespaces of one tier, as its directory holds them: list them, and remove the ones the controller names.

A namespace is a direct subdirectory of the tier's directory (hicache_cache_dir). Listing walks each
subdirectory with os.scandir without following symlinks or entering another filesystem and gives its bytes
(apparent size), files, pages (SGLang's: one per key, whatever its ranks and k/v parts), newest mtime and the mount
points it is or holds; the files directly in the
directory (a server with hicache_l3_namespace: off writes its pages there) are summed apart and never removed.
The tier's directory itself is never removed.

Removal is defence in depth behind the controller's decision (hicachectl/ops/l3.py): a name is refused, not
removed, unless it has the form `auto` derives (DERIVED_FORM, a copy of hicachectl/config/namespace.py's; tests/test_l3.py
holds the two equal), so a literal namespace, `models`, `backup`, a bucket directory `00`..`ff` of the nixl
backend or lost+found never is. It is refused too when the controller says to hold (a server of the tier could not
be checked), when it is in C(keep) (the namespaces the inventory's servers use and run, computed again when the
removal runs), is a symlink or not a directory, is, holds or lies inside a path of C(protect) (compared resolved),
is or holds a mount point (/proc/self/mountinfo, and st_dev while walking), could not be read entirely, or has a
page written less than C(min_age) seconds ago. The removal itself opens each directory with O_NOFOLLOW and stops
at another filesystem (shutil.rmtree would enter it). The decisions are plain functions below (tests/test_l3.py
calls them on a tmp dir). This file is shipped to the host on its own: standard library and ansible.module_utils only.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: hicache_l3_namespaces
short_description: List the L3 namespaces of a tier's directory, or remove the ones no server uses
description:
  - C(listed) returns every direct subdirectory of O(path) with its bytes, file count, newest mtime and the mount points it
    is or holds, walked without following symlinks or entering another filesystem, and the same sums for the files directly in
    O(path) (pages written without a namespace). It changes nothing.
  - C(pruned) removes the subdirectories named in O(names), then lists as C(listed) does. A name is refused (kept, and
    returned in RV(refused) with the reason) unless it has the form C(auto) derives (the model's slug, C(-), 12 hex digits).
    It is refused too when O(hold) is given, or when it is in O(keep), is a symlink or not a directory, is, holds or lies inside
    a path of O(protect), is or holds a mount point, could not be read entirely, or has a page written less than O(min_age) seconds ago.
    O(path) itself is never removed; the removal never follows a symlink nor enters another filesystem.
  - In check mode C(pruned) removes nothing and returns in RV(removed) what it would remove.
options:
  path:
    description: The tier's directory (C(hicache_cache_dir)). When it does not exist, RV(exists) is false and nothing is listed.
    type: path
    required: true
  state:
    description: C(listed) or C(pruned), see the description.
    type: str
    choices: [listed, pruned]
    default: listed
  names:
    description: With C(pruned), the namespaces to remove (the controller's decision).
    type: list
    elements: str
    default: []
  keep:
    description: Namespaces that are never removed, whatever O(names) says (the ones the inventory's servers use).
    type: list
    elements: str
    default: []
  protect:
    description: Directories never removed, nor any directory holding one or lying inside one (the servers' model, base and cfg directories).
    type: list
    elements: path
    default: []
  min_age:
    description: Seconds; a namespace with a page written more recently is kept (a server may still use it).
    type: float
    default: 0.0
  hold:
    description: When given, nothing is removed and every name is refused with this reason (a server of the tier could not be checked).
    type: str
notes:
  - Supports check mode (C(pruned) reports what it would remove and removes nothing).
  - Bytes are apparent sizes (st_size); the newest mtime is the last time a page was written (a read does not change it), the
    newest atime of a file later than its mtime the last read recorded since a write (none when written and never read). The
    filesystem that holds the files records it, with relatime (the default) the first read after a write and then one a
    day, with noatime none; on NFS the server's export filesystem decides, and a client's reads from its own page cache
    never reach the server.
author: hicache-deploy developers (@hicache-deploy)
"""

EXAMPLES = r"""
- name: List the namespaces of the tier
  hicache.deploy.hicache_l3_namespaces:
    path: /mnt/hicache
  register: listed

- name: Remove an old namespace, never one in use
  hicache.deploy.hicache_l3_namespaces:
    path: /mnt/hicache
    state: pruned
    names: [qwen3-8b-5f1c2a9e0d14]
    keep: [qwen3-8b-0b7d4e11a2c3]
    protect: [/opt/sglang-hicache]
    min_age: 86400
"""

RETURN = r"""
exists:
  description: Whether O(path) exists and is a directory.
  returned: always
  type: bool
path:
  description: O(path) as given.
  returned: always
  type: str
entries:
  description: Each direct subdirectory (after any removal), sorted by name; C(namespace_form) says whether its name could be a namespace,
    C(derived) whether it has the form C(auto) derives, C(mounts) how many mount points it is or holds.
  returned: always
  type: list
  elements: dict
  sample: [{name: qwen3-8b-5f1c2a9e0d14, bytes: 1048576, files: 16, pages: 8, newest: 1767225600.0, newest_read: 1767229200.0,
            namespace_form: true, derived: true, errors: 0, mounts: 0}]
top:
  description: The regular files directly in O(path) (pages without a namespace), summed; C(other) counts symlinks and special files there (not followed).
  returned: always
  type: dict
  sample: {bytes: 0, files: 0, pages: 0, newest: null, newest_read: null, other: 0}
fs:
  description: The size and free space (for unprivileged users, f_bavail) of the filesystem holding O(path), in bytes, when it exists.
  returned: when O(path) exists
  type: dict
  sample: {size: 2000000000000, free: 1200000000000}
now:
  description: The host's time of the listing (epoch seconds), to judge the newest mtimes against.
  returned: always
  type: float
removed:
  description: The namespaces removed (in check mode, the ones that would be).
  returned: always
  type: list
  elements: str
removal_errors:
  description: The names whose removal failed part-way, each with the error (the task then fails, after listing).
  returned: always
  type: list
  elements: dict
refused:
  description: The names not removed, each with why.
  returned: always
  type: list
  elements: dict
  sample: [{name: lost+found, reason: "not a name auto derives (a literal namespace or another directory): never removed"}]
"""

import errno
import os
import re
import stat
import time

from ansible.module_utils.basic import AnsibleModule

# hicachectl/config/schema.py: the domain of hicache_l3_namespace (a copy: this file runs on the host without the core).
NAMESPACE_FORM = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# hicachectl/config/namespace.py: the form of a name `auto` derives, the only names ever removed (a copy, held equal by a test).
DERIVED_FORM = re.compile(r"[a-z0-9][a-z0-9._-]{0,40}-[0-9a-f]{12}")


def is_namespace_name(name):
    return bool(NAMESPACE_FORM.fullmatch(name or "")) and "/" not in name


def is_derived(name):
    return bool(DERIVED_FORM.fullmatch(name or ""))


# SGLang's page files start with the page's key (64 hex digits) and '_', or '.' before a pool component: HiCacheFile
# `<key>[.<pool>]_<model>_<tp_rank>_<tp_size>...bin` (_get_suffixed_key, _log_key), HiCacheNixl
# `<bucket>/<key>_<model>_<tp_rank>_<tp_size>[_k|_v]` (sglang 0.5.23 mem_cache/hicache_storage.py, storage/nixl/).
# The tier's collector (roles/sglang_server/files/hicache-l3-collect) groups pages with the same pattern (a test holds them equal).
PAGE_KEY = re.compile(r"([0-9a-f]{64})[._]")
# The tier collector's lock file in the tier's directory (hicachectl/plans/l3_collector.py LOCK_NAME; a test holds them equal).
COLLECTOR_LOCK = ".hicache-l3-collector.lock"


def page_of(name, path):
    """The page a file holds: its key for SGLang's names (one page is a file per rank and k/v part), None for a file being
    written (HiCacheFile's hidden `.<uuid>.tmp`), else the file's path (a file of another layout is a page)."""
    if name.startswith(".") and name.endswith(".tmp"):
        return None
    found = PAGE_KEY.match(name)
    return found.group(1) if found else "file:" + path


def walk(path):
    """(bytes, files, newest mtime or None, entries that could not be read, directories on another filesystem, pages,
    newest atime of a file read since it was written, or None) under a directory, symlinks not followed and other
    filesystems not entered."""
    total = files = errors = mounts = 0
    pages = set()
    newest = read = None
    try:
        dev = os.lstat(path).st_dev
    except OSError:
        return total, files, newest, 1, mounts, 0, read
    stack = [path]
    while stack:
        current = stack.pop()
        try:
            with os.scandir(current) as entries:
                for entry in entries:
                    try:
                        st = entry.stat(follow_symlinks=False)
                        if stat.S_ISDIR(st.st_mode):
                            if st.st_dev != dev:  # a mount point: not entered
                                mounts += 1
                            else:
                                stack.append(entry.path)
                        elif stat.S_ISREG(st.st_mode):
                            total += st.st_size
                            files += 1
                            newest = st.st_mtime if newest is None else max(newest, st.st_mtime)
                            if st.st_atime > st.st_mtime:  # read since written (a new file's atime is its creation)
                                read = st.st_atime if read is None else max(read, st.st_atime)
                            pages.add(page_of(entry.name, entry.path))
                    except OSError:  # gone meanwhile (a server replacing a page) or unreadable
                        errors += 1
        except OSError:
            errors += 1
    pages.discard(None)
    return total, files, newest, errors, mounts, len(pages), read


def mount_points(mountinfo="/proc/self/mountinfo"):
    """The mount points of this host (bind mounts of one filesystem included, which st_dev does not show); None
    when they cannot be read."""
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    points = []
    for line in lines:
        fields = line.split(" ")
        if len(fields) > 4:
            points.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
    return points


def listing(path, mounts=None):
    """What `listed` returns for a directory."""
    top = {"bytes": 0, "files": 0, "pages": 0, "newest": None, "newest_read": None, "other": 0}
    top_pages = set()
    now = time.time()
    if not os.path.isdir(path):  # the tier's directory itself may be a symlink (to the mount): followed
        return {"exists": False, "path": path, "entries": [], "top": top, "now": now}
    real = os.path.realpath(path)
    mounts = mount_points() if mounts is None else mounts
    entries = []
    with os.scandir(path) as found:
        for entry in sorted(found, key=lambda e: e.name):
            try:
                if entry.is_dir(follow_symlinks=False):
                    size, count, newest, errors, crossings, pages, read = walk(entry.path)
                    crossings += len(mounted_in(os.path.join(real, entry.name), mounts or ()))
                    entries.append({"name": entry.name, "bytes": size, "files": count, "pages": pages, "newest": newest, "newest_read": read,
                                    "namespace_form": is_namespace_name(entry.name), "derived": is_derived(entry.name),
                                    "errors": errors, "mounts": crossings})
                elif entry.name == COLLECTOR_LOCK:
                    continue  # the tier's collector lock: the toolkit's, not a page
                elif entry.is_file(follow_symlinks=False):
                    st = entry.stat(follow_symlinks=False)
                    top["bytes"] += st.st_size
                    top["files"] += 1
                    top_pages.add(page_of(entry.name, entry.path))
                    top["newest"] = st.st_mtime if top["newest"] is None else max(top["newest"], st.st_mtime)
                    if st.st_atime > st.st_mtime:
                        top["newest_read"] = st.st_atime if top["newest_read"] is None else max(top["newest_read"], st.st_atime)
                else:
                    top["other"] += 1
            except OSError:
                top["other"] += 1
    top_pages.discard(None)
    top["pages"] = len(top_pages)
    vfs = os.statvfs(path)
    return {"exists": True, "path": path, "entries": entries, "top": top, "now": now,
            "fs": {"size": vfs.f_blocks * vfs.f_frsize, "free": vfs.f_bavail * vfs.f_frsize}}


def _inside(child, parent):
    return child == parent or parent == "/" or child.startswith(parent.rstrip("/") + "/")


def mounted_in(target, mounts):
    """The mount points that are `target` or lie under it."""
    return [m for m in mounts if _inside(m, target)]


def protection(target, protect):
    """Why `target` (resolved) must not be removed for the protected paths, or None: it is one, holds one or lies in one."""
    for where in protect:
        for form in dict.fromkeys([os.path.normpath(where), os.path.realpath(where)]):
            if target == form:
                return f"it is {where} (a server's model, base or cfg directory)"
            if _inside(target, form):
                return f"it lies inside {where} (a server's model, base or cfg directory)"
            if _inside(form, target):
                return f"it holds {where} (a server's model, base or cfg directory)"
    return None


def refusal(path, name, keep, protect=(), min_age=0.0, hold=None, mounts=None, now=None):
    """Why `name` must not be removed from `path`, or None when it may be."""
    if not is_derived(name) or "/" in name:
        return "not a name auto derives (a literal namespace or another directory): never removed"
    if hold:
        return hold
    if name in keep:
        return "in use by a server of the inventory"
    target = os.path.join(path, name)
    if os.path.islink(target):
        return "a symlink (not followed)"
    if not os.path.lexists(target):
        return "not there"
    if not os.path.isdir(target):
        return "not a directory"
    real = os.path.realpath(target)
    why = protection(real, protect)
    if why:
        return why
    if mounts is None:
        return "the mount points of the host could not be read (/proc/self/mountinfo)"
    if os.path.ismount(target) or mounted_in(real, mounts):
        return "a mount point or holds one"
    newest, errors, crossings = walk(target)[2:5]
    if crossings:
        return "holds a mount point"
    if errors:
        return f"{errors} entr(y/ies) could not be read"
    now = time.time() if now is None else now
    if min_age and newest is not None and now - newest < min_age:
        return f"written {int(max(0, now - newest) // 60)} min ago: a server may still use it"
    return None


def remove_tree(path):
    """Remove a directory and what it holds, never following a symlink and never entering another filesystem
    (unlike shutil.rmtree, which enters a mount point): each directory is opened relative to its parent with
    O_NOFOLLOW and its st_dev compared with the top's; another filesystem stops the removal with EXDEV."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    top = os.open(path, flags)
    try:
        dev = os.fstat(top).st_dev
        _clear(top, dev, path)
    finally:
        os.close(top)
    os.rmdir(path)


def _clear(fd, dev, where):
    for name in os.listdir(fd):
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            if st.st_dev != dev:
                raise OSError(errno.EXDEV, "another filesystem is mounted here: not entered", os.path.join(where, name))
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), dir_fd=fd)
            try:
                if os.fstat(sub).st_dev != dev:
                    raise OSError(errno.EXDEV, "another filesystem is mounted here: not entered", os.path.join(where, name))
                _clear(sub, dev, os.path.join(where, name))
            finally:
                os.close(sub)
            os.rmdir(name, dir_fd=fd)
        else:
            os.unlink(name, dir_fd=fd)


def prune(path, names, keep, check_mode=False, protect=(), min_age=0.0, hold=None, mounts=None):
    """(removed, refused, removal errors) for the names asked; only what refusal() allows is removed. A removal that
    fails part-way (a file busy on NFS, a permission, a mount point that appeared) is in the third list with its
    error; the others go on."""
    removed, refused, failed = [], [], []
    keep = set(keep)
    if not os.path.isdir(path):
        return removed, [{"name": n, "reason": f"{path} does not exist"} for n in names], failed
    mounts = mount_points() if mounts is None else mounts
    for name in dict.fromkeys(names):
        why = refusal(path, name, keep, protect, min_age, hold, mounts)
        if why:
            refused.append({"name": name, "reason": why})
            continue
        if not check_mode:
            try:
                remove_tree(os.path.join(path, name))
            except OSError as exc:
                failed.append({"name": name, "reason": f"could not be removed: {exc}"})
                continue
        removed.append(name)
    return removed, refused, failed


def main():
    module = AnsibleModule(argument_spec={
        "path": {"type": "path", "required": True},
        "state": {"type": "str", "choices": ["listed", "pruned"], "default": "listed"},
        "names": {"type": "list", "elements": "str", "default": []},
        "keep": {"type": "list", "elements": "str", "default": []},
        "protect": {"type": "list", "elements": "path", "default": []},
        "min_age": {"type": "float", "default": 0.0},
        "hold": {"type": "str"},
    }, supports_check_mode=True)
    p = module.params
    path = p["path"].rstrip("/") or "/"
    removed, refused, failed = [], [], []
    if p["state"] == "pruned":
        removed, refused, failed = prune(path, p["names"], p["keep"], module.check_mode, p["protect"], p["min_age"], p["hold"])
    try:
        listed = listing(path)
    except OSError as exc:
        module.fail_json(msg=f"cannot list {path}: {exc}", changed=bool(removed), removed=removed, refused=refused, removal_errors=failed)
    if failed:
        module.fail_json(msg="; ".join(f"{f['name']} {f['reason']}" for f in failed), changed=bool(removed),
                         removed=removed, refused=refused, removal_errors=failed, **listed)
    module.exit_json(changed=bool(removed), removed=removed, refused=refused, removal_errors=failed, **listed)


if __name__ == "__main__":
    main()
