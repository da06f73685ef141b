"""Report a step as skipped, with the reason, so hardware this host lacks never reads as ok or changed."""

from __future__ import annotations

from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        reason = str(self._task.args.get("reason", "")).strip()
        if not reason:
            return {"failed": True, "msg": "hicache_skip needs a reason"}
        return {"skipped": True, "changed": False, "skip_reason": reason, "msg": reason}
