"""Parsers of live host state, on samples written from the documented formats (proc(5), ethtool)."""

from __future__ import annotations

from helpers import deployment

from hicachectl.formats import portlist
from hicachectl.plans import host_limits, nic_tuning, storage, storage_live

# proc(5) documents the line `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`.
# The NFS lines follow the same format, with the options the NFS client reports in the superblock field.
VAST_SUPER = ",".join(["rw", "vers=3", "rsize=1048576", "wsize=1048576", "namlen=255", "hard", "proto=rdma", "nconnect=32", "port=20049",
                       "timeo=600", "retrans=2", "sec=sys", "mountaddr=192.0.2.1", "mountvers=3", "mountproto=tcp", "local_lock=none",
                       "addr=192.0.2.1", "remoteports=192.0.2.1-192.0.2.16"])
NETAPP_SUPER = ",".join(["rw", "vers=4.1", "rsize=65536", "wsize=65536", "namlen=255", "hard", "proto=rdma", "port=20049", "timeo=600",
                         "retrans=2", "sec=sys", "clientaddr=192.0.2.50", "local_lock=none", "addr=192.0.2.10"])
MOUNTINFO = f"""\
22 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
120 22 0:55 / /mnt/kvcache-2ports rw,relatime shared:80 - nfs vast-vip.example.com:/kvcache {VAST_SUPER}
121 22 0:56 / /mnt/kvcache rw,relatime shared:81 - nfs4 netapp-lif.example.com:/kvcache {NETAPP_SUPER}
130 22 0:60 / /mnt/with\\040space rw,relatime - tmpfs tmpfs rw
"""


def test_parse_mountinfo_fields_and_escapes():
    entries = storage_live.parse_mountinfo(MOUNTINFO)
    assert [e.mount_point for e in entries] == ["/", "/mnt2", "/mnt/kvcache-2ports", "/mnt/kvcache", "/mnt/with space"]
    proc5 = entries[1]
    assert (proc5.mount_id, proc5.parent_id, proc5.major_minor, proc5.root, proc5.fstype, proc5.source) == (36, 35, "98:0", "/mnt1", "ext3", "/dev/root")
    assert proc5.super_options == ("rw", "errors=continue")
    vast = storage_live.mount_at(entries, "/mnt/kvcache-2ports")
    assert vast.option_map()["nconnect"] == "32" and storage_live.bdi_read_ahead_path(vast) == "/sys/class/bdi/0:55/read_ahead_kb"


def test_live_vast_mount_matches_the_vast_inventory():
    wanted = storage.mount(deployment("vast"))
    live = storage_live.mount_at(storage_live.parse_mountinfo(MOUNTINFO), wanted.point)
    assert storage_live.compare_mount(live, wanted.options, wanted.source, wanted.fstype) == []


def test_live_mount_with_other_nconnect_is_reported():
    wanted = storage.mount(deployment("vast", storage_nconnect=16))
    live = storage_live.mount_at(storage_live.parse_mountinfo(MOUNTINFO), wanted.point)
    assert storage_live.compare_mount(live, wanted.options, wanted.source, wanted.fstype) == ["nconnect=32, expected 16"]


def test_live_netapp_mount_matches_and_a_missing_one_is_reported():
    wanted = storage.mount(deployment("netapp"))
    entries = storage_live.parse_mountinfo(MOUNTINFO)
    assert storage_live.compare_mount(storage_live.mount_at(entries, wanted.point), wanted.options, wanted.source, wanted.fstype) == []
    assert storage_live.compare_mount(storage_live.mount_at(entries, "/mnt/elsewhere"), wanted.options, wanted.source, wanted.fstype) == ["not mounted"]
    tcp = MOUNTINFO.replace("proto=rdma,port=20049,timeo=600,retrans=2,sec=sys,clientaddr", "proto=tcp,port=2049,timeo=600,retrans=2,sec=sys,clientaddr")
    problems = storage_live.compare_mount(storage_live.mount_at(storage_live.parse_mountinfo(tcp), wanted.point), wanted.options, wanted.source, wanted.fstype)
    assert problems == ["proto=tcp, expected rdma", "port=2049, expected 20049"]


# proc(5): /proc/<pid>/limits, laid out as the kernel prints it (fs/proc/base.c, "%-25s %-20s %-20s %-10s").
def _limits_line(name, soft, hard, units):
    return f"{name:<25} {soft:<20} {hard:<20} {units:<10}\n"


LIMITS = (_limits_line("Limit", "Soft Limit", "Hard Limit", "Units") + _limits_line("Max cpu time", "unlimited", "unlimited", "seconds")
          + _limits_line("Max stack size", "8388608", "unlimited", "bytes") + _limits_line("Max open files", "1048576", "1048576", "files")
          + _limits_line("Max locked memory", "8388608", "8388608", "bytes") + _limits_line("Max nice priority", "0", "0", ""))


def test_parse_limits_and_memlock_judgement():
    limits = host_limits.parse_limits(LIMITS)
    assert limits["Max locked memory"] == ("8388608", "8388608") and limits["Max nice priority"] == ("0", "0")
    assert not host_limits.memlock_ok(limits, "unlimited")
    assert host_limits.memlock_ok(limits, "8192") and not host_limits.memlock_ok(limits, "16384")
    unlimited = LIMITS.replace(_limits_line("Max locked memory", "8388608", "8388608", "bytes"), _limits_line("Max locked memory", "unlimited", "unlimited", "bytes"))
    assert host_limits.memlock_ok(host_limits.parse_limits(unlimited), "unlimited")


ETHTOOL_G = """\
Ring parameters for ens1f0np0:
Pre-set maximums:
RX:\t\t8192
RX Mini:\tn/a
RX Jumbo:\tn/a
TX:\t\t8192
Current hardware settings:
RX:\t\t1024
RX Mini:\tn/a
RX Jumbo:\tn/a
TX:\t\t1024
"""


def test_parse_ethtool_rings():
    assert nic_tuning.parse_ethtool_rings(ETHTOOL_G) == {"max": {"RX": 8192, "TX": 8192}, "current": {"RX": 1024, "TX": 1024}}


LOCAL_DEVICE = "140 22 259:1 / /mnt/nvme/sglang-hicache rw,relatime shared:90 - xfs /dev/nvme1n1 rw,attr2,inode64\n"


def test_a_uuid_source_matches_the_device_it_names_on_the_host():
    wanted = storage.mount(deployment("local", storage_device="UUID=1234-abcd"))
    live = storage_live.mount_at(storage_live.parse_mountinfo(MOUNTINFO + LOCAL_DEVICE), wanted.point)
    assert storage_live.compare_mount(live, wanted.options, wanted.source, wanted.fstype, "/dev/nvme1n1") == []
    assert storage_live.compare_mount(live, wanted.options, wanted.source, wanted.fstype, "/dev/nvme2n1") == [
        "source is /dev/nvme1n1, expected UUID=1234-abcd (/dev/nvme2n1)"]
    assert storage_live.compare_mount(live, wanted.options, wanted.source, wanted.fstype) == ["source is /dev/nvme1n1, expected UUID=1234-abcd"]


def test_a_local_mount_of_another_filesystem_is_reported():
    wanted = storage.mount(deployment("local", storage_device="/dev/nvme1n1", storage_fstype="ext4"))
    live = storage_live.mount_at(storage_live.parse_mountinfo(LOCAL_DEVICE), wanted.point)
    assert storage_live.compare_mount(live, wanted.options, wanted.source, wanted.fstype) == ["filesystem is xfs, expected ext4"]


def report(**fields):
    return {"interfaces": [], "connectx": [], "missing": [], "changes": [], "unavailable": [], "failed": [], **fields}


def test_nic_verdict_a_host_with_connectx_fails_on_what_it_tried_and_has_gaps_for_what_it_lacks():
    """Strict means strict on ConnectX hosts too (#34): what the host lacks (a named port, a tool, a module) is a gap,
    which hicache_strict makes a failure and hicache_strict: false leaves degraded; before, a ConnectX port made every
    such item a failure whatever the inventory tolerated. What the program tried and could not do stays a failure."""
    named_absent = report(interfaces=["ens9"], connectx=["ens1f0np0"], missing=["ens9"],
                          unavailable=[{"what": "ens9", "reason": "no interface ens9 on this host (named in hicache_nic_interfaces)"}])
    assert nic_tuning.nic_verdict(named_absent, asked=True) == {
        "failures": [], "gaps": ["ens9: no interface ens9 on this host (named in hicache_nic_interfaces)"], "changes": []}
    tool = report(interfaces=["ens1f0np0"], connectx=["ens1f0np0"], unavailable=[{"what": "ens1f0np0 qos", "reason": "mlnx_qos is not installed"}],
                  changes=[{"what": "ens1f0np0 mtu"}], failed=[{"what": "ens1f0np0 mtu", "reason": "ip: Operation not permitted"}])
    assert nic_tuning.nic_verdict(tool, asked=False) == {
        "failures": ["ens1f0np0 mtu: ip: Operation not permitted"], "gaps": ["ens1f0np0 qos: mlnx_qos is not installed"], "changes": ["ens1f0np0 mtu"]}
    module = report(interfaces=["ens1f0np0"], connectx=["ens1f0np0"], unavailable=[{"what": "ens1f0np0 rdma", "reason": "mlx5_ib is not loaded"}])
    assert nic_tuning.nic_verdict(module, asked=True) == {"failures": [], "gaps": ["ens1f0np0 rdma: mlx5_ib is not loaded"], "changes": []}


def test_nic_verdict_a_host_without_connectx_has_gaps_only_for_what_is_asked():
    none_here = report(unavailable=[{"what": "interfaces", "reason": "no ConnectX port (driver mlx5_core, PCI vendor 0x15b3) on this host"}])
    assert nic_tuning.nic_verdict(none_here, asked=True)["gaps"] == ["interfaces: no ConnectX port (driver mlx5_core, PCI vendor 0x15b3) on this host"]
    assert nic_tuning.nic_verdict(none_here, asked=False) == {"failures": [], "gaps": [], "changes": []}  # a local tier, no port named
    named = report(interfaces=["ens9"], missing=["ens9"], unavailable=[{"what": "ens9", "reason": "no interface ens9 on this host (named in hicache_nic_interfaces)"}])
    assert nic_tuning.nic_verdict(named, asked=True)["gaps"] == ["ens9: no interface ens9 on this host (named in hicache_nic_interfaces)"]


def test_validate_counts_remoteports_with_the_parser_the_live_check_expands():
    from hicachectl.rules import remote_port_count

    for spec in ("172.16.0.1-172.16.0.16", "172.16.0.1~172.16.0.3-172.16.0.5", "fd00::1-fd00::4~fd00::9", "10.0.0.7"):
        assert remote_port_count(spec) == len(portlist.expand_ports(spec)), spec
    for spec in ("dns", "", None, "vip.example.net", "10.0.0.9-10.0.0.1", "10.0.0.1~fd00::1", "10.0.0.1-fd00::1"):
        assert remote_port_count(spec) is None and portlist.expand_ports(spec or "") is None, spec
    assert remote_port_count("10.0.0.0-10.0.255.255") == 65536 and portlist.expand_ports("10.0.0.0-10.0.255.255") is None
