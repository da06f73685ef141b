"""Count, per host, the tasks that ran a module on the host (bench/fleet_deploy.py reads $HICACHE_BENCH_COUNT_FILE).

A task ran on the host when its result carries the module's `invocation` (every module run by AnsiballZ) or when its
action runs a program there itself (script, raw); set_fact, debug, assert and the hicache_gap/hicache_note actions
run on the controller and carry neither.
"""

from __future__ import annotations

import collections
import json
import os

from ansible.plugins.callback import CallbackBase

HOST_ACTIONS = ("ansible.builtin.script", "script", "ansible.builtin.raw", "raw")


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "bench_count"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.module_runs = collections.Counter()

    def _count(self, result):
        if "invocation" in result._result or result._task.action in HOST_ACTIONS:
            self.module_runs[result._host.get_name()] += 1

    def v2_runner_on_ok(self, result):
        self._count(result)

    v2_runner_on_failed = v2_runner_item_on_ok = v2_runner_item_on_failed = v2_runner_on_ok

    def v2_playbook_on_stats(self, stats):
        path = os.environ.get("HICACHE_BENCH_COUNT_FILE")
        if path:
            with open(path, "w") as handle:
                json.dump(self.module_runs, handle)
