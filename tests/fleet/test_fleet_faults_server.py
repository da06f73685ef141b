"""Faults around the server and the run itself, on two SSH hosts: every one must end in a named failure (or
a host shown *degraded* where the inventory tolerates the gap), never in "ok". SGLang needs a GPU, so start.sh
runs the SGLang stand-in (tests/standin) on the host, as in test_fleet_service.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from fleet import HEALTH_TIMEOUT, STANDIN, Fleet
from support import ROOT, cli, cli_json

pytestmark = pytest.mark.slow


SERVER_VARS = {
    "hicache_container_runtime": "none",
    "hicache_launcher": ["python3", STANDIN],
    "hicache_served_model_name": "faults",
    "hicache_page_size": 16,
    "hicache_health_timeout": HEALTH_TIMEOUT,
    "hicache_container_env": {"STANDIN_LOAD_SECONDS": "2"},
}
LOCK = "/run/hicache-deploy.lock"


@pytest.fixture(scope="module")
def fleet2(tmp_path_factory):
    fleet = Fleet(tmp_path_factory.mktemp("faults"), 2, prefix="hicache-faults").up().install_standin()
    yield fleet
    fleet.down()


def rows(text: str) -> dict[str, str]:
    """The table's row of each host, by host name."""
    return {line.split()[0]: line for line in text.splitlines() if line.startswith("hicache-faults-") and not line.split()[0].endswith(":")}


def test_status_of_a_host_never_deployed_says_so(fleet2):
    inventory = fleet2.inventory(extra_vars=SERVER_VARS, name="never")
    run = cli("status", "--inventory", str(inventory))
    assert run.returncode == 1, run.stdout + run.stderr
    for row in rows(run.stdout).values():
        assert "not deployed" in row and "/opt/sglang-hicache/cfg" in row, row
    data = cli_json("status", "--inventory", str(inventory), check_rc=1)
    assert all(h["config"] == "not deployed" and not h["ok"] for h in data["hosts"].values())


def test_strict_inventory_on_hosts_without_gpus_fails_naming_the_gpu(fleet2):
    inventory = fleet2.inventory(extra_vars={**SERVER_VARS, "hicache_strict": True}, name="strict")
    run = cli("deploy", "--inventory", str(inventory))
    assert run.returncode == 1, run.stdout[-3000:]
    for row in rows(run.stdout).values():
        assert row.split()[1] == "failed" and "gpu" in row.lower(), row
    for host in fleet2.hosts:  # refused before anything ran, and the lock is released
        assert fleet2.ssh(host, f"test -e {LOCK}").returncode == 1
        assert fleet2.ssh(host, "test -e /opt/sglang-hicache/cfg/deployed.json").returncode == 1


def test_a_test_bed_inventory_deploys_as_degraded_never_ok(fleet2):
    inventory = fleet2.inventory(extra_vars={**SERVER_VARS, "hicache_strict": False}, name="lax")
    report = cli_json("deploy", "--inventory", str(inventory))
    assert report["ok"], json.dumps(report, indent=1)[-3000:]
    for result in report["hosts"].values():
        assert result["status"] == "degraded", result
        assert any("gpu" in g["reason"].lower() for g in result["gaps"]), result["gaps"]
    text = cli("deploy", "--inventory", str(inventory), check_rc=0).stdout
    for row in rows(text).values():
        assert row.split()[1] == "degraded" and "gpu" in row.lower(), row
    assert "ok" not in {row.split()[1] for row in rows(text).values()}
    status = cli("status", "--inventory", str(inventory), check_rc=0).stdout
    assert all("(current)" in row for row in rows(status).values()), status


def test_a_stopped_server_fails_status_and_verify(fleet2):
    inventory = fleet2.inventory(extra_vars={**SERVER_VARS, "hicache_strict": False}, name="lax")
    cli("deploy", "--inventory", str(inventory), check_rc=0)
    host = sorted(fleet2.hosts)[0]
    assert fleet2.ssh(host, "systemctl stop sglang-hicache.service").returncode == 0
    try:
        status = cli("status", "--inventory", str(inventory))
        assert status.returncode == 1 and "down" in rows(status.stdout)[host] and "nothing answers /health" in rows(status.stdout)[host], status.stdout
        verify = cli("verify", "--inventory", str(inventory))
        assert verify.returncode == 1 and "verify: FAILED" in verify.stdout, verify.stdout
        assert any(line.startswith(host) and "/health" in line and " fail " in line for line in verify.stdout.splitlines()), verify.stdout
    finally:
        cli("deploy", "--inventory", str(inventory), check_rc=0)  # a deploy starts a stopped server again


def test_files_installed_without_a_restart_are_pending_restart_until_a_deploy(fleet2):
    base = {**SERVER_VARS, "hicache_strict": False}
    cli("deploy", "--inventory", str(fleet2.inventory(extra_vars=base, name="lax")), check_rc=0)
    changed = fleet2.inventory(extra_vars={**base, "hicache_served_model_name": "faults-next"}, name="next")
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    plain = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(changed), "playbooks/site.yml",
                            "--tags", "config"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert plain.returncode == 0, plain.stdout[-3000:]
    assert "pending restart" in plain.stderr  # a warning: plain ansible-playbook shows it
    status = cli("status", "--inventory", str(changed))
    assert status.returncode == 1, status.stdout
    for row in rows(status.stdout).values():
        assert "(pending restart)" in row and "hicachectl restart" in row, row
    report = cli_json("deploy", "--inventory", str(changed))  # nothing to install, but the server restarts with it
    assert report["ok"], report
    data = cli_json("status", "--inventory", str(changed))
    assert all(h["config"] == "current" and h["server_info"]["served_model_name"] == "faults-next" for h in data["hosts"].values()), data



def test_a_run_that_installs_no_config_never_restarts_the_server_onto_other_files(fleet2):
    """--skip-tags config (as --tags service): cfg/ and the unit keep the config they hold, so the server runs on as it
    is. Before roles/sglang_server/tasks/service.yml judged the restart against the config cfg/ holds and left the unit
    to the config step, it installed the inventory's unit and restarted each server onto the unchanged files, and
    recorded those as running."""
    base = {**SERVER_VARS, "hicache_strict": False}
    first = fleet2.inventory(extra_vars=base, name="kept")
    cli("deploy", "--inventory", str(first), check_rc=0)
    before = cli_json("status", "--inventory", str(first))
    changed = fleet2.inventory(extra_vars={**base, "hicache_served_model_name": "faults-other"}, name="other")
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    run = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(changed), "playbooks/site.yml",
                          "--skip-tags", "config"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:]
    recap = [line for line in run.stdout.splitlines() if line.startswith("hicache-faults-") and " : ok=" in line]
    changed_tasks = [line for line in run.stdout.splitlines() if line.startswith(("TASK", "changed"))]
    assert len(recap) == len(fleet2.hosts) and all(" changed=0 " in line for line in recap), "\n".join(recap + changed_tasks)
    after = cli_json("status", "--inventory", str(first))
    for host, state in after["hosts"].items():
        assert state["config"] == "current" and state["server_info"]["served_model_name"] == "faults", state
        was = before["hosts"][host]
        assert (state["since"], state["main_pid"]) == (was["since"], was["main_pid"]), (host, was, state)  # never restarted

def test_a_failed_start_releases_the_lock(fleet2):
    host = sorted(fleet2.hosts)[1]
    bad = fleet2.inventory(extra_vars={**SERVER_VARS, "hicache_strict": False, "hicache_served_model_name": "never",
                                       "hicache_health_timeout": 6, "hicache_container_env": {"STANDIN_NEVER_HEALTHY": "1"}}, name="bad")
    run = cli("deploy", "--inventory", str(bad), "--limit", host)
    assert run.returncode == 1 and rows(run.stdout)[host].split()[1] == "failed", run.stdout[-3000:]
    assert fleet2.ssh(host, f"test -e {LOCK}").returncode == 1, "the lock outlived a failed run"


def test_a_run_killed_midway_names_every_host_interrupted_and_releases_its_locks(fleet2):
    slow = fleet2.inventory(extra_vars={**SERVER_VARS, "hicache_strict": False, "hicache_served_model_name": "slow",
                                        "hicache_container_env": {"STANDIN_LOAD_SECONDS": "60"}}, name="slow")
    proc = subprocess.Popen([sys.executable, "-m", "hicachectl", "deploy", "--inventory", str(slow)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline, seen = time.time() + 300, ""
    while time.time() < deadline and "Wait until the server answers /health ... running" not in seen:
        seen += proc.stderr.readline()
    assert "... running" in seen, seen
    for host in fleet2.hosts:
        assert fleet2.ssh(host, f"test -e {LOCK}").returncode == 0  # held while the run is under way
    killed = subprocess.run(["pkill", "-KILL", "-f", f"ansible-playbook.*{slow}"], capture_output=True)
    assert killed.returncode == 0
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, out + err
    assert "INTERRUPTED" in out
    table = rows(out)
    assert set(table) == set(fleet2.hosts) and all(row.split()[1] == "interrupted" for row in table.values()), out
    for host in fleet2.hosts:
        assert fleet2.ssh(host, f"test -e {LOCK}").returncode == 1, f"{host}: the interrupted run left its lock"
        assert f"{host}: note: released the deploy lock of run" in out
