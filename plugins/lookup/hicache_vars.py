"""Every `hicache_*` variable visible to the task, templated: inventory, play, role and extra vars alike.

`hostvars[inventory_hostname]` holds only host-level variables; a role's `vars:` or a play's would be
missed. Tasks pass this lookup's result to the hicache filters instead.
"""

from __future__ import annotations

from ansible.plugins.lookup import LookupBase

DOCUMENTATION = r"""
name: hicache_vars
short_description: The task's hicache_* variables, templated
description: Returns one mapping of every variable whose name starts with hicache_.
"""


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        names = [name for name in (variables or {}) if name.startswith("hicache_")]
        return [{name: self._templar.template(variables[name]) for name in names}]
