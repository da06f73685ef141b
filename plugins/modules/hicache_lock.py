#!/usr/bin/python
"""A per-host lock so two deploys never interleave on one host.

The lock is a file created atomically (O_EXCL) under /run, so a reboot clears it. It holds the run's
id, who started it and when; a second run is refused with those. A lock older than `stale_after`
seconds is taken over, with a warning, so a crashed run cannot block a host for ever. Taking and
releasing the lock are bookkeeping of the run, not changes to the host: they report changed=false.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: hicache_lock
short_description: Take or release the hicache-deploy lock on a host
options:
  state: {description: acquired or released, type: str, choices: [acquired, released], required: true}
  run_id: {description: The id of this run, type: str, required: true}
  holder: {description: Who runs it (user@controller), type: str, default: unknown}
  path: {description: The lock file, type: str, default: /run/hicache-deploy.lock}
  stale_after: {description: Seconds after which a lock is taken over, type: int, default: 21600}
author: hicache-deploy
"""

RETURN = r"""
lock: {description: The lock's content, returned: always, type: dict}
"""

import json
import os
import time

from ansible.module_utils.basic import AnsibleModule


def read(path):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def main():
    module = AnsibleModule(argument_spec={
        "state": {"type": "str", "choices": ["acquired", "released"], "required": True},
        "run_id": {"type": "str", "required": True},
        "holder": {"type": "str", "default": "unknown"},
        "path": {"type": "str", "default": "/run/hicache-deploy.lock"},
        "stale_after": {"type": "int", "default": 21600},
    }, supports_check_mode=True)
    p = module.params
    current = read(p["path"])
    if p["state"] == "released":
        if current and current.get("run_id") == p["run_id"] and not module.check_mode:
            os.unlink(p["path"])
        module.exit_json(changed=False, lock=current or {})
    if current and current.get("run_id") == p["run_id"]:
        module.exit_json(changed=False, lock=current)
    mine = {"run_id": p["run_id"], "holder": p["holder"], "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "epoch": time.time()}
    if current:
        age = time.time() - float(current.get("epoch", 0))
        if age < p["stale_after"]:
            module.fail_json(msg=f"another deploy holds this host: {current.get('holder')} since {current.get('since')} (run {current.get('run_id')}). "
                                 f"Wait for it, or remove {p['path']} if that run is gone.", lock=current)
        module.warn(f"took over a stale lock of {current.get('holder')} from {current.get('since')} ({int(age)} s old)")
        if not module.check_mode:
            os.unlink(p["path"])
    if module.check_mode:
        module.exit_json(changed=False, lock=current or {})
    try:
        fd = os.open(p["path"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        module.fail_json(msg=f"another deploy took this host a moment ago: {read(p['path'])}")
    with os.fdopen(fd, "w") as handle:
        json.dump(mine, handle)
    module.exit_json(changed=False, lock=mine)


if __name__ == "__main__":
    main()
