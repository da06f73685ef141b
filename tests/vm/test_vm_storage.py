"""The storage role against a real kernel: NFS over RDMA (Soft-RoCE) from a real NFS server VM, the VAST shape
(NFSv3, nconnect) and the NetApp shape (NFS 4.1), read-ahead through nfsrahead and udev, the RDMA slot table,
fstab and reboots, and a storage outage at boot. Every assertion reads what the kernel reports: /proc/self/mountinfo,
/sys/class/bdi/<maj:min>/read_ahead_kb, /proc/sys. The tests run in order on one pair of VMs (tests/vm/conftest.py).

The vastnfs client's own options (remoteports, localports, spread_reads) cannot be mounted by the stock kernel: they are
tested by their rules and rendering (tests/unit/plans/test_storage.py), not here; what localports needs of the kernel (reverse-path
filtering off on the storage ports, before the mount) is tuned and read here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import time

import pytest
from bed import EXPORT, LINKS, ROOT, vmlib

from hicachectl import rules
from hicachectl.plans import nic_tuning, storage

pytestmark = [pytest.mark.slow, pytest.mark.vm, pytest.mark.timeout(3600)]  # a boot, an image import and a converge on a loaded TCG guest

POINT = "/mnt/l3"
READ_AHEAD = 8192
SLOTS = 64  # not the kernel's 128, so the test sees the role set it
FOREIGN_FSTAB = "# a line of the host's own, kept byte for byte \t\n/dev/vdz  /srv/other  ext4  noauto,x-foo=1  0 0\n"
OLD_SUNRPC_MODPROBE = "/etc/modprobe.d/hicache-sunrpc.conf"  # what 0.1.0 wrote (hicachectl/plans/storage.py OLD_SUNRPC_MODPROBE_FILE)
STORAGE_ROLE = [{"name": "The storage role", "ansible.builtin.include_role": {"name": "hicache.deploy.storage"}}]
STORAGE_VERIFY = [{"name": "The storage role's verify", "ansible.builtin.include_role": {"name": "hicache.deploy.storage", "tasks_from": "verify"}}]
SERVER_ROLES = [{"name": "The limits role", "ansible.builtin.include_role": {"name": "hicache.deploy.host_limits"}},
                {"name": "The server role", "ansible.builtin.include_role": {"name": "hicache.deploy.sglang_server"}}]
STANDIN = "/opt/standin/sglang_standin.py"
# SGLang's stand-in as the L3 tier's user, run by the server role's own unit (runtime none): stdlib only (no L3
# backend, so neither torch nor SGLang's wheel is needed in the VM). What is tested is the unit's rule about its tier.
SERVER = {"hicache_container_runtime": "none", "hicache_launcher": ["python3", STANDIN], "hicache_model_path": "hicache-standin-model",
          "hicache_image": "lmsysorg/sglang:v0.5.23-cu129",  # with runtime none only a record (deployed.json)
          "hicache_sglang_version": "0.5.23", "hicache_health_timeout": 120, "hicache_container_env": {"STANDIN_LOAD_SECONDS": "1"}}
UNIT = "sglang-hicache.service"
NFSRAHEAD = "/usr/libexec/nfsrahead"  # Debian 12's nfs-common 2.6.2
# exits 0 when the server answers /health with 200
HEALTHY = vmlib.http_ok()


def vast(**extra):
    return {"hicache_storage_type": "vast", "hicache_storage_server": LINKS[0][0], "hicache_storage_export": EXPORT,
            "hicache_cache_dir": POINT, "hicache_storage_nconnect": 4, "hicache_storage_read_ahead_kb": READ_AHEAD,
            # 90 s: under TCG the first NFSv3 mount of a boot also starts rpc-statd, which takes a while.
            "hicache_storage_sunrpc_slots": SLOTS, "hicache_storage_mount_timeout": 90, "hicache_strict": True, **extra}


def netapp(**extra):
    return {**vast(), "hicache_storage_type": "netapp", "hicache_storage_nconnect": None, **extra}


def recap(run) -> dict[str, int]:
    match = re.search(r"ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", run.stdout)
    assert match, run.stdout[-3000:] + run.stderr[-2000:]
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, match.groups()), strict=True))


def changed_tasks(run) -> list[str]:
    """Each task the run reported changed, with what its result said (-v)."""
    out, task, lines = [], None, run.stdout.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("TASK ["):
            task = line
        elif line.startswith("changed:"):
            detail = []
            for following in lines[i + 1:i + 40]:
                if not following.startswith(" "):
                    break
                detail.append(following.strip())
            out.append(f"{task} {line} {' | '.join(detail)}")
    return out


def converge(bed, variables, name):
    run = bed.play(bed.inventory(name, variables), STORAGE_ROLE)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    return recap(run)


def mount_entry(vm, point=POINT):
    """(major:minor, fstype, source, options) of the mount at `point`, from the kernel's own mountinfo."""
    for line in vm.read("/proc/self/mountinfo").splitlines():
        fields = line.split()
        if fields[4] == point:
            sep = fields.index("-")
            return {"majmin": fields[2], "fstype": fields[sep + 1], "source": fields[sep + 2],
                    "options": set(fields[5].split(",")) | set(fields[sep + 3].split(","))}
    return None


def live_read_ahead(vm, point=POINT) -> int:
    return int(vm.read(f"/sys/class/bdi/{mount_entry(vm, point)['majmin']}/read_ahead_kb").strip())


def assert_tuned(vm, vers, transports=None):
    entry = mount_entry(vm)
    assert entry is not None, vm.read("/proc/self/mountinfo")
    assert entry["source"] == f"{LINKS[0][0]}:{EXPORT}" and entry["fstype"] == ("nfs" if vers == "3" else "nfs4")
    assert {f"vers={vers}", "proto=rdma", "port=20049"} <= entry["options"], entry
    if transports:
        assert f"nconnect={transports}" in entry["options"], entry
    assert live_read_ahead(vm) == READ_AHEAD
    assert vm.read("/proc/sys/sunrpc/rdma_slot_table_entries").strip() == str(SLOTS)
    # The TCP tables are the kernel's (an older role lowered the maximum to 128).
    assert vm.read("/proc/sys/sunrpc/tcp_max_slot_table_entries").strip() == "65536"


def test_a_dry_run_on_the_fresh_host_passes_and_changes_nothing(bed):
    """What `hicachectl plan` runs (check mode) on a host that never mounted NFS over RDMA: rpcrdma is not loaded, so
    sunrpc.rdma_slot_table_entries does not exist yet, and the role's modprobe is a command check mode skips. It failed
    here ("does not exist") until the plan named the values that wait for rpcrdma."""
    vm = bed.client
    # rdma-core loads it at boot once an RDMA device is there (kernel-boot/modules/rdma.conf lists xprtrdma, its alias):
    # a host without rdma-core's boot rules, or whose device came later, has none; nothing is mounted yet to hold it.
    vm.ssh("modprobe -r rpcrdma", check=True)
    assert "rpcrdma" not in vm.ssh("cut -d' ' -f1 /proc/modules").stdout.split()
    fstab = vm.read("/etc/fstab")
    dry = bed.play(bed.inventory("vast", vast()), STORAGE_ROLE, check=True, verbose=True)
    assert dry.returncode == 0 and recap(dry)["failed"] == 0, dry.stdout[-6000:]
    assert "sunrpc.rdma_slot_table_entries" in dry.stdout
    assert vm.read("/etc/fstab") == fstab and mount_entry(vm) is None
    assert "rpcrdma" not in vm.ssh("cut -d' ' -f1 /proc/modules").stdout.split()


def test_first_converge_of_a_vast_shaped_host_has_read_ahead_in_effect(bed):
    """Failed before this change: the role mounted before writing nfsrahead's config, wrote the live read-ahead from
    the facts read before the mount (none), and then found 128 where it wanted 8192."""
    vm = bed.client
    vm.write("/etc/fstab", vm.read("/etc/fstab") + FOREIGN_FSTAB)
    bed.fstab_before = vm.read("/etc/fstab")
    # A host upgraded from 0.1.0: its modprobe.d options and their live effect (the TCP tables lowered to 128).
    vm.write(OLD_SUNRPC_MODPROBE, "# Managed by hicache-deploy.\noptions sunrpc tcp_slot_table_entries=128 tcp_max_slot_table_entries=128\n")
    vm.ssh("modprobe sunrpc && echo 128 > /proc/sys/sunrpc/tcp_slot_table_entries && echo 128 > /proc/sys/sunrpc/tcp_max_slot_table_entries", check=True)
    converge(bed, vast(), "vast")
    assert_tuned(vm, "3", transports=4)
    assert vm.read("/proc/sys/sunrpc/tcp_slot_table_entries").strip() == "2"  # the kernel's own again, without a reboot
    assert vm.ssh(f"test -e {OLD_SUNRPC_MODPROBE}").returncode == 1
    # nfsrahead's config was in place when the mount's bdi appeared: udev's rule set the value, not only the role.
    assert vm.read("/etc/nfs.conf.d/hicache-readahead.conf").count(f"={READ_AHEAD}") == 2
    assert vm.ssh(f"/usr/libexec/nfsrahead {mount_entry(vm)['majmin']}").stdout.strip() == str(READ_AHEAD)


def test_the_hosts_own_fstab_lines_are_kept_byte_for_byte(bed):
    fstab = bed.client.read("/etc/fstab")
    assert fstab.startswith(bed.fstab_before)
    ours = fstab[len(bed.fstab_before):]
    assert ours.startswith("# BEGIN hicache-deploy L3 tier\n") and f"{LINKS[0][0]}:{EXPORT} {POINT} nfs " in ours


def test_a_second_converge_changes_nothing_and_verify_passes(bed):
    assert converge(bed, vast(), "vast")["changed"] == 0
    run = bed.play(bed.inventory("vast", vast()), STORAGE_VERIFY)
    assert run.returncode == 0 and recap(run)["failed"] == 0, run.stdout[-4000:]
    check = bed.play(bed.inventory("vast", vast()), STORAGE_ROLE, check=True)
    assert check.returncode == 0 and recap(check)["changed"] == 0, check.stdout[-4000:]


def test_bench_tier_only_reads_the_nfs_over_rdma_mount_as_nixl_does(bed):
    """#35: `hicachectl bench --tier-only` on the VAST-shaped mount (NFS v3 over Soft-RoCE, nconnect 4), through the CLI
    and playbooks/bench_tier.yml as an operator runs it: K/V-sized files (half a page of the model's config) read with
    O_DIRECT at NIXL's queue depth, in a directory of its own under the tier; the raw GB/s, and SGLang's share said not
    measured (no SGLang server runs in this VM: its GPU server cannot); nothing left behind."""
    import subprocess
    import sys

    sys.path.insert(0, str(ROOT / "tests/standin"))
    import sglang_pages  # the stand-in's model, no torch at import

    config = bed.workdir / "model-config.json"  # 4 layers, 1 KV head of 128 in bf16: 2 KiB a token, 128 KiB a page of 64
    config.write_text(json.dumps(sglang_pages.CONFIG_JSON))
    variables = vast(hicache_storage_backend="nixl", hicache_model_config=str(config), hicache_page_size=64,
                     hicache_image="lmsysorg/sglang:v0.5.23-cu129", hicache_sglang_version="0.5.23", hicache_model_path="/models/tiny",
                     hicache_served_model_name="tiny")
    d, findings = rules.check_host(bed.client.name, variables)
    assert d is not None and not rules.has_errors(findings), [f.format() for f in findings]
    before = bed.client.ssh(f"ls -A {POINT}").stdout.split()
    run = subprocess.run([sys.executable, "-m", "hicachectl", "bench", "--inventory", str(bed.inventory("tier", variables)), "--tier-only",
                          "--tier-bytes", str(64 << 20), "--json"], stdin=subprocess.DEVNULL, capture_output=True, text=True, cwd=ROOT, timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    tier = json.loads(run.stdout)["tier"][bed.client.name]
    print(f"bench --tier-only on NFS v3 over Soft-RoCE: {tier['gbps']:.3f} GB/s ({tier['method']}, {tier['files']} files of "
          f"{tier['read_bytes']} B, depth {tier['queue_depth']}, O_DIRECT {tier['direct']})")
    assert tier["gbps"] > 0 and tier["read_bytes"] == 64 * 2048 // 2 and tier["queue_depth"] == 256 and tier["direct"] is True
    assert tier["bytes"] == tier["read_bytes"] * tier["files"] >= 64 << 20 and json.loads(run.stdout)["tier_share"] is None
    assert bed.client.ssh(f"ls -A {POINT}").stdout.split() == before  # its directory (.hicache-tier-bench-*) removed after the reads
    assert mount_entry(bed.client)["fstype"] == "nfs"  # read through the mount, which is still there


def test_verify_fails_when_a_tuned_value_drifts(bed):
    vm = bed.client
    vm.ssh("echo 128 > /proc/sys/sunrpc/rdma_slot_table_entries", check=True)
    run = bed.play(bed.inventory("vast", vast()), STORAGE_VERIFY)
    assert run.returncode != 0 and "sunrpc.rdma_slot_table_entries" in run.stdout, run.stdout[-4000:]
    vm.ssh(f"echo {SLOTS} > /proc/sys/sunrpc/rdma_slot_table_entries", check=True)


NIC_ONLY_MTU = {"hicache_nic_mtu": 9000, "hicache_nic_rings": None, "hicache_nic_channels": None, "hicache_nic_qos_trust": None,
                "hicache_nic_pfc_priorities": [], "hicache_nic_ecn_priorities": [], "hicache_nic_irq_affinity": False,
                "hicache_nic_max_read_request": None, "hicache_nic_cpu_governor": None, "hicache_nic_roce_dscp": None}
NIC_ROLE = [{"name": "The NIC role", "ansible.builtin.include_role": {"name": "hicache.deploy.nic_tuning"}}]


def test_nic_tuning_selects_no_virtio_port_unless_named_and_sets_a_named_ports_mtu(bed):
    """The VMs' storage ports are virtio, not ConnectX: unnamed, none is tuned; named, its MTU changes in the kernel.
    Every setting but the MTU is null ("None leaves it"): the role's argument spec and plan take that."""
    vm = bed.client
    ports = bed.client_ports
    before = {port: vm.read(f"/sys/class/net/{port}/mtu").strip() for port in ports}
    unnamed = bed.play(bed.inventory("nic", {**vast(), **NIC_ONLY_MTU, "hicache_strict": False}), NIC_ROLE)
    assert unnamed.returncode == 0, unnamed.stdout[-6000:]
    assert {port: vm.read(f"/sys/class/net/{port}/mtu").strip() for port in ports} == before, unnamed.stdout[-4000:]
    named = bed.play(bed.inventory("nic", {**vast(), **NIC_ONLY_MTU, "hicache_nic_interfaces": [ports[1]]}), NIC_ROLE)
    assert named.returncode == 0, named.stdout[-6000:]
    assert vm.read(f"/sys/class/net/{ports[1]}/mtu").strip() == "9000"
    assert vm.read(f"/sys/class/net/{ports[0]}/mtu").strip() == before[ports[0]]  # the one carrying the mount is left alone
    assert vm.ssh("systemctl is-enabled hicache-nic-tuning.service").stdout.strip() == "enabled"


def test_after_a_reboot_the_mount_and_every_tuned_value_come_back(bed):
    """The one plain reboot of the bed (each TCG boot costs minutes on a loaded machine): the VAST mount and every
    tuned value come back from their persistence; the NetApp shape's mount comes back through a boot too, in the
    storage outage test below. Here the host has no nfsrahead, as with nfs-utils before 2.6.2 (Ubuntu 22.04's 2.6.1):
    the read-ahead comes back through the toolkit's own udev rule; after the outage's boot below, through nfsrahead's."""
    vm = bed.client
    vm.ssh(f"mv {NFSRAHEAD} {NFSRAHEAD}.testbed-hidden", check=True)
    try:
        converge(bed, vast(), "vast")  # the facts find no nfsrahead: the role installs its own rule
        assert vm.ssh(f"test -x {storage.READ_AHEAD_PROGRAM} && test -f {storage.READ_AHEAD_RULE_FILE}").returncode == 0
        vm.reboot()
        # 300 s: the mount may start late and take its whole mount timeout on a loaded machine; a pass ends at the mount.
        vm.ssh(f"for i in $(seq 300); do mountpoint -q {POINT} && exit 0; sleep 1; done; journalctl -b -u testbed-rxe -u mnt-l3.mount; exit 1",
               check=True, timeout=400)
        assert_tuned(vm, "3", transports=4)  # read-ahead included: nothing but the toolkit's rule could have set it
        run = bed.play(bed.inventory("vast", vast()), STORAGE_VERIFY)
        assert run.returncode == 0, run.stdout[-4000:]
    finally:
        vm.ssh(f"mv {NFSRAHEAD}.testbed-hidden {NFSRAHEAD}")


def test_after_the_reboot_the_named_ports_mtu_is_back_from_the_boot_unit(bed):
    """The NIC test ran before that reboot: the boot unit set the MTU again, before the network."""
    vm = bed.client
    assert vm.read(f"/sys/class/net/{bed.client_ports[1]}/mtu").strip() == "9000"
    result = vm.ssh("systemctl show -p ActiveState,Result --value hicache-nic-tuning.service").stdout.split()
    assert result[:2] == ["active", "success"] or "success" in result, result
    order = vm.ssh("systemctl show -p Before,After --value hicache-nic-tuning.service").stdout
    assert "network-pre.target" in order, order
    # after configfs, where the RDMA-CM default ToS lives (the unit's After=, as systemd loaded it)
    assert "sys-kernel-config.mount" in order.split(), order


def test_a_netapp_shaped_host_mounts_nfs_4_1_over_rdma_with_everything_in_effect_on_the_first_run(bed):
    vm = bed.client
    vm.ssh(f"umount {POINT}", check=True)
    first = converge(bed, netapp(), "netapp")
    assert first["changed"] > 0
    assert_tuned(vm, "4.1")
    # nfsrahead is back (the reboot test hid it): the toolkit's own rule is gone, nfs-utils' set the new mount's value
    assert vm.ssh(f"test -e {storage.READ_AHEAD_PROGRAM} || test -e {storage.READ_AHEAD_RULE_FILE}").returncode == 1
    assert {"rsize=65536", "wsize=65536"} <= mount_entry(vm)["options"]
    assert converge(bed, netapp(), "netapp")["changed"] == 0
    # The kernel NFS server grants no pNFS layout: the kernel's own mountstats says so (",pnfs=not configured",
    # fs/nfs/super.c), and the storage role's verify notes pNFS as not checked, neither passed nor failed.
    assert "pnfs=not configured" in vm.read("/proc/self/mountstats")
    checked = bed.play(bed.inventory("netapp", netapp()), STORAGE_VERIFY, verbose=True)
    assert checked.returncode == 0, checked.stdout[-4000:]
    shown = " ".join(checked.stdout.split())  # the yaml callback may fold a long note
    assert f"not checked on {POINT}: pNFS: the server granted no layout (pnfs=not configured)" in shown, checked.stdout[-4000:]
    fstab = vm.read("/etc/fstab")
    assert fstab.startswith(bed.fstab_before) and fstab.count("# BEGIN hicache-deploy L3 tier") == 1


def assert_memlock_unlimited(vm):
    """memlock where it matters (host_limits): a new login session (pam_limits reads limits.d) and the running
    server's own process, as the kernel reports them."""
    assert vm.ssh("ulimit -l; ulimit -Hl", login=True).stdout.split() == ["unlimited", "unlimited"]
    pid = vm.ssh(f"systemctl show -p MainPID --value {UNIT}").stdout.strip()
    assert pid not in ("", "0"), pid
    limits = next(x for x in vm.read(f"/proc/{pid}/limits").splitlines() if x.startswith("Max locked memory"))
    assert limits.split()[3:5] == ["unlimited", "unlimited"], limits


def serves(vm) -> bool:
    return vm.ssh(HEALTHY).returncode == 0


def test_with_the_storage_down_at_boot_the_host_boots_and_verify_names_the_missing_mount(bed):
    """On the NetApp shape the NetApp test left mounted (NFS 4.1), so that shape's fstab line meets a boot too.
    The behaviour chosen (templates/sglang-hicache.service.j2): the mount is nofail, so the host boots; the server's
    unit refuses to start without its tier (ExecStartPre) and retries every RestartSec with no start limit, mounting
    the tier itself once the storage answers, so the server comes back when the storage does, with no converge."""
    vm, storage = bed.client, bed.storage
    vm.write(STANDIN, (ROOT / "tests/standin/sglang_standin.py").read_text(), mode="0755")
    served = bed.play(bed.inventory("server", {**netapp(), **SERVER}), SERVER_ROLES)
    assert served.returncode == 0, served.stdout[-6000:] + served.stderr[-2000:]
    assert serves(vm)
    assert_memlock_unlimited(vm)
    storage.power_off()
    started = time.monotonic()
    vm.reboot()
    booted = time.monotonic() - started
    assert mount_entry(vm) is None
    # The boot went on without the mount (nofail): the system reached its default target, not stuck on the mount.
    booted_state = vm.ssh("systemctl is-system-running --wait").stdout.strip()
    assert booted_state in ("running", "degraded"), booted_state
    assert vm.ssh("systemctl is-active mnt-l3.mount").stdout.strip() != "active"
    run = bed.play(bed.inventory("netapp", netapp()), STORAGE_VERIFY)
    assert run.returncode != 0 and f"nothing is mounted at {POINT}" in run.stdout, run.stdout[-4000:]
    print(f"client booted with its storage down in {booted:.0f} s")
    # No server without its tier: the unit is retrying its start, nothing listens.
    assert vm.ssh(f"systemctl is-enabled {UNIT}").stdout.strip() == "enabled"
    assert vm.ssh(f"systemctl show -p ActiveState --value {UNIT}").stdout.strip() != "active"
    assert not serves(vm)
    # its ExecStartPre (the tier must be a mount point) failed; Restart= tries again
    journal = vm.ssh(f"journalctl -b -u {UNIT} --no-pager -o cat").stdout
    assert "Control process exited" in journal, journal[-3000:]
    # The storage comes back: the server's own retry mounts the tier and it serves, with no converge.
    storage.start().wait_ssh()
    storage.ssh("for i in $(seq 60); do systemctl is-active -q nfs-server && exit 0; sleep 1; done; exit 1", check=True)
    back = vm.ssh(f"for i in $(seq 300); do {HEALTHY} && exit 0; sleep 1; done; systemctl status --no-pager {UNIT}; exit 1", timeout=400)
    assert back.returncode == 0, back.stdout[-3000:]
    assert mount_entry(vm) is not None
    assert_memlock_unlimited(vm)  # after a reboot, from their persistence
    # The mount the server's unit made has every tuned value in effect (nfsrahead's udev rule, the slot table); a
    # converge then leaves the server serving.
    assert_tuned(vm, "4.1")
    converge(bed, netapp(), "netapp")
    assert serves(vm)
    # The later tests change the tier under it: the server leaves the bed.
    vm.ssh(f"systemctl disable --now {UNIT}", check=True)


def test_a_roce_tos_set_under_a_live_mount_is_not_in_effect_until_its_transports_reconnect(bed):
    """#34, ToS in effect: RDMA-CM reads the default ToS when a connection resolves its route, so a ToS set while the
    tier is mounted does not reach the mount's transports. On the NetApp-shaped mount the outage test left (NFS 4.1
    over Soft-RoCE on the first storage link, its server stopped): the NIC program, as the role runs it (--apply-json,
    then --check-json judged by nic_verdict), sets the default ToS of the link's RDMA device in configfs (the device
    found by its GID table: rdma_rxe sits on no PCI device) and reports it "set, not yet in effect", never passed;
    once the tier is mounted again, the same check finds it in effect. Before, the Soft-RoCE port had "no RDMA device"
    and the ToS was never set here."""
    vm, port = bed.client, bed.client_ports[0]
    mtu = int(vm.read(f"/sys/class/net/{port}/mtu").strip())  # the link's own: only the ToS is asked of it
    variables = {**netapp(), **NIC_ONLY_MTU, "hicache_nic_mtu": mtu, "hicache_nic_interfaces": [port], "hicache_nic_roce_dscp": 26}
    deployment, findings = rules.check_host(vm.name, variables, role="nic_tuning")
    assert deployment is not None, findings
    config = shlex.quote(json.dumps(nic_tuning.desired(deployment)))

    def program(mode: str) -> dict:
        proc = vm.ssh(f"{nic_tuning.PROGRAM} {mode} {config}")
        assert proc.stdout.startswith("{"), proc.stdout[-2000:] + proc.stderr[-2000:]
        return json.loads(proc.stdout)

    applied = program("--apply-json")
    tos = next(c for c in applied["changes"] if c["what"] == f"{port} roce tos")
    ibdev, number = tos["apply"][1], tos["apply"][2]
    assert f"{port} roce tos" in applied["applied"] and not applied["failed"], applied
    assert vm.read(f"/sys/kernel/config/rdma_cm/{ibdev}/ports/{number}/default_roce_tos").strip() == str(26 << 2)
    verdict = nic_tuning.nic_verdict(program("--check-json"), asked=True)
    assert verdict["failures"] == [] and not verdict.get("not_checked"), verdict
    assert any(f"set, not yet in effect on {POINT}" in x for x in verdict.get("not_in_effect", [])), verdict
    vm.ssh(f"umount {POINT} && mount {POINT}", check=True, timeout=300)
    settled = nic_tuning.nic_verdict(program("--check-json"), asked=True)
    assert settled["failures"] == [] and not settled.get("not_in_effect") and not settled.get("not_checked"), settled
    assert mount_entry(vm)["fstype"] == "nfs4" and "proto=rdma" in mount_entry(vm)["options"]


MULTIPATH_POINT = "/mnt/l3-multipath"


def rp_filter(vm, interface: str) -> str:
    return vm.read(f"/proc/sys/net/ipv4/conf/{interface}/rp_filter").strip()


def test_multipath_ports_get_reverse_path_filtering_off_per_interface_before_the_mount(bed):
    """localports multipath (VAST): the kernel filters with the larger of conf/all and conf/<port> (ip-sysctl.rst), so
    the role turns both off for the storage ports, keeps every other interface's filtering, persists it in sysctl.d
    (applied again by systemd-sysctl, as at boot), all before the mount. The stock kernel cannot mount the VAST
    driver's localports: the host's gap says why (hicache_strict false here), and the tuning is in effect anyway."""
    vm = bed.client
    ports = bed.client_ports
    others = [i for i in vm.ssh("ls /sys/class/net").stdout.split() if i not in (*ports, "lo")]
    # A host with strict reverse-path filtering everywhere (RFC 3704; what a hardened image sets).
    vm.ssh("sysctl -qw net.ipv4.conf.all.rp_filter=1 " + " ".join(f"net/ipv4/conf/{i}/rp_filter=1" for i in (*ports, *others)), check=True)
    variables = vast(hicache_storage_localports=[LINKS[0][1], LINKS[1][1]], hicache_storage_remoteports=f"{LINKS[0][0]}~{LINKS[1][0]}",
                     hicache_cache_dir=MULTIPATH_POINT, hicache_strict=False)
    run = bed.play(bed.inventory("multipath", variables), STORAGE_ROLE, verbose=True)  # -v: the gap's reason
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    said = " ".join(run.stdout.split())
    gap = said[said.index("Mount the L3 tier (this host cannot)"):][:1500]
    assert "needs the VAST NFS driver for" in gap and "localports" in gap, gap
    tuned_at = said.index("Apply the tier's kernel values now (RDMA slots, reverse-path filtering)")  # rp_filter off
    assert tuned_at < said.index("Mount the L3 tier (this host cannot)")
    assert rp_filter(vm, "all") == "0"
    assert [rp_filter(vm, port) for port in ports] == ["0", "0"]
    assert [rp_filter(vm, other) for other in others] == ["1"] * len(others)  # kept: raised to what conf/all gave them
    persisted = vm.read("/etc/sysctl.d/90-hicache-storage.conf")
    assert f"net/ipv4/conf/{ports[0]}/rp_filter = 0" in persisted, persisted
    # What boot does: systemd-sysctl applies sysctl.d again (Debian's 50-default.conf sets every interface to 2 first).
    vm.ssh("sysctl -qw " + " ".join(f"net/ipv4/conf/{i}/rp_filter=2" for i in ports) + " && systemctl restart systemd-sysctl.service", check=True)
    assert [rp_filter(vm, port) for port in ports] == ["0", "0"] and rp_filter(vm, "all") == "0"
    # The second run (conf/all now 0) writes the same sysctl.d: --check --diff shows no change, and neither does a run.
    planned = bed.play(bed.inventory("multipath", variables), STORAGE_ROLE, check=True)
    assert planned.returncode == 0 and recap(planned)["changed"] == 0, planned.stdout[-5000:]
    again = bed.play(bed.inventory("multipath", variables), STORAGE_ROLE, verbose=True)
    assert again.returncode == 0 and recap(again)["changed"] == 0, changed_tasks(again)


def test_the_bed_leaves_pytests_stdin_blocking(bed):
    """Other test files run after the bed in the same pytest (tests/run's streams): every ansible there refuses a
    non-blocking stdin. The KVM probe's QEMU (-serial stdio) once left pytest's own stdin non-blocking."""
    assert os.get_blocking(0), "pytest's stdin was left non-blocking: ansible-playbook and ansible-galaxy would refuse to run"
