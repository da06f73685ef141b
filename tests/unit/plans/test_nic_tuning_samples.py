"""The nic_tuning host program on sample trees of four real kinds of host (tests/samples/nic/README.md says where
each file comes from): MLNX_OFED/DOCA's mlx5 (a bond over two storage ports, a front-end port), the same with RoCE LAG
(both ports of one NIC in an 802.3ad bond: one RDMA device, mlx5_bond_0), the distribution's inbox mlx5 (a VLAN over
the storage port, no ECN tree) and an IPoIB port. `ip` is the samples' stand-in
(tests/samples/nic/bin/ip), and iproute2's `dcb` where a test puts it on PATH (tests/samples/dcb/bin/dcb, answering from
the dcb-*.json samples: tests/samples/dcb/README.md); every other tool is absent, so what needs it is reported as such.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
from helpers import deployment
from support import ROOT

from hicachectl.plans import nic_tuning

PROGRAM = ROOT / "roles/nic_tuning/files/hicache-nic-tuning"
SAMPLES = ROOT / "tests/samples/nic"
DCB_SAMPLES = ROOT / "tests/samples/dcb"
SERVER = "172.16.10.20"


def sample(tmp_path: pathlib.Path, name: str) -> tuple[pathlib.Path, pathlib.Path]:
    root = tmp_path / name
    shutil.copytree(SAMPLES / name / "root", root, symlinks=True)
    return root, SAMPLES / name / "tool"


def python_only(tmp: pathlib.Path) -> pathlib.Path:
    """A PATH entry with python3 alone (the stand-in `ip` runs on it): no ethtool, mlnx_qos, systemctl, modprobe."""
    bin_dir = tmp / "python-bin"
    if not bin_dir.exists():
        bin_dir.mkdir(parents=True)
        (bin_dir / "python3").symlink_to(sys.executable)
    return bin_dir


def program(sample_root, mode, config):
    """The deploy's run (--check-json/--apply-json, the desired state inline), or the installed state's run (--check or
    --apply with the config as a file, as the boot unit runs it: ExecStart=... --apply /etc/hicache/nic-tuning.json)."""
    root, tool = sample_root
    path = f"{SAMPLES / 'bin'}:{python_only(root.parent)}"
    env = {**os.environ, "HICACHE_SYSFS_ROOT": str(root), "HICACHE_SAMPLE_TOOL": str(tool), "PATH": path}
    argument = json.dumps(config)
    if not mode.endswith("-json"):
        (root.parent / "nic-tuning.json").write_text(argument)
        argument = str(root.parent / "nic-tuning.json")
    proc = subprocess.run([sys.executable, str(PROGRAM), mode, argument], env=env, capture_output=True, text=True, timeout=60)
    assert proc.stdout.startswith("{"), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def routed(**overrides):
    """The vast profile reaching its server by route: no localports, the server an address the samples route."""
    return {**nic_tuning.desired(deployment("vast", storage_localports=[], storage_server=SERVER, **overrides))}


def test_ofed_tunes_the_bond_s_ports_that_route_to_the_server_not_the_front_end(tmp_path):
    rc, report = program(sample(tmp_path, "ofed-mlx5"), "--check-json", routed(nic_ecn_priorities=[3]))
    assert rc == 0 and report["interfaces"] == ["ens1f0np0", "ens1f1np1"] and report["uppers"] == ["bond0"]
    assert {s["port"]: s["reason"] for s in report["selected"]}["ens1f0np0"] == f"routes to {SERVER}, below bond0"
    assert [s["port"] for s in report["skipped"]] == ["ens2f0np0"]
    assert not any(c["what"].startswith("ens2f0np0") for c in report["changes"])
    differ = {c["what"] for c in report["changes"]}
    assert {"ens1f0np0 mtu", "ens1f1np1 mtu", "bond0 mtu", "ens1f0np0 ecn roce_np 3", "ens1f1np1 ecn roce_rp 3"} <= differ
    assert report["not_offered"] == []


def test_ofed_sets_rdma_cm_s_default_tos_to_the_dscp_of_the_pfc_priority(tmp_path):
    root = sample(tmp_path, "ofed-mlx5")
    rc, report = program(root, "--check-json", routed())
    tos = {c["what"]: c for c in report["changes"] if c["what"].endswith("roce tos")}
    assert tos["ens1f0np0 roce tos"]["current"] == 0 and tos["ens1f0np0 roce tos"]["wanted"] == 26 << 2 == 104
    program(root, "--apply-json", routed())
    assert (root[0] / "sys/kernel/config/rdma_cm/mlx5_0/ports/1/default_roce_tos").read_text() == "104"
    assert (root[0] / "sys/kernel/config/rdma_cm/mlx5_1/ports/1/default_roce_tos").read_text() == "104"
    assert (root[0] / "sys/kernel/config/rdma_cm/mlx5_2").exists() is False  # the front-end port's device: untouched
    _, again = program(root, "--check-json", routed())
    assert not any(c["what"].endswith("roce tos") for c in again["changes"])


def test_irqs_are_pinned_one_cpu_each_round_robin_after_irqbalance_is_stopped(tmp_path):
    root = sample(tmp_path, "ofed-mlx5")
    pinned = routed(nic_irq_affinity=True)  # asked for: the default leaves IRQs and irqbalance as found (#34)
    _, report = program(root, "--check-json", pinned)
    whats = [c["what"] for c in report["changes"]]
    irqbalance = next(c for c in report["changes"] if c["what"] == "irqbalance")
    assert irqbalance["apply"] == ["irqbalance", "stop", nic_tuning.IRQBALANCE_MARKER]  # systemctl disable --now, below
    assert whats.index("irqbalance") < whats.index("ens1f0np0 irq 101")  # stopped before the pins, or it undoes them
    pins = {c["what"]: c["wanted"] for c in report["changes"] if " irq " in c["what"]}
    # msi_irqs 100-104 on CPUs 0-3: the first vector (async events) left out as set_irq_affinity_cpulist.sh does
    assert {k: v for k, v in pins.items() if k.startswith("ens1f0np0")} == {
        "ens1f0np0 irq 101": "0", "ens1f0np0 irq 102": "1", "ens1f0np0 irq 103": "2", "ens1f0np0 irq 104": "3"}
    program(root, "--apply-json", pinned)
    assert (root[0] / "proc/irq/102/smp_affinity_list").read_text() == "1"
    assert (root[0] / "proc/irq/100/smp_affinity_list").read_text() == "0-63\n"


def test_irqbalance_is_left_as_found_unless_pinning_is_asked_and_given_back_when_it_is_turned_off(tmp_path):
    """#34: irqbalance was stopped and disabled host-wide by default, and nothing started it again when
    hicache_nic_irq_affinity was later set false. A stand-in systemctl records what the program asks of systemd."""
    root, tool = sample(tmp_path, "ofed-mlx5")
    log = tmp_path / "systemctl.log"
    (python_only(tmp_path) / "systemctl").write_text(f"#!/bin/sh\necho \"$*\" >> {log}\n")
    (python_only(tmp_path) / "systemctl").chmod(0o755)
    marker = root / nic_tuning.IRQBALANCE_MARKER.lstrip("/")
    _, report = program((root, tool), "--apply-json", routed())  # the default: irqbalance (running here) as found
    assert not [c for c in report["changes"] if c["what"] == "irqbalance" or " irq " in c["what"]] and not log.exists() and not marker.exists()
    _, report = program((root, tool), "--apply-json", routed(nic_irq_affinity=True))  # asked for: stopped, and recorded
    assert "irqbalance" in report["applied"] and log.read_text().splitlines() == ["disable --now irqbalance.service"] and marker.is_file()
    (root / "proc/1234/comm").unlink()  # what systemd's stop does (the stand-in stops nothing)
    _, pinned = program((root, tool), "--check-json", routed(nic_irq_affinity=True))
    assert not [c for c in pinned["changes"] if c["what"] == "irqbalance"]  # stopped: nothing to do
    _, report = program((root, tool), "--apply-json", routed())  # turned off: the irqbalance it stopped comes back
    assert "irqbalance" in report["applied"] and log.read_text().splitlines()[-1] == "enable --now irqbalance.service"
    assert not marker.exists()
    (root / "proc/1234/comm").write_text("irqbalance\n")
    _, again = program((root, tool), "--check-json", routed())
    assert not [c for c in again["changes"] if c["what"] == "irqbalance"]  # given back once, then as found


ETHTOOL_G = "Ring parameters for {port}:\nPre-set maximums:\nRX:\t\t8192\nRX Mini:\tn/a\nRX Jumbo:\tn/a\nTX:\t\t8192\n" \
            "Current hardware settings:\nRX:\t\t{rx}\nRX Mini:\tn/a\nRX Jumbo:\tn/a\nTX:\t\t8192\n"  # as tests/unit/plans/test_storage_live.py has it


@pytest.mark.parametrize(("rx", "differs"), [(1024, True), (8192, False)])
def test_rings_change_only_where_they_differ_and_say_they_reopen_the_queues(tmp_path, rx, differs):
    root, tool = sample(tmp_path, "ofed-mlx5")
    bin_dir = python_only(tmp_path)
    (bin_dir / "ethtool").write_text(f"#!/bin/sh\nprintf '{ETHTOOL_G.format(port='$2', rx=rx)}'\n")
    (bin_dir / "ethtool").chmod(0o755)
    _, report = program((root, tool), "--check-json", routed(nic_rings=8192))
    rings = [c for c in report["changes"] if c["what"].endswith(" rings")]
    assert [c["what"] for c in rings] == (["ens1f0np0 rings", "ens1f1np1 rings"] if differs else [])
    assert all(c["note"] == "reopens the port's queues (traffic on it pauses for a moment)" for c in rings)
    if differs:
        assert "ens1f0np0 rings (reopens the port's queues" in " ".join(nic_tuning.nic_verdict(report, asked=True)["changes"])


def test_inbox_mlx5_ecn_asked_for_is_a_named_gap_not_a_failure(tmp_path):
    config = nic_tuning.desired(deployment("vast", storage_localports=["10.10.0.5"], nic_ecn_priorities=[3]))
    rc, report = program(sample(tmp_path, "inbox-mlx5"), "--check-json", config)
    assert report["interfaces"] == ["ens1f0np0"] and report["uppers"] == ["ens1f0np0.100"]
    assert report["selected"][0]["reason"] == "holds 10.10.0.5 (hicache_storage_localports), below ens1f0np0.100"
    ecn = next(u for u in report["not_offered"] if u["what"] == "ens1f0np0 ecn")
    assert "MLNX_OFED/DOCA" in ecn["reason"] and ecn["setting"] == "ecn"
    assert not any("ecn" in u["what"] for u in report["unavailable"])
    verdict = nic_tuning.nic_verdict(report, asked=True)
    assert not any("ecn" in f for f in verdict["failures"]) and f"ens1f0np0 ecn: {ecn['reason']}" in verdict["driver_gaps"]
    assert any("ecn" in f for f in nic_tuning.nic_verdict(report, asked=True, ecn_required=True)["failures"])


def test_inbox_mlx5_without_a_group_reads_the_kernel_default_tos(tmp_path):
    config = nic_tuning.desired(deployment("vast", storage_localports=["ens1f0np0.100"]))
    _, report = program(sample(tmp_path, "inbox-mlx5"), "--check-json", config)
    tos = next(c for c in report["changes"] if c["what"] == "ens1f0np0 roce tos")
    assert tos["current"] == 0 and tos["apply"] == ["roce_tos", "mlx5_0", "1", "104"]


def test_an_ipoib_port_is_never_tuned(tmp_path):
    rc, report = program(sample(tmp_path, "ipoib"), "--check-json", routed())
    assert rc == 0 and report["interfaces"] == []
    # nothing to tune; the empty selection is recorded, so that the boot unit tunes no port either
    assert [(c["what"], c["wanted"]["ports"]) for c in report["changes"]] == [("boot selection", [])]
    skipped = {s["port"]: s["reason"] for s in report["skipped"]}
    assert "IPoIB" in skipped["ib0"] and "4092" in skipped["ib0"] and "ens2f0np0" in skipped
    assert (tmp_path / "ipoib/sys/class/net/ib0/mtu").read_text() == "2044\n"


def test_a_deploy_with_no_route_falls_back_on_the_recorded_ports(tmp_path):
    """The deploy's own run where the storage network is down: the ports its last apply recorded, saying why; the
    record is kept as it was (a selection that could not be made is never recorded)."""
    root = sample(tmp_path, "ofed-mlx5")
    program(root, "--apply-json", routed())
    recorded = (root[0] / nic_tuning.SELECTION_FILE.lstrip("/")).read_text()
    no_route = (root[0], tmp_path / "no-tool-output")
    rc, report = program(no_route, "--apply-json", routed())
    assert report["interfaces"] == ["ens1f0np0", "ens1f1np1"]
    assert report["selected"][0]["reason"] == (f"routes to {SERVER}, below bond0 (as recorded by the last deploy; now: ip -json route get "
                                               f"{SERVER}: RTNETLINK answers: Network is unreachable)")
    assert not any(u["what"] == "storage ports" for u in report["unavailable"])
    assert not any(c["what"] == "boot selection" for c in report["changes"])
    assert (root[0] / nic_tuning.SELECTION_FILE.lstrip("/")).read_text() == recorded


def boot_route(tmp_path: pathlib.Path, dev: str) -> pathlib.Path:
    """What `ip -json route get` answers at boot when a management port's DHCP default route is up before the storage
    network (iproute2's JSON of a route through a gateway, as tool/ip-route-get-*.json)."""
    tool = tmp_path / f"boot-route-{dev}"
    tool.mkdir()
    (tool / f"ip-route-get-{SERVER}.json").write_text(json.dumps(
        [{"dst": SERVER, "gateway": "10.0.0.1", "dev": dev, "prefsrc": "10.0.0.5", "flags": [], "uid": 0, "cache": []}]))
    return tool


@pytest.mark.parametrize("dev", ["ens2f0np0", "eno1"])
def test_the_boot_unit_tunes_only_the_ports_the_deploy_recorded_whatever_route_it_finds(tmp_path, dev):
    """#34: the boot run chose its ports by route whenever a route existed. At boot a route through another port (a
    management port's DHCP default route) made it tune the front-end ConnectX port ens2f0np0 (MTU 9000, PFC) and record
    it, or, through a port that is no ConnectX (eno1), tune none with exit 0, the storage ports left as the driver has
    them. The boot unit runs the installed config (--apply CONFIG): it tunes the ports the last deploy recorded, and
    no other."""
    root, tool = sample(tmp_path, "ofed-mlx5")
    net = root / "sys/class/net"
    (net / "eno1").mkdir()
    (net / "eno1/mtu").write_text("1500\n")
    (net / "eno1/type").write_text("1\n")
    config = {**routed(), "irq_affinity": False}
    program((root, tool), "--apply-json", config)  # the deploy: the ports behind bond0, recorded
    record = (root / nic_tuning.SELECTION_FILE.lstrip("/")).read_text()
    reboot_without_the_bond(net)
    rc, boot = program((root, boot_route(tmp_path, dev)), "--apply", config)
    assert rc == 0 and boot["interfaces"] == ["ens1f0np0", "ens1f1np1"], boot
    assert boot["selected"][0]["reason"] == f"routes to {SERVER}, below bond0 (as recorded by the last deploy)"
    assert {p: (net / p / "mtu").read_text() for p in ("ens1f0np0", "ens1f1np1", "ens2f0np0", "eno1")} == {
        "ens1f0np0": "9000\n", "ens1f1np1": "9000\n", "ens2f0np0": "1500\n", "eno1": "1500\n"}
    assert not any(c["what"].startswith(("ens2f0np0", "eno1")) for c in boot["changes"])
    assert {s["port"]: s["reason"] for s in boot["skipped"]}["ens2f0np0"] == "not recorded as a storage port by the last deploy: left as it is"
    assert (root / nic_tuning.SELECTION_FILE.lstrip("/")).read_text() == record  # the boot never records
    assert not (root / "sys/kernel/config/rdma_cm/mlx5_2").exists()  # the front-end port's device: no ToS


def test_the_boot_unit_tunes_no_port_without_a_deploy_s_record_for_this_config(tmp_path):
    """No record (or one made for another storage server): the boot run tunes no port, whatever the route, and says
    why: a gap of the host (cannot tell its storage ports), never a guess."""
    root, tool = sample(tmp_path, "ofed-mlx5")
    _, boot = program((root, tool), "--apply", routed())  # the route to the server through bond0 is there, no record
    assert boot["interfaces"] == [] and boot["changes"] == [] and boot["applied"] == []
    reason = next(u["reason"] for u in boot["unavailable"] if u["what"] == "storage ports")
    assert reason.startswith(f"cannot tell which ports carry the storage traffic: no selection recorded by a deploy ({nic_tuning.SELECTION_FILE})")
    assert nic_tuning.nic_verdict(boot, asked=True)["gaps"] == [f"storage ports: {reason}"]
    program((root, tool), "--apply-json", routed())  # a deploy records the ports routing to 172.16.10.20
    other = {**routed(), "storage_server": "172.16.99.1"}  # the installed config names another server since
    _, boot = program((root, tool), "--check", other)
    assert boot["interfaces"] == [] and "was recorded for" in next(u["reason"] for u in boot["unavailable"] if u["what"] == "storage ports")


def test_the_deploy_records_its_selection_where_no_port_setting_differs(tmp_path):
    """The record was written only by an apply, and the role applies only where the check found a difference: a host
    whose ports were tuned already, or a changed inventory whose new ports were, kept a stale record (or none) for the
    boot. The check names a stale record as a change (`boot selection`), so the apply runs and writes it."""
    root, tool = sample(tmp_path, "ofed-mlx5")
    config = {**routed(), "irq_affinity": False}
    program((root, tool), "--apply-json", config)
    _, settled = program((root, tool), "--check-json", config)
    assert settled["changes"] == []
    (root / nic_tuning.SELECTION_FILE.lstrip("/")).unlink()
    _, check = program((root, tool), "--check-json", config)
    assert [(c["what"], c["current"], c["wanted"]["ports"], c["apply"][0]) for c in check["changes"]] == [
        ("boot selection", None, ["ens1f0np0", "ens1f1np1"], "record")]
    rc, applied = program((root, tool), "--apply-json", config)
    assert rc == 0 and applied["applied"] == ["boot selection"]
    assert json.loads((root / nic_tuning.SELECTION_FILE.lstrip("/")).read_text())["rule"] == {
        "interfaces": [], "storage_ports": [], "storage_server": SERVER}
    _, again = program((root, tool), "--check-json", config)
    assert again["changes"] == []


def test_no_route_and_nothing_recorded_is_a_gap_naming_why_that_strict_makes_a_failure(tmp_path):
    """The host cannot tell its storage ports (no route, nothing recorded): a gap of the host, never ok; the role's
    hicache_gap fails it under hicache_strict, and hicache_strict: false leaves it degraded, ConnectX or not (#34)."""
    root, _ = sample(tmp_path, "ofed-mlx5")
    rc, report = program((root, tmp_path / "none"), "--check-json", routed())
    assert report["interfaces"] == [] and report["unavailable"] == [
        {"what": "storage ports", "reason": "cannot tell which ports carry the storage traffic: ip -json route get 172.16.10.20: "
                                            "RTNETLINK answers: Network is unreachable"}]
    verdict = nic_tuning.nic_verdict(report, asked=True)
    assert verdict["gaps"] == ["storage ports: cannot tell which ports carry the storage traffic: ip -json route get 172.16.10.20: "
                               "RTNETLINK answers: Network is unreachable"] and verdict["failures"] == []


def test_a_virtio_host_tunes_nothing_unless_named_and_a_named_port_s_mtu_changes(tmp_path):
    root = tmp_path / "virtio"
    (root / "sys/class/net/enp1s0").mkdir(parents=True)
    (root / "sys/class/net/enp1s0/mtu").write_text("1500\n")
    (root / "sys/class/net/enp1s0/type").write_text("1\n")
    tool = tmp_path / "tool"
    tool.mkdir()
    (tool / f"ip-route-get-{SERVER}.json").write_text(json.dumps([{"dst": SERVER, "dev": "enp1s0", "flags": [], "uid": 0, "cache": []}]))
    _, report = program((root, tool), "--check-json", routed())
    assert report["interfaces"] == [] and "not a ConnectX port" in report["skipped"][0]["reason"]
    named = {**routed(), "interfaces": ["enp1s0"]}
    program((root, tool), "--apply-json", named)
    assert (root / "sys/class/net/enp1s0/mtu").read_text() == "9000\n"


def test_a_hung_tool_is_cut_off(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ethtool").write_text("#!/bin/sh\nsleep 30\n")
    (bin_dir / "ethtool").chmod(0o755)
    root = tmp_path / "host"
    (root / "sys/class/net/enp1s0").mkdir(parents=True)
    (root / "sys/class/net/enp1s0/mtu").write_text("9000\n")
    config = {**routed(nic_rings=8192), "interfaces": ["enp1s0"], "tool_timeout": 1}
    env = {**os.environ, "HICACHE_SYSFS_ROOT": str(root), "PATH": f"{bin_dir}:/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, str(PROGRAM), "--check-json", json.dumps(config)], env=env, capture_output=True, text=True, timeout=20)
    reasons = {u["what"]: u["reason"] for u in json.loads(proc.stdout)["unavailable"]}
    assert reasons["enp1s0 rings"] == "ethtool -g enp1s0: no answer within 1 s"


def test_the_boot_unit_runs_before_the_network_after_the_driver_stack_and_bounded():
    unit = nic_tuning.unit_text()
    lines = unit.splitlines()
    assert "Before=network-pre.target shutdown.target" in lines and "Wants=network-pre.target" in lines
    assert any(line.startswith("After=") and "openibd.service" in line for line in lines)
    # #34: after configfs, which holds rdma_cm's default ToS (Documentation/ABI/testing/configfs-rdma_cm: visible only
    # when configfs is mounted); with DefaultDependencies=no nothing ordered the unit after systemd's mount of it
    assert any(line.startswith("After=") and "sys-kernel-config.mount" in line.split("=", 1)[1].split() for line in lines)
    assert "Wants=sys-kernel-config.mount" in lines and "DefaultDependencies=no" in lines
    assert not any(line.startswith("After=") and "network-pre.target" in line for line in lines)
    assert f"TimeoutStartSec={nic_tuning.START_TIMEOUT}" in lines and nic_tuning.TOOL_TIMEOUT * 4 < nic_tuning.START_TIMEOUT


def test_render_says_which_ports_and_why():

    assert "hicache_storage_localports" in nic_tuning.nic_plan(deployment("vast")).selection
    routed_plan = nic_tuning.nic_plan(deployment("vast", storage_localports=[], storage_server=SERVER))
    assert f"route to hicache_storage_server {SERVER}" in routed_plan.selection
    assert json.loads(routed_plan.config_text)["selection"] == routed_plan.selection  # render shows the config file


@pytest.mark.parametrize("name", ["ofed-mlx5", "ofed-mlx5-lag", "inbox-mlx5", "ipoib"])
def test_each_sample_is_described_in_the_readme(name):
    assert f"## {name}" in (SAMPLES / "README.md").read_text()


def test_each_dcb_sample_is_described_in_its_readme_with_its_source():
    readme = (DCB_SAMPLES / "README.md").read_text()
    names = sorted(p.name for p in DCB_SAMPLES.glob("dcb-*.json"))
    assert len(names) == 5 and all(f"`{name}`" in readme for name in names)
    assert all(json.loads((DCB_SAMPLES / name).read_text()) is not None for name in names)


def test_every_symlink_in_the_samples_points_at_a_file_a_clone_has():
    """git keeps no empty directory: a sample's `driver -> ../../bus/pci/drivers/mlx5_core` resolves in the tree it was
    written in and dangles in a fresh clone (ansible-galaxy's build refuses a dangling link, and the program reads the
    driver's name through it). Each link's target must hold a tracked file."""
    listed = subprocess.run(["git", "ls-files", "-s", "--", str(SAMPLES)], cwd=ROOT, capture_output=True, text=True, check=True)
    tracked = subprocess.run(["git", "ls-files", "--", str(SAMPLES)], cwd=ROOT, capture_output=True, text=True, check=True)
    files = {ROOT / f for f in tracked.stdout.split()}
    links = [ROOT / line.split("\t", 1)[1] for line in listed.stdout.splitlines() if line.startswith("120000 ")]
    assert links, "the samples have symlinks (sys/devices/.../driver)"
    dangling = []
    for link in links:
        target = pathlib.Path(os.path.normpath(link.parent / os.readlink(link)))
        if target not in files and not any(f.is_relative_to(target) for f in files):
            dangling.append(f"{link.relative_to(ROOT)} -> {os.readlink(link)}")
    assert not dangling, dangling


def with_ethtool(tmp_path: pathlib.Path, rx: int = 8192) -> None:
    """ethtool as a stand-in answering -g as a port whose rings are at the maximum (other modes: a non-zero exit)."""
    bin_dir = python_only(tmp_path)
    (bin_dir / "ethtool").write_text(f"#!/bin/sh\n[ \"$1\" = -g ] || exit 1\nprintf '{ETHTOOL_G.format(port='$2', rx=rx)}'\n")
    (bin_dir / "ethtool").chmod(0o755)


def test_inbox_mlx5_without_dcb_or_mlnx_qos_is_degraded_with_named_gaps_never_failed(tmp_path):
    """The distribution's mlx5 has no OFED ECN tree and the distribution ships no mlnx_qos (it is MLNX_OFED/DOCA's
    mlnx-tools): trust/PFC failed every inbox host with the shipped defaults ("mlnx_qos is not installed") while the
    test above looked at ECN only. Neither mlnx_qos nor iproute2's dcb is on PATH here: only then is QoS a named gap
    (with dcb, test_inbox_mlx5_sets_trust_and_pfc_with_dcb_where_mlnx_qos_is_absent)."""
    root, tool = sample(tmp_path, "inbox-mlx5")
    with_ethtool(tmp_path)
    config = {**nic_tuning.desired(deployment("vast", storage_localports=["10.10.0.5"], nic_ecn_priorities=[3])), "channels": None}
    _, report = program((root, tool), "--check-json", config)
    verdict = nic_tuning.nic_verdict(report, asked=True)
    assert verdict["failures"] == [], verdict
    assert sorted(g.split(":")[0] for g in verdict["driver_gaps"]) == ["ens1f0np0 ecn", "ens1f0np0 qos"]
    # the shipped vast profile (per-priority ECN left to the firmware): QoS alone is "not offered"
    _, shipped = program((root, tool), "--check-json", inbox_vast())
    assert [g.split(":")[0] for g in nic_tuning.nic_verdict(shipped, asked=True)["driver_gaps"]] == ["ens1f0np0 qos"]
    assert any("MLNX_OFED/DOCA's mlnx-tools" in g and "iproute2's dcb (iproute2 5.12 or later)" in g
               for g in verdict["driver_gaps"] if g.startswith("ens1f0np0 qos"))
    # hicache_nic_ecn_required makes ECN's gap a failure, not the QoS one
    required = nic_tuning.nic_verdict(report, asked=True, ecn_required=True)
    assert [f.split(":")[0] for f in required["failures"]] == ["ens1f0np0 ecn"]
    assert [g.split(":")[0] for g in required["driver_gaps"]] == ["ens1f0np0 qos"]


# DSCP d -> priority d >> 3 for every DSCP: the map mlnx_qos --trust dscp writes (mlnx-tools python/Python/dcbnetlink.py,
# setDefaultAppEntry), and the one the mlx5 firmware starts with (tests/samples/dcb/README.md)
DEFAULT_MAP = [f"{d}:{d >> 3}" for d in range(64)]
PFC_3 = ["0:off", "1:off", "2:off", "3:on", "4:off", "5:off", "6:off", "7:off"]  # dcb-pfc.8: PFC-MAPPING := PRIO:{on|off}


def with_dcb(tmp_path: pathlib.Path, app: str | None, pfc: str | None, port: str = "ens1f0np0", **env: str) -> pathlib.Path:
    """iproute2's dcb as a stand-in (tests/samples/dcb/bin/dcb) on the program's PATH, its port state copied from the
    dcb-*.json samples (None: the port has no DCB); returns the state directory, whose argv.log records every call."""
    state = tmp_path / "dcb-state"
    state.mkdir()
    for obj, name in (("app", app), ("pfc", pfc)):
        if name:
            shutil.copy(DCB_SAMPLES / name, state / f"{obj}-{port}.json")
    exports = " ".join(f"{k}={v}" for k, v in {"HICACHE_DCB_STATE": str(state), **env}.items())
    wrapper = python_only(tmp_path) / "dcb"
    wrapper.write_text(f"#!/bin/sh\n{exports} exec python3 {DCB_SAMPLES / 'bin/dcb'} \"$@\"\n")
    wrapper.chmod(0o755)
    return state


def dcb_calls(state: pathlib.Path) -> list[list[str]]:
    log = state / "argv.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def inbox_vast():
    """The shipped vast profile on the inbox sample: trust dscp, PFC on priority 3 (hicache_nic_pfc_priorities [3])."""
    return {**nic_tuning.desired(deployment("vast", storage_localports=["10.10.0.5"])), "channels": None}


def test_inbox_mlx5_sets_trust_and_pfc_with_dcb_where_mlnx_qos_is_absent(tmp_path):
    """#34: with the distribution's mlx5 and no mlnx_qos, trust and PFC were a named gap ("not offered") on every inbox
    host. Through DCB netlink (iproute2's dcb) the vast profile's trust dscp and PFC on priority 3 are read, set, and
    read back as set; only a host with neither tool keeps the gap (the test above)."""
    root, tool = sample(tmp_path, "inbox-mlx5")
    with_ethtool(tmp_path)
    state = with_dcb(tmp_path, app="dcb-app-dscp-prio-none.json", pfc="dcb-pfc-prio-pfc-off.json")
    config = inbox_vast()
    assert config["qos_trust"] == "dscp" and config["pfc"] == [0, 0, 0, 1, 0, 0, 0, 0]
    _, report = program((root, tool), "--check-json", config)
    assert not [g for g in report["not_offered"] if " qos" in g["what"]] and not [u for u in report["unavailable"] if " qos" in u["what"]]
    qos = {c["what"]: c for c in report["changes"] if " qos" in c["what"]}
    assert qos["ens1f0np0 qos trust"]["current"] == "pcp" and qos["ens1f0np0 qos trust"]["wanted"] == "dscp"
    assert qos["ens1f0np0 qos trust"]["apply"] == ["dcb", "app", "add", "dev", "ens1f0np0", "dscp-prio", *DEFAULT_MAP]
    assert qos["ens1f0np0 qos pfc"]["current"] == [0] * 8 and qos["ens1f0np0 qos pfc"]["wanted"] == [0, 0, 0, 1, 0, 0, 0, 0]
    assert qos["ens1f0np0 qos pfc"]["apply"] == ["dcb", "pfc", "set", "dev", "ens1f0np0", "prio-pfc", *PFC_3]
    assert "toggles the port's link" in qos["ens1f0np0 qos pfc"]["note"]
    assert dcb_calls(state) == [["dcb", "-j", "app", "show", "dev", "ens1f0np0", "dscp-prio"],
                                ["dcb", "-j", "pfc", "show", "dev", "ens1f0np0", "prio-pfc"]]  # a check changes nothing
    verdict = nic_tuning.nic_verdict(report, asked=True)
    assert verdict.get("driver_gaps", []) == [] and verdict["failures"] == [] and verdict["gaps"] == []  # QoS is no gap any more
    rc, applied = program((root, tool), "--apply-json", config)
    assert {"ens1f0np0 qos trust", "ens1f0np0 qos pfc"} <= set(applied["applied"]) and not [f for f in applied["failed"] if " qos" in f["what"]]
    assert [c for c in dcb_calls(state) if c[1] != "-j"] == [["dcb", "app", "add", "dev", "ens1f0np0", "dscp-prio", *DEFAULT_MAP],
                                                            ["dcb", "pfc", "set", "dev", "ens1f0np0", "prio-pfc", *PFC_3]]
    # the port now shows what a port trusting DSCP with the default map and PFC on priority 3 shows
    assert json.loads((state / "app-ens1f0np0.json").read_text()) == json.loads((DCB_SAMPLES / "dcb-app-dscp-prio-default.json").read_text())
    assert (state / "pfc-ens1f0np0.json").read_text() == (DCB_SAMPLES / "dcb-pfc-prio-pfc-3.json").read_text()
    _, again = program((root, tool), "--check-json", config)
    assert not [c for c in again["changes"] if " qos" in c["what"]]
    settled = nic_tuning.nic_verdict(again, asked=True)
    assert not [x for x in settled["failures"] + settled["gaps"] + settled.get("driver_gaps", []) if " qos" in x]


def test_inbox_mlx5_with_dcb_passes_every_nic_check_of_the_shipped_vast_profile(tmp_path):
    """#34's acceptance: on the inbox sample with iproute2's dcb, the shipped vast profile's NIC checks pass once
    applied: no failure, no gap, no driver gap. Per-priority ECN, which the distribution's mlx5 has no switch for, is
    not asked by the profile (hicache_nic_ecn_priorities [] leaves the firmware's DCQCN setting): it is named as left,
    not checked, never passed. Before, the schema's default [3] left every inbox host degraded."""
    root, tool = sample(tmp_path, "inbox-mlx5")
    with_ethtool(tmp_path)
    with_dcb(tmp_path, app="dcb-app-dscp-prio-none.json", pfc="dcb-pfc-prio-pfc-off.json")
    # the RDMA-CM group of mlx5_0 as the kernel makes it on mkdir (a sample tree's mkdir makes no ports/1): ToS 0
    group = root / "sys/kernel/config/rdma_cm/mlx5_0/ports/1"
    group.mkdir(parents=True)
    (group / "default_roce_tos").write_text("0\n")
    config = {**nic_tuning.desired(deployment("vast")), "storage_ports": ["10.10.0.5"]}
    assert config["ecn_priorities"] == [] and config["left"]["ecn_priorities"] == "hicache_nic_ecn_priorities"
    # A first deploy: the ToS is set before the tier is mounted (nic_tuning runs before storage), and the tier's mount,
    # made after it, carries it (the kernel's mountstats samples, with the profile's server as the mount's source).
    with_mountstats(root, "mountstats-not-mounted.txt")
    program((root, tool), "--apply-json", config)
    shift_stamps(root, 120)
    remounted = (ROCE_SAMPLES / "mountstats-remounted.txt").read_text().replace(SERVER, config["storage_server"])
    (root / "proc/self/mountstats").write_text(remounted)
    _, report = program((root, tool), "--check-json", config)
    verdict = nic_tuning.nic_verdict(report, asked=True)
    qos = [c for c in report["changes"] if " qos" in c["what"]]
    assert qos == [] and verdict["failures"] == [] and verdict["gaps"] == [] and verdict.get("driver_gaps", []) == [], verdict
    # nothing the role would turn into a gap either (roles/nic_tuning/tasks/report.yml): not a ToS whose effect cannot
    # be told, nor one not in effect (the sample without mountstats had "mountstats was not read": degraded)
    assert verdict.get("not_checked", []) == [] and verdict.get("not_in_effect", []) == [], verdict
    assert len(report["roce_tos_effect"]["stamps"]) == 1
    assert "ens1f0np0 ecn: no value in hicache_nic_ecn_priorities (null, unset or empty): left as it is, not checked" in verdict["left"]
    assert not [g for g in report["not_offered"] if g["setting"] == "ecn"]


@pytest.mark.parametrize("app", ["dcb-app-dscp-prio-default.json", "dcb-app-dscp-prio-default-6.1.json"])
def test_inbox_mlx5_already_trusting_dscp_with_pfc_on_3_is_left_alone(tmp_path, app):
    """Both JSON forms of dcb app show (iproute2 6.5 and later add a third item to each entry) read as trust dscp."""
    root, tool = sample(tmp_path, "inbox-mlx5")
    state = with_dcb(tmp_path, app=app, pfc="dcb-pfc-prio-pfc-3.json")
    _, report = program((root, tool), "--apply-json", inbox_vast())
    assert not [c for c in report["changes"] if " qos" in c["what"]] and not [u for u in report["unavailable"] if " qos" in u["what"]]
    assert all(call[1] == "-j" for call in dcb_calls(state))  # read only


def test_inbox_mlx5_trust_pcp_flushes_the_dscp_entries(tmp_path):
    """mlx5 goes back to trust PCP when its last DSCP APP entry goes (en_dcbnl.c, mlx5e_dcbnl_ieee_delapp)."""
    root, tool = sample(tmp_path, "inbox-mlx5")
    state = with_dcb(tmp_path, app="dcb-app-dscp-prio-default.json", pfc="dcb-pfc-prio-pfc-3.json")
    config = {**inbox_vast(), "qos_trust": "pcp"}
    _, report = program((root, tool), "--check-json", config)
    trust = next(c for c in report["changes"] if c["what"] == "ens1f0np0 qos trust")
    assert (trust["current"], trust["wanted"], trust["apply"]) == ("dscp", "pcp", ["dcb", "app", "flush", "dev", "ens1f0np0", "dscp-prio"])
    program((root, tool), "--apply-json", config)
    assert (state / "app-ens1f0np0.json").read_text() == (DCB_SAMPLES / "dcb-app-dscp-prio-none.json").read_text()


def test_dcb_without_dcb_app_or_a_port_without_dcb_is_a_reason_not_a_gap_of_the_driver(tmp_path):
    """iproute2 5.11 had dcb and dcb pfc, not dcb app: trust is a reason naming the release, PFC is still set."""
    root, tool = sample(tmp_path, "inbox-mlx5")
    with_dcb(tmp_path, app="dcb-app-dscp-prio-none.json", pfc="dcb-pfc-prio-pfc-off.json", HICACHE_DCB_NO_APP="1")
    _, report = program((root, tool), "--check-json", inbox_vast())
    reasons = {u["what"]: u["reason"] for u in report["unavailable"]}
    assert reasons["ens1f0np0 qos trust"] == ('dcb -j app show dev ens1f0np0 dscp-prio: Object "app" is unknown '
                                              "(dcb app came with iproute2 5.12)")
    assert [c["what"] for c in report["changes"] if " qos" in c["what"]] == ["ens1f0np0 qos pfc"]
    assert not [g for g in report["not_offered"] if " qos" in g["what"]]
    other = tmp_path / "no-dcb"
    other.mkdir()
    root2, _ = sample(other, "inbox-mlx5")
    with_dcb(other, app=None, pfc=None)
    _, report = program((root2, tool), "--check-json", inbox_vast())
    reasons = {u["what"]: u["reason"] for u in report["unavailable"]}
    assert reasons["ens1f0np0 qos pfc"] == "dcb -j pfc show dev ens1f0np0 prio-pfc: Attribute read: Operation not supported"


MLNX_QOS = ("DCBX mode: OS controlled\nPriority trust state: pcp\nCable len: 7\nPFC configuration:\n"
            "\tpriority    0   1   2   3   4   5   6   7\n\tenabled     0   0   0   0   0   0   0   0   \n")  # mlnx_qos pretty_print


def test_where_mlnx_qos_is_installed_it_is_used_and_dcb_is_not(tmp_path):
    """The mlnx_qos path stays as it was wherever mlnx_qos exists, with dcb installed too (an inbox host with mlnx-tools).
    The stand-in prints what mlnx-tools python/mlnx_qos pretty_print prints (its format strings)."""
    root, tool = sample(tmp_path, "inbox-mlx5")
    state = with_dcb(tmp_path, app="dcb-app-dscp-prio-none.json", pfc="dcb-pfc-prio-pfc-off.json")
    mlnx_qos = python_only(tmp_path) / "mlnx_qos"
    mlnx_qos.write_text(f"#!/bin/sh\nprintf '{MLNX_QOS}'\n")
    mlnx_qos.chmod(0o755)
    _, report = program((root, tool), "--check-json", inbox_vast())
    qos = [c for c in report["changes"] if " qos" in c["what"]]
    assert qos == [{"what": "ens1f0np0 qos", "current": {"trust": "pcp", "pfc": [0] * 8}, "wanted": {"trust": "dscp", "pfc": [0, 0, 0, 1, 0, 0, 0, 0]},
                    "apply": ["mlnx_qos", "-i", "ens1f0np0", "--trust", "dscp", "--pfc", "0,0,0,1,0,0,0,0"]}]
    assert dcb_calls(state) == []


def remapped(tmp_path: pathlib.Path, dscp: int, prio: int) -> str:
    """A state file of a port trusting DSCP whose map sends `dscp` elsewhere: the default sample (dcb 6.5+ form) with
    that one entry changed, as a switch team's map or a half-done `dcb app add` leaves it."""
    entries = json.loads((DCB_SAMPLES / "dcb-app-dscp-prio-default.json").read_text())["dscp_prio"]
    changed = tmp_path / "dcb-app-remapped.json"
    changed.write_text(json.dumps({"dscp_prio": [[d, prio if d == dscp else p, x] for d, p, x in entries]}, separators=(",", ":")) + "\n")
    return str(changed)


def test_inbox_mlx5_trusting_dscp_with_the_storage_dscp_elsewhere_is_remapped_with_dcb(tmp_path):
    """Audit: trust read as dscp from any DSCP entry, the map never read: DSCP 26 (NFS over RDMA's) on priority 0, PFC
    on 3, and every check passed while the storage traffic ran on a priority without PFC. Now that entry differs and
    one `dcb app add` sets it (mlx5 keeps one priority per DSCP); the rest of the map is left as the port has it."""
    root, tool = sample(tmp_path, "inbox-mlx5")
    state = tmp_path / "dcb-state"
    with_dcb(tmp_path, app=None, pfc="dcb-pfc-prio-pfc-3.json")
    shutil.copy(remapped(tmp_path, 26, 0), state / "app-ens1f0np0.json")
    _, report = program((root, tool), "--check-json", inbox_vast())
    qos = [c for c in report["changes"] if " qos" in c["what"]]
    assert [(c["what"], c["current"], c["wanted"], c["apply"]) for c in qos] == [
        ("ens1f0np0 qos dscp 26", 0, 3, ["dcb", "app", "add", "dev", "ens1f0np0", "dscp-prio", "26:3"])]
    assert "goes to priority 0" in qos[0]["note"]
    _, applied = program((root, tool), "--apply-json", inbox_vast())
    assert "ens1f0np0 qos dscp 26" in applied["applied"] and not [f for f in applied["failed"] if " qos" in f["what"]]
    assert json.loads((state / "app-ens1f0np0.json").read_text()) == json.loads((DCB_SAMPLES / "dcb-app-dscp-prio-default.json").read_text())
    _, again = program((root, tool), "--check-json", inbox_vast())
    assert not [c for c in again["changes"] if " qos" in c["what"]]
    # without a ToS of its own (hicache_nic_roce_dscp null) the map is not the toolkit's to judge
    _, untouched = program((root, tool), "--check-json", {**inbox_vast(), "roce_tos": None})
    assert not [c for c in untouched["changes"] if " qos" in c["what"]]


def test_mlnx_qos_trusting_dscp_with_the_storage_dscp_elsewhere_is_remapped(tmp_path):
    """The same through mlnx_qos: its dscp2prio lines (mlnx-tools python/Python/dcbnetlink.py printAppSelector: per
    priority "\\tprio:<p> dscp:" and up to eight two-digit DSCPs a line) read, and `--dscp2prio set,26,3` set."""
    root, tool = sample(tmp_path, "inbox-mlx5")
    lines = {p: [d for d in range(64) if (0 if d == 26 else d >> 3) == p] for p in range(8)}
    dscp_map = "".join(f"\\tprio:{p} dscp:{''.join(f'{d:02d},' for d in chunk)}\\n"
                       for p, ds in lines.items() for chunk in (ds[i:i + 8] for i in range(0, len(ds), 8)))
    text = ("DCBX mode: OS controlled\\nPriority trust state: dscp\\ndscp2prio mapping:\\n" + dscp_map + "Cable len: 7\\nPFC configuration:\\n"
            "\\tpriority    0   1   2   3   4   5   6   7\\n\\tenabled     0   0   0   1   0   0   0   0   \\n")
    mlnx_qos = python_only(tmp_path) / "mlnx_qos"
    mlnx_qos.write_text(f"#!/bin/sh\nprintf '{text}'\n")
    mlnx_qos.chmod(0o755)
    _, report = program((root, tool), "--check-json", inbox_vast())
    qos = [(c["what"], c["current"], c["wanted"], c["apply"]) for c in report["changes"] if " qos" in c["what"]]
    assert qos == [("ens1f0np0 qos dscp 26", 0, 3, ["mlnx_qos", "-i", "ens1f0np0", "--dscp2prio", "set,26,3"])], report["changes"]


def test_with_ofed_a_missing_mlnx_qos_is_a_broken_install_and_fails(tmp_path):
    root, tool = sample(tmp_path, "ofed-mlx5")
    _, report = program((root, tool), "--check-json", routed())
    assert {"what": "ens1f0np0 qos", "reason": "mlnx_qos is not installed"} in report["unavailable"]
    assert not any(u["what"].endswith(" qos") for u in report["not_offered"])


def test_a_roce_lag_bond_sets_the_tos_of_its_one_rdma_device_once_named_after_the_bond(tmp_path):
    """Both ports of one ConnectX in an 802.3ad bond: mlx5 activates RoCE LAG and registers one RDMA device,
    mlx5_bond_0, on the first port's PCI device only (tests/samples/nic/README.md, ofed-mlx5-lag). The second port has
    none of its own: it reaches the bond's, whose ToS is set once; it used to fail the host ("no RDMA device behind
    ens1f1np1")."""
    root = sample(tmp_path, "ofed-mlx5-lag")
    rc, report = program(root, "--check-json", routed())
    assert rc == 0 and report["interfaces"] == ["ens1f0np0", "ens1f1np1"] and report["uppers"] == ["bond0"]
    assert [c for c in report["changes"] if "roce tos" in c["what"]] == [
        {"what": "bond0 roce tos (mlx5_bond_0 port 1)", "current": 0, "wanted": 104, "apply": ["roce_tos", "mlx5_bond_0", "1", "104"]}]
    assert not any("roce tos" in u["what"] for u in report["unavailable"])
    assert not [f for f in nic_tuning.nic_verdict(report, asked=True)["failures"] if "roce tos" in f or "RDMA" in f]
    rc, applied = program(root, "--apply-json", routed())
    assert rc == 0 and applied["failed"] == [] and "bond0 roce tos (mlx5_bond_0 port 1)" in applied["applied"]
    assert (root[0] / "sys/kernel/config/rdma_cm/mlx5_bond_0/ports/1/default_roce_tos").read_text() == "104"
    assert not (root[0] / "sys/kernel/config/rdma_cm/mlx5_2").exists()  # the front-end port's device: untouched
    _, again = program(root, "--check-json", routed())
    assert not any("roce tos" in c["what"] for c in again["changes"])


@pytest.mark.parametrize(("change", "named"), [
    ("none", ["ens1f1np1"]),  # its `master` link names bond0, whose GIDs name mlx5_bond_0's port 1
    ("no GID names the bond", ["ens1f1np1"]),  # then the device on the bond's other port's PCI device
    ("no master link", []),  # then the bond it was selected under (the route goes through bond0)
])
def test_the_second_port_of_a_lag_reaches_the_bond_s_rdma_device(tmp_path, change, named):
    root, tool = sample(tmp_path, "ofed-mlx5-lag")
    if change == "no GID names the bond":
        for ndev in (root / "sys/class/infiniband/mlx5_bond_0/ports/1/gid_attrs/ndevs").iterdir():
            ndev.unlink()
    if change == "no master link":
        (root / "sys/class/net/ens1f1np1/master").unlink()
    _, report = program((root, tool), "--check-json", {**routed(), "interfaces": named})
    tos = [(c["what"], c["apply"]) for c in report["changes"] if "roce tos" in c["what"]]
    assert tos == [("bond0 roce tos (mlx5_bond_0 port 1)", ["roce_tos", "mlx5_bond_0", "1", "104"])]
    assert not any("roce tos" in u["what"] for u in report["unavailable"])


def test_a_port_with_no_rdma_device_and_no_bond_is_still_a_reason(tmp_path):
    root, tool = sample(tmp_path, "ofed-mlx5-lag")
    for link in ("master", "upper_bond0"):
        (root / f"sys/class/net/ens1f1np1/{link}").unlink()
    _, report = program((root, tool), "--check-json", {**routed(), "interfaces": ["ens1f1np1"]})
    reasons = {u["what"]: u["reason"] for u in report["unavailable"]}
    assert reasons["ens1f1np1 roce tos"].startswith("no RDMA device behind ens1f1np1")


def test_the_recorded_selection_keeps_the_bond_above_the_ports(tmp_path):
    root = sample(tmp_path, "ofed-mlx5")
    program(root, "--apply-json", routed())
    recorded = json.loads((root[0] / nic_tuning.SELECTION_FILE.lstrip("/")).read_text())
    assert [s["port"] for s in recorded["selected"]] == ["ens1f0np0", "ens1f1np1"] and recorded["uppers"] == ["bond0"]


BONDED = ("ens1f0np0", "ens1f1np1")


def reboot_without_the_bond(net: pathlib.Path) -> None:
    """At boot the unit runs before network-pre.target: the network stack has not made bond0 yet, the ports are at
    their driver's MTU."""
    shutil.rmtree(net / "bond0")
    for port in BONDED:
        (net / port / "master").unlink()
        (net / port / "upper_bond0").unlink()
        (net / port / "mtu").write_text("1500\n")


def the_network_makes_the_bond(net: pathlib.Path) -> None:
    """bond0 appears with the default MTU 1500 and takes its ports: bond_enslave sets each port's MTU to the bond's
    (drivers/net/bonding/bond_main.c: dev_set_mtu(slave_dev, bond->dev->mtu))."""
    shutil.copytree(SAMPLES / "ofed-mlx5/root/sys/class/net/bond0", net / "bond0", symlinks=True)
    for port in BONDED:
        (net / port / "master").symlink_to("../bond0")
        (net / port / "upper_bond0").symlink_to("../bond0")
        (net / port / "mtu").write_text((net / "bond0/mtu").read_text())


def test_a_bond_s_jumbo_mtu_outlives_the_boot_it_appears_after(tmp_path):
    """The boot run sets the ports' MTU from the recorded selection and says nothing of the bond that is not there
    yet (no failure); enslaving then puts the ports back at the bond's 1500, and the udev rule's run when bond0 appears
    sets the bond's MTU, which is its ports' too. Before, `uppers` were not recorded: the jumbo MTU was lost at every
    boot until the role ran again."""
    root, tool = sample(tmp_path, "ofed-mlx5")
    config = {**routed(), "irq_affinity": False}  # no systemctl here to stop the sample's irqbalance
    program((root, tool), "--apply-json", config)  # the role's run: finds the ports by route, records them
    net = root / "sys/class/net"
    reboot_without_the_bond(net)
    at_boot = (root, tmp_path / "no-tool-output")  # no address, no route yet
    rc, boot = program(at_boot, "--apply", config)  # the boot unit: the installed config, the recorded ports
    assert rc == 0 and boot["failed"] == [] and boot["uppers"] == []
    assert [c["what"] for c in boot["changes"] if c["what"].endswith(" mtu")] == ["ens1f0np0 mtu", "ens1f1np1 mtu"]
    assert not any("bond0" in u["what"] for u in boot["unavailable"])
    assert not [f for f in nic_tuning.nic_verdict(boot, asked=True)["failures"] if " mtu" in f or "bond0" in f]
    assert (net / "ens1f0np0/mtu").read_text() == "9000\n"
    the_network_makes_the_bond(net)
    assert (net / "ens1f0np0/mtu").read_text() == "1500\n"
    rc, udev = program(at_boot, "--apply", config)  # the udev rule restarts the unit: still no route
    assert rc == 0 and udev["uppers"] == ["bond0"] and "bond0 mtu" in udev["applied"]
    assert {p: (net / p / "mtu").read_text() for p in ("bond0", *BONDED)} == dict.fromkeys(("bond0", *BONDED), "9000\n")
    _, settled = program(at_boot, "--check", config)
    assert not any(c["what"].endswith(" mtu") for c in settled["changes"])


def test_the_udev_rule_reapplies_when_an_rdma_device_a_bond_or_a_vlan_appears():
    """A net device's uevent carries DEVTYPE from its device_type: "bond" (drivers/net/bonding/bond_main.c) or "vlan"
    (net/8021q/vlan_dev.c); drivers/base/core.c, dev_uevent."""
    run = f'RUN+="/bin/systemctl --no-block restart {nic_tuning.UNIT}"'
    rules = [line for line in nic_tuning.udev_rule_text().splitlines() if not line.startswith("#")]
    assert rules == [f'ACTION=="add", SUBSYSTEM=="infiniband", {run}',
                     f'ACTION=="add", SUBSYSTEM=="net", ENV{{DEVTYPE}}=="bond|vlan", {run}']


ROCE_SAMPLES = ROOT / "tests/samples/roce-tos"  # mountstats and mountinfo from the kernel's print code (its README)


def stand_in(tmp_path: pathlib.Path, name: str, body: str) -> pathlib.Path:
    """A tool on the program's PATH, in Python: logs its argv (one JSON list a line) to <name>.log, then runs `body`
    with `root` (the sample's HICACHE_SYSFS_ROOT) and `args`."""
    log = tmp_path / f"{name}.log"
    tool = python_only(tmp_path) / name
    tool.write_text("#!/usr/bin/env python3\nimport json, os, pathlib, shutil, sys\nargs = sys.argv[1:]\n"
                    f"open({str(log)!r}, 'a').write(json.dumps(args) + '\\n')\nroot = pathlib.Path(os.environ['HICACHE_SYSFS_ROOT'])\n{body}\n")
    tool.chmod(0o755)
    return log


def calls(log: pathlib.Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.parametrize("configfs", ["not loaded", "not mounted", "mounted"])
def test_configfs_is_mounted_before_the_tos_is_set_where_it_is_not(tmp_path, configfs):
    """#34: the boot unit could run before systemd mounted configfs (DefaultDependencies=no, no After= on
    sys-kernel-config.mount); rdma_cm's default ToS is a configfs attribute (Documentation/ABI/testing/configfs-rdma_cm),
    so the program mounts configfs where the mount table lacks it, as mlnx-tools' sbin/cma_roce_tos does
    (`mount -t configfs none /sys/kernel/config` where /proc/mounts does not show it), then loads rdma_cm, and says so.
    Stand-ins: `mount` makes the mount (the directory exists and mountinfo shows it); `modprobe rdma_cm` makes what the
    kernel then shows (rdma_cm/, and a device's group with its ports once made: drivers/infiniband/core/cma_configfs.c).
    configfs makes /sys/kernel/config when it loads (fs/configfs/mount.c, configfs_init): without it, configfs is a
    module not loaded yet, loaded first."""
    root, tool = sample(tmp_path, "ofed-mlx5")
    rdma_cm = SAMPLES / "ofed-mlx5/root/sys/kernel/config/rdma_cm"
    shutil.rmtree(root / "sys/kernel/config")
    (root / "proc/self").mkdir(parents=True)
    shutil.copy(ROCE_SAMPLES / ("mountinfo-configfs.txt" if configfs == "mounted" else "mountinfo-no-configfs.txt"),
                root / "proc/self/mountinfo")
    if configfs != "not loaded":
        (root / "sys/kernel/config").mkdir(parents=True)
    configfs_line = (ROCE_SAMPLES / "mountinfo-configfs.txt").read_text().splitlines()[-1]
    mount = stand_in(tmp_path, "mount", f"(root / 'sys/kernel/config').mkdir(parents=True, exist_ok=True)\n"
                                        f"open(root / 'proc/self/mountinfo', 'a').write({configfs_line!r} + '\\n')")
    modprobe = stand_in(tmp_path, "modprobe", f"if args == ['rdma_cm']:\n    shutil.copytree({str(rdma_cm)!r}, root / 'sys/kernel/config/rdma_cm')")
    config = {**routed(), "irq_affinity": False}
    _, check = program((root, tool), "--check-json", config)
    tos = next(c for c in check["changes"] if c["what"] == "ens1f0np0 roce tos")
    assert tos["note"] == ("/sys/kernel/config/rdma_cm is not there yet: the rdma_cm module is loaded first" if configfs == "mounted" else
                           "configfs is not mounted at /sys/kernel/config: it is mounted first (mount -t configfs, as mlnx-tools' "
                           "cma_roce_tos does), then rdma_cm loaded")
    assert calls(mount) == [] and calls(modprobe) == []  # a check changes nothing
    rc, applied = program((root, tool), "--apply-json", config)
    assert rc == 0 and applied["failed"] == [] and {"ens1f0np0 roce tos", "ens1f1np1 roce tos"} <= set(applied["applied"])
    if configfs != "mounted":
        assert calls(mount) == [["-t", "configfs", "configfs", "/sys/kernel/config"]]
        assert "configfs mounted at /sys/kernel/config (rdma_cm's default ToS lives there)" in applied["applied"]
    else:
        assert calls(mount) == [] and not [a for a in applied["applied"] if a.startswith("configfs")]
    assert calls(modprobe) == ([["configfs"]] if configfs == "not loaded" else []) + [["rdma_cm"]]
    assert (root / "sys/kernel/config/rdma_cm/mlx5_0/ports/1/default_roce_tos").read_text() == "104"
    _, again = program((root, tool), "--apply-json", config)
    assert not any(c["what"].endswith("roce tos") for c in again["changes"]) and len(calls(mount)) == (configfs != "mounted")


def shift_stamps(root: pathlib.Path, seconds: float) -> None:
    """As if the program had set the ToS `seconds` earlier (the samples read 60 s apart; the tests run in less)."""
    stamp_file = root / nic_tuning.TOS_STAMP_FILE.lstrip("/")
    if not stamp_file.exists():
        return  # nothing stamped (the judgement below then says why it fails)
    stamps = json.loads(stamp_file.read_text())
    stamp_file.write_text(json.dumps({k: {**v, "set_at": v["set_at"] - seconds} for k, v in stamps.items()}))


def with_mountstats(root: pathlib.Path, name: str) -> None:
    (root / "proc/self").mkdir(parents=True, exist_ok=True)
    shutil.copy(ROCE_SAMPLES / name, root / "proc/self/mountstats")


def test_a_tos_set_under_a_mount_whose_transports_predate_it_is_set_not_yet_in_effect(tmp_path):
    """#34: RDMA-CM takes the default ToS when a connection resolves its route (drivers/infiniband/core/cma.c,
    cma_resolve_iboe_route), so an L3 mount made before the ToS keeps its transports' old ToS, and verify passed on the
    configfs value alone. The program stamps each ToS it sets with the mount's statistics read just after; the verdict
    says "set, not yet in effect" (a gap: degraded) until every transport has connected again or the tier is mounted
    again, and names the fix."""
    root, tool = sample(tmp_path, "ofed-mlx5")
    config = {**routed(), "irq_affinity": False}
    with_mountstats(root, "mountstats-at-set.txt")  # the tier mounted a day before this deploy
    _, applied = program((root, tool), "--apply-json", config)
    assert {"ens1f0np0 roce tos", "ens1f1np1 roce tos"} <= set(applied["applied"])
    shift_stamps(root, 60)
    with_mountstats(root, "mountstats-same.txt")
    _, check = program((root, tool), "--check-json", config)
    assert check["changes"] == []
    verdict = nic_tuning.nic_verdict(check, asked=True)
    assert [g.split(":")[0] for g in verdict.get("not_in_effect", [])] == ["ens1f0np0 roce tos", "ens1f1np1 roce tos"], verdict
    assert verdict["not_in_effect"][0].startswith("ens1f0np0 roce tos: set, not yet in effect on /mnt/kvcache-2ports: 2 of its 2 RDMA "
                                                  "transports connected before the ToS was set (60 s ago; the mount is 86460 s old)")
    assert verdict["not_in_effect"][0].endswith(": remount /mnt/kvcache-2ports (with no other mount of the same server left, so that its "
                                                "transports are made anew) or restart the host")
    # degraded, not failed: checks.yml reports it with strict false (the sample's gaps are its missing tools)
    assert not [x for x in verdict["failures"] + verdict["gaps"] if "roce tos" in x]
    with_mountstats(root, "mountstats-one-reconnected.txt")
    _, check = program((root, tool), "--check-json", config)
    assert "1 of its 2 RDMA transports" in nic_tuning.nic_verdict(check, asked=True)["not_in_effect"][0]
    for name in ("mountstats-reconnected.txt", "mountstats-remounted.txt"):  # every transport connected since; mounted again since
        with_mountstats(root, name)
        _, check = program((root, tool), "--check-json", config)
        assert "not_in_effect" not in nic_tuning.nic_verdict(check, asked=True), name
    # the stamp: each RDMA port set, under /run, with the server's mounts read just after
    assert config["storage_server"] == SERVER and config["tos_stamp_file"].startswith("/run/") and check["roce_tos_effect"]["server"] == SERVER
    stamps = json.loads((root / nic_tuning.TOS_STAMP_FILE.lstrip("/")).read_text())
    assert sorted(stamps) == ["mlx5_0 1", "mlx5_1 1"] and stamps["mlx5_0 1"]["tos"] == 104
    then = stamps["mlx5_0 1"]["mountstats"]
    assert then.startswith("device 172.16.10.20:/kvcache mounted on /mnt/kvcache-2ports ") and "\tage:\t86400\n" in then
    assert "per-op statistics" not in then and "/home" not in then  # the server's mounts only, up to their per-op statistics


def test_a_tos_set_before_the_tier_was_mounted_is_in_effect(tmp_path):
    """The boot unit (or a first deploy) sets the ToS before the tier is mounted: the stamp shows no mount then, and
    the mount made since carries it."""
    root, tool = sample(tmp_path, "ofed-mlx5")
    config = {**routed(), "irq_affinity": False}
    with_mountstats(root, "mountstats-not-mounted.txt")
    program((root, tool), "--apply-json", config)
    stamps = json.loads((root / nic_tuning.TOS_STAMP_FILE.lstrip("/")).read_text())
    assert {v["mountstats"] for v in stamps.values()} == {""}
    shift_stamps(root, 120)
    with_mountstats(root, "mountstats-remounted.txt")  # mounted 30 s ago, 90 s after the ToS
    _, check = program((root, tool), "--check-json", config)
    verdict = nic_tuning.nic_verdict(check, asked=True)
    assert len(check["roce_tos_effect"]["stamps"]) == 2 and "not_in_effect" not in verdict and "not_checked" not in verdict


def test_a_tos_this_program_did_not_set_since_the_boot_is_not_checked_against_the_mount(tmp_path):
    root, tool = sample(tmp_path, "ofed-mlx5")
    for device in ("mlx5_0", "mlx5_1"):
        (root / f"sys/kernel/config/rdma_cm/{device}/ports/1/default_roce_tos").write_text("104\n")  # by another tool, or a release before
    with_mountstats(root, "mountstats-same.txt")
    _, check = program((root, tool), "--check-json", {**routed(), "irq_affinity": False})
    verdict = nic_tuning.nic_verdict(check, asked=True)
    assert "not_in_effect" not in verdict and [n.split(":")[0] for n in verdict["not_checked"]] == ["ens1f0np0 roce tos", "ens1f1np1 roce tos"]
    assert "not set by hicache-nic-tuning since the boot" in verdict["not_checked"][0]


@pytest.mark.parametrize("run,reason", [
    ({"rc": 1, "stdout": "", "stderr": "Traceback ...\nPermissionError: /sys/class/net"}, "(rc 1): Traceback ...\nPermissionError"),
    ({"rc": 0, "stdout": "not json", "stderr": ""}, "(rc 0): "),
    ({"rc": 0, "stdout": "{not json", "stderr": "cut"}, "(rc 0): cut"),
    ({"rc": 2, "stdout": '{"changes": []}', "stderr": "died late"}, "(rc 2): died late"),
])
def test_a_program_that_failed_or_wrote_no_report_fails_the_host(run, reason):
    """The role judges the whole run of --check-json (rc, stdout, stderr): one that failed, or wrote no report, is a
    failure of the host whatever hicache_strict says, never a pass on an empty report."""
    report, failure = nic_tuning.program_report(run)
    assert report == {} and failure.startswith("hicache-nic-tuning failed on this host ") and reason in failure
    verdict = nic_tuning.nic_plan(deployment("vast", strict=False), run).verdict
    assert verdict == {"failures": [failure], "gaps": [], "changes": []}


def test_a_run_with_a_report_is_judged_as_the_report_itself():
    report = {"changes": [{"what": "ens1f0np0 mtu 1500 -> 9000"}], "selected": [{"port": "ens1f0np0", "reason": "named"}]}
    run = {"rc": 0, "stdout": json.dumps(report) + "\n", "stderr": ""}
    d = deployment("vast")
    assert nic_tuning.program_report(run) == (report, None)
    assert nic_tuning.nic_plan(d, run).verdict == nic_tuning.nic_plan(d, report).verdict
