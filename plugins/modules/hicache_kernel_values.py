#!/usr/bin/python
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
options:
  values:
    description: Absolute file path (or a sysctl name such as net.ipv4.conf.all.rp_filter) to the wanted value.
    type: dict
    required: true
  strict:
    description: The inventory's hicache_strict. A value that cannot be set fails the task; false reports it in hicache_gaps.
    type: bool
    default: true
author: hicache-deploy
"""

RETURN = r"""
set: {description: keys written (or that would be in check mode), with before and after, returned: always, type: dict}
unavailable: {description: keys that could not be set, with the reason, returned: always, type: dict}
matching: {description: keys already at the wanted value, returned: always, type: list}
hicache_gaps: {description: one reason per key that could not be set (strict false), returned: when a key could not be set, type: list}
"""

import os

from ansible.module_utils.basic import AnsibleModule


def path_of(key, root=""):
    return root + (key if key.startswith("/") else "/proc/sys/" + key.replace(".", "/"))


def writable(path):
    """access(2) answers EROFS for a read-only mount (a container's /proc/sys) even to root."""
    return os.access(path, os.W_OK)


def write_value(path, value):
    with open(path, "w") as handle:
        handle.write(value)


def decide(values, check_mode, root=""):
    """Read every value, write what differs (unless check_mode). Returns set / unavailable / matching."""
    changed, unavailable, matching = {}, {}, []
    for key, wanted in values.items():
        path, wanted = path_of(key, root), str(wanted).strip()
        shown = path[len(root):]
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
    module = AnsibleModule(argument_spec={"values": {"type": "dict", "required": True}, "strict": {"type": "bool", "default": True}},
                           supports_check_mode=True)
    result = outcome(decide(module.params["values"], module.check_mode), module.params["strict"], module._diff)
    for warning in result.pop("warnings", []):
        module.warn(warning)
    if result.get("failed"):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
