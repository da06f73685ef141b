# Copyright: hicache-deploy developers
# SPDX-License-Identifier: Apache-2.0
"""Load hicachectl's core once, in the controller process, before any task runs.

Ansible runs each task of each host in a worker forked from the controller process. A hicache filter imports the
core (hicachectl) when first used; in a fork that import is lost with the fork, so every task planning with the
core paid it again (about half of each plan's cost). Imported here, in the parent, every fork inherits it.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: hicache_preload
type: aggregate
short_description: Load hicache-deploy's core once in the controller process
description:
  - Imports the Python package hicache-deploy (hicachectl), which the collection's filters use, in the controller process
    when the callback loads, so the workers Ansible forks for each task inherit it instead of importing it per task.
  - Does nothing else, and nothing at all when the package is not installed (the filters then name it).
requirements:
  - Enabled in C(callbacks_enabled) (ansible.cfg or E(ANSIBLE_CALLBACKS_ENABLED)).
author: hicache-deploy developers (@hicache-deploy)
"""

import importlib  # noqa: E402 (imports below the documentation, as ansible-test's validate-modules wants)

from ansible.plugins.callback import CallbackBase  # noqa: E402

# The modules the collection's filter plugins import (plugins/filter/*.py).
CORE_MODULES = ("config.deployment", "config.inventory", "config.namespace", "config.schema", "config.secrets", "ops.l3", "ops.metrics",
                "ops.rolling", "ops.verify", "plans.container_runtime", "plans.host_limits", "plans.launch", "plans.model",
                "plans.nic_tuning", "plans.plan", "plans.preflight", "plans.router", "plans.sglang_image", "plans.sglang_server",
                "plans.storage", "plans.storage_live", "rules")

for name in CORE_MODULES:
    try:
        importlib.import_module("hicachectl." + name)
    except ImportError:
        break


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "hicache_preload"
    CALLBACK_NEEDS_ENABLED = True
