#!/usr/bin/python
# Copyright: hicache-deploy developers
# SPDX-License-Identifier: Apache-2.0
"""Set live kernel values (files under /proc/sys and /sys) that differ from the wanted ones.

Reads first and writes only what differs. A value that cannot be set here (the file is absent, as
for a misspelt sysctl; read-only, as in a container; or the kernel refuses the write) is something
the inventory asked for and did not get: under `strict` the task fails naming each key and why;
otherwise it reports ok with the reasons in `hicache_gaps` (the host is *degraded*). Never skipped.
Persistence is the role's job (sysctl.d, modprobe.d, udev).
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: hicache_kernel_values
short_description: Set live /proc/sys and /sys values that differ
description:
  - Reads each wanted kernel value first and writes only those that differ.
  - A value that cannot be set here (the file is absent, as for a misspelt sysctl; read-only, as in a container; or the kernel
    refuses the write) is something the inventory asked for and did not get. With O(strict) the task fails naming each key and why;
    otherwise it reports ok with the reasons in RV(hicache_gaps) and as warnings (the host is degraded). It is never skipped.
  - Only live values are set. Making them persistent (sysctl.d, modprobe.d, udev) is the calling role's job.
options:
  values:
    description:
      - Wanted value of each key. A key is an absolute file path (under /proc/sys or /sys) or a sysctl name such as
        C(net.ipv4.conf.all.rp_filter), read as sysctl.d(5) reads it (C(net/ipv4/conf/ens1f0.100/rp_filter) names a VLAN interface).
      - Values are compared as text with runs of whitespace folded to one space.
    type: dict
    required: true
  after_load:
    description:
      - Keys of O(values) whose file appears only once a kernel module is loaded that the calling role loads just before
        this task (sunrpc.rdma_* with rpcrdma). Check mode loads nothing, so there an absent one is shown as a value that
        would be set, not as one that cannot be; outside check mode it is judged as any other key.
    type: list
    elements: str
    default: []
  strict:
    description: The inventory's C(hicache_strict). A value that cannot be set fails the task; false reports it in RV(hicache_gaps).
    type: bool
    default: true
notes:
  - Supports check mode (reads, writes nothing) and diff mode.
author: hicache-deploy developers (@hicache-deploy)
"""

EXAMPLES = r"""
- name: Set the NFS client's kernel values
  hicache.deploy.hicache_kernel_values:
    values:
      net.ipv4.conf.all.rp_filter: 2
      sunrpc.rdma_slot_table_entries: 128
    strict: "{{ hicache_strict }}"
  register: kernel_values
"""

RETURN = r"""
set:
  description: Keys written (or that would be in check mode), each with its value C(before) and C(after).
  returned: always
  type: dict
  sample: {net.ipv4.conf.all.rp_filter: {before: "1", after: "2"}}
unavailable:
  description: Keys that could not be set, each with the reason.
  returned: always
  type: dict
  sample: {vm.no_such_value: /proc/sys/vm/no_such_value does not exist on this host (no such sysctl, or its module is not loaded)}
matching:
  description: Keys already at the wanted value.
  returned: always
  type: list
  elements: str
hicache_gaps:
  description: "One reason per key that could not be set, as C(key: reason)."
  returned: when a key could not be set
  type: list
  elements: str
"""

import os

from ansible.module_utils.basic import AnsibleModule


def path_of(key, root=""):
    """A file path as given; a sysctl name as sysctl.d(5) reads it: when its first separator is a slash, dots stay
    (net/ipv4/conf/ens1f0.100/rp_filter, a VLAN); when it is a dot, dots and slashes swap (net.ipv4.conf.ens1f0/100.rp_filter)."""
    if key.startswith("/"):
        return root + key
    dot, slash = key.find("."), key.find("/")
    if slash != -1 and (dot == -1 or slash < dot):
        path = "/proc/sys/" + key
    else:
        path = "/proc/sys/" + key.translate(str.maketrans("./", "/."))
    # A sysctl name never leads out of /proc/sys (kernel/../../../root/.ssh/authorized_keys is a file, not a sysctl).
    if any(part in ("", ".", "..") for part in path[len("/proc/sys/"):].split("/")):
        raise ValueError(f"{key!r} is not a sysctl name")
    return root + path


def writable(path):
    """access(2) answers EROFS for a read-only mount (a container's /proc/sys) even to root."""
    return os.access(path, os.W_OK)


def write_value(path, value):
    with open(path, "w") as handle:
        handle.write(value)


def decide(values, check_mode, root="", after_load=()):
    """Read every value, write what differs (unless check_mode). Returns set / unavailable / matching."""
    changed, unavailable, matching = {}, {}, []
    for key, wanted in values.items():
        try:
            path = path_of(key, root)
        except ValueError as exc:
            unavailable[key] = str(exc)
            continue
        wanted = str(wanted).strip()
        shown = path[len(root):]
        if check_mode and key in after_load and not os.path.exists(path):
            changed[key] = {"before": "(absent until its module is loaded)", "after": wanted}
            continue
        if not os.path.exists(path):
            unavailable[key] = f"{shown} does not exist on this host" + ("" if key.startswith("/") else " (no such sysctl, or its module is not loaded)")
            continue
        try:
            with open(path) as handle:
                current = " ".join(handle.read().split())
        except OSError as exc:
            unavailable[key] = f"reading {shown} failed: {exc.strerror}"
            continue
        if current == wanted:
            matching.append(key)
            continue
        if not writable(path):
            unavailable[key] = f"{shown} is read-only here (current {current}, wanted {wanted})"
            continue
        if not check_mode:
            try:
                write_value(path, wanted)
            except OSError as exc:
                unavailable[key] = f"writing {wanted} to {shown} failed: {exc.strerror} (current {current})"
                continue
        changed[key] = {"before": current, "after": wanted}
    return {"set": changed, "unavailable": unavailable, "matching": matching}


def outcome(decided, strict, diff=False):
    """The task's result: failed under strict when a value could not be set, else ok with hicache_gaps."""
    changed, unavailable = decided["set"], decided["unavailable"]
    result = {"changed": bool(changed), **decided}
    if unavailable:
        reasons = [f"{key}: {why}" for key, why in unavailable.items()]
        result["hicache_gaps"] = reasons
        if strict:
            result["failed"] = True
            result["msg"] = "cannot set " + "; ".join(reasons)
        else:
            result["msg"] = "not set (hicache_strict is false): " + "; ".join(reasons)
            result["warnings"] = [f"degraded (hicache_strict is false): {reason}" for reason in reasons]
    if changed and diff:
        result["diff"] = {"before": "".join(f"{k} = {v['before']}\n" for k, v in changed.items()),
                          "after": "".join(f"{k} = {v['after']}\n" for k, v in changed.items())}
    return result


def main():
    module = AnsibleModule(argument_spec={"values": {"type": "dict", "required": True}, "strict": {"type": "bool", "default": True},
                                          "after_load": {"type": "list", "elements": "str", "default": []}},
                           supports_check_mode=True)
    result = outcome(decide(module.params["values"], module.check_mode, after_load=module.params["after_load"]), module.params["strict"],
                     module._diff)
    for warning in result.pop("warnings", []):
        module.warn(warning)
    if result.get("failed"):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
