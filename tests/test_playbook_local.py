"""Real ansible-playbook runs of site.yml on this machine (connection local), into a temporary base dir."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
import yaml
from support import ROOT, cli, cli_json

ANSIBLE_PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")


def playbook(base: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    """site.yml on this machine with every path the roles write under `base`; only the roles that
    write there (config, storage): the others would change this machine's /etc."""
    return subprocess.run([ANSIBLE_PLAYBOOK, "-i", "inventories/local", "playbooks/site.yml", "--tags", "config,storage",
                           "-e", f"hicache_base_dir={base}", "-e", f"hicache_cache_dir={base}/l3", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def recap(stdout: str) -> dict[str, int]:
    line = re.search(r"^localhost\s*:(.*)$", stdout, re.M).group(1)
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


@pytest.fixture
def base(tmp_path) -> pathlib.Path:
    return tmp_path / "hicache"


@pytest.mark.slow  # a whole site.yml run (10-25 s)
def test_converge_then_second_run_changes_nothing(base):
    first = playbook(base)
    assert first.returncode == 0, first.stdout + first.stderr
    # two tasks: the L3 dir (with the storage role's files), the launch files (start.sh, run.sh) with their cfg dir
    assert recap(first.stdout)["changed"] == 2
    assert (base / "l3").is_dir()
    start = (base / "cfg/start.sh").read_text()
    assert "--hicache-storage-backend file" in start and os.access(base / "cfg/start.sh", os.X_OK)
    second = playbook(base)
    assert second.returncode == 0 and recap(second.stdout)["changed"] == 0, second.stdout


@pytest.mark.slow  # a whole site.yml run (10-25 s)
def test_an_existing_script_is_backed_up_not_lost(base):
    (base / "cfg").mkdir(parents=True)
    (base / "cfg/start.sh").write_text("#!/bin/sh\n# hand-made\n")
    run = playbook(base)
    assert run.returncode == 0, run.stdout
    backups = [p for p in (base / "cfg").iterdir() if p.name.startswith("start.sh.") and p.name != "start.sh"]
    assert [b.read_text() for b in backups] == ["#!/bin/sh\n# hand-made\n"]


@pytest.mark.slow  # four site.yml runs
def test_config_changes_leave_no_backup_clutter_beside_the_hand_made_one(base):
    """#34: each change used to leave a backup of every changed file in cfg/. Only the first install, over files the
    toolkit did not write, keeps one."""
    (base / "cfg").mkdir(parents=True)
    (base / "cfg/start.sh").write_text("#!/bin/sh\n# hand-made\n")
    for port in (30001, 30002, 30003, 30004):
        run = playbook(base, "-e", f"{{\"hicache_port\": {port}}}")  # JSON: an integer, as the inventory gives it
        assert run.returncode == 0 and recap(run.stdout)["changed"] > 0, run.stdout
        assert f"--port {port}" in (base / "cfg/start.sh").read_text()
        # #34: the server's L3 directory (its namespace under the tier), removed under the server (a prune), is made
        # again by the next deploy, not only by the server's next start (no server runs here: these are the deploy's)
        [namespace] = [p for p in (base / "l3").iterdir() if p.is_dir()]
        assert str(namespace) == json.loads((base / "cfg/installed.json").read_text())["l3_dir"]  # the server's own
        if port == 30002:
            namespace.rmdir()
    backups = sorted(p.name for p in (base / "cfg").iterdir() if p.name.endswith("~"))
    assert len(backups) == 1 and backups[0].startswith("start.sh."), backups
    assert (base / "cfg" / backups[0]).read_text() == "#!/bin/sh\n# hand-made\n"


@pytest.mark.slow  # two site.yml runs
def test_backups_an_earlier_release_left_are_removed_and_the_operators_kept(base):
    """#34: before one previous config was kept, each change left a backup of every changed file in cfg/ (and
    cfg.previous/). A deploy now removes those (files only the toolkit writes, or with its header), keeps the backup
    of the operator's own start.sh, restarts nothing for it, and the next run changes nothing."""
    cfg = base / "cfg"
    cfg.mkdir(parents=True)
    (cfg / "start.sh").write_text("#!/bin/sh\n# hand-made\n")
    ours = {"start.sh.4242.2026-11-30@10:00:00~": "#!/usr/bin/env bash\n# Rendered by hicache-deploy for localhost from its inventory\n",
            "installed.json.4242.2026-11-30@10:00:00~": '{"config_hash": "old"}\n'}
    theirs = {"start.sh.77.2026-11-01@09:00:00~": "#!/bin/sh\n# an operator's earlier start.sh\n",
              "start.sh.bak": "#!/usr/bin/env bash\n# Rendered by hicache-deploy, copied by hand\n"}  # not a backup of Ansible's
    for name, text in {**ours, **theirs}.items():
        (cfg / name).write_text(text)
    first = playbook(base)
    assert first.returncode == 0, first.stdout + first.stderr
    left = {p.name for p in cfg.iterdir()}
    assert not left & set(ours) and set(theirs) <= left, sorted(left)
    # and the backup of the hand-made start.sh this first install replaced
    assert [n for n in left - set(theirs) if n.startswith("start.sh.") and n.endswith("~")], sorted(left)
    again = playbook(base)
    assert again.returncode == 0 and recap(again.stdout)["changed"] == 0, again.stdout


@pytest.mark.slow  # a whole site.yml run (10-25 s)
def test_check_mode_reports_and_changes_nothing(base):
    run = playbook(base, "--check", "--diff")
    assert run.returncode == 0, run.stdout
    assert recap(run.stdout)["changed"] == 2 and f"+++ after: {base}/cfg/start.sh" in run.stdout  # as the converge above
    assert not base.exists()


STORAGE_FILES = "Create the L3 directory, persist the NFS client's tuning (nfsrahead, rpcrdma at boot) and the tier's kernel values"


@pytest.mark.slow  # a whole site.yml run (10-25 s)
def test_plan_shows_the_planned_files_and_touches_nothing(tmp_path, base):
    inventory = tmp_path / "inv"
    cli("init", "--profile", "local", "--hosts", "localhost", "--out", str(inventory), check_rc=0)
    group_vars = inventory / "group_vars/all.yml"
    settings = yaml.safe_load(group_vars.read_text()) | {"hicache_base_dir": str(base), "hicache_cache_dir": f"{base}/l3"}
    group_vars.write_text(yaml.safe_dump(settings))  # a key written twice would be refused
    proc = cli("plan", "--inventory", str(inventory), "--diff", check_rc=0)
    assert "localhost: would change: Install start.sh, run.sh, serve.sh and the backend config [start.sh]" in proc.stdout
    assert "+  --hicache-storage-backend file" in proc.stdout
    # No GPU and no container engine here: the local profile tolerates it, so localhost is degraded, never ok.
    assert re.search(r"^localhost\s+degraded\s+\d+\s+\d+\s+0\s.*gpus: ", proc.stdout, re.M), proc.stdout
    assert not base.exists()
    report = cli_json("plan", "--inventory", str(inventory), "--no-diff")
    host = report["hosts"]["localhost"]
    assert report["ok"] and report["check"] and host["status"] == "degraded" and host["changed"] > 0
    assert any(g["reason"].startswith("gpus: ") for g in host["gaps"]), host["gaps"]
    planned = {(c["task"], c["item"]) for c in host["changes"]}
    assert {(STORAGE_FILES, "L3 directory"), ("Install start.sh, run.sh, serve.sh and the backend config", "config directory"),
            ("Install start.sh, run.sh, serve.sh and the backend config", "start.sh"), ("Install start.sh, run.sh, serve.sh and the backend config", "run.sh")} <= planned


@pytest.mark.slow  # a whole site.yml run (10-25 s)
def test_plan_of_the_builtin_local_inventory():
    """README command 1's last step, exactly: it succeeds here and shows the files for localhost."""
    before = {p: os.path.exists(p) for p in ("/opt/sglang-hicache", "/mnt/nvme/sglang-hicache")}
    proc = cli("plan", "--inventory", "local", check_rc=0)
    # one line per change, with its size (#34: the content is --diff's)
    assert "localhost: would change: Install start.sh, run.sh, serve.sh and the backend config [start.sh]" in proc.stdout
    assert {p: os.path.exists(p) for p in before} == before


def test_syntax_check_of_every_playbook():
    for path in sorted((ROOT / "playbooks").glob("*.yml")):
        proc = subprocess.run([ANSIBLE_PLAYBOOK, "--syntax-check", "-i", "inventories/local", str(path)],
                              cwd=ROOT, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


def test_argument_specs_match_the_catalogue():
    proc = subprocess.run([sys.executable, "-m", "hicachectl.config.schema"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, "argument_specs drifted from hicachectl/config/schema.py; run python -m hicachectl.config.schema --write\n" + proc.stdout
    specs = yaml.safe_load((ROOT / "roles/sglang_server/meta/argument_specs.yml").read_text())
    assert specs["argument_specs"]["main"]["options"]["hicache_image"]["required"] is True
