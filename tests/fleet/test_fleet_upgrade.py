"""Upgrades that stay declarative (issue #24, items 1 and 2), on two SSH hosts serving SGLang's stand-in
(hicache_container_runtime none, as tests/fleet/test_fleet_service.py): the image lives in the inventory, so after
`upgrade` a `plan` shows nothing to do and a `deploy` changes nothing; `rollback` right after it puts the previous
image back on every host (with runtime none an image change rewrites installed.json only, and left no step back);
an image the inventory does not pin is refused before any host is contacted; a downgrade is named by `plan` and
done by `deploy` only with --allow-downgrade."""

from __future__ import annotations

import json

import pytest
from fleet import HEALTH_TIMEOUT, STANDIN, Fleet
from support import cli, cli_json

pytestmark = pytest.mark.slow

OLD, NEW = "lmsysorg/sglang:v0.5.21-cu129", "lmsysorg/sglang:v0.5.23-cu129"
SERVICE_VARS = {
    "hicache_container_runtime": "none",
    "hicache_launcher": ["python3", STANDIN],
    "hicache_served_model_name": "upgrade",
    "hicache_page_size": 16,
    "hicache_health_timeout": HEALTH_TIMEOUT,
    "hicache_container_env": {"STANDIN_LOAD_SECONDS": "1"},
}


@pytest.fixture(scope="module")
def fleet2(tmp_path_factory):
    fleet = Fleet(tmp_path_factory.mktemp("fleet-upgrade"), 2, prefix="hicache-upgrade").up()
    try:
        yield fleet.install_standin()
    finally:
        fleet.down()


def inventories(fleet):
    return (fleet.inventory(extra_vars={**SERVICE_VARS, "hicache_image": OLD}, name="old"),
            fleet.inventory(extra_vars={**SERVICE_VARS, "hicache_image": NEW}, name="new"))


def running(fleet, host) -> dict:
    return json.loads(fleet.ssh(host, "cat /opt/sglang-hicache/cfg/deployed.json").stdout)


def main_pid(fleet, host):
    return fleet.ssh(host, "systemctl show --property=MainPID --value sglang-hicache.service").stdout.strip()


def healthy(fleet, host) -> bool:
    probe = "python3 -c \"import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:30000/health').status)\""
    return fleet.ssh(host, probe).stdout.strip() == "200"


def test_upgrade_leaves_nothing_to_plan_or_deploy_and_rollback_restores_the_previous_image_everywhere(fleet2):
    old, new = inventories(fleet2)
    hosts = sorted(fleet2.hosts)
    cli("deploy", "--inventory", str(old), check_rc=0)
    assert {running(fleet2, h)["image"] for h in hosts} == {OLD}

    # The new image is set in the inventory, then rolled out; --image is the operator's expectation, checked.
    cli("upgrade", "--image", NEW, "--inventory", str(new), check_rc=0)
    assert {running(fleet2, h)["image"] for h in hosts} == {NEW}
    pids = {h: main_pid(fleet2, h) for h in hosts}

    plan = cli_json("plan", "--inventory", str(new))  # no drift: the inventory is what runs
    assert plan["ok"] and {h: r["changed"] for h, r in plan["hosts"].items()} == dict.fromkeys(hosts, 0), plan
    again = cli_json("deploy", "--inventory", str(new))
    assert again["ok"] and {h: r["changed"] for h, r in again["hosts"].items()} == dict.fromkeys(hosts, 0), again
    assert {h: main_pid(fleet2, h) for h in hosts} == pids  # nothing restarted

    # One step back exists after the upgrade on every host, though only installed.json's image changed.
    back = cli("rollback", "--inventory", str(new))
    assert back.returncode == 0, back.stdout + back.stderr
    for host in hosts:
        assert running(fleet2, host)["image"] == OLD, host
        assert main_pid(fleet2, host) != pids[host] and healthy(fleet2, host)


def test_upgrade_refuses_an_image_the_inventory_does_not_pin_before_any_host_is_contacted(fleet2):
    old, _ = inventories(fleet2)
    host = sorted(fleet2.hosts)[0]
    before = fleet2.ssh(host, "cat /opt/sglang-hicache/cfg/installed.json 2>/dev/null; ls /run/hicache-deploy.lock 2>&1").stdout
    run = cli("upgrade", "--image", NEW, "--inventory", str(old))
    assert run.returncode == 1, run.stdout + run.stderr
    refusal = [line for line in run.stderr.splitlines() if "[upgrade-image]" in line]
    assert len(refusal) == 1, run.stderr  # one line for the hosts alike, naming them, the variable and the fix
    assert f"{len(fleet2.hosts)} hosts {host[:-2]}-[1:2], hicache_image: upgrade --image {NEW} is not the image the inventory pins ({OLD})" in refusal[0]
    assert f"Fix: set hicache_image: {NEW} in the inventory" in refusal[0]
    assert "no host was contacted" in run.stderr and "running site.yml" not in run.stderr
    assert fleet2.ssh(host, "cat /opt/sglang-hicache/cfg/installed.json 2>/dev/null; ls /run/hicache-deploy.lock 2>&1").stdout == before


def test_a_downgrade_is_named_by_plan_and_deployed_only_when_asked_for(fleet2):
    old, new = inventories(fleet2)
    hosts = sorted(fleet2.hosts)
    cli("deploy", "--inventory", str(new), check_rc=0)
    pids = {h: main_pid(fleet2, h) for h in hosts}

    plan = cli("plan", "--inventory", str(old))
    assert plan.returncode == 0, plan.stdout + plan.stderr
    # for CI to gate on: a change deploy would refuse is an error (Terraform's -detailed-exitcode: 1)
    gated = cli("plan", "--inventory", str(old), "--detailed-exitcode")
    assert gated.returncode == 1, gated.stdout + gated.stderr
    for host in hosts:
        assert (f"{host}: note: the server runs SGLang 0.5.23 (image {NEW}) and the inventory pins the older 0.5.21 "
                f"(hicache_image {OLD}): a downgrade; deploy refuses it without --allow-downgrade") in plan.stdout, plan.stdout

    refused = cli_json("deploy", "--inventory", str(old), check_rc=1)
    for host in hosts:
        assert refused["hosts"][host]["status"] == "failed"
        assert "a downgrade, refused before anything on this host changed" in refused["hosts"][host]["reason"]
        assert "--allow-downgrade" in refused["hosts"][host]["reason"]
        assert running(fleet2, host)["image"] == NEW and main_pid(fleet2, host) == pids[host]
        assert fleet2.ssh(host, "test -e /run/hicache-deploy.lock").returncode == 1  # the refused run left no lock

    asked = cli("deploy", "--allow-downgrade", "--inventory", str(old))
    assert asked.returncode == 0, asked.stdout + asked.stderr
    assert {running(fleet2, h)["image"] for h in hosts} == {OLD}
    assert "a downgrade, asked for (--allow-downgrade)" in asked.stdout
