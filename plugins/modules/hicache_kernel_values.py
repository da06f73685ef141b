#!/usr/bin/python
"""Set live kernel values (files under /proc/sys and /sys) that differ from the wanted ones.

Reads first and writes only what differs. A value that cannot be set here (the file is absent,
or read-only as in a container) is reported with the reason; when nothing could be set the task
ends as skipped, never as ok. Persistence is the role's job (sysctl.d, modprobe.d, udev).
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
author: hicache-deploy
"""

RETURN = r"""
set: {description: paths written, returned: always, type: dict}
unavailable: {description: paths that could not be set, with the reason, returned: always, type: dict}
"""

import os

from ansible.module_utils.basic import AnsibleModule


def path_of(key):
    return key if key.startswith("/") else "/proc/sys/" + key.replace(".", "/")


def main():
    module = AnsibleModule(argument_spec={"values": {"type": "dict", "required": True}}, supports_check_mode=True)
    changed, unavailable, matching = {}, {}, []
    for key, wanted in module.params["values"].items():
        path, wanted = path_of(key), str(wanted).strip()
        if not os.path.exists(path):
            unavailable[key] = f"{path} does not exist on this host"
            continue
        with open(path) as handle:
            current = " ".join(handle.read().split())
        if current == wanted:
            matching.append(key)
            continue
        if not os.access(path, os.W_OK):
            unavailable[key] = f"{path} is read-only here (current {current}, wanted {wanted})"
            continue
        if not module.check_mode:
            try:
                with open(path, "w") as handle:
                    handle.write(wanted)
            except OSError as exc:
                unavailable[key] = f"writing {path} failed: {exc.strerror} (current {current}, wanted {wanted})"
                continue
        changed[key] = {"before": current, "after": wanted}
    result = {"changed": bool(changed), "set": changed, "unavailable": unavailable, "matching": matching}
    if unavailable and not changed and not matching:
        result["skipped"] = True
        result["msg"] = "; ".join(f"{k}: {v}" for k, v in unavailable.items())
    elif unavailable:
        result["msg"] = "not set here: " + "; ".join(f"{k}: {v}" for k, v in unavailable.items())
    if changed and module._diff:
        result["diff"] = {"before": "".join(f"{k} = {v['before']}\n" for k, v in changed.items()),
                          "after": "".join(f"{k} = {v['after']}\n" for k, v in changed.items())}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
