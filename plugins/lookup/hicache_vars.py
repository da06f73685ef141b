# Copyright: hicache-deploy developers
# SPDX-License-Identifier: Apache-2.0
"""Every `hicache_*` variable visible to the task, templated: inventory, play, role and extra vars alike.

`hostvars[inventory_hostname]` holds only host-level variables; a role's `vars:` or a play's would be
missed. Tasks pass this lookup's result to the hicache filters instead.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: hicache_vars
short_description: The task's hicache_* variables, templated
description:
  - Returns one mapping of every variable visible to the task whose name starts with C(hicache_), templated.
  - Inventory, play, role and extra variables alike; C(hostvars[inventory_hostname]) holds only the host-level ones.
  - Takes no terms; any given are ignored.
author: hicache-deploy developers (@hicache-deploy)
"""

EXAMPLES = r"""
- name: Decide what the model role does on this host
  ansible.builtin.set_fact:
    model_plan: "{{ lookup('hicache.deploy.hicache_vars') | hicache.deploy.hicache_model(inventory_hostname) }}"
"""

RETURN = r"""
_raw:
  description: One mapping of variable name to its templated value.
  type: list
  elements: dict
"""

from ansible.plugins.lookup import LookupBase  # noqa: E402 (below the documentation, as ansible-test's validate-modules wants)

try:
    from hicachectl.config.schema import FACTS  # what the roles set (hicache_facts, the reports): not inventory variables
except ImportError:  # pragma: no cover - the filters name the missing package; templating these is only slower
    FACTS = {}


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        # The facts the roles set are large (every interface, every file the host facts read) and no filter reads them
        # from here: templating them on every call was most of a plan's cost.
        names = [name for name in (variables or {}) if name.startswith("hicache_") and name not in FACTS]
        return [{name: self._templar.template(variables[name]) for name in names}]
