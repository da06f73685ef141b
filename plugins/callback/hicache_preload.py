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
  - Also loads Ansible's own filter and test plugins and this collection's filters, for the same reason. A worker
    otherwise builds the table of every builtin Jinja plugin again on its first filter or test (about a tenth of a
    worker's CPU in a no-op deploy).
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

# One filter of each of the collection's filter files (plugins/filter/*.py), and the builtin plugins they sit beside.
JINJA_PLUGINS = (("filter", "ansible.builtin.bool"), ("test", "ansible.builtin.truthy"), ("filter", "hicache.deploy.hicache_findings"),
                 ("filter", "hicache.deploy.hicache_l3_dir"), ("filter", "hicache.deploy.hicache_rolling"),
                 ("filter", "hicache.deploy.hicache_router_plan"))

for name in CORE_MODULES:
    try:
        importlib.import_module("hicachectl." + name)
    except ImportError:
        break


def _load_jinja_plugins() -> None:
    """Ansible's Jinja plugin loaders fill their tables on first use, in whichever process uses them first: here, the
    controller process, so that every worker forked after inherits them (ansible-core 2.19 plugins/loader.py,
    Jinja2Loader._ensure_non_collection_wrappers, a table of every builtin filter or test built by loading each file)."""
    from ansible.plugins.loader import filter_loader, test_loader

    loaders = {"filter": filter_loader, "test": test_loader}
    for kind, name in JINJA_PLUGINS:
        try:
            loaders[kind].get(name)
        except Exception:  # noqa: BLE001 (a speed-up only: a plugin that does not load here fails where it is used)
            pass


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "hicache_preload"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _load_jinja_plugins()
