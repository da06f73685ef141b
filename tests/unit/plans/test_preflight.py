"""preflight's judgement of a host's facts; the facts are written out in the shape hicache_host_facts returns
(the module itself runs on the Molecule and fleet hosts).

Judged against what the inventory needs, whatever hicache_strict says: an item not needed is "not needed",
a needed item the host lacks is missing and required; doctor's exit code follows from that alone.
"""

from __future__ import annotations

import yaml
from helpers import BARE, FULL, NFS_ITEMS, deployment
from support import ROOT

from hicachectl.plans import preflight, storage
from hicachectl.plans.plan import MISSING, NOT_CHECKED, NOT_NEEDED, OK, WARN


# A GPU host as the VAST document describes it: 8 GPUs, two ConnectX-7 ports, RDMA, NFS client with rpcrdma,
# the VAST NFS driver, Docker answering, the NVIDIA toolkit.
def statuses(facts, d):
    return {c.item: c.status for c in preflight.judge(facts, d)}


def runtime(facts, **overrides):
    return next(c for c in preflight.judge(facts, deployment("vast", **overrides)) if c.item == "container_runtime")


def test_a_docker_client_without_its_daemon_cannot_run_the_server():
    facts = {"tools": {"docker": "/usr/bin/docker"},
             "runtime_engines": {"docker": {"answers": False, "detail": "Cannot connect to the Docker daemon at unix:///var/run/docker.sock"}}}
    check = runtime(facts, strict=True)
    assert check.status == MISSING and check.blocking
    assert "/usr/bin/docker is there, but its engine does not answer (Cannot connect to the Docker daemon" in check.detail


def test_an_answering_engine_a_missing_client_and_no_runtime():
    answering = {"tools": {"docker": "/usr/bin/docker"}, "runtime_engines": {"docker": {"answers": True, "detail": "27.3.1"}}}
    assert runtime(answering).status == OK and "engine 27.3.1" in runtime(answering).detail
    assert runtime({"tools": {}}).detail == "docker not found (needed for the server's docker container)"
    assert runtime({"tools": {}}, container_runtime="none", cache_container_dir=None, model_dir=None).status == NOT_NEEDED


def test_the_vast_host_of_the_document_has_everything():
    report = preflight.report(FULL, deployment("vast"))
    assert report["required_missing"] == [] and preflight.host_status(report) == "ok"
    assert {c["item"] for c in report["checks"] if c["status"] == OK} >= {"gpus", "vastnfs", *NFS_ITEMS, "container_runtime"}


def test_the_judgement_does_not_depend_on_strictness():
    for facts in (FULL, BARE):
        strict, lax = (preflight.report(facts, deployment("vast", strict=s)) for s in (True, False))
        assert strict["checks"] == lax["checks"] and strict["required_missing"] == lax["required_missing"]
        assert (strict["strict"], lax["strict"]) == (True, False)


def test_a_bare_host_lacks_everything_a_vast_server_needs():
    report = preflight.report(BARE, deployment("vast"))
    missing = [m.split(":")[0] for m in report["required_missing"]]
    assert missing == ["gpus", "connectx", "rdma", "nfs_client", "rpcrdma", "vastnfs", "host_ram", "container_runtime", "nvidia_container_toolkit"]
    assert "rpcrdma: no rpcrdma module for this kernel" in report["required_missing"][4]
    assert "(needed for the vast L3 tier over proto=rdma)" in report["required_missing"][4]


def test_a_local_tier_needs_no_nfs_client_rdma_or_connectx():
    d = deployment("local")
    judged = statuses(BARE, d)
    assert {item: judged[item] for item in (*NFS_ITEMS, "vastnfs")} == dict.fromkeys((*NFS_ITEMS, "vastnfs"), NOT_NEEDED)
    detail = next(c.detail for c in preflight.judge(BARE, d) if c.item == "nfs_client")
    assert detail == "not needed: the L3 tier is local (host: mount.nfs is not installed (package nfs-common / nfs-utils))"
    assert judged["gpus"] == MISSING  # any SGLang server needs a GPU
    assert "l3_device" not in judged  # a plain directory


def test_the_runtime_and_toolkit_are_needed_only_for_a_container():
    in_container = statuses(BARE, deployment("local"))
    assert in_container["container_runtime"] == in_container["nvidia_container_toolkit"] == MISSING
    on_host = statuses(BARE, deployment("local", container_runtime="none"))
    assert on_host["container_runtime"] == on_host["nvidia_container_toolkit"] == NOT_NEEDED
    report = preflight.report(BARE, deployment("local", container_runtime="none"))
    assert [m.split(":")[0] for m in report["required_missing"]] == ["gpus"]


def test_vastnfs_only_for_multipath_and_rdma_only_over_rdma():
    single_path = statuses(BARE, deployment("vast", storage_remoteports=None, storage_localports=[], storage_nconnect=16))
    assert single_path["vastnfs"] == NOT_NEEDED and single_path["rpcrdma"] == MISSING
    over_tcp = statuses(BARE, deployment("netapp", storage_options=["proto=tcp"]))
    assert over_tcp["rpcrdma"] == over_tcp["rdma"] == NOT_NEEDED
    assert over_tcp["nfs_client"] == over_tcp["connectx"] == MISSING
    assert statuses(BARE, deployment("netapp"))["rpcrdma"] == MISSING


def test_can_mount_asks_a_local_device_tier_for_its_device_not_for_nfs():
    by_uuid = deployment("local", storage_device="UUID=1234-abcd")
    assert storage.can_mount(FULL, by_uuid) == (True, "UUID=1234-abcd is /dev/nvme1n1")
    ok, why = storage.can_mount(BARE, by_uuid)
    assert not ok and why == "no block device with UUID=1234-abcd on this host (none in /dev/disk/by-uuid)"
    assert storage.can_mount(BARE, deployment("local", storage_device="/dev/nvme1n1"))[0]  # no mount.nfs asked for
    judged = {c.item: c for c in preflight.judge(BARE, by_uuid)}
    assert judged["l3_device"].blocking and judged["nfs_client"].status == NOT_NEEDED
    ok, why = storage.can_mount(BARE, deployment("vast"))
    assert not ok and why.startswith("mount.nfs is not installed")
    ok, why = storage.can_mount({**FULL, "kernel_modules": {"nfs": {"loaded": True, "available": True}}}, deployment("vast"))
    assert not ok and why.startswith("no rpcrdma module")


def test_doctor_exit_codes():
    ok, missing = preflight.report(FULL, deployment("vast")), preflight.report(BARE, deployment("vast"))
    assert preflight.doctor_exit_code({"a": ok, "b": ok}) == 0
    assert preflight.doctor_exit_code({"a": ok, "b": missing}) == 1
    assert preflight.doctor_exit_code({"a": missing, "b": None}) == 2  # a host that could not be checked
    assert [preflight.host_status(r) for r in (ok, missing, None)] == ["ok", "missing", "not checked"]
    lax = preflight.report(BARE, deployment("vast", strict=False))
    assert preflight.doctor_exit_code({"a": lax}) == 1  # a tolerated gap is still missing for doctor


def test_old_os_warns_and_python_and_ansible_are_required():
    old = {**FULL, "os": {"id": "ubuntu", "version_id": "18.04"}, "python": "3.6.9"}
    judged = {c.item: c for c in preflight.judge(old, deployment("vast"), ansible_version="2.14.0")}
    assert judged["os"].status == WARN and not judged["os"].blocking
    assert judged["python"].blocking and judged["ansible"].blocking


# vastnfs before the first mount: hicache_host_facts reads vastnfs_installed from `modinfo -F parmtype sunrpc` (vastnfs'
# bundle/net/sunrpc/sunrpc_syms.c declares nfs_bundle_version with module_param_string); nfs_bundle_version in /sys exists
# only once sunrpc is loaded (vastnfs docs/src/monitoring/version.md).
INSTALLED_NOT_LOADED = {**FULL, "vastnfs_version": None, "vastnfs_installed": True}


def test_vastnfs_installed_but_not_loaded_is_not_missing():
    judged = {c.item: c for c in preflight.judge(INSTALLED_NOT_LOADED, deployment("vast"))}
    assert judged["vastnfs"].status == OK and "not loaded yet" in judged["vastnfs"].detail
    assert not preflight.report(INSTALLED_NOT_LOADED, deployment("vast"))["required_missing"]
    neither = {**FULL, "vastnfs_version": None, "vastnfs_installed": False}
    assert {c.item: c.status for c in preflight.judge(neither, deployment("vast"))}["vastnfs"] == MISSING


def test_nconnect_above_16_needs_vastnfs_even_without_multipath():
    # the stock kernel's fs/nfs/fs_context.c: NFS_MAX_CONNECTIONS 16; vastnfs' bundle/fs/nfs/fs_context.c: 64
    stock = {**FULL, "vastnfs_version": None, "vastnfs_installed": False}
    wide = deployment("vast", storage_remoteports=None, storage_localports=[], storage_nconnect=32)
    judged = {c.item: c for c in preflight.judge(stock, wide)}
    assert judged["vastnfs"].blocking and "nconnect=32" in judged["vastnfs"].detail
    assert statuses(stock, deployment("vast", storage_remoteports=None, storage_localports=[], storage_nconnect=16))["vastnfs"] == NOT_NEEDED


def test_a_version_gated_option_is_judged_on_the_loaded_version_only():
    dns = deployment("vast", storage_remoteports="dns", storage_localports=[])
    old = {c.item: c for c in preflight.judge({**FULL, "vastnfs_version": "4.0.28-vastdata-MLNX.OFED.5.9"}, dns)}
    assert old["vastnfs_version"].blocking and "remoteports=dns needs 4.0.29+" in old["vastnfs_version"].detail
    new = {c.item: c for c in preflight.judge({**FULL, "vastnfs_version": "4.0.33-vastdata"}, dns)}
    assert new["vastnfs_version"].status == OK
    # installed, not loaded: the version is unknown before the first mount: "not checked", never a failure
    unknown = {c.item: c for c in preflight.judge(INSTALLED_NOT_LOADED, dns)}
    assert unknown["vastnfs_version"].status == NOT_CHECKED and not unknown["vastnfs_version"].blocking
    assert "sunrpc is not loaded" in unknown["vastnfs_version"].detail
    assert preflight.report(INSTALLED_NOT_LOADED, dns)["not_checked"]


def test_remoteports_dns_without_nconnect_needs_4_0_30():
    dns_alone = deployment("vast", storage_remoteports="dns", storage_localports=[], storage_nconnect=None)
    judged = {c.item: c for c in preflight.judge({**FULL, "vastnfs_version": "4.0.29"}, dns_alone)}
    assert judged["vastnfs_version"].blocking and "without nconnect needs 4.0.30+" in judged["vastnfs_version"].detail
    assert storage.vastnfs_version_tuple("dev") is None and storage.vastnfs_version_tuple("4.0.33-vastdata") == (4, 0, 33)


def test_an_ipv6_netapp_server_still_needs_rpcrdma():
    # proto=rdma6 is still NFS over RDMA (net/sunrpc/xprtrdma/transport.c registers netids rdma and rdma6)
    assert statuses(BARE, deployment("netapp", storage_server="[fd00::10]"))["rpcrdma"] == MISSING


def test_the_storage_role_does_not_try_a_mount_the_stock_kernel_refuses():
    """The stock kernel refuses the VAST driver's options ("nfs: Unknown parameter 'localports'", fs/nfs/fs_context.c
    has no such key): with the driver neither loaded nor installed, can_mount says why and the role does not mount."""
    stock = {**FULL, "vastnfs_version": None, "vastnfs_installed": False}
    for d, named in ((deployment("vast"), "VAST multipath (remoteports, localports)"),
                     (deployment("vast", storage_remoteports=None, storage_localports=[], storage_nconnect=32), "nconnect=32")):
        ok, why = storage.can_mount(stock, d)
        assert not ok and why.startswith("this mount needs the VAST NFS driver for") and named in why, why
        assert "neither loaded nor installed" in why
        assert storage.can_mount(FULL, d)[0] and storage.can_mount(INSTALLED_NOT_LOADED, d)[0]
    single = deployment("vast", storage_remoteports=None, storage_localports=[], storage_nconnect=16)
    assert storage.can_mount(stock, single)[0]  # what the stock kernel mounts is mounted


def test_the_supported_ansible_core_range_is_the_same_wherever_it_is_said():
    """pyproject.toml's requirement, the collection's meta/runtime.yml, preflight's window, docs/collection.md's
    heading and the sanity ignore files (one per supported minor) name one range."""
    import tomllib

    low, high = preflight.ANSIBLE_WINDOW
    minors = [f"{low[0]}.{m}" for m in range(low[1], high[1] + 1)]
    assert low[0] == high[0], "a range across major versions: say it here"
    after = f"{high[0]}.{high[1] + 1}"
    requirement = next(r for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"] if r.startswith("ansible-core"))
    assert requirement.replace(" ", "") == f"ansible-core>={minors[0]},<{after}", requirement
    runtime = yaml.safe_load((ROOT / "meta/runtime.yml").read_text())["requires_ansible"]
    assert runtime == f">={minors[0]}.0,<{after}", runtime
    assert f"## Supported ansible-core: {minors[0]} to {minors[-1]}" in (ROOT / "docs/collection.md").read_text()
    assert sorted(p.name for p in (ROOT / "tests/sanity").glob("ignore-*.txt")) == sorted(f"ignore-{m}.txt" for m in minors)


def test_vastnfs_installed_behind_the_kernels_own_loaded_sunrpc_cannot_mount_and_says_reload():
    """vastnfs installed without a reboot: modinfo lists nfs_bundle_version, but the sunrpc in memory is the kernel's
    (vastnfs docs/src/monitoring/version.md: no nfs_bundle_version while /sys/module/sunrpc exists). Neither the mount
    nor modprobe rpcrdma swaps it; the driver's options then fail with the kernel's raw "Unknown parameter"."""
    stale = {**INSTALLED_NOT_LOADED, "kernel_modules": {**FULL["kernel_modules"], "sunrpc": {"loaded": True, "available": True}}}
    ok, why = storage.can_mount(stale, deployment("vast"))
    assert ok is False and "vastnfs-ctl reload" in why and "kernel's own sunrpc is loaded" in why
    judged = {c.item: c for c in preflight.judge(stale, deployment("vast"))}
    assert judged["vastnfs"].status == MISSING and "vastnfs-ctl reload" in judged["vastnfs"].detail
    # before the first mount with nothing loaded yet, the mount loads it (as before)
    assert storage.can_mount(INSTALLED_NOT_LOADED, deployment("vast"))[0] is True


def test_the_host_pool_counts_every_rank_as_validate_does():
    """--hicache-size is per rank: a TP 2 x PP 2 server pins four pools, not two (validate's host_pool_ranks)."""
    facts = {**FULL, "mem_total_gb": 200}
    fits = preflight.report(facts, deployment("local", size_gb=60, tp_size=2, host_ram_headroom_gb=16))
    pipeline = preflight.report(facts, deployment("local", size_gb=60, tp_size=2, pp_size=2, host_ram_headroom_gb=16))
    ram = {name: next(c for c in r["checks"] if c["item"] == "host_ram") for name, r in (("tp", fits), ("pp", pipeline))}
    assert ram["tp"]["status"] == OK, ram
    assert ram["pp"]["status"] == MISSING and "240 GB host pool (60 GB x 2 TP x 2 PP ranks)" in ram["pp"]["detail"], ram


def uring(detail, answers=True, **overrides):
    facts = {**FULL, "runtime_engines": {"docker": {"answers": answers, "detail": detail}}}
    return next((c for c in preflight.judge(facts, deployment("vast", **overrides)) if c.item == "io_uring"), None)


def test_io_uring_under_docker_is_judged_by_the_hosts_engine_until_a_profile_is_set():
    """Moved from validate's uring-seccomp (#34): Docker 25.0 and later block io_uring in their default seccomp profile
    (moby#46762), 20.10 to 24 allow it (docs/docker-vm.md shows Debian's 20.10 allowing it on the VM bed)."""
    blocked = uring("27.3.1")
    assert blocked.status == WARN and "27.3.1" in blocked.detail and "hicache_container_seccomp" in blocked.detail
    assert "posix_aio" in blocked.detail
    assert uring("25.0.0").status == WARN
    assert uring("20.10.24+dfsg1").status == OK and uring("24.0.7").status == OK
    assert uring("27.3.1", container_seccomp="/etc/hicache/seccomp-uring.json") is None  # a profile given: as the operator chose
    assert uring("27.3.1", extra_config={"use_direct_io": True, "use_posix_aio": "true"}) is None  # no io_uring asked
    assert uring("27.3.1", container_runtime="podman") is None
    assert uring("Cannot connect to the Docker daemon", answers=False) is None  # the runtime check names that
    assert uring("") is None  # a version not known is not guessed
    warned = preflight.report({**FULL, "runtime_engines": {"docker": {"answers": True, "detail": "26.1.3"}}}, deployment("vast"))
    assert any(w.startswith("io_uring: Docker 26.1.3") for w in warned["warnings"]) and not warned["required_missing"]
