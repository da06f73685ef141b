"""The hicache_preload callback (plugins/callback/hicache_preload.py) loads, in the controller process, what every forked
worker would otherwise load again: hicachectl's core, Ansible's table of builtin Jinja plugins, the collection's filters."""

from __future__ import annotations

import subprocess
import sys

from support import ROOT

PROBE = f"""
import sys
from ansible.plugins.loader import callback_loader, filter_loader, init_plugin_loader, test_loader
init_plugin_loader([{str(ROOT / ".ansible/collections")!r}])
callback_loader.add_directory({str(ROOT / "plugins/callback")!r})
assert not filter_loader._cached_non_collection_wrappers and not test_loader._cached_non_collection_wrappers
callback = callback_loader.get("hicache_preload")
callback.__class__()
module = sys.modules[callback.__class__.__module__]
loaders = {{"filter": filter_loader, "test": test_loader}}
missing = [name for kind, name in module.JINJA_PLUGINS if loaders[kind].get(name) is None]
assert not missing, missing
# the tables a worker would otherwise build on its first filter or test
assert "bool" in filter_loader._cached_non_collection_wrappers and "truthy" in test_loader._cached_non_collection_wrappers
assert "hicachectl.plans.storage" in sys.modules
print("ok")
"""


def test_the_controller_process_loads_the_jinja_plugins_before_any_worker_forks():
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr
