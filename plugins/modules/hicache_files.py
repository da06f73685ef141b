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
"""

import grp  # noqa: E402 (imports below the documentation, as ansible-test's validate-modules wants)
import os  # noqa: E402
import pwd  # noqa: E402
import tempfile  # noqa: E402

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


def lay_down(module):
    """Returns whether anything changed, the labels of the labelled items that did, the diffs and the backups."""
    check = module.check_mode
    changed, changed_items, diffs, backups, enabled = False, [], [], {}, []
    units_changed = False

    def note(spec):
        nonlocal changed
        changed = True
        if spec.get("label"):
            changed_items.append(spec["label"])

    for spec in module.params["directories"]:
        path = spec["path"]
        if not os.path.isdir(path):
            note(spec)
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
        note(spec)
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
    return changed, changed_items, diffs, backups, enabled


def main():
    module = AnsibleModule(
        argument_spec={
            "directories": {"type": "list", "elements": "dict", "default": []},
            "files": {"type": "list", "elements": "dict", "default": []},
            "absent": {"type": "list", "elements": "str", "default": []},
            "enable_units": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    try:
        changed, changed_items, diffs, backups, enabled = lay_down(module)
    except (OSError, KeyError, ValueError) as exc:
        module.fail_json(msg=f"could not lay down the files: {exc}")
    result = {"changed": changed, "changed_items": changed_items, "backups": backups, "enabled": enabled}
    if module._diff and diffs:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
