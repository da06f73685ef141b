#!/usr/bin/python
# Copyright: hicache-deploy developers
# SPDX-License-Identifier: Apache-2.0
"""Lay down a role's directories, files and systemd units in one round trip.

A role's small steps that always go together (a directory, three files, the unit that uses them) cost one
SSH round trip each as separate tasks; this module does them together, idempotently, with check and diff
mode: it reads first and writes only what differs (atomically, keeping a backup when asked), then reloads
systemd when a unit file changed and enables the units that are not enabled.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: hicache_files
short_description: Lay down directories, files and systemd units in one step
description:
  - Creates the directories, writes the files (atomically, only when their content or owner, group or mode differ),
    removes the paths listed as absent, reloads systemd when a file under /etc/systemd/system changed and enables the
    listed units that are not enabled.
  - Each changed directory or file given a C(label) is named in RV(changed_items), so a report can say which of them changed.
options:
  directories:
    description: Directories to create (with their parents), each with C(path), C(owner), C(group), C(mode) and an optional C(label).
    type: list
    elements: dict
    default: []
  files:
    description:
      - Files to write, each with C(path), C(content), C(owner), C(group), C(mode), an optional C(backup) (keep the previous
        content beside the file, as M(ansible.builtin.copy) does) and an optional C(label) (default the file's name).
      - Never pass a secret here; its content would be shown in diff mode.
    type: list
    elements: dict
    default: []
  absent:
    description: Files to remove when present.
    type: list
    elements: str
    default: []
  enable_units:
    description: systemd units to enable (after any daemon reload). Needs systemd on the host.
    type: list
    elements: str
    default: []
  data_directories:
    description:
      - Directories on a data tier (an NFS or local L3 tier), each with C(path) and an optional C(label), made after
        everything else and only where missing, as a service's C(mkdir) would make them (umask 022, root's).
      - Only the last component is made (its parent must exist), and only while every mount point /etc/fstab lists
        at or above its parent is mounted, so nothing lands on the disk beneath a missing mount.
      - Each is looked at in a child process given O(data_timeout) seconds, so a hung mount never hangs the run. One that
        cannot be made is said as a warning and left; it is never a failure of the step.
    type: list
    elements: dict
    default: []
  data_timeout:
    description: Seconds each of O(data_directories) may take (a hard NFS mount whose server does not answer blocks).
    type: int
    default: 15
notes:
  - Supports check mode (reads, writes nothing) and diff mode.
  - A path that is a symlink is judged and written through it; the link itself is kept.
  - systemd is reloaded, and units enabled, only where systemd runs the host (/run/systemd/system).
author: hicache-deploy developers (@hicache-deploy)
"""

EXAMPLES = r"""
- name: Install the tuning program, its desired state and its unit
  hicache.deploy.hicache_files:
    directories:
      - {path: /etc/hicache, owner: root, group: root, mode: "0755"}
    files:
      - {path: /etc/hicache/nic.json, content: "{}", owner: root, group: root, mode: "0644"}
      - {path: /etc/systemd/system/hicache-nic.service, content: "...", owner: root, group: root, mode: "0644"}
    enable_units: [hicache-nic.service]
"""

RETURN = r"""
changed_items:
  description: The label of each labelled directory and file that changed (or would in check mode).
  returned: always
  type: list
  elements: str
  sample: [start.sh, run.sh]
backups:
  description: The backup file written for each file that had one, by path.
  returned: always
  type: dict
enabled:
  description: The units that were enabled (or would be in check mode).
  returned: always
  type: list
  elements: str
created_items:
  description: The label of each labelled directory and file that did not exist before (or would be created in check mode).
  returned: always
  type: list
  elements: str
"""

import grp  # noqa: E402 (imports below the documentation, as ansible-test's validate-modules wants)
import os  # noqa: E402
import pwd  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

UNIT_DIR = "/etc/systemd/system/"


def octal(mode):
    """A mode as Ansible takes it: an octal string ("0755") or the number YAML made of an unquoted 0755."""
    return mode if isinstance(mode, int) else int(str(mode), 8)


def wanted_ids(owner, group):
    """The uid and gid to set (-1: leave as is); a name or a numeric id, as ansible.builtin.file takes them."""
    def uid_of(name):
        return int(name) if str(name).isdigit() else pwd.getpwnam(str(name)).pw_uid

    def gid_of(name):
        return int(name) if str(name).isdigit() else grp.getgrnam(str(name)).gr_gid
    return (uid_of(owner) if owner is not None else -1), (gid_of(group) if group is not None else -1)


def attributes_differ(path, owner, group, mode):
    st = os.stat(path)  # a symlinked file or directory is judged (and written) through its link
    uid, gid = wanted_ids(owner, group)
    return (uid != -1 and st.st_uid != uid) or (gid != -1 and st.st_gid != gid) or \
        (mode is not None and (st.st_mode & 0o7777) != octal(mode))


def set_attributes(path, owner, group, mode):
    uid, gid = wanted_ids(owner, group)
    os.chown(path, uid, gid)
    if mode is not None:
        os.chmod(path, octal(mode))


def read_text(path):
    try:
        with open(path, "rb") as handle:
            return handle.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return None


def write_atomically(module, path, content):
    path = os.path.realpath(path)  # through a symlink: the link stays, its target gets the content
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".hicache-")
    with os.fdopen(handle, "wb") as out:
        out.write(content.encode("utf-8"))
    module.atomic_move(temporary, path)


def unescape_mount_path(field):
    """A path as fstab and mountinfo write it: octal escapes (\\040 a space, \\011 a tab, \\134 a backslash) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda found: chr(int(found.group(1), 8)), field)


def fstab_mount_points(text):
    """The mount points /etc/fstab lists (its second field; swap and 'none' are no mount points)."""
    points = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 2 and not fields[0].startswith("#") and fields[1].startswith("/"):
            points.append(os.path.normpath(unescape_mount_path(fields[1])))
    return points


def mountinfo_points(text):
    """The mount points /proc/self/mountinfo lists now (its fifth field): bind mounts included, subvolumes not."""
    return {os.path.normpath(unescape_mount_path(line.split()[4])) for line in text.splitlines() if len(line.split()) > 4}


def unmounted_above(path, fstab_text, mounted):
    """The mount points /etc/fstab lists at or above `path` (itself included; the root aside) that are not among the
    `mounted` mount points now."""
    path = os.path.normpath(path)
    return [point for point in fstab_mount_points(fstab_text)
            if point != "/" and (path == point or path.startswith(point + "/")) and point not in mounted]


def read_or_empty(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:  # no fstab: no mount of it to wait for
        return ""


def look_at_data_directory(path, check, fstab="/etc/fstab", mountinfo="/proc/self/mountinfo"):
    """'there', 'made' (in check mode: would be), or 'not made: why' (see data_directories)."""
    if os.path.isdir(path):
        return "there"
    missing = unmounted_above(path, read_or_empty(fstab), mountinfo_points(read_or_empty(mountinfo)))
    if missing:
        return f"not made: {', '.join(missing)} (in /etc/fstab) is not mounted"
    if os.path.lexists(path):
        return f"not made: {path} is there and is not a directory"
    parent = os.path.dirname(os.path.normpath(path))
    if not os.path.isdir(parent):
        return f"not made: {parent} does not exist"
    if check:
        return "made" if os.access(parent, os.W_OK) else f"not made: {parent} is not writable"
    os.umask(0o022)  # as systemd runs serve.sh's mkdir -p, whatever the login session's umask
    os.mkdir(path)
    return "made"


def in_child(function, timeout, *args):
    """function(*args)'s answer (a short text), computed in a forked child given `timeout` seconds: a child blocked on
    a hung mount is killed (NFS waits are killable) and left to init, and the answer says so. The child holds none of
    the module's output (its 0, 1 and 2 are /dev/null), so even one that cannot be killed keeps no run waiting."""
    try:
        read_end, write_end = os.pipe()
    except OSError as exc:
        return f"not made: {exc}"
    try:
        pid = os.fork()
    except OSError as exc:
        os.close(read_end)
        os.close(write_end)
        return f"not made: {exc}"
    if pid == 0:  # the child: answer and leave at once, running nothing of the parent's on the way out
        answer = "not made: no answer"
        try:
            os.close(read_end)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            answer = function(*args)
        except (OSError, ValueError, TypeError) as exc:  # anything else: "no answer", and the finally still leaves
            answer = f"not made: {exc}"
        finally:
            try:
                os.write(write_end, str(answer).encode("utf-8", "replace")[:4000])
            finally:
                os._exit(0)
    os.close(write_end)
    deadline = time.monotonic() + timeout
    try:
        while not os.waitpid(pid, os.WNOHANG)[0]:
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                time.sleep(0.1)
                if os.waitpid(pid, os.WNOHANG)[0] and (late := os.read(read_end, 8192).decode("utf-8", "replace")):
                    return late  # it answered as the time ran out
                return f"not made: {args[0]} did not answer within {timeout} s (its storage unreachable?)"
            time.sleep(0.02)
        return os.read(read_end, 8192).decode("utf-8", "replace") or "not made: no answer"
    finally:
        os.close(read_end)


def lay_down(module):
    """Returns whether anything changed, the labels of the labelled items that did, the diffs and the backups."""
    check = module.check_mode
    changed, changed_items, diffs, backups, enabled, created_items = False, [], [], {}, [], []
    units_changed = False

    def note(spec, created=False):
        nonlocal changed
        changed = True
        if spec.get("label"):
            changed_items.append(spec["label"])
            if created:
                created_items.append(spec["label"])

    for spec in module.params["directories"]:
        path = spec["path"]
        if not os.path.isdir(path):
            note(spec, created=True)
            diffs.append({"before_header": path, "after_header": path, "before": {"path": path, "state": "absent"},
                          "after": {"path": path, "state": "directory"}})
            if not check:
                os.makedirs(path, exist_ok=True)
                set_attributes(path, spec.get("owner"), spec.get("group"), spec.get("mode"))
        elif attributes_differ(path, spec.get("owner"), spec.get("group"), spec.get("mode")):
            note(spec)
            if not check:
                set_attributes(path, spec.get("owner"), spec.get("group"), spec.get("mode"))
    for spec in module.params["files"]:
        path, content = spec["path"], spec.get("content") or ""
        before = read_text(path)
        content_differs = before != content
        if not content_differs and not attributes_differ(path, spec.get("owner"), spec.get("group"), spec.get("mode")):
            continue
        note(spec, created=before is None and not os.path.lexists(path))
        units_changed |= path.startswith(UNIT_DIR)
        if content_differs:
            diffs.append({"before_header": path, "after_header": path, "before": before or "", "after": content})
        if check:
            continue
        if not os.path.isdir(os.path.dirname(path)):
            module.fail_json(msg=f"{path}: its directory {os.path.dirname(path)} does not exist", changed_items=changed_items)
        if content_differs:
            if before is not None and spec.get("backup"):
                backups[path] = module.backup_local(path)
            write_atomically(module, path, content)
        set_attributes(path, spec.get("owner"), spec.get("group"), spec.get("mode"))
    for path in module.params["absent"]:
        if os.path.lexists(path):
            note({"label": os.path.basename(path)})
            units_changed |= path.startswith(UNIT_DIR)
            diffs.append({"before_header": path, "after_header": path, "before": {"path": path, "state": "file"},
                          "after": {"path": path, "state": "absent"}})
            if not check:
                os.unlink(path)
    enable = module.params["enable_units"]
    # systemctl may be installed where systemd does not run (a container, a chroot): nothing to reload or enable there.
    if (enable or units_changed) and os.path.isdir("/run/systemd/system"):
        systemctl = module.get_bin_path("systemctl", required=bool(enable))
        if systemctl and units_changed and not check:
            rc, dummy, err = module.run_command([systemctl, "daemon-reload"])
            if rc != 0:
                module.fail_json(msg=f"systemctl daemon-reload failed: {err.strip()}", changed_items=changed_items)
        for unit in enable:
            rc, out, dummy = module.run_command([systemctl, "is-enabled", unit])
            if rc == 0 and out.strip() in ("enabled", "enabled-runtime", "static", "alias", "generated", "indirect"):
                continue
            changed = True
            enabled.append(unit)
            if check:  # a unit this run would write cannot be enabled yet; the write is reported above
                continue
            rc, dummy, err = module.run_command([systemctl, "enable", unit])
            if rc != 0:
                module.fail_json(msg=f"systemctl enable {unit} failed: {err.strip()}", changed_items=changed_items)
    for spec in module.params["data_directories"]:
        path = spec["path"]
        answer = in_child(look_at_data_directory, module.params["data_timeout"], path, check)
        if answer == "made":
            note(spec, created=True)
            diffs.append({"before_header": path, "after_header": path, "before": {"path": path, "state": "absent"},
                          "after": {"path": path, "state": "directory"}})
        elif answer != "there":
            module.warn(f"{spec.get('label') or path} {path}: {answer}")
    return changed, changed_items, diffs, backups, enabled, created_items


def main():
    module = AnsibleModule(
        argument_spec={
            "directories": {"type": "list", "elements": "dict", "default": []},
            "files": {"type": "list", "elements": "dict", "default": []},
            "absent": {"type": "list", "elements": "str", "default": []},
            "enable_units": {"type": "list", "elements": "str", "default": []},
            "data_directories": {"type": "list", "elements": "dict", "default": []},
            "data_timeout": {"type": "int", "default": 15},
        },
        supports_check_mode=True,
    )
    try:
        changed, changed_items, diffs, backups, enabled, created_items = lay_down(module)
    except (OSError, KeyError, ValueError) as exc:
        module.fail_json(msg=f"could not lay down the files: {exc}")
    result = {"changed": changed, "changed_items": changed_items, "backups": backups, "enabled": enabled, "created_items": created_items}
    if module._diff and diffs:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
