"""sglang_server's plan of cfg/: the backups an earlier release left (#34: no backup clutter), judged from the host
facts, and the host facts' listing of them (hicache_host_facts' backups)."""

from __future__ import annotations

import importlib.util
import os

from helpers import deployment
from support import ROOT

from hicachectl.plans import sglang_server
from hicachectl.plans.plan import as_fact


def _facts_module():
    spec = importlib.util.spec_from_file_location("hicache_host_facts", ROOT / "plugins/modules/hicache_host_facts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_only_the_backups_of_files_the_toolkit_wrote_are_stale_and_none_restarts_the_server():
    d = deployment("local")
    cfg, previous = d.cfg_dir.rstrip("/"), d.cfg_dir.rstrip("/") + ".previous"
    header = "#!/usr/bin/env bash\n# Rendered by hicache-deploy for gpu-01 from its inventory; change the inventory, not this file.\n"
    backups = {f"{cfg}/start.sh.4242.2026-11-30@10:00:00~": header, f"{cfg}/installed.json.9.2026-11-30@10:00:00~": '{"config_hash": "x"}',
               f"{previous}/deployed.json.9.2026-11-30@10:00:01~": "{}", f"{previous}/run.sh.5.2026-11-29@08:00:00~": header,
               f"{cfg}/start.sh.77.2026-11-01@09:00:00~": "#!/bin/sh\n# the operator's own\n"}
    stale = sglang_server.stale_backups(d, {"backups": backups})
    assert stale == sorted(p for p in backups if "77" not in p), stale
    plan = as_fact(sglang_server.server_plan(d, facts={"systemd": True, "tools": {}, "files": {}, "backups": backups}))
    assert set(stale) <= set(plan["absent_secret_files"])  # removed in the launch files' one step
    # what restarts the server is a file's label, never a removed backup's (hicache_files labels it by its name)
    assert not {os.path.basename(p) for p in stale} & set(plan["restart_items"])
    assert {"start.sh", "run.sh", "secrets.env"} <= set(plan["restart_items"]) and "config directory" not in plan["restart_items"]
    # the files whose backups the host facts list: the public ones in cfg/ and cfg.previous/, never a secret file
    listed = sglang_server.backed_up_files(d)
    assert f"{cfg}/start.sh" in listed and f"{previous}/installed.json" in listed and f"{cfg}/deployed.json" in listed
    assert not [p for p in listed if os.path.basename(p) in ("secrets.env", "server_secrets.yaml")]


def test_the_host_facts_list_ansibles_backups_beside_each_file_with_their_first_lines(tmp_path):
    (tmp_path / "start.sh").write_text("now\n")
    (tmp_path / "start.sh.4242.2026-11-30@10:00:00~").write_text("line 1\nline 2\nline 3\nline 4\n")
    (tmp_path / "start.sh.bak").write_text("a copy by hand\n")
    (tmp_path / "start.sh.x.2026-11-30@10:00:00~").write_text("not a pid\n")
    (tmp_path / "other.sh.1.2026-11-30@10:00:00~").write_text("not asked for\n")
    found = _facts_module().backups([str(tmp_path / "start.sh"), str(tmp_path / "missing-dir/start.sh")])
    assert found == {str(tmp_path / "start.sh.4242.2026-11-30@10:00:00~"): "line 1\nline 2\nline 3\n"}
