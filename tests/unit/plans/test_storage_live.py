"""Parsers of live host state, on samples written from the documented formats (proc(5), ethtool)."""

from __future__ import annotations

import pytest
from helpers import deployment, proc_limits
from support import ROOT

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


LIMITS = proc_limits()


def test_parse_limits_and_memlock_judgement():
    limits = host_limits.parse_limits(LIMITS)
    assert limits["Max locked memory"] == ("8388608", "8388608") and limits["Max nice priority"] == ("0", "0")
    assert not host_limits.memlock_ok(limits, "unlimited")
    assert host_limits.memlock_ok(limits, "8192") and not host_limits.memlock_ok(limits, "16384")
    assert host_limits.memlock_ok(host_limits.parse_limits(proc_limits("unlimited", "unlimited")), "unlimited")


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


# /proc/self/mountstats of an NFSv3 mount over RDMA (two transports) beside one over TCP, from the kernel's print code
# (tests/samples/roce-tos/README.md: fs/nfs/super.c nfs_show_stats, net/sunrpc/xprtrdma/transport.c xprt_rdma_print_stats,
# net/sunrpc/xprtsock.c xs_tcp_print_stats).
ROCE_TOS = ROOT / "tests/samples/roce-tos"
POINT = "/mnt/kvcache-2ports"


def mountstats(name: str) -> str:
    return (ROCE_TOS / name).read_text()


def test_parse_mountstats_reads_the_mount_s_age_and_each_transport_s_connect_count():
    stats = storage_live.parse_mountstats(mountstats("mountstats-at-set.txt"))
    assert [m.mount_point for m in stats] == ["/proc", "/sys", "/", "/sys/kernel/config", POINT, "/home"]
    tier = storage_live.mountstats_at(stats, POINT)
    assert tier.age == 86400 and tier.xprts == (("rdma", 1), ("rdma", 1)) and tier.ops["WRITE"] == (6144, 0)
    assert storage_live.mountstats_at(stats, "/home").xprts == (("tcp", 3),)
    assert storage_live.mountstats_at(stats, "/proc").age is None
    reconnected = storage_live.mountstats_at(storage_live.parse_mountstats(mountstats("mountstats-one-reconnected.txt")), POINT)
    assert reconnected.age == 86460 and reconnected.xprts == (("rdma", 2), ("rdma", 1))
    vast = storage_live.parse_mountstats((ROOT / "tests/samples/vastnfs/mountstats-expose-id.txt").read_text())[0]
    assert vast.age == 812 and vast.xprts == (("rdma", 1),) * 4


def effect(now: str | None, then: str | None, seconds_ago: float | None) -> dict:
    """The NIC program's roce_tos_effect (roles/nic_tuning/files/hicache-nic-tuning, tos_effect): the tier's block now,
    and one port's stamp with the block read just after the ToS was set."""
    block = None if now is None else mountstats(now)
    return {"server": "172.16.10.20", "mountstats": block,
            "stamps": [{"what": "ens1f0np0 roce tos", "tos": 104, "seconds_ago": seconds_ago, "mountstats": then if then in ("", None) else mountstats(then)}]}


@pytest.mark.parametrize(("now", "then", "ago", "old"), [
    ("mountstats-same.txt", "mountstats-at-set.txt", 60, 2),  # mounted a day before, no transport connected since
    ("mountstats-one-reconnected.txt", "mountstats-at-set.txt", 60, 1),  # one of the two connected again since
    ("mountstats-reconnected.txt", "mountstats-at-set.txt", 60, 0),  # both connected again since: in effect
    ("mountstats-remounted.txt", "mountstats-at-set.txt", 60, 0),  # mounted again 30 s ago, 30 s after the ToS
    ("mountstats-remounted.txt", "", 60, 0),  # not mounted when the ToS was set (the boot unit, a first deploy)
    ("mountstats-same.txt", None, 60, 2),  # nothing read then: by the mount's age alone, and no count to compare
    ("mountstats-remounted.txt", None, 60, 0),
    ("mountstats-remounted.txt", None, 20, 2),  # the mount is older than the ToS
])
def test_the_tos_is_in_effect_only_where_every_transport_connected_after_it_was_set(now, then, ago, old):
    not_in_effect, not_checked = storage_live.roce_tos_in_effect(effect(now, then, ago))
    assert not_checked == []
    if old:
        assert not_in_effect == [f"ens1f0np0 roce tos: set, not yet in effect on {POINT}: {old} of its 2 RDMA transports connected before the "
                                 f"ToS was set ({ago} s ago; the mount is {86460 if 'remounted' not in now else 30} s old) and not since, so "
                                 f"they keep the ToS they had (RDMA-CM reads it when a connection is made): remount {POINT} (with no other "
                                 "mount of the same server left, so that its transports are made anew) or restart the host"]
    else:
        assert not_in_effect == []


def test_the_tos_against_a_mount_that_is_not_there_or_not_read():
    assert storage_live.roce_tos_in_effect(effect("mountstats-not-mounted.txt", "mountstats-at-set.txt", 60)) == ([], [])  # a later mount takes it
    assert storage_live.roce_tos_in_effect(None) == ([], [])  # no NFS server, or no ToS as wanted yet
    unread, not_checked = storage_live.roce_tos_in_effect(effect(None, "mountstats-at-set.txt", 60))
    assert unread == [] and not_checked == ["RoCE ToS on the mounts of 172.16.10.20: /proc/self/mountstats was not read, so whether their "
                                            "transports carry the ToS is not known"]
    unstamped, not_checked = storage_live.roce_tos_in_effect(effect("mountstats-same.txt", None, None))
    assert unstamped == [] and not_checked[0].startswith("ens1f0np0 roce tos: as wanted, but not set by hicache-nic-tuning since the boot")
    tcp = mountstats("mountstats-same.txt").replace("\txprt:\trdma ", "\txprt:\ttcp ")  # the tier over TCP: the RoCE ToS does not apply
    assert storage_live.roce_tos_in_effect({**effect("mountstats-same.txt", "mountstats-at-set.txt", 60), "mountstats": tcp}) == ([], [])


def test_nic_verdict_says_set_not_yet_in_effect_apart_from_failures_and_gaps():
    verdict = nic_tuning.nic_verdict(report(interfaces=["ens1f0np0"], connectx=["ens1f0np0"],
                                            roce_tos_effect=effect("mountstats-same.txt", "mountstats-at-set.txt", 60)), asked=True)
    assert verdict["failures"] == [] and verdict["gaps"] == [] and verdict["changes"] == []
    assert [n.split(": set, ")[0] for n in verdict["not_in_effect"]] == ["ens1f0np0 roce tos"] and "not_checked" not in verdict


def test_every_rdma_mount_of_the_server_is_judged_and_a_hidden_one_is_not():
    """The program gives the lines of every NFS mount of the storage server (the tier's, and any other: they share its
    ports, and may share its transports); a mount hidden by a later one on the same point is not in use."""
    same, at_set = mountstats("mountstats-same.txt"), mountstats("mountstats-at-set.txt")
    tier = same[same.index("device 172.16.10.20"):same.index("device 192.0.2.30")]
    other = tier.replace(f"mounted on {POINT} ", "mounted on /mnt/models ")
    both = {**effect("mountstats-same.txt", "mountstats-at-set.txt", 60), "mountstats": tier + other}
    both["stamps"][0]["mountstats"] = at_set + at_set[at_set.index("device 172.16.10.20"):at_set.index("device 192.0.2.30")].replace(
        f"mounted on {POINT} ", "mounted on /mnt/models ")
    assert [n.split(": set, not yet in effect on ")[1].split(":")[0] for n in storage_live.roce_tos_in_effect(both)[0]] == [POINT, "/mnt/models"]
    hidden = {**both, "mountstats": tier + mountstats("mountstats-remounted.txt")[mountstats("mountstats-remounted.txt").index("device 172.16.10.20"):]}
    assert storage_live.roce_tos_in_effect(hidden) == ([], [])  # the later mount on the point, made after the ToS, is the one in use


def test_the_nic_program_is_told_where_to_stamp_the_tos_under_run():
    assert nic_tuning.desired(deployment("vast"))["tos_stamp_file"] == nic_tuning.TOS_STAMP_FILE == "/run/hicache/roce-tos.json"
