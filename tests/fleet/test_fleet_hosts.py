"""Host preparation on real SSH hosts with the `vast` profile: what can run here does, the rest is skipped with its reason."""

from __future__ import annotations

import json

import pytest
from support import cli, cli_json

pytestmark = pytest.mark.slow

HOST_FILES = "/etc/fstab /etc/nfs.conf.d /etc/modprobe.d/hicache-sunrpc.conf /etc/security/limits.d/90-hicache-memlock.conf /root/vastdata /mnt/kvcache-2ports"


def snapshot(fleet, host):
    return fleet.ssh(host, f"for f in {HOST_FILES}; do echo \"== $f\"; cat $f 2>&1 || ls -la $f 2>&1; done").stdout


def test_check_mode_on_a_fresh_host_reports_and_changes_nothing(fleet3):
    inventory = fleet3.inventory(profile="vast", name="vast-check")
    before = {h: snapshot(fleet3, h) for h in fleet3.hosts}
    report = cli_json("plan", "--inventory", str(inventory))
    assert report["ok"]
    for result in report["hosts"].values():
        tasks = {c["task"] for c in result["changes"]}
        assert "Persist the L3 mount in /etc/fstab (other lines are left as they are)" in tasks
        assert "Install start.sh, run.sh, serve.sh and the backend config" in tasks
    assert {h: snapshot(fleet3, h) for h in fleet3.hosts} == before


def test_deploy_skips_the_mount_with_its_reason_and_lays_down_the_rest(fleet3):
    inventory = fleet3.inventory(profile="vast", name="vast-deploy")
    report = cli_json("deploy", "--inventory", str(inventory))
    assert report["ok"], json.dumps(report, indent=1)[-3000:]
    host = next(iter(fleet3.hosts))
    skips = report["hosts"][host]["skips"]
    assert any(s.startswith("storage : Mount the L3 tier (cannot here): /mnt/kvcache-2ports not mounted: mount.nfs is not installed") for s in skips), skips
    assert any(s.startswith("storage : Apply the sunrpc slot tables now: sunrpc.tcp_slot_table_entries: /proc/sys/sunrpc/tcp_slot_table_entries does not exist")
               for s in skips), skips
    changed_tasks = {c["task"] for c in report["hosts"][host]["changes"]}
    assert not any(t.startswith("Mount the L3 tier") for t in changed_tasks)
    fstab = fleet3.ssh(host, "cat /etc/fstab").stdout
    assert "nfs vers=3,proto=rdma,port=20049,nconnect=32,remoteports=192.0.2.1-192.0.2.16" in fstab
    again = cli_json("deploy", "--inventory", str(inventory))
    assert all(r["changed"] == 0 for r in again["hosts"].values()), again


def test_doctor_prints_one_table_and_the_same_json(fleet3):
    inventory = fleet3.inventory(profile="vast", name="vast-doctor")
    text = cli("doctor", "--inventory", str(inventory), check_rc=0).stdout
    header = text.splitlines()[0].split()
    assert header == ["item", *sorted(fleet3.hosts)]
    assert any(line.split()[:2] == ["rpcrdma", "missing"] for line in text.splitlines())
    data = cli_json("doctor", "--inventory", str(inventory))
    assert data["exit_code"] == 0 and sorted(data["hosts"]) == sorted(fleet3.hosts)
    for host, report in data["hosts"].items():
        statuses = {c["item"]: c["status"] for c in report["checks"]}
        assert statuses["rpcrdma"] == "missing" and statuses["python"] == "ok"
        assert f"{host}: rpcrdma: " in text


def test_doctor_exit_codes_say_what_is_missing_or_unchecked(fleet3):
    strict = fleet3.inventory(profile="vast", extra_vars={"hicache_strict": True}, name="vast-strict")
    run = cli("doctor", "--inventory", str(strict))
    assert run.returncode == 1 and "missing (required)" in run.stdout and "[required by the inventory]" in run.stdout
    host = list(fleet3.hosts)[2]
    fleet3.stop(host)
    try:
        lax = fleet3.inventory(profile="vast", name="vast-lax")
        unreachable = cli("doctor", "--inventory", str(lax))
        assert unreachable.returncode == 2 and f"{host}: could not be checked" in unreachable.stdout
    finally:
        fleet3.start(host)
