"""Say that this host cannot do something its inventory asks for, and why.

Under `strict` (hicache_strict, the default) the task fails with the reason. Otherwise the inventory
tolerates the gap: the task reports ok without a change, the reason travels in `hicache_gaps` (hicachectl
shows the host as *degraded*, never ok) and as a warning (plain ansible-playbook shows it). A gap is never a
skip: skipped means "not asked for". With `tolerated: false` the host could have done it and did not: the
task fails whatever `strict` says, so one task covers both cases of a check. `why_tolerated` says why a gap the
role always tolerates (strict: false whatever hicache_strict says) is tolerated, and `checked` that the host's state
was read and does not meet the request (hicachectl verify shows that check as failed and tolerated, not as a check
not made).
"""

from __future__ import annotations

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        reason = str(self._task.args.get("reason", "")).strip()
        if not reason:
            return {"failed": True, "msg": "hicache_gap needs a reason"}
        if "strict" not in self._task.args:
            return {"failed": True, "msg": "hicache_gap needs strict: the inventory's hicache_strict"}
        if not boolean(self._task.args.get("tolerated", True), strict=False):  # the host could and did not: not a gap
            return {"failed": True, "changed": False, "msg": reason}
        if boolean(self._task.args["strict"], strict=False):
            return {"failed": True, "changed": False, "msg": reason, "hicache_gaps": [reason]}
        why = str(self._task.args.get("why_tolerated") or "hicache_strict is false").strip()
        checked = boolean(self._task.args.get("checked", False), strict=False)
        return {"changed": False, "msg": reason, "hicache_gaps": [reason], "hicache_gap_outcome": {"checked": checked, "why_tolerated": why},
                "warnings": [f"degraded ({why}): {reason}"]}
