"""Tell the operator something that happened on a host and changed nothing by itself (a fallback
taken, a restart that is still needed); hicachectl prints these notes under the host's results."""

from __future__ import annotations

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        note = str(self._task.args.get("note", "")).strip()
        result = {"changed": False, "msg": note, "hicache_note": note}
        if boolean(self._task.args.get("warn", False), strict=False):  # plain ansible-playbook shows warnings, not msg
            result["warnings"] = [note]
        return result
