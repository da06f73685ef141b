"""The live VAST / NetApp mount judged on samples built from vastnfs' own source (tests/samples/vastnfs/README.md names
the file and function behind each): the driver's own options by version, each multipath path, pNFS in use."""

from __future__ import annotations

import pytest
from helpers import deployment
from support import ROOT

from hicachectl.plans import storage, storage_live

SAMPLES = ROOT / "tests" / "samples" / "vastnfs"
# The samples' mount: nconnect=4 over remoteports 192.0.2.1..4 from localports 192.0.2.101..102.
MULTIPATH = {"storage_nconnect": 4, "storage_remoteports": "192.0.2.1-192.0.2.4", "storage_localports": ["192.0.2.101", "192.0.2.102"]}


def sample(name: str) -> str:
    return (SAMPLES / name).read_text()


def judged(mountinfo: str, version: str | None, **overrides):
    wanted = storage.mount(deployment("vast", **{**MULTIPATH, **overrides}))
    entry = storage_live.mount_at(storage_live.parse_mountinfo(sample(mountinfo)), wanted.point)
    return (storage_live.compare_mount(entry, wanted.options, wanted.source, wanted.fstype),
            storage_live.vastnfs_option_checks(entry, wanted.options, version))


def test_remoteports_as_the_driver_compacts_them_match():
    # written as two ranges and as single addresses; nfs_show_portgroup prints both as 192.0.2.1-192.0.2.4
    for spelling in ("192.0.2.1-192.0.2.2~192.0.2.3-192.0.2.4", "192.0.2.1~192.0.2.2~192.0.2.3~192.0.2.4"):
        base, (problems, unchecked) = judged("mountinfo-4.0.33.txt", "4.0.33-vastdata", storage_remoteports=spelling)
        assert base == [] and problems == [] and unchecked == [], spelling


def test_other_remoteports_and_missing_spread_options_fail_on_a_driver_that_shows_them():
    _, (problems, _) = judged("mountinfo-4.0.33.txt", "4.0.33", storage_remoteports="192.0.2.1-192.0.2.8")
    assert problems == ["remoteports=192.0.2.1-192.0.2.4, expected 192.0.2.1-192.0.2.8"]
    no_spread = sample("mountinfo-4.0.33.txt").replace(",spread_reads,spread_writes", "")
    wanted = storage.mount(deployment("vast", **MULTIPATH))
    entry = storage_live.mount_at(storage_live.parse_mountinfo(no_spread), wanted.point)
    assert storage_live.vastnfs_option_checks(entry, wanted.options, "4.0.33")[0] == ["spread_reads is not in effect", "spread_writes is not in effect"]


@pytest.mark.parametrize("version", ["4.0.29", None, "dev"])
def test_a_driver_that_shows_no_own_options_is_not_checked_never_failed(version):
    base, (problems, unchecked) = judged("mountinfo-4.0.29.txt", version)
    assert base == [] and problems == []
    assert len(unchecked) == 1 and unchecked[0].startswith("remoteports, localports, spread_reads, spread_writes: ")


def test_localports_by_name_are_not_checked_against_the_addresses_shown():
    _, (problems, unchecked) = judged("mountinfo-4.0.33.txt", "4.0.33", storage_localports=["ens1f0np0", "ens2f0np0"])
    assert problems == [] and unchecked == ["localports=ens1f0np0~ens2f0np0: named interfaces, shown by the driver as the addresses it resolved "
                                            "(192.0.2.101-192.0.2.102)"]


def test_mountstats_gives_the_sunrpc_id_and_its_debugfs_stats_path():
    stats = storage_live.mountstats_at(storage_live.parse_mountstats(sample("mountstats-expose-id.txt")), "/mnt/kvcache-2ports")
    assert stats.sunrpc_id == "1f" and storage_live.rpc_clnt_stats_path(stats.sunrpc_id) == "/sys/kernel/debug/sunrpc/rpc_clnt/1f/stats"
    hidden = sample("mountstats-expose-id.txt").replace("\tsunrpc-id:\t1f\n", "")
    assert storage_live.mountstats_at(storage_live.parse_mountstats(hidden), "/mnt/kvcache-2ports").sunrpc_id is None


def test_every_multipath_path_connected_passes():
    options = storage.mount(deployment("vast", **MULTIPATH)).options
    transports = storage_live.parse_rpc_clnt_stats(sample("rpc_clnt-stats-connected.txt"))
    assert [(t.local, t.remote, t.connected) for t in transports][:2] == [("192.0.2.101", "192.0.2.1", True), ("192.0.2.102", "192.0.2.2", True)]
    problems, unchecked, passed = storage_live.multipath_checks(transports, options)
    assert problems == [] and unchecked == [] and len(passed) == 4


def test_an_idle_path_is_not_checked_without_noidlexprt_and_fails_with_it():
    transports = storage_live.parse_rpc_clnt_stats(sample("rpc_clnt-stats-idle.txt"))
    problems, unchecked, passed = storage_live.multipath_checks(transports, storage.mount(deployment("vast", **MULTIPATH)).options)
    assert problems == [] and len(passed) == 3 and unchecked[0].startswith("192.0.2.102 -> 192.0.2.4 is not connected now (state: BOUND)")
    strict = storage.mount(deployment("vast", **MULTIPATH, storage_options=["noidlexprt"])).options
    assert storage_live.multipath_checks(transports, strict)[0] == ["192.0.2.102 -> 192.0.2.4 is not connected (state: BOUND), with noidlexprt"]


def test_a_localport_no_transport_uses_fails():
    three = {**MULTIPATH, "storage_localports": ["192.0.2.101", "192.0.2.102", "192.0.2.103"]}
    transports = storage_live.parse_rpc_clnt_stats(sample("rpc_clnt-stats-connected.txt"))
    assert storage_live.multipath_checks(transports, storage.mount(deployment("vast", **three)).options)[0] == ["no transport from localports 192.0.2.103"]


def test_pnfs_in_use_is_a_granted_layout_not_only_the_layout_driver():
    """The layout driver (pnfs=) comes from the server's fs_layout_types; a layout is granted per file by LAYOUTGET at
    I/O. So pNFS passes only on a LAYOUTGET that did not fail (per-op statistics: net/sunrpc/stats.c)."""
    options = storage.mount(deployment("netapp", storage_nconnect=8)).options

    def judged(text):
        return storage_live.pnfs_checks(storage_live.mountstats_at(storage_live.parse_mountstats(text), "/mnt/kvcache"), options)

    granted = sample("mountstats-netapp-pnfs.txt")
    assert storage_live.parse_mountstats(granted)[0].ops["LAYOUTGET"] == (4, 0) and storage_live.parse_mountstats(granted)[0].ops["LOOKUP"] == (3, 3)
    assert judged(granted) == ([], [], ["pNFS in use (LAYOUT_NFSV4_1_FILES: 4 of 4 LAYOUTGET granted)"])
    problems, unchecked, passed = judged(sample("mountstats-netapp-nolayout.txt"))
    assert problems == passed == [] and unchecked[0].startswith("pNFS: the server granted no layout (pnfs=not configured)")
    # the driver set, no I/O yet: nothing proves a layout (this passed on the driver alone before)
    no_io = granted.replace("LAYOUTGET: 4 4 0 880 1024 0 2 2 0", "LAYOUTGET: 0 0 0 0 0 0 0 0 0")
    problems, unchecked, passed = judged(no_io)
    assert problems == passed == [] and "no I/O has asked for a layout yet (LAYOUTGET 0)" in unchecked[0]
    refused = granted.replace("LAYOUTGET: 4 4 0 880 1024 0 2 2 0", "LAYOUTGET: 4 4 0 880 64 0 2 2 4")
    assert judged(refused)[1] == ["pNFS: the server refused every layout (LAYOUTGET 4, 4 failed); I/O goes through the metadata server only"]
    no_errors_field = granted.replace("LAYOUTGET: 4 4 0 880 1024 0 2 2 0", "LAYOUTGET: 4 4 0 880 1024 0 2 2")
    assert "no LAYOUTGET count with its errors" in judged(no_errors_field)[1][0]


def _filter():
    import importlib.util

    spec = importlib.util.spec_from_file_location("hicache_mount_state_under_test", ROOT / "plugins/filter/hicache.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.hicache_mount_state


def _plan(d):
    mount = storage.mount(d)
    return {"mount": {"source": mount.source, "point": mount.point, "fstype": mount.fstype, "options": ",".join(mount.options)}}


def test_the_mount_state_filter_follows_mountstats_to_each_path():
    state = _filter()
    plan = _plan(deployment("vast", **MULTIPATH))
    mountinfo = sample("mountinfo-4.0.33.txt")
    # the facts' first look (no version, no mountstats): the driver's options are not checked, nothing fails
    first = state(mountinfo, plan)
    assert first["problems"] == [] and first["not_checked"] and first["rpc_clnt_stats_path"] is None
    # with mountstats: the sunrpc-id names the debugfs file; not read yet is "not checked"
    found = state(mountinfo, plan, "4.0.33-vastdata", sample("mountstats-expose-id.txt"))
    assert found["rpc_clnt_stats_path"] == "/sys/kernel/debug/sunrpc/rpc_clnt/1f/stats" and found["problems"] == []
    assert found["not_checked"] == ["multipath paths: /sys/kernel/debug/sunrpc/rpc_clnt/1f/stats was not read (debugfs not mounted, or not root)"]
    proven = state(mountinfo, plan, "4.0.33-vastdata", sample("mountstats-expose-id.txt"), sample("rpc_clnt-stats-connected.txt"))
    assert proven["problems"] == [] and proven["not_checked"] == [] and len(proven["passed"]) == 4
    # a localports address no interface of the host holds (plans.StoragePlan.unknown_localports) is a problem of the mount
    stray = state(mountinfo, {**plan, "unknown_localports": ["192.0.2.109"]})
    assert stray["problems"] == ["localports 192.0.2.109: no interface of this host has that address or name"]
    hidden = state(mountinfo, plan, "4.0.33", sample("mountstats-expose-id.txt").replace("\tsunrpc-id:\t1f\n", ""))
    assert "expose_id_in_mountstats" in hidden["not_checked"][0]
    netapp = state("121 22 0:56 / /mnt/kvcache rw,relatime - nfs4 netapp-lif.example.com:/kvcache rw,vers=4.1,rsize=65536,wsize=65536,"
                   "proto=rdma,nconnect=8,port=20049\n", _plan(deployment("netapp", storage_nconnect=8)), None, sample("mountstats-netapp-pnfs.txt"))
    assert netapp["problems"] == [] and netapp["passed"] == ["pNFS in use (LAYOUT_NFSV4_1_FILES: 4 of 4 LAYOUTGET granted)"]


def test_options_the_nfs_client_does_not_print_back_are_not_checked_never_failed():
    """fs/nfs/super.c nfs_show_mount_options prints a fixed set of options (and the attribute cache times only where
    not the kernel's default, include/linux/nfs_fs.h NFS_DEF_AC*): an fstab option outside it cannot be found in
    mountinfo, so it is named as not checked, never "not in effect" (which failed every converge and verify)."""
    extra = ["noidlexprt", "noextend", "retry=5", "bg", "acregmin=3", "lookupcache=all"]
    base, _ = judged("mountinfo-4.0.29.txt", "4.0.29", storage_options=extra)
    assert base == []
    wanted = storage.mount(deployment("vast", **MULTIPATH, storage_options=extra))
    notes = storage_live.nfs_unechoed_options(wanted.options, wanted.fstype)
    assert [n.split(":")[0] for n in notes] == [f"mount option {o}" for o in extra], notes
    assert all("not checked" in n for n in notes)
    # what the kernel prints is still compared, spelt as it prints it
    for option, problem in (("nfsvers=4.1", "vers=3, expected 4.1"), ("actimeo=600", "acregmin is not in effect (expected acregmin=600)"),
                            ("lookupcache=positive", "lookupcache is not in effect (expected lookupcache=positive)"),
                            ("timeo=100", "timeo=600, expected 100")):
        base, _ = judged("mountinfo-4.0.29.txt", "4.0.29", storage_options=[option])
        assert problem in base, (option, base)


def test_the_printed_spellings_of_aliases_and_defaults_match():
    live = sample("mountinfo-4.0.29.txt").replace(",timeo=600", ",acregmin=600,acregmax=600,acdirmin=600,acdirmax=600,lookupcache=pos,timeo=600")
    wanted = storage.mount(deployment("vast", **MULTIPATH, storage_options=["nfsvers=3", "actimeo=600", "lookupcache=positive"]))
    entry = storage_live.mount_at(storage_live.parse_mountinfo(live), wanted.point)
    assert storage_live.compare_mount(entry, wanted.options, wanted.source, wanted.fstype) == []
