"""The L3 mount each profile asks for."""

from __future__ import annotations

from helpers import deployment

from hicachectl import storage


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
    assert "tcp_slot_table_entries=128 tcp_max_slot_table_entries=128" in storage.sunrpc_modprobe_conf(d)
    assert storage.rp_filter_sysctls(deployment("vast", storage_localports=["192.0.2.101"])) == {"net.ipv4.conf.all.rp_filter": "0"}


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
