"""Host preparation on real SSH hosts with the `vast` profile, which is strict: these hosts have none of its
hardware (no GPU, ConnectX, RDMA, NFS client), so a deploy fails naming what is missing; with
hicache_strict: false what can run here does, and each step that cannot is a named gap (the host degraded)."""

from __future__ import annotations

import json

import pytest
from support import cli, cli_json

pytestmark = pytest.mark.slow

HOST_FILES = "/etc/fstab /etc/nfs.conf.d /etc/modules-load.d /etc/sysctl.d/90-hicache-storage.conf /etc/security/limits.d/90-hicache-memlock.conf /root/vastdata /mnt/kvcache-2ports"
TOLERANT = {"hicache_strict": False}
VAST_FSTAB = "nfs vers=3,proto=rdma,port=20049,nconnect=32,remoteports=10.255.2.1-10.255.2.16"  # the profile's placeholders filled in (tests/infra/fleet.py)


def snapshot(fleet, host):
    return fleet.ssh(host, f"for f in {HOST_FILES}; do echo \"== $f\"; cat $f 2>&1 || ls -la $f 2>&1; done").stdout


def test_check_mode_on_a_fresh_host_reports_and_changes_nothing(fleet3):
    inventory = fleet3.inventory(profile="vast", extra_vars=TOLERANT, name="vast-check")
    before = {h: snapshot(fleet3, h) for h in fleet3.hosts}
    report = cli_json("plan", "--inventory", str(inventory))
    assert report["ok"]
    for result in report["hosts"].values():
        tasks = {c["task"] for c in result["changes"]}
        assert "Persist the L3 mount in /etc/fstab (other lines are left as they are)" in tasks
        assert "Install start.sh, run.sh, serve.sh and the backend config" in tasks
    assert {h: snapshot(fleet3, h) for h in fleet3.hosts} == before


def test_a_strict_deploy_fails_naming_the_missing_hardware_and_touches_nothing(fleet3):
    # The server on the host itself (no container runtime), so that preflight is the first to judge the host.
    on_host = {"hicache_container_runtime": "none", "hicache_cache_container_dir": None, "hicache_model_dir": None}
    inventory = fleet3.inventory(profile="vast", extra_vars=on_host, name="vast-strict-deploy")
    run = cli("deploy", "--inventory", str(inventory))
    assert run.returncode == 1, run.stdout + run.stderr
    report = cli_json("deploy", "--inventory", str(inventory), check_rc=1)
    for host, result in report["hosts"].items():
        assert result["status"] == "failed" and result["gaps"] == [], result
        for missing in ("gpus: nvidia-smi not found (needed for an SGLang server)", "rpcrdma: no rpcrdma module for this kernel",
                        "nfs_client: mount.nfs is not installed", "connectx: no mlx5_core / 0x15b3 interface"):
            assert missing in result["reason"], result["reason"]
        assert VAST_FSTAB not in fleet3.ssh(host, "cat /etc/fstab").stdout
    assert "gpus: nvidia-smi not found" in run.stdout


def test_a_tolerant_deploy_is_degraded_with_each_gap_named_and_lays_down_the_rest(fleet3):
    inventory = fleet3.inventory(profile="vast", extra_vars=TOLERANT, name="vast-deploy")
    report = cli_json("deploy", "--inventory", str(inventory))
    assert report["ok"], json.dumps(report, indent=1)[-3000:]
    host = next(iter(fleet3.hosts))
    result = report["hosts"][host]
    assert result["status"] == "degraded"
    gaps = [g["reason"] for g in result["gaps"]]
    assert "/mnt/kvcache-2ports is not mounted: this host cannot mount it: mount.nfs is not installed (package nfs-common / nfs-utils)" in gaps, gaps
    # NFS over RDMA's slot table (xprtrdma's, not the TCP one): these hosts have no rpcrdma to load.
    assert ("sunrpc.rdma_slot_table_entries: /proc/sys/sunrpc/rdma_slot_table_entries does not exist on this host "
            "(no such sysctl, or its module is not loaded)") in gaps, gaps
    assert any(g.startswith("read-ahead is set on the live mount only, not persistent") for g in gaps), gaps
    assert any(g.startswith("gpus: nvidia-smi not found") for g in gaps) and any(g.startswith("rpcrdma: no rpcrdma module") for g in gaps), gaps
    assert any(g.startswith("interfaces: no ConnectX port") for g in gaps), gaps
    changed_tasks = {c["task"] for c in result["changes"]}
    assert not any(t.startswith("Mount the L3 tier") for t in changed_tasks)
    assert VAST_FSTAB in fleet3.ssh(host, "cat /etc/fstab").stdout
    again = cli_json("deploy", "--inventory", str(inventory))
    assert all(r["changed"] == 0 and r["status"] == "degraded" for r in again["hosts"].values()), again


def test_doctor_prints_one_table_and_the_same_json(fleet3):
    inventory = fleet3.inventory(profile="vast", name="vast-doctor")
    text = cli("doctor", "--inventory", str(inventory), check_rc=1).stdout
    header = text.splitlines()[0].split()
    assert header == ["item", *sorted(fleet3.hosts)]
    assert any(line.split()[:3] == ["rpcrdma", "missing", "(required)"] for line in text.splitlines())
    data = cli_json("doctor", "--inventory", str(inventory), check_rc=1)
    assert data["exit_code"] == 1 and sorted(data["hosts"]) == sorted(fleet3.hosts)
    for host, report in data["hosts"].items():
        statuses = {c["item"]: c["status"] for c in report["checks"]}
        assert statuses["rpcrdma"] == "missing" and statuses["python"] == "ok" and report["status"] == "missing"
        assert f"{host}: rpcrdma: " in text


def test_doctor_judges_router_hosts_in_their_own_column_with_values(fleet3):
    """#34: a router host has its own column (OS, Python and its venv support, systemd, disk), and a check that
    passed shows what was found, not only `ok`."""
    *servers, router = list(fleet3.hosts)
    # each server at its own address: the test hosts all answer SSH on 127.0.0.1, one port each (rules/fleet.py worker-url-shared)
    inventory = fleet3.inventory(profile="vast", name="vast-doctor-router", routers=(router,),
                                 host_vars={s: {"hicache_worker_url": f"http://{fleet3.address(s)}:30000"} for s in servers})
    text = cli("doctor", "--inventory", str(inventory), check_rc=1).stdout
    assert text.splitlines()[0].split() == ["item", *sorted(servers), router]
    data = cli_json("doctor", "--inventory", str(inventory), check_rc=1)
    judged = {c["item"]: c for c in data["hosts"][router]["checks"]}
    assert {"os", "kernel", "python", "systemd", "python_venv", "disk"} <= set(judged), judged
    assert judged["systemd"]["status"] == "ok" and judged["python"]["status"] == "ok" and data["hosts"][router]["status"] == "ok"
    assert "rpcrdma" not in judged  # a router mounts no tier
    python_row = next(line for line in text.splitlines() if line.startswith("python "))
    assert "ok: 3." in python_row and " ok " not in f"{python_row} "  # the version found, on every host


def test_doctor_exit_codes_say_what_is_missing_or_unchecked(fleet3):
    strict = fleet3.inventory(profile="vast", name="vast-strict")
    run = cli("doctor", "--inventory", str(strict))
    assert run.returncode == 1 and "missing (required)" in run.stdout and "[required by the inventory]" in run.stdout
    lax = fleet3.inventory(profile="vast", extra_vars=TOLERANT, name="vast-lax")
    assert cli("doctor", "--inventory", str(lax)).returncode == 1  # doctor judges what is needed, however strict
    host = list(fleet3.hosts)[2]
    fleet3.stop(host)
    try:
        unreachable = cli("doctor", "--inventory", str(lax))
        assert unreachable.returncode == 2 and f"{host}: could not be checked" in unreachable.stdout
    finally:
        fleet3.start(host)
