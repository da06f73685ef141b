"""The storage role against a real kernel: NFS over RDMA (Soft-RoCE) from a real NFS server VM, the VAST shape
(NFSv3, nconnect) and the NetApp shape (NFS 4.1), read-ahead through nfsrahead and udev, the RDMA slot table,
fstab and reboots, and a storage outage at boot. Every assertion reads what the kernel reports: /proc/self/mountinfo,
/sys/class/bdi/<maj:min>/read_ahead_kb, /proc/sys. The tests run in order on one pair of VMs (tests/vm/conftest.py).

The vastnfs client's own options (remoteports, localports, spread_reads) cannot be mounted by the stock kernel: they are
tested by their rules and rendering (tests/test_storage.py), not here.
"""

from __future__ import annotations

import re
import time

import pytest
from bed import EXPORT, LINKS

pytestmark = [pytest.mark.slow, pytest.mark.vm]

POINT = "/mnt/l3"
READ_AHEAD = 8192
SLOTS = 64  # not the kernel's 128, so the test sees the role set it
FOREIGN_FSTAB = "# a line of the host's own, kept byte for byte \t\n/dev/vdz  /srv/other  ext4  noauto,x-foo=1  0 0\n"
STORAGE_ROLE = [{"name": "The storage role", "ansible.builtin.include_role": {"name": "hicache.deploy.storage"}}]
STORAGE_VERIFY = [{"name": "The storage role's verify", "ansible.builtin.include_role": {"name": "hicache.deploy.storage", "tasks_from": "verify"}}]


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


def test_first_converge_of_a_vast_shaped_host_has_read_ahead_in_effect(bed):
    """Failed before this change: the role mounted before writing nfsrahead's config, wrote the live read-ahead from
    the facts read before the mount (none), and then found 128 where it wanted 8192."""
    vm = bed.client
    vm.write("/etc/fstab", vm.read("/etc/fstab") + FOREIGN_FSTAB)
    bed.fstab_before = vm.read("/etc/fstab")
    converge(bed, vast(), "vast")
    assert_tuned(vm, "3", transports=4)
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


def test_after_a_reboot_the_mount_and_every_tuned_value_come_back(bed):
    vm = bed.client
    vm.reboot()
    vm.ssh(f"for i in $(seq 120); do mountpoint -q {POINT} && exit 0; sleep 1; done; journalctl -b -u mnt-l3.mount; exit 1", check=True)
    assert_tuned(vm, "3", transports=4)
    run = bed.play(bed.inventory("vast", vast()), STORAGE_VERIFY)
    assert run.returncode == 0, run.stdout[-4000:]


def test_verify_fails_when_a_tuned_value_drifts(bed):
    vm = bed.client
    vm.ssh("echo 128 > /proc/sys/sunrpc/rdma_slot_table_entries", check=True)
    run = bed.play(bed.inventory("vast", vast()), STORAGE_VERIFY)
    assert run.returncode != 0 and "sunrpc.rdma_slot_table_entries" in run.stdout, run.stdout[-4000:]
    vm.ssh(f"echo {SLOTS} > /proc/sys/sunrpc/rdma_slot_table_entries", check=True)


def test_with_the_storage_down_at_boot_the_host_boots_and_verify_names_the_missing_mount(bed):
    vm, storage = bed.client, bed.storage
    storage.power_off()
    started = time.monotonic()
    vm.reboot(timeout=600)
    booted = time.monotonic() - started
    assert mount_entry(vm) is None
    # The boot went on without the mount (nofail): the system reached its default target, not stuck on the mount.
    booted_state = vm.ssh("systemctl is-system-running --wait").stdout.strip()
    assert booted_state in ("running", "degraded"), booted_state
    assert vm.ssh("systemctl is-active mnt-l3.mount").stdout.strip() != "active"
    run = bed.play(bed.inventory("vast", vast()), STORAGE_VERIFY)
    assert run.returncode != 0 and f"nothing is mounted at {POINT}" in run.stdout, run.stdout[-4000:]
    print(f"client booted with its storage down in {booted:.0f} s")
    # The storage comes back: a converge mounts the tier again, in effect at once.
    storage.start().wait_ssh()
    storage.ssh("for i in $(seq 60); do systemctl is-active -q nfs-server && exit 0; sleep 1; done; exit 1", check=True)
    converge(bed, vast(), "vast")
    assert_tuned(vm, "3", transports=4)


def test_a_netapp_shaped_host_mounts_nfs_4_1_over_rdma_with_everything_in_effect_on_the_first_run(bed):
    vm = bed.client
    vm.ssh(f"umount {POINT}", check=True)
    first = converge(bed, netapp(), "netapp")
    assert first["changed"] > 0
    assert_tuned(vm, "4.1")
    assert {"rsize=65536", "wsize=65536"} <= mount_entry(vm)["options"]
    assert converge(bed, netapp(), "netapp")["changed"] == 0
    vm.reboot()
    vm.ssh(f"for i in $(seq 120); do mountpoint -q {POINT} && exit 0; sleep 1; done; journalctl -b -u mnt-l3.mount; exit 1", check=True)
    assert_tuned(vm, "4.1")
    fstab = vm.read("/etc/fstab")
    assert fstab.startswith(bed.fstab_before) and fstab.count("# BEGIN hicache-deploy L3 tier") == 1

