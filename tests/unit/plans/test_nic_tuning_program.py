"""The host program of nic_tuning on a sample sysfs tree of one ConnectX port (tests/unit/plans/test_nic_tuning_samples.py: whole hosts).

No ConnectX port exists here, so its sysfs files (vendor 0x15b3, RoCE ECN switches, MSI IRQs, NUMA-local
CPUs) and cpufreq are laid out in a temporary tree (HICACHE_SYSFS_ROOT); the program reads and writes
those files exactly as it would under /sys and /proc. MTU, rings and QoS go through ip/ethtool/mlnx_qos
(or iproute2's dcb on the distribution's mlx5), which act on real devices: they are covered by the nic_tuning
Molecule scenario (MTU), by stand-ins in test_nic_tuning_samples.py (ethtool, dcb, mlnx_qos), or reported
unavailable here.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
from helpers import deployment
from support import ROOT

from hicachectl.plans import nic_tuning

PROGRAM = ROOT / "roles/nic_tuning/files/hicache-nic-tuning"


def write(root: pathlib.Path, path: str, text: str) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text + "\n")


@pytest.fixture
def sample_connectx(tmp_path):
    """Sample sysfs/procfs of port ens1f0np0 (PCI 0000:17:00.0, NUMA CPUs 0-15) and a veth beside it."""
    port = "/sys/class/net/ens1f0np0"
    write(tmp_path, f"{port}/mtu", "1500")
    write(tmp_path, f"{port}/device/vendor", "0x15b3")
    write(tmp_path, f"{port}/device/local_cpulist", "0-15")
    for prio in range(8):
        for point in ("roce_np", "roce_rp"):
            write(tmp_path, f"{port}/ecn/{point}/enable/{prio}", "0")
    for irq in ("120", "121"):
        write(tmp_path, f"{port}/device/msi_irqs/{irq}", "msix")
        write(tmp_path, f"/proc/irq/{irq}/smp_affinity_list", "0-63")
    write(tmp_path, "/sys/class/net/veth0/mtu", "1500")
    for cpu in ("cpu0", "cpu1"):
        write(tmp_path, f"/sys/devices/system/cpu/{cpu}/cpufreq/scaling_governor", "powersave")
    return tmp_path


def program(root, mode, config):
    env = {**os.environ, "HICACHE_SYSFS_ROOT": str(root), "PATH": "/nonexistent"}  # ip/ethtool/mlnx_qos/setpci: absent
    proc = subprocess.run([sys.executable, str(PROGRAM), mode, json.dumps(config)], env=env, capture_output=True, text=True)
    return proc.returncode, json.loads(proc.stdout)


# Rings, IRQ pinning and per-priority ECN are left as found by default (#34: NFS over RDMA does not use the Ethernet
# rings; irqbalance stays unless pinning is asked for; ECN stays as the firmware has it): the tests of those mechanisms
# ask for them.
TUNED = {"nic_rings": 8192, "nic_irq_affinity": True, "nic_ecn_priorities": [3]}


def test_it_finds_the_storage_port_and_only_what_differs(sample_connectx):
    config = nic_tuning.desired(deployment("vast", storage_localports=["ens1f0np0"], **TUNED))
    rc, report = program(sample_connectx, "--check-json", config)
    assert rc == 0 and report["interfaces"] == ["ens1f0np0"]
    assert report["selected"] == [{"port": "ens1f0np0", "reason": "named in hicache_storage_localports"}]
    differ = {c["what"] for c in report["changes"]}
    # IRQ 120, the port's first MSI vector (async events), is left alone as mlnx-tools' set_irq_affinity_cpulist.sh does;
    # the selection is not recorded yet for the boot unit (nothing recorded here)
    assert {"ens1f0np0 mtu", "ens1f0np0 ecn roce_np 3", "ens1f0np0 ecn roce_rp 3", "ens1f0np0 irq 121",
            "cpu governor cpu0", "cpu governor cpu1", "boot selection"} == differ
    reasons = {u["what"]: u["reason"] for u in report["unavailable"]}
    assert reasons["ens1f0np0 rings"] == "ethtool is not installed" and reasons["ens1f0np0 qos"] == "mlnx_qos is not installed"
    assert reasons["ens1f0np0 roce tos"].startswith("no RDMA device behind ens1f0np0")


def test_apply_writes_the_files_then_nothing_differs_but_what_needs_a_tool(sample_connectx):
    config = nic_tuning.desired(deployment("vast", storage_localports=["ens1f0np0"], **TUNED))
    rc, report = program(sample_connectx, "--apply-json", config)
    assert rc == 1 and [f["what"] for f in report["failed"]] == ["ens1f0np0 mtu"]  # `ip` is absent here
    assert (sample_connectx / "sys/class/net/ens1f0np0/ecn/roce_np/enable/3").read_text() == "1"
    assert (sample_connectx / "sys/class/net/ens1f0np0/ecn/roce_np/enable/2").read_text() == "0\n"  # untouched
    assert (sample_connectx / "proc/irq/121/smp_affinity_list").read_text() == "0"  # one CPU per IRQ, not the node's list
    rc, again = program(sample_connectx, "--check-json", config)
    assert [c["what"] for c in again["changes"]] == ["ens1f0np0 mtu"]


def test_no_connectx_port_is_a_reason_not_a_success(tmp_path):
    write(tmp_path, "/sys/class/net/eth0/mtu", "1500")
    rc, report = program(tmp_path, "--check-json", nic_tuning.desired(deployment("vast")))
    assert rc == 0 and report["changes"] == [] and report["interfaces"] == []
    assert report["unavailable"][0] == {"what": "interfaces", "reason": "no ConnectX port (driver mlx5_core, PCI vendor 0x15b3) on this host"}
    assert [u["reason"].rsplit(": ", 1)[1] for u in report["unavailable"][1:]] == ["no interface ens1f0np0", "no interface ens2f0np0"]


def test_the_installed_check_on_a_host_without_connectx_names_that_first(tmp_path):
    """The installed state's check (--check /etc/hicache/nic-tuning.json, what the boot unit runs and molecule's verify
    reads): nothing recorded by a deploy here (its storage ports are absent), and the first reason is still the lack of
    any ConnectX port, then why no port is known."""
    write(tmp_path, "/sys/class/net/eth0/mtu", "1500")
    config_file = tmp_path / "nic-tuning.json"
    config_file.write_text(json.dumps(nic_tuning.desired(deployment("vast"))))
    env = {**os.environ, "HICACHE_SYSFS_ROOT": str(tmp_path), "PATH": "/nonexistent"}
    proc = subprocess.run([sys.executable, str(PROGRAM), "--check", str(config_file)], env=env, capture_output=True, text=True)
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["changes"] == [] and report["interfaces"] == []
    assert [u["what"] for u in report["unavailable"]] == ["interfaces", "storage ports"]
    assert report["unavailable"][0]["reason"] == "no ConnectX port (driver mlx5_core, PCI vendor 0x15b3) on this host"
    assert report["unavailable"][1]["reason"].startswith("cannot tell which ports carry the storage traffic: no selection recorded by a deploy")


def test_pfc_and_ecn_follow_the_inventory():
    desired = nic_tuning.desired(deployment("vast", nic_pfc_priorities=[3, 4], nic_ecn_priorities=[]))
    assert desired["pfc"] == [0, 0, 0, 1, 1, 0, 0, 0] and desired["ecn_priorities"] == []


def test_a_named_port_that_is_absent_is_reported_by_name(sample_connectx):
    config = {**nic_tuning.desired(deployment("vast")), "interfaces": ["ens1f0np0", "ens9f0np0"]}
    rc, report = program(sample_connectx, "--check-json", config)
    assert rc == 0 and report["missing"] == ["ens9f0np0"] and report["connectx"] == ["ens1f0np0"]
    assert {"what": "ens9f0np0", "reason": "no interface ens9f0np0 on this host (named in hicache_nic_interfaces)"} in report["unavailable"]
    assert not any(u["what"].startswith("ens9f0np0 ") for u in report["unavailable"])  # not once per setting


def test_a_null_leaves_the_setting_neither_read_nor_written(sample_connectx):
    """hicache_nic_rings/qos_trust/cpu_governor/roce_dscp: null (tests/test_nullable.py: the role takes them): the
    program neither reads nor writes those settings, and its report names each as left as it is, never as a failure."""
    import dataclasses

    left = deployment("vast", storage_localports=["ens1f0np0"], nic_pfc_priorities=[], nic_ecn_priorities=[3])
    left = dataclasses.replace(left, nic_rings=None, nic_qos_trust=None, nic_cpu_governor=None, nic_roce_dscp=None)
    config = nic_tuning.desired(left)
    assert config["left"] == {"rings": "hicache_nic_rings", "channels": "hicache_nic_channels", "qos_trust": "hicache_nic_qos_trust",
                              "pfc": "hicache_nic_pfc_priorities", "roce_tos": "hicache_nic_roce_dscp", "max_read_request": "hicache_nic_max_read_request",
                              "cpu_governor": "hicache_nic_cpu_governor"}
    for mode in ("--check-json", "--apply-json"):
        rc, report = program(sample_connectx, mode, config)
        seen = {c["what"] for c in report["changes"]} | {u["what"] for u in report["unavailable"]} | {f["what"] for f in report["failed"]}
        assert not {w for w in seen if re.search(r"rings|channels|qos|roce tos|max read request|cpu governor", w)}, seen
        assert {x["what"] for x in report["left"]} == {"ens1f0np0 rings", "ens1f0np0 channels", "ens1f0np0 qos trust", "ens1f0np0 qos pfc", "ens1f0np0 roce tos",
                                                       "ens1f0np0 max read request", "cpu governor"}
        assert {"what": "ens1f0np0 rings", "reason": "no value in hicache_nic_rings (null, unset or empty): left as it is, not checked"} in report["left"]
        # the role's note says them as not checked (roles/nic_tuning/tasks/checks.yml): neither passed nor failed
        verdict = nic_tuning.nic_verdict(report, asked=True)
        assert "ens1f0np0 rings: no value in hicache_nic_rings (null, unset or empty): left as it is, not checked" in verdict["left"]
        assert not [f for f in verdict["failures"] if "rings" in f]
    assert (sample_connectx / "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor").read_text() == "powersave\n"  # untouched
    assert (sample_connectx / "sys/class/net/ens1f0np0/ecn/roce_np/enable/3").read_text() == "1"  # the rest still applied


def test_without_nulls_nothing_is_left_but_what_is_unset_by_default(sample_connectx):
    rc, report = program(sample_connectx, "--check-json", nic_tuning.desired(deployment("vast", storage_localports=["ens1f0np0"], **TUNED)))
    assert {x["what"] for x in report["left"]} == {"ens1f0np0 channels", "ens1f0np0 max read request"}  # their defaults are None
    _, default = program(sample_connectx, "--check-json", nic_tuning.desired(deployment("vast", storage_localports=["ens1f0np0"])))
    assert {x["what"] for x in default["left"]} == {"ens1f0np0 rings", "ens1f0np0 channels", "ens1f0np0 ecn",
                                                 "ens1f0np0 max read request"}  # rings and ECN too
    assert not [c for c in default["changes"] if c["what"] == "irqbalance" or " irq " in c["what"]]  # IRQs and irqbalance as found
    assert "ens1f0np0 rings" in {u["what"] for u in report["unavailable"]}  # ethtool absent here: read, so a reason


def test_a_vlan_over_a_bond_takes_its_mtu_after_the_bond(sample_connectx):
    """The MTUs go bottom up: a VLAN's MTU cannot exceed its real device's (net/8021q/vlan_dev.c, vlan_dev_change_mtu:
    -ERANGE), so the bond under it is set first; the VLAN came first before, and failed while the bond was at 1500."""
    net = sample_connectx / "sys/class/net"
    for upper, lower in (("bond0", "ens1f0np0"), ("bond0.100", "bond0")):
        write(sample_connectx, f"/sys/class/net/{upper}/mtu", "1500")
        (net / upper / f"lower_{lower}").symlink_to(f"../{lower}")
    config = nic_tuning.desired(deployment("vast", storage_localports=["bond0.100"]))
    _, report = program(sample_connectx, "--check-json", config)
    assert report["interfaces"] == ["ens1f0np0"] and report["uppers"] == ["bond0", "bond0.100"]
    assert [c["what"] for c in report["changes"] if c["what"].endswith(" mtu")] == ["ens1f0np0 mtu", "bond0 mtu", "bond0.100 mtu"]


def test_an_rdma_device_found_only_by_its_gid_table_gets_the_roce_tos(tmp_path):
    """A RoCE device registered with no parent device (rdma_rxe: rxe_verbs.c, rxe_register_device) is not under the
    port's device/infiniband; its GID table names the port (gid_attrs/ndevs). It was "no RDMA device behind" the port,
    so the ToS of a named port over such a device was never set (the VM bed's Soft-RoCE ports among them)."""
    write(tmp_path, "/sys/class/net/eth1/mtu", "1500")
    write(tmp_path, "/sys/class/infiniband/rxe_eth1/ports/1/gid_attrs/ndevs/0", "eth1")
    write(tmp_path, "/sys/class/infiniband/rxe_eth1/ports/1/gid_attrs/ndevs/1", "eth1")
    write(tmp_path, "/sys/class/infiniband/rxe_other/ports/1/gid_attrs/ndevs/0", "eth2")
    write(tmp_path, "/sys/kernel/config/rdma_cm/rxe_eth1/ports/1/default_roce_tos", "0")
    config = {**nic_tuning.desired(deployment("vast", nic_interfaces=["eth1"], nic_mtu=1500)), "cpu_governor": None}
    rc, report = program(tmp_path, "--check-json", config)
    tos = [c for c in report["changes"] if c["what"].endswith("roce tos")]
    assert tos == [{"what": "eth1 roce tos", "current": 0, "wanted": 104, "apply": ["roce_tos", "rxe_eth1", "1", "104"]}], report
    assert not [u for u in report["unavailable"] if "roce tos" in u["what"]]
    rc, applied = program(tmp_path, "--apply-json", config)
    assert "eth1 roce tos" in applied["applied"], applied
    assert (tmp_path / "sys/kernel/config/rdma_cm/rxe_eth1/ports/1/default_roce_tos").read_text() == "104"
