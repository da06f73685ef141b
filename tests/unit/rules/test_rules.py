"""Rules that warn rather than refuse, and the helpers behind them."""

from __future__ import annotations

import pytest
from helpers import _host_vars

from hicachectl import rules


def findings(name: str, **overrides):
    host, variables = _host_vars(name)
    _, found = rules.check_host(host, {**variables, **{f"hicache_{k}": v for k, v in overrides.items()}})
    return {(f.level, f.rule, f.variable) for f in found}


@pytest.mark.parametrize("spec,count", [("192.0.2.1-192.0.2.16", 16), ("192.0.2.1-192.0.2.8~192.0.3.1-192.0.3.8", 16),
                                        ("192.0.2.7", 1), ("dns", None), ("192.0.2.9-192.0.2.1", None), ("nonsense", None)])
def test_remote_port_count(spec, count):
    assert rules.remote_port_count(spec) == count


def test_the_vast_seed_mount_is_sane():
    assert not {f for f in findings("vast") if f[1].startswith("nconnect")}


def test_nconnect_not_a_multiple_of_the_remote_ports_warns():
    assert ("warning", "nconnect-ports", "hicache_storage_nconnect") in findings("vast", storage_nconnect=30)


def test_nconnect_against_the_line_rate_warns_both_ways():
    assert ("warning", "nconnect-link", "hicache_storage_nconnect") in findings("vast", storage_nconnect=64)
    assert ("warning", "nconnect-link", "hicache_storage_nconnect") in findings("vast", storage_nconnect=4, storage_remoteports="dns")


def test_size_and_ratio_together_warn():
    assert ("warning", "size-overrides-ratio", "hicache_ratio") in findings("vast", ratio=2.0)


def test_nixl_plugin_beside_a_plugin_section_warns():
    assert ("warning", "nixl-plugin-ignored", "hicache_nixl_plugin") in findings("netapp", nixl_plugin="POSIX")


def test_netapp_rsize_above_64k_warns():
    assert ("warning", "netapp-rdma-rsize", "hicache_storage_rsize") in findings("netapp", storage_rsize=1048576)


def test_the_seeds_json_boolean_for_nixl_is_not_warned():
    # SGLang hands NIXL str(True) == 'True', which NIXL 1.5.1 reads as true (case-insensitive): the seed's boolean works.
    assert not any(f[1].startswith("nixl-") for f in findings("vast"))
    assert ("error", "nixl-param-type", "hicache_extra_config.use_uring") in findings("vast", extra_config={"use_uring": "maybe"})


def test_validate_leaves_io_uring_under_docker_to_the_hosts_engine():
    """#34: whether Docker's seccomp blocks io_uring is a matter of the host's engine (25.0 and later), which validate
    cannot know: a fresh vast inventory is not warned about its own document; preflight judges it with the version
    (tests/unit/plans/test_preflight.py)."""
    assert not any(f[1] == "uring-seccomp" for f in findings("vast"))


def test_the_seccomp_profile_reaches_docker_run():
    from helpers import deployment

    from hicachectl.plans import launch

    argv = launch.container_argv(deployment("vast", container_seccomp="unconfined"))
    assert argv[argv.index("--security-opt") + 1] == "seccomp=unconfined"


# --- domains (issue 11) ------------------------------------------------------------------------------

def _errors(name: str, **overrides):
    return {(f.rule, f.variable) for f in rules.check_host(*_with(name, overrides))[1] if f.level == rules.ERROR}


def _with(name: str, overrides: dict):
    host, variables = _host_vars(name)
    return host, {**variables, **{f"hicache_{k}": v for k, v in overrides.items()}}


def test_every_variable_has_a_domain_a_type_that_says_it_all_or_choices():
    from hicachectl.config import schema

    assert [v.name for v in schema.VARIABLES if v.type != "bool" and not v.choices and v.domain is None] == []


@pytest.mark.parametrize("var", [v for v in __import__("hicachectl.config.schema").config.schema.VARIABLES if v.domain is not None], ids=lambda v: v.name)
def test_each_domain_example_is_valid_so_the_fix_is_real(var):
    """The fix of a domain finding suggests the domain's example: applied, it leaves no error on that variable."""
    seed = {"hicache_storage_fstype": "local", "hicache_storage_device": "local", "hicache_extra_config_file": "netapp"}.get(var.name, "vast")
    host, variables = _host_vars(seed)
    _, found = rules.check_host(host, {**variables, var.name: var.domain.example})
    domain_rules = {d.rule for d in (var.domain, var.domain.keys, var.domain.items) if d is not None} | {"type", "control-character"}
    assert not [f.format() for f in found if f.level == rules.ERROR and f.variable.startswith(var.name) and f.rule in domain_rules]


def test_memlock_misspelt_is_refused_with_a_fix_that_works():
    host, variables = _host_vars("vast")
    _, found = rules.check_host(host, {**variables, "hicache_limits_memlock": "unlimted"})
    [finding] = [f for f in found if f.variable == "hicache_limits_memlock"]
    assert finding.rule == "memlock" and "'unlimited'" in finding.fix
    assert ("memlock", "hicache_limits_memlock") not in _errors("vast", limits_memlock="1048576")
    assert ("type", "hicache_limits_memlock") in _errors("vast", limits_memlock=1048576)  # fix: quote it


def test_a_malformed_image_names_the_image_not_the_version():
    errors = _errors("vast", image="lmsysorg/sglang v0.5.20")
    assert ("image-reference", "hicache_image") in errors
    assert not any(variable == "hicache_sglang_version" for _, variable in errors)
    assert not _errors("vast", image="registry.example.com:5000/lmsysorg/sglang:v0.5.20-cu130@sha256:" + "a" * 64)


@pytest.mark.parametrize("spec,count", [("all", None), ("8", 8), ('"device=0,1,2,3"', 4), ("device=3", 1), ("count=2", 2),
                                        ("capabilities=compute,utility", None), ("count=all,capabilities=compute", None)])
def test_docker_gpus(spec, count):
    from hicachectl.config import schema

    if spec.startswith("capabilities"):
        with pytest.raises(ValueError):  # the CSV field 'utility' reads as a second count
            schema.docker_gpus(spec)
    else:
        assert schema.docker_gpus(spec) == count


def test_tp_against_the_container_gpus():
    assert ("tp-gpus", "hicache_tp_size") in _errors("vast", container_gpus="4")
    assert ("tp-gpus", "hicache_tp_size") not in _errors("vast", container_gpus="8")
    assert ("tp-gpus", "hicache_tp_size") in _errors("vast", tp_size=4, pp_size=2, container_gpus='"device=0,1,2,3"')
    assert not _errors("vast", container_gpus='"device=0,1,2,3,4,5,6,7"')
    assert ("container-gpus", "hicache_container_gpus") in _errors("vast", container_gpus="device=0,1")
    assert ("tp-gpus", "hicache_tp_size") in _errors("vast", container_runtime="podman", container_gpus="0,1")


def test_control_characters_are_refused_inside_lists_and_mapping_keys():
    assert ("control-character", "hicache_container_extra_args[0]") in _errors("vast", container_extra_args=["--shm-size\n32g"])
    assert ("control-character", "hicache_extra_config.bad\nkey") in _errors("vast", extra_config={"use_direct_io": True, "bad\nkey": "1"})
    assert ("control-character", "hicache_extra_config.plugin.posix.x") in _errors(
        "vast", extra_config={"plugin": {"posix": {"active": True, "x": "a\u2028b"}}})


def test_the_inventory_host_name_must_be_one_line():
    host, variables = _host_vars("vast")
    _, found = rules.check_host("gpu\nExecStartPre=x", variables)
    assert [(f.rule, f.variable) for f in found if f.level == rules.ERROR] == [("control-character", "inventory_hostname")]


def test_a_secret_is_not_echoed_by_its_domain_finding():
    host, variables = _host_vars("vast")
    _, found = rules.check_host(host, {**variables, "hicache_model_hub_token": "hf_secret value"})
    [finding] = [f for f in found if f.variable == "hicache_model_hub_token"]
    assert "hf_secret" not in finding.format()


# --- the fleet and fleet-sized output -----------------------------------------------------------------

def test_two_hosts_at_one_address_and_port_are_one_machine():
    hosts = {"a": {}, "b": {}, "c": {}}
    connections = {"a": {"ansible_host": "10.0.0.1"}, "b": {"ansible_host": "10.0.0.1", "ansible_port": 22}, "c": {"ansible_host": "10.0.0.1", "ansible_port": 2222}}
    found = rules.check_fleet(hosts, connections)
    assert {(f.host, f.rule, f.variable) for f in found} == {("a", "duplicate-host", "ansible_host"), ("b", "duplicate-host", "ansible_host")}
    assert all(f.level == rules.ERROR and "a, b" in f.fix for f in found)
    assert rules.check_fleet({"x": {}, "y": {}}) == []  # reached by their names
    local = rules.check_fleet({"gpu1": {"ansible_connection": "local"}, "gpu2": {"ansible_connection": "local"}})
    assert len(local) == 2 and "ansible_connection: local" in local[0].message


def test_compact_hosts():
    assert rules.compact_hosts([f"b200-{i:02d}" for i in range(1, 17)]) == "b200-[01:16]"
    assert rules.compact_hosts(["gpu-a", "gpu-b"]) == "gpu-a, gpu-b"
    assert rules.compact_hosts(["n1", "n2", "n3", "n5", "x"]) == "n[1:3], n5, x"
    assert rules.compact_hosts([f"h{i}" for i in range(0, 20, 2)], limit=3) == "h0, h2, h4 and 7 more"


def test_the_same_finding_on_many_hosts_is_one_group():
    vast_host, variables = _host_vars("vast")
    found = [f for i in range(1, 1001) for f in rules.check_host(f"b200-{i:04d}", variables)[1]]
    groups = rules.group_findings(found)
    # The vast profile warns about its own placeholders too (its documentation addresses: fill them in).
    assert len(found) >= 2000 and len(groups) == len({f.key() for f in found}) <= 5
    first, hosts = groups[0]
    assert len(hosts) == 1000
    line = first.format("vast", hosts)
    assert "1000 hosts b200-[0001:1000]" in line and len(line) < 600
    assert first.format("vast") == first.format("vast", [first.host])  # one host: as before


# --- the rules SGLang's and NIXL's keys require (issue 23) -----------------------------------------------------

@pytest.mark.parametrize("name", ["pp_size", "attn_cp_size"])
def test_nixl_with_pipeline_or_context_parallelism_is_refused(name):
    # sglang 0.5.23 nixl/hicache_nixl.py: tp_config_suffix = f"_{model_name}_{tp_rank}_{tp_size}", no PP/CP rank
    assert ("error", "nixl-rank-keys", f"hicache_{name}") in findings("vast", **{name: 2})
    assert not any(f[1] == "nixl-rank-keys" for f in findings("vast", **{name: 1}))
    assert not any(f[1] == "nixl-rank-keys" for f in findings("local", **{name: 2}))  # the file backend keys both


@pytest.mark.parametrize("config,refused", [
    ({"use_uring": True, "use_posix_aio": "true"}, True),
    ({"use_aio": "yes", "use_posix_aio": "on"}, True),
    ({"plugin": {"posix": {"use_aio": "true", "use_uring": "true", "active": True}}}, True),
    ({"use_uring": "true", "use_posix_aio": "false"}, False),  # a key set to false asks for nothing
    ({"use_uring": True}, False),
])
def test_two_nixl_io_queues_are_refused(config, refused):
    found = findings("vast", extra_config={"use_direct_io": True, **config}, nixl_plugin=None if "plugin" in config else "POSIX")
    assert any(f[:2] == ("error", "nixl-io-queue") for f in found) is refused


@pytest.mark.parametrize("key", ["SGLANG_HICACHE_NIXL_BACKEND_STORAGE_DIR", "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR",
                                 "SGLANG_HICACHE_NIXL_BACKEND_PLUGIN", "SGLANG_HICACHE_NIXL_USE_DIRECT_IO",
                                 "SGLANG_HICACHE_HF3FS_STORAGE_DIR"])
def test_the_backends_own_variables_are_refused_in_container_env(key):
    assert ("error", "backend-env", f"hicache_container_env.{key}") in findings("vast", container_env={"SAFETENSORS_FAST_GPU": "1", key: "x"})


def test_other_container_env_is_kept():
    assert not any(f[1] == "backend-env" for f in findings("vast", container_env={"SAFETENSORS_FAST_GPU": "1", "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE": "1T"}))


@pytest.mark.parametrize("overrides,ranks", [({}, 8), ({"pp_size": 2}, 16), ({"dp_size": 2}, 16),
                                             ({"dp_size": 2, "enable_dp_attention": True}, 8), ({"pp_size": 2, "dp_size": 2}, 32)])
def test_the_host_pool_is_per_rank_of_every_pipeline_stage_and_dp_replica(overrides, ranks):
    # the vast seed: 200 GB per rank, TP 8, 2048 GB RAM, 64 GB headroom; refused from 11 pools on
    size = 1984 // ranks
    assert not any(f[1] == "host-pool-ram" for f in findings("vast", size_gb=size, **overrides))
    assert ("error", "host-pool-ram", "hicache_size_gb") in findings("vast", size_gb=size + 1, **overrides)


@pytest.mark.parametrize("name,refused", [("ab", True), ("0f", True), ("FF", True), ("abc", False), ("g1", False)])
def test_a_namespace_of_two_hex_digits_is_refused(name, refused):
    assert (("error", "l3-namespace-bucket", "hicache_l3_namespace") in findings("vast", l3_namespace=name)) is refused


def test_nixl_cleaner_on_a_shared_tier_or_beside_the_weights_warns():
    on = {"use_direct_io": True, "use_uring": True}
    assert ("warning", "nixl-cleaner-shared", "hicache_extra_config.l3_cleaner_enabled") in findings("vast", extra_config=on, l3_share="vast-prod")
    # the vast seed keeps its weights in /root/vastdata, not on the tier
    assert not any(f[1] == "nixl-cleaner-weights" for f in findings("vast", extra_config=on))
    assert ("warning", "nixl-cleaner-weights", "hicache_extra_config.l3_cleaner_enabled") in findings(
        "vast", extra_config=on, model_dir="/mnt/kvcache-2ports/models/llama")
    # the seed turns the cleaner off: nothing to warn about
    assert not any(f[1].startswith("nixl-cleaner") for f in findings("vast", l3_share="vast-prod", model_dir="/mnt/kvcache-2ports/m"))


def test_nixl_cleaner_watermarks_out_of_order_are_refused():
    # sglang nixl/nixl_cleaner.py HiCacheL3Cleaner.__init__: low_watermark >= high_watermark raises ValueError
    config = {"use_direct_io": True, "l3_cleaner_high_watermark": 70, "l3_cleaner_low_watermark": 80}
    assert ("error", "nixl-cleaner", "hicache_extra_config.l3_cleaner_low_watermark") in findings("vast", extra_config=config)


def test_the_unbounded_file_backend_warns_until_a_bound_is_set():
    assert ("warning", "file-backend-unbounded", "hicache_extra_config.max_size") in findings("local")
    assert not any(f[1].startswith("file-backend") for f in findings("local", extra_config={"max_size": "800G"}))
    assert not any(f[1].startswith("file-backend") for f in findings("local", extra_config={"min_free_space": "50Gi"}))
    assert not any(f[1].startswith("file-backend") for f in findings("local", container_env={"SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE": "1T"}))
    assert ("warning", "file-backend-unbounded", "hicache_extra_config.max_size") in findings("local", extra_config={"max_size": "0"})


@pytest.mark.parametrize("value,ok", [("800G", True), ("1.5T", True), ("1Ti", True), (1048576, True),
                                      ("800GB", False), ("1.5Ti", False), ("800g", False), ("lots", False)])
def test_a_file_backend_size_sglang_cannot_read_is_refused(value, ok):
    # human_readable_int (sglang/srt/utils/common.py): SI k/M/G/T with decimals, IEC Ki/Mi/Gi/Ti integers, case-sensitive
    assert (("error", "file-backend-size", "hicache_extra_config.max_size") not in findings("local", extra_config={"max_size": value})) is ok


# nconnect bounds: the stock kernel's fs/nfs/fs_context.c refuses above NFS_MAX_CONNECTIONS 16, vastnfs'
# bundle/fs/nfs/fs_context.c (Opt_nconnect) above its NFS_MAX_CONNECTIONS 64.
def test_vast_nconnect_above_64_is_refused():
    assert ("error", "range", "hicache_storage_nconnect") in findings("vast", storage_nconnect=65)
    assert ("error", "range", "hicache_storage_nconnect") not in findings("vast", storage_nconnect=64)


def test_nconnect_below_the_remote_ports_is_documented_usage_not_a_warning():
    # vastnfs docs/src/usage/mount-params.md: nconnect=8 over remoteports of 32 addresses picks a sub-range of 8
    assert ("warning", "nconnect-ports", "hicache_storage_nconnect") not in findings("vast", storage_nconnect=8)
    assert ("warning", "nconnect-ports", "hicache_storage_nconnect") in findings("vast", storage_nconnect=24)


def test_netapp_nconnect_is_allowed_without_trunking_and_capped_at_16():
    # ONTAP pnfs/pnfs-plan-concept.adoc: pNFS with nconnect or with session trunking, not both; ONTAP allows 16
    assert not {f for f in findings("netapp", storage_nconnect=8) if f[2] == "hicache_storage_nconnect"}
    assert ("error", "pnfs-nconnect-trunking", "hicache_storage_nconnect") in findings("netapp", storage_nconnect=8, storage_options=["max_connect=4"])
    assert ("error", "range", "hicache_storage_nconnect") in findings("netapp", storage_nconnect=17)
    assert not {f for f in findings("netapp", storage_options=["max_connect=4"]) if f[2] == "hicache_storage_nconnect"}


def test_the_roce_dscp_must_land_on_the_pfc_and_ecn_priorities():
    """NFS over RDMA runs on priority roce_dscp >> 3 with trust dscp (the default dscp2prio map): a DSCP of another
    priority, or PFC/ECN lists without it, leave the storage traffic neither paused nor marked."""
    assert not {f for f in findings("vast") if f[1] == "roce-priority"}  # 26 -> 3, PFC on 3 (ECN left to the firmware)
    assert not {f for f in findings("vast", nic_ecn_priorities=[3]) if f[1] == "roce-priority"}  # ECN on 3 too
    assert {("warning", "roce-priority", "hicache_nic_pfc_priorities"), ("warning", "roce-priority", "hicache_nic_ecn_priorities")} <= \
        findings("vast", nic_roce_dscp=46, nic_ecn_priorities=[3])
    assert ("warning", "roce-priority", "hicache_nic_pfc_priorities") in findings("netapp", nic_pfc_priorities=[4])
    assert not {f for f in findings("vast", nic_roce_dscp=46, nic_qos_trust="pcp") if f[1] == "roce-priority"}
    assert not {f for f in findings("vast", nic_pfc_priorities=[], nic_ecn_priorities=[]) if f[1] == "roce-priority"}


def test_ecn_required_without_ecn_priorities_is_named():
    """ECN is left to the firmware by default (hicache_nic_ecn_priorities []): requiring it then requires nothing."""
    assert ("warning", "ecn-required-alone", "hicache_nic_ecn_required") in findings("vast", nic_ecn_required=True)
    assert not {f for f in findings("vast", nic_ecn_required=True, nic_ecn_priorities=[3]) if f[1] == "ecn-required-alone"}
    assert not {f for f in findings("vast") if f[1] == "ecn-required-alone"}


def test_without_a_container_a_downloaded_model_has_one_consistent_fix():
    """#34's operator audit: with hicache_container_runtime none and a hub download, model-dir-required said "set
    hicache_model_dir" and no-container said "remove it": no inventory satisfied both. The weights now go where the
    server reads them (hicache_model_dir == hicache_model_path), and each fix says so."""
    host, variables = _host_vars("local")
    base = {**variables, "hicache_container_runtime": "none", "hicache_model_source": "hub", "hicache_model_repo": "Qwen/Qwen3-8B",
            "hicache_model_path": "/srv/models/qwen3-8b", "hicache_cache_container_dir": None}
    _, found = rules.check_host(host, {**base, "hicache_model_dir": None})
    fixes = {f.rule: f.fix for f in found if f.level == rules.ERROR}
    assert set(fixes) == {"model-dir-required"} and "set hicache_model_dir to hicache_model_path" in fixes["model-dir-required"], fixes
    _, found = rules.check_host(host, {**base, "hicache_model_dir": "/srv/models/qwen3-8b/"})
    assert not [f for f in found if f.level == rules.ERROR], [f.format() for f in found]
    _, found = rules.check_host(host, {**base, "hicache_model_dir": "/srv/elsewhere"})
    assert [(f.rule, f.variable) for f in found if f.level == rules.ERROR] == [("no-container", "hicache_model_dir")]


# --- what an audit of bad input found (2026-12-06) ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["kernel/../../../root/.ssh/authorized_keys", "/etc/shadow", "net..core", "net.core.", ".net.core",
                                  "net//core"])
def test_a_sysctl_name_that_is_a_path_is_refused(name):
    assert ("sysctl", f"hicache_host_sysctls.{name}") in _errors("local", host_sysctls={name: "1"})


@pytest.mark.parametrize("name", ["net.core.rmem_max", "net/ipv4/conf/ens1f0.100/rp_filter", "net.ipv4.conf.ens1f0/100.rp_filter",
                                  "net.ipv4.conf.*.rp_filter", "kernel.numa_balancing"])
def test_sysctl_names_as_sysctl_d_writes_them_pass(name):
    assert not _errors("local", host_sysctls={name: "1"})


@pytest.mark.parametrize("variable", ["ratio", "mem_fraction_static", "l3_budget_gb"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_not_a_number_and_infinity_are_refused(variable, value):
    assert any(v == f"hicache_{variable}" for _, v in _errors("local", **{variable: value}))


def test_a_secret_of_the_wrong_type_is_not_shown_in_its_error():
    found = [f for f in rules.check_host(*_with("local", {"model_hub_token": 123}))[1]
             if f.variable == "hicache_model_hub_token" and f.rule == "type"]
    assert found and "123" not in found[0].message + found[0].fix, found


@pytest.mark.parametrize("host", ["../../escape", "/tmp/abs", "a/b", "..", "."])
def test_a_host_name_that_is_a_path_is_refused(host):
    from hicachectl.rules import variables

    assert any(f.rule == "host-name" and f.level == "error" for f in variables._check_host_name(host))


def test_the_kernel_values_module_never_writes_outside_proc_sys_for_a_sysctl_name(tmp_path):
    import importlib.util

    from support import ROOT

    spec = importlib.util.spec_from_file_location("kv", ROOT / "plugins/modules/hicache_kernel_values.py")
    kv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kv)
    target = tmp_path / "root/.ssh/authorized_keys"
    target.parent.mkdir(parents=True)
    target.write_text("keep\n")
    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    with pytest.raises(ValueError):
        kv.path_of("kernel/../../../root/.ssh/authorized_keys", str(tmp_path))
    decided = kv.decide({"kernel/../../../root/.ssh/authorized_keys": "x"}, False, str(tmp_path))
    assert not decided["set"] and "is not a sysctl name" in decided["unavailable"]["kernel/../../../root/.ssh/authorized_keys"]
    assert target.read_text() == "keep\n"


@pytest.mark.parametrize("variable", ["cfg_dir", "cache_dir", "base_dir"])
@pytest.mark.parametrize("path", ["/", "/etc", "/usr", "/usr/lib", "/var/lib", "/opt", "/etc/", "/srv/../etc", "/mnt/../usr/lib"])
def test_a_directory_the_toolkit_fills_mounts_or_copies_is_never_the_systems(variable, path):
    assert ("unit-safe-path", f"hicache_{variable}") in _errors("local", **{variable: path})


@pytest.mark.parametrize("path", ["/mnt/nvme/../kv", "/mnt/kv/", "/mnt//kv", "/mnt/./kv"])
def test_the_l3_mount_point_is_written_as_the_kernel_and_systemd_name_it(path):
    assert ("unit-safe-path", "hicache_cache_dir") in _errors("local", cache_dir=path)


@pytest.mark.parametrize("path", ["/mnt/kvcache", "/opt/sglang-hicache/cfg", "/srv/l3", "/root/vastdata", "/data/kv.cache"])
def test_directories_of_the_toolkits_own_pass(path):
    assert not _errors("local", cfg_dir=path, cache_dir=path + "-l3", base_dir=path + "-base")


def test_two_mounts_at_one_path_in_the_container_are_refused():
    assert ("container-mount", "hicache_cache_container_dir") in _errors("vast", cache_container_dir="/cfg")
    assert ("container-mount", "hicache_cache_container_dir") in _errors("vast", cache_container_dir="/cfg/")
    host, variables = _host_vars("vast")
    assert variables["hicache_model_dir"]  # the weights are mounted at hicache_model_path
    assert ("container-mount", "hicache_cache_container_dir") in _errors("vast", cache_container_dir=variables["hicache_model_path"])
    assert not {f for f in _errors("vast") if f[0] == "container-mount"}


@pytest.mark.parametrize("name", ["docker", "ssh", "containerd", "systemd-journald", "hicache-nic-tuning", "hicache-l3-collector",
                                  "nfs-server", "getty"])
def test_the_servers_unit_never_takes_the_name_of_another(name):
    assert ("unit-name", "hicache_service_name") in _errors("local", service_name=name)


def test_a_unit_name_of_its_own_passes():
    assert not _errors("local", service_name="sglang-hicache-b")


@pytest.mark.parametrize("extra", [{"d": __import__("datetime").date(2024, 1, 1)}, {"b": b"hello"}, {1: "x"},
                                   {"plugin": {"POSIX": {"n": float("nan")}}}, {"l": [{"when": __import__("datetime").date(2024, 1, 1)}]}])
def test_an_extra_config_value_json_cannot_hold_is_refused(extra):
    assert ("extra-config-type", "hicache_extra_config") in _errors("local", extra_config=extra)
    assert ("extra-config-type", "hicache_extra_config") in _errors("local", extra_config=extra, extra_config_file="nixl.toml")


def test_an_unquoted_octal_mode_gets_the_fix_written_as_it_was():
    host, variables = _with("local", {"cache_mode": 0o755})  # YAML's reading of `hicache_cache_mode: 0755`
    found = [f for f in rules.check_host(host, variables)[1] if f.variable == "hicache_cache_mode"]
    assert found and "'0755'" in found[0].fix and "493" not in found[0].fix, [f.format() for f in found]


@pytest.mark.parametrize("args", [["-e", "HF_TOKEN=hf_abcdefghijkl"], ["--env", "API_KEY=x1234"], ["--env=DB_PASSWORD=hunter22"],
                                  ["-eHF_TOKEN=hf_abcdefghijkl"], ["-e=HF_TOKEN=hf_abc"], ["-ie", "HF_TOKEN=hf_abc"],
                                  ["-tieHF_TOKEN=hf_abc"]])
def test_a_secret_set_through_the_containers_extra_args_is_warned(args):
    found = findings("vast", container_extra_args=args)
    assert ("warning", "secret-not-marked", "hicache_container_extra_args") in found, found


@pytest.mark.parametrize("args", [["-e", "NCCL_DEBUG=INFO"], ["-v", "/x:/secret-key"], ["--shm-size", "TOKEN=1"], ["-m", "KEY=1"]])
def test_a_plain_environment_value_in_extra_args_is_not_warned(args):
    assert not {f for f in findings("vast", container_extra_args=args) if f[1] == "secret-not-marked"}


@pytest.mark.parametrize("path", ["//", "//etc", "///usr", "/etc/ssh", "/etc/systemd/system", "/root/.ssh", "/proc/sys", "/sys/kernel",
                                  "/lib/x86_64-linux-gnu", "/var/spool", "/usr/local/bin", "/usr/lib/x", "/var/lib/docker/volumes",
                                  "/boot/efi", "/dev/sda", "/run/hicache"])
def test_what_the_system_owns_is_refused_however_it_is_written(path):
    assert ("unit-safe-path", "hicache_cfg_dir") in _errors("local", cfg_dir=path)


@pytest.mark.parametrize("path", ["/data/kv", "/scratch/l3", "/mnt/vast", "/home/user/x", "/dev/shm/kv", "/usr/local/sglang/cfg",
                                  "/etc/sglang-hicache", "/var/lib/hicache/cfg"])
def test_a_sites_own_directories_pass(path):
    assert not _errors("local", cfg_dir=path)


@pytest.mark.parametrize("inside", ["//cfg", "/cfg/.", "/x/../cfg"])
def test_a_container_path_equal_once_cleaned_is_still_one_mount(inside):
    assert ("container-mount", "hicache_cache_container_dir") in _errors("vast", cache_container_dir=inside)
