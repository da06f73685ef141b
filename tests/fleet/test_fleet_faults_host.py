"""Host faults on a real SSH test host: each must fail (strict) or show as a named gap (not strict), never pass.

The host is a systemd container with CAP_SYS_ADMIN, so the storage role really mounts its L3 tier. What can
be mounted here honestly is a local tier on tmpfs (hicache_storage_device: tmpfs): the same fstab block, the
same `mount <point>` and the same /proc/self/mountinfo comparison as an NVMe device; NFS cannot be mounted
(the kernel of this machine has no NFS client). It has no GPU: a stand-in `nvidia-smi`, named as such,
lets a strict preflight pass, so that a strict deploy reaches the role whose fault is tested; the server is
the SGLang stand-in run on the host (hicache_container_runtime: none), as in test_fleet_service.py.
"""

from __future__ import annotations

import json

import pytest
from fleet import HEALTH_TIMEOUT, STANDIN, Fleet
from support import cli, cli_json

pytestmark = pytest.mark.slow

GPU_STANDIN = "/usr/local/bin/nvidia-smi"
L3 = "/mnt/nvme/sglang-hicache"
SERVED = {
    "hicache_strict": True,
    "hicache_container_runtime": "none",
    "hicache_launcher": ["python3", STANDIN],
    "hicache_served_model_name": "gpt-oss-20b",
    "hicache_page_size": 16,
    "hicache_health_timeout": HEALTH_TIMEOUT,
    "hicache_container_env": {"STANDIN_LOAD_SECONDS": "1"},
}
TMPFS_TIER = {"hicache_storage_device": "tmpfs", "hicache_storage_fstype": "tmpfs"}


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """One test host with CAP_SYS_ADMIN, the SGLang stand-in and a stand-in nvidia-smi: (fleet, name)."""
    fleet = Fleet(tmp_path_factory.mktemp("faults"), 1, prefix="hicache-faults", caps=("SYS_ADMIN",)).up().install_standin()
    name = next(iter(fleet.hosts))
    gpu = ("#!/bin/sh\n# Stand-in for nvidia-smi in hicache-deploy's fault tests: this test host has no GPU.\n"
           'echo "GPU 0: hicache-deploy test stand-in, not a GPU (UUID: GPU-00000000-0000-0000-0000-000000000000)"\n')
    assert fleet.ssh(name, f"cat > {GPU_STANDIN} <<'GPU_EOF'\n{gpu}GPU_EOF\nchmod 0755 {GPU_STANDIN}").returncode == 0
    yield fleet, name
    fleet.down()


def host_json(report: dict, name: str) -> dict:
    return report["hosts"][name]


def check(verify_report: dict, name: str, item: str | None = None, detail: str | None = None) -> dict:
    """One of verify's checks of a host, by its name or its detail."""
    checks = [c for c in verify_report["hosts"][name]["checks"] if c["check"] == item or (detail is not None and c["detail"] == detail)]
    assert checks, json.dumps(verify_report, indent=1)[-3000:]
    return checks[0]


def test_a_removed_l3_mount_fails_verify_naming_the_mount(host):
    fleet, name = host
    inventory = fleet.inventory(profile="local", extra_vars={**SERVED, **TMPFS_TIER}, name="l3-tmpfs")
    deployed = cli_json("deploy", "--inventory", str(inventory))
    assert host_json(deployed, name)["status"] == "changed" and host_json(deployed, name)["gaps"] == [], deployed
    assert fleet.ssh(name, f"findmnt -n -o FSTYPE,SOURCE {L3}").stdout.split() == ["tmpfs", "tmpfs"]
    assert f"tmpfs {L3} tmpfs defaults,nofail,x-systemd.mount-timeout=60 0 2" in fleet.ssh(name, "cat /etc/fstab").stdout
    passed = cli_json("verify", "--inventory", str(inventory))
    assert passed["exit_code"] == 0 and host_json(passed, name)["status"] == "passed", passed

    assert fleet.ssh(name, f"umount {L3}").returncode == 0
    run = cli("verify", "--inventory", str(inventory))
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"nothing is mounted at {L3} (the inventory mounts tmpfs there)" in run.stdout
    failed = cli_json("verify", "--inventory", str(inventory), check_rc=1)
    mount = check(failed, name, "L3 mount")
    assert mount["status"] == "fail" and mount["detail"] == f"nothing is mounted at {L3} (the inventory mounts tmpfs there)"

    # Something else mounted there fails too (the comparison this file does not change).
    assert fleet.ssh(name, f"mount -t tmpfs -o size=1m other-tmpfs {L3}").returncode == 0
    try:
        differs = check(cli_json("verify", "--inventory", str(inventory), check_rc=1), name, "L3 mount")
        assert differs["status"] == "fail" and differs["detail"] == f"{L3}: source is other-tmpfs, expected tmpfs"
    finally:
        fleet.ssh(name, f"umount {L3}")
    again = cli_json("deploy", "--inventory", str(inventory))  # a deploy mounts it again
    assert any(c["task"] == "Mount the L3 tier" for c in host_json(again, name)["changes"]), again
    assert fleet.ssh(name, f"findmnt -n -o FSTYPE {L3}").stdout.strip() == "tmpfs"


def test_a_device_this_host_lacks_is_a_gap_when_tolerated_and_a_failure_when_strict(host):
    fleet, name = host
    assert fleet.ssh(name, f"umount {L3} || true").returncode == 0  # nothing mounted there: the host cannot mount the device
    absent = {"hicache_storage_device": "UUID=0000-dead", "hicache_storage_fstype": "xfs"}
    why = f"{L3} is not mounted: this host cannot mount it: no block device with UUID=0000-dead on this host (none in /dev/disk/by-uuid)"
    lax = fleet.inventory(profile="local", extra_vars={**SERVED, **absent, "hicache_strict": False}, name="l3-absent-lax")
    report = cli_json("verify", "--inventory", str(lax), check_rc=None)
    gap = check(report, name, detail=why)
    assert gap["status"] == "not checked", report
    strict = fleet.inventory(profile="local", extra_vars={**SERVED, **absent}, name="l3-absent-strict")
    failed = cli_json("verify", "--inventory", str(strict), check_rc=1)
    mount = check(failed, name, "L3 mount")
    assert mount["status"] == "fail" and mount["detail"] == why, failed


def test_an_absent_named_port_fails_verify_and_a_strict_deploy_naming_it(host):
    fleet, name = host
    port = "ens9f9np0"
    why = f"{port}: no interface {port} on this host (named in hicache_nic_interfaces)"
    strict = fleet.inventory(profile="local", extra_vars={**SERVED, **TMPFS_TIER, "hicache_nic_interfaces": [port]}, name="nic-strict")
    deploy = cli("deploy", "--inventory", str(strict))
    assert deploy.returncode == 1 and why in deploy.stdout, deploy.stdout + deploy.stderr
    report = cli_json("deploy", "--inventory", str(strict), check_rc=1)
    assert host_json(report, name)["status"] == "failed" and why in host_json(report, name)["reason"], report
    verify = cli_json("verify", "--inventory", str(strict), check_rc=1)
    nic = check(verify, name, "NIC state")
    assert nic["status"] == "fail" and why in nic["detail"]
    # Not strict: this host has no ConnectX port at all, so the named port is a gap, and the host degraded.
    lax = fleet.inventory(profile="local", extra_vars={**SERVED, **TMPFS_TIER, "hicache_nic_interfaces": [port], "hicache_strict": False},
                          name="nic-lax")
    degraded = cli_json("deploy", "--inventory", str(lax))
    assert host_json(degraded, name)["status"] == "degraded"
    assert any(why in g["reason"] for g in host_json(degraded, name)["gaps"]), degraded


def test_a_refused_sysctl_fails_a_strict_deploy_naming_the_key(host):
    fleet, name = host
    misspelt = "net.ipv4.conf.all.rp_filtr"
    strict = fleet.inventory(profile="local", extra_vars={**SERVED, **TMPFS_TIER, "hicache_host_sysctls": {misspelt: 0}}, name="sysctl-misspelt")
    run = cli("deploy", "--inventory", str(strict))
    why = f"{misspelt}: /proc/sys/net/ipv4/conf/all/rp_filtr does not exist on this host (no such sysctl, or its module is not loaded)"
    assert run.returncode == 1 and why in run.stdout, run.stdout + run.stderr
    # A real key this container may not write: podman mounts /proc/sys read-only.
    current = fleet.ssh(name, "cat /proc/sys/net/ipv4/conf/all/rp_filter").stdout.strip()
    wanted = "1" if current != "1" else "2"
    read_only = fleet.inventory(profile="local", extra_vars={**SERVED, **TMPFS_TIER, "hicache_host_sysctls": {"net.ipv4.conf.all.rp_filter": wanted}},
                                name="sysctl-read-only")
    report = cli_json("deploy", "--inventory", str(read_only), check_rc=1)
    reason = host_json(report, name)["reason"]
    assert f"net.ipv4.conf.all.rp_filter: /proc/sys/net/ipv4/conf/all/rp_filter is read-only here (current {current}, wanted {wanted})" in reason, report
    lax = fleet.inventory(profile="local", extra_vars={**SERVED, **TMPFS_TIER, "hicache_host_sysctls": {misspelt: 0}, "hicache_strict": False},
                          name="sysctl-lax")
    degraded = cli_json("deploy", "--inventory", str(lax))
    assert host_json(degraded, name)["status"] == "degraded" and [g["reason"] for g in host_json(degraded, name)["gaps"]] == [why], degraded


def test_doctor_on_a_strict_vast_host_names_what_is_missing_and_what_is_not_needed(host):
    fleet, name = host
    # Single-path VAST (no remoteports, nconnect within the stock kernel's 16): the VAST NFS driver is not needed;
    # everything NFS over RDMA is.
    inventory = fleet.inventory(profile="vast", extra_vars={"hicache_storage_remoteports": None, "hicache_storage_localports": [],
                                                             "hicache_storage_nconnect": 16}, name="doctor-vast")
    assert fleet.ssh(name, f"mv {GPU_STANDIN} {GPU_STANDIN}.away").returncode == 0
    try:
        run = cli("doctor", "--inventory", str(inventory))
        data = cli_json("doctor", "--inventory", str(inventory), check_rc=1)
    finally:
        fleet.ssh(name, f"mv {GPU_STANDIN}.away {GPU_STANDIN}")
    assert run.returncode == 1, run.stdout + run.stderr
    rows = {line.split()[0]: " ".join(line.split()[1:]) for line in run.stdout.splitlines()[2:] if line and not line.startswith(name)}
    assert rows["rpcrdma"] == rows["nfs_client"] == rows["gpus"] == rows["container_runtime"] == "missing (required)", run.stdout
    assert rows["vastnfs"] == "not needed" and rows["python"].startswith("ok: 3.")  # the version found (#34)
    assert f"{name}: rpcrdma: no rpcrdma module for this kernel" in run.stdout and "[required by the inventory]" in run.stdout
    assert f"{name}: gpus: nvidia-smi not found (needed for an SGLang server) [required by the inventory]" in run.stdout
    report = data["hosts"][name]
    assert data["exit_code"] == 1 and report["status"] == "missing" and report["strict"] is True
    statuses = {c["item"]: (c["status"], c["required"]) for c in report["checks"]}
    assert statuses["vastnfs"] == ("not needed", False) and statuses["rpcrdma"] == ("missing", True)
    # The same host with the local profile: not strict, and still exit 1 (doctor does not ask how strict);
    # its NFS items are not needed.
    local = cli_json("doctor", "--inventory", str(fleet.inventory(profile="local", name="doctor-local")), check_rc=1)
    local_statuses = {c["item"]: c["status"] for c in local["hosts"][name]["checks"]}
    assert local["hosts"][name]["strict"] is False
    assert {local_statuses[i] for i in ("connectx", "rdma", "nfs_client", "rpcrdma", "vastnfs")} == {"not needed"}
    assert local_statuses["gpus"] == "ok"  # the stand-in nvidia-smi is back
    assert local_statuses["container_runtime"] == "missing"  # the local profile runs docker, which this host lacks
