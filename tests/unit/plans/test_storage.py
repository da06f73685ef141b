"""The L3 mount each profile asks for."""

from __future__ import annotations

import importlib.util

from helpers import deployment, filled_in, profile_vars
from support import ROOT

from hicachectl.plans import storage


def test_vast_mount_line():
    line = storage.mount(deployment("vast")).fstab_line
    assert line.startswith("vast-vip.example.com:/kvcache /mnt/kvcache-2ports nfs ")
    assert "vers=3,proto=rdma,port=20049,nconnect=32,remoteports=192.0.2.1-192.0.2.16,localports=ens1f0np0~ens2f0np0,spread_reads,spread_writes" in line
    assert line.endswith(",_netdev,nofail,x-systemd.mount-timeout=60 0 0")


def test_netapp_mount_line_has_no_nconnect_and_64k_transfers():
    line = storage.mount(deployment("netapp")).fstab_line
    assert "vers=4.1,proto=rdma,port=20049,rsize=65536,wsize=65536" in line and "nconnect" not in line


def test_local_tier_is_a_directory_or_a_device():
    assert storage.mount(deployment("local")) is None
    device = storage.mount(deployment("local", storage_device="UUID=1234-abcd")).fstab_line
    assert device == "UUID=1234-abcd /mnt/nvme/sglang-hicache xfs defaults,nofail,x-systemd.mount-timeout=60 0 2"


def test_nfs_tuning_files():
    d = deployment("vast")
    assert "nfs=8192" in storage.nfsrahead_conf(d) and "nfs4=8192" in storage.nfsrahead_conf(d)
    # NFS over RDMA takes its slots from xprtrdma's table; the TCP tables (tcp_max_slot_table_entries: 65536) are left alone.
    assert storage.sunrpc_sysctls(d) == {"sunrpc.rdma_slot_table_entries": "128"}
    assert storage.modules_load_conf(d).splitlines()[-1] == "rpcrdma"
    directories, files, absent = storage.host_files(d, storage.sunrpc_sysctls(d))
    text = "".join(f["content"] for f in files)
    assert "tcp_" not in text and "sunrpc.rdma_slot_table_entries = 128" in text
    assert storage.OLD_SUNRPC_MODPROBE_FILE in absent  # an older release's TCP options are removed
    assert {f["path"] for f in files} == {storage.NFSRAHEAD_FILE, storage.MODULES_LOAD_FILE, storage.SYSCTL_FILE, storage.VASTNFS_MODPROBE_FILE}
    assert storage.host_files(deployment("local"), {})[1] == []  # a local tier persists nothing


def test_rp_filter_is_off_on_the_multipath_ports_and_all_and_kept_elsewhere():
    facts = {"interfaces": [{"name": "ens1f0", "addresses": ["198.18.1.2"]}, {"name": "ens1f1.100", "addresses": ["198.18.2.2"]},
                            {"name": "eno1", "addresses": ["198.51.100.7"]}],
             "rp_filter": {"all": "1", "default": "0", "lo": "0", "ens1f0": "1", "ens1f1.100": "0", "eno1": "0", "eno2": "2"}}
    d = deployment("vast", storage_localports=["198.18.1.2", "ens1f1.100"])
    keys = storage.rp_filter_sysctls(d, facts)
    # Slash form (sysctl.d(5)): the VLAN's dot stays inside its path component.
    assert keys["net/ipv4/conf/all/rp_filter"] == "0"
    assert keys["net/ipv4/conf/ens1f0/rp_filter"] == "0" and keys["net/ipv4/conf/ens1f1.100/rp_filter"] == "0"
    # The kernel filters with max(all, interface): eno1 was strict through `all`; it stays strict, as new interfaces do.
    assert keys["net/ipv4/conf/eno1/rp_filter"] == "1" and keys["net/ipv4/conf/default/rp_filter"] == "1"
    assert "net/ipv4/conf/lo/rp_filter" not in keys and "net/ipv4/conf/eno2/rp_filter" not in keys  # 2 (loose) is above the floor already
    # An address no interface holds is named, not guessed.
    assert storage.multipath_interfaces(deployment("vast", storage_localports=["198.18.9.9"]), facts) == ([], ["198.18.9.9"])
    # A name the host has no interface of is named too, and kept for sysctl.d (it applies once the port appears).
    assert storage.multipath_interfaces(deployment("vast", storage_localports=["ens9f0", "ens1f0"]), facts) == (["ens9f0", "ens1f0"], ["ens9f0"])
    assert storage.multipath_interfaces(deployment("vast", storage_localports=["ens9f0"]), {}) == (["ens9f0"], [])  # no facts: not judged
    assert storage.rp_filter_sysctls(deployment("vast", storage_localports=[]), facts) == {}  # no localports, nothing to turn off


def test_rp_filter_a_second_run_writes_the_same_file_though_conf_all_is_now_0():
    """Failed on the VM before: the first run turned conf/all off, so the second no longer saw the floor it had raised
    the other interfaces to, dropped those raises from sysctl.d and reported a change (and the next boot would have
    left eno1 and new interfaces unfiltered)."""
    interfaces = [{"name": "ens1f0", "addresses": ["198.18.1.2"]}, {"name": "eno1", "addresses": ["198.51.100.7"]}]
    d = deployment("vast", storage_localports=["198.18.1.2"])
    before = {"interfaces": interfaces, "rp_filter": {"all": "1", "default": "0", "lo": "0", "ens1f0": "1", "eno1": "0"}, "files": {}}
    first = storage.rp_filter_sysctls(d, before)
    live = {"all": "0", "default": "1", "lo": "0", "ens1f0": "0", "eno1": "1"}  # what the first run left in effect
    after = {"interfaces": interfaces, "rp_filter": live, "files": {storage.SYSCTL_FILE: storage.sysctl_conf(first)}}
    assert storage.rp_filter_sysctls(d, after) == first
    assert first["net/ipv4/conf/eno1/rp_filter"] == first["net/ipv4/conf/default/rp_filter"] == "1"


def test_read_ahead_persists_only_with_nfsrahead_its_rule_and_udevd():
    facts = {"tools": {"nfsrahead": "/usr/libexec/nfsrahead"}, "nfsrahead_udev_rule": "/usr/lib/udev/rules.d/99-nfs.rules", "udevd_running": True}
    assert storage.read_ahead_persistence(facts)[0]
    ok, why = storage.read_ahead_persistence({**facts, "udevd_running": False})
    assert not ok and "not persistent" in why and "udevd" in why
    ok, why = storage.read_ahead_persistence({**facts, "tools": {"nfsrahead": None}, "nfsrahead_udev_rule": None})
    assert not ok and "no nfsrahead" in why and "udev rule" in why
    # the release that brought nfsrahead (tag nfs-utils-2-6-2), so an operator on Ubuntu 22.04 (2.6.1) knows why
    assert "nfs-utils 2.6.2 or newer" in why and "Ubuntu 22.04" in why


def test_without_nfsrahead_the_toolkits_own_rule_sets_the_l3_mounts_read_ahead_alone(tmp_path):
    import subprocess

    d = deployment("vast")
    without = {"tools": {"nfsrahead": None}, "nfsrahead_udev_rule": None, "udevd_running": True}
    with_it = {"tools": {"nfsrahead": "/usr/libexec/nfsrahead"}, "nfsrahead_udev_rule": "/usr/lib/udev/rules.d/99-nfs.rules", "udevd_running": True}
    plan = storage.storage_plan(d, without)
    files = {f["path"]: f for f in plan.files}
    assert plan.read_ahead_persistent and storage.READ_AHEAD_RULE_FILE in plan.read_ahead_not_persistent_reason
    assert files[storage.READ_AHEAD_PROGRAM]["mode"] == "0755" and "nfsrahead" not in files[storage.READ_AHEAD_RULE_FILE]["content"]
    assert 'KERNEL=="0:*"' in files[storage.READ_AHEAD_RULE_FILE]["content"]  # anonymous bdis only: never a disk's
    # with nfsrahead the host keeps nfs-utils' rule, and a rule of ours left from before is removed
    kept = storage.storage_plan(d, with_it)
    assert storage.READ_AHEAD_RULE_FILE in kept.absent and storage.READ_AHEAD_PROGRAM in kept.absent
    assert storage.READ_AHEAD_RULE_FILE not in {f["path"] for f in kept.files}
    # no udevd: nothing runs the rule, the read-ahead is live only (a gap)
    assert not storage.storage_plan(d, {**without, "udevd_running": False}).read_ahead_persistent
    # render plans without host facts: nfs-utils' nfsrahead is assumed; a local tier never has the rule
    assert storage.READ_AHEAD_RULE_FILE not in {f["path"] for f in storage.storage_plan(d, {}).files}
    assert storage.host_files(deployment("local"), {}, without)[1] == []
    # the program, on a sample mountinfo: the L3 mount's bdi gets the value, another NFS mount's nothing, at once
    point = storage.mount(d).point
    sample = tmp_path / "mountinfo"
    sample.write_text(f"36 25 0:53 / {point} rw,relatime shared:1 - nfs 198.18.1.1:/srv/l3 rw,vers=3\n"
                      "37 25 0:54 / /home rw,relatime shared:2 - nfs other:/home rw,vers=3\n")
    program = tmp_path / "program"
    program.write_text(files[storage.READ_AHEAD_PROGRAM]["content"].replace("/proc/self/mountinfo", str(sample)))
    ours = subprocess.run(["sh", str(program), "0:53"], capture_output=True, text=True, timeout=30)
    assert ours.returncode == 0 and ours.stdout.strip() == str(d.storage_read_ahead_kb)
    other = subprocess.run(["sh", str(program), "0:54"], capture_output=True, text=True, timeout=5)  # no 10 s wait
    assert other.returncode == 1 and other.stdout == ""


def test_the_read_ahead_variable_says_nfsraheads_setting_is_host_wide():
    from hicachectl.config.schema import VARIABLES

    [var] = [v for v in VARIABLES if v.name == "hicache_storage_read_ahead_kb"]
    assert "host-wide" in var.doc and "every NFS mount of the host" in var.doc


def test_uuid_and_label_sources_resolve_through_the_hosts_links():
    ids = {"UUID=1234-abcd": "/dev/nvme1n1", "LABEL=kv cache": "/dev/nvme2n1p1"}
    assert storage.resolve_source("UUID=1234-abcd", ids) == "/dev/nvme1n1"
    assert storage.resolve_source('LABEL="kv cache"', ids) == "/dev/nvme2n1p1"
    assert storage.resolve_source("UUID=ffff", ids) is None  # no such device on this host
    assert storage.resolve_source("/dev/nvme1n1", ids) == "/dev/nvme1n1" and storage.resolve_source("tmpfs", {}) == "tmpfs"
    assert storage.is_device_id("PARTUUID=0a1b") and not storage.is_device_id("/dev/disk/by-uuid/x") and not storage.is_device_id(None)
    assert storage.device_id_kind("PARTLABEL=x") == "partlabel"


def test_host_facts_map_udev_links_to_devices(tmp_path):
    import importlib.util

    from support import ROOT

    spec = importlib.util.spec_from_file_location("hicache_host_facts", ROOT / "plugins/modules/hicache_host_facts.py")
    facts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(facts)
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/nvme1n1").touch()
    (tmp_path / "by-uuid").mkdir()
    (tmp_path / "by-uuid/1234-abcd").symlink_to("../dev/nvme1n1")
    (tmp_path / "by-label").mkdir()
    (tmp_path / "by-label/kv\\x20cache").symlink_to("../dev/nvme1n1")
    dirs = {"UUID": str(tmp_path / "by-uuid"), "LABEL": str(tmp_path / "by-label"), "PARTUUID": str(tmp_path / "absent")}
    device = str(tmp_path / "dev/nvme1n1")
    assert facts.block_ids(dirs) == {"UUID=1234-abcd": device, "LABEL=kv cache": device}


def test_netapp_mount_carries_nconnect_and_an_ipv6_server_mounts_with_rdma6():
    # xprtrdma's netids are rdma and rdma6 (net/sunrpc/xprtrdma/transport.c); ONTAP's NFS over RDMA docs: rdma6 for IPv6
    options = storage.mount(deployment("netapp", storage_nconnect=8)).options
    assert "nconnect=8" in options and "proto=rdma" in options
    v6 = storage.mount(deployment("netapp", storage_server="[fd00::10]"))
    assert "proto=rdma6" in v6.options and "proto=rdma" not in v6.options and v6.source == "[fd00::10]:/kvcache"
    assert "proto=rdma" in storage.mount(deployment("netapp", storage_server="192.0.2.10")).options
    assert storage.rdma_netid("netapp-lif.example.com") == "rdma"  # a name keeps rdma (see rdma_netid)


def test_the_plan_names_the_rdma_slots_a_dry_run_cannot_read_before_rpcrdma_is_loaded():
    from helpers import FULL

    d = deployment("vast")
    not_loaded = {**FULL, "kernel_modules": {**FULL["kernel_modules"], "rpcrdma": {"loaded": False, "available": True}}}
    fresh = storage.storage_plan(d, not_loaded)
    assert fresh.load_rpcrdma and fresh.after_rpcrdma == ["sunrpc.rdma_slot_table_entries"]
    assert set(fresh.after_rpcrdma) <= set(fresh.sysctls)
    loaded = storage.storage_plan(d, FULL)
    assert not loaded.load_rpcrdma and loaded.after_rpcrdma == []
    assert storage.storage_plan(deployment("local"), not_loaded).after_rpcrdma == []


def test_a_host_upgraded_from_0_1_0_gets_the_kernels_tcp_slot_tables_back_live():
    """0.1.0 lowered tcp_max_slot_table_entries to 128 (options sunrpc ... in OLD_SUNRPC_MODPROBE_FILE) and set it live:
    removing the file alone left 128 in effect until sunrpc's next load. The role reads the file (host_reads) and
    gives each value it named back to the kernel's (net/sunrpc/xprtsock.c: 2 and 65536), live, once."""
    from helpers import FULL

    old = "# Managed by hicache-deploy.\noptions sunrpc tcp_slot_table_entries=128 tcp_max_slot_table_entries=128\n"
    upgraded = {**FULL, "files": {storage.OLD_SUNRPC_MODPROBE_FILE: old}}
    plan = storage.storage_plan(deployment("vast"), upgraded)
    assert plan.restored_sysctls == {"sunrpc.tcp_slot_table_entries": "2", "sunrpc.tcp_max_slot_table_entries": "65536"}
    assert storage.OLD_SUNRPC_MODPROBE_FILE in plan.absent and "tcp_" not in (plan.sysctl_conf or "")  # nothing persisted
    assert storage.storage_plan(deployment("vast"), {**FULL, "files": {storage.OLD_SUNRPC_MODPROBE_FILE: None}}).restored_sysctls == {}
    assert storage.storage_plan(deployment("vast"), FULL).restored_sysctls == {}
    # the host facts read the file (the filter that names what they read besides the usual)
    spec = importlib.util.spec_from_file_location("hicache_filter_reads", ROOT / "plugins/filter/hicache.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert storage.OLD_SUNRPC_MODPROBE_FILE in module.hicache_host_reads(filled_in(profile_vars("vast")), "gpu-1")["files"]



def test_a_vast_multipath_mount_has_the_driver_show_its_sunrpc_id_for_the_multipath_proof():
    """vastnfs prints a mount's sunrpc-id in mountstats only with expose_id_in_mountstats set (bundle/net/sunrpc/stats.c,
    default false), and without the id verify's multipath path check was always "not checked". Set live after the
    mount (which only vastnfs' client makes) and in modprobe.d; render shows the file as plan does (no host facts)."""
    from helpers import FULL

    plan = storage.storage_plan(deployment("vast"), FULL)
    assert plan.vastnfs_values == {storage.EXPOSE_ID_PARAMETER: "Y"}
    conf = next(f["content"] for f in plan.files if f["path"] == storage.VASTNFS_MODPROBE_FILE)
    assert conf.splitlines()[-1] == "options sunrpc expose_id_in_mountstats=1"
    assert [f for f in storage.storage_plan(deployment("vast"), {}).files if f["path"] == storage.VASTNFS_MODPROBE_FILE]
    for d in (deployment("vast", storage_remoteports=None, storage_localports=[], storage_nconnect=16), deployment("netapp")):
        single_path = storage.storage_plan(d, FULL)
        assert single_path.vastnfs_values == {} and storage.VASTNFS_MODPROBE_FILE in single_path.absent
