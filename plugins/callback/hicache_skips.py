# Copyright: hicache-deploy developers
# SPDX-License-Identifier: Apache-2.0
"""Record why each task was skipped, for hicachectl's per-host report.

ansible-runner's events for skipped tasks carry no result, so the reason (hicache_skip's message or
the false condition) would be lost; this writes one JSON line per skip to $HICACHE_SKIPS_FILE.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: hicache_skips
type: aggregate
short_description: Write skip reasons to $HICACHE_SKIPS_FILE
description:
  - Appends one JSON line per skipped task and host (loop items included) to the file named by the environment variable
    E(HICACHE_SKIPS_FILE), with the host, the task and the reason (the false condition, or the skip message).
  - ansible-runner's events for skipped tasks carry no result, so hicachectl reads the reasons from this file for its per-host report.
  - Does nothing when the variable is unset.
requirements:
  - Enabled in C(callbacks_enabled) (ansible.cfg or E(ANSIBLE_CALLBACKS_ENABLED)).
author: hicache-deploy developers (@hicache-deploy)
"""

import json  # noqa: E402 (imports below the documentation, as ansible-test's validate-modules wants)
import os  # noqa: E402

from ansible.plugins.callback import CallbackBase  # noqa: E402


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "hicache_skips"
    CALLBACK_NEEDS_ENABLED = True

    def v2_runner_on_skipped(self, result):
        path = os.environ.get("HICACHE_SKIPS_FILE")
        if not path:
            return
        res = result._result
        if res.get("false_condition"):
            reason = f"condition false: {res['false_condition']}"
        else:
            reason = res.get("msg") or res.get("skip_reason") or "skipped"
        with open(path, "a") as handle:
            handle.write(json.dumps({"host": result._host.get_name(), "task": result._task.get_name(), "reason": str(reason)}) + "\n")

    v2_runner_item_on_skipped = v2_runner_on_skipped
