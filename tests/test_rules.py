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


def test_the_seeds_json_boolean_for_nixl_warns():
    assert ("warning", "nixl-bool-text", "hicache_extra_config.use_uring") in findings("vast")
    assert not any(f[1] == "nixl-bool-text" for f in findings("vast", extra_config={"use_direct_io": True, "use_uring": "true"}))


def test_uring_under_docker_warns_about_seccomp_until_a_profile_is_set():
    assert ("warning", "uring-seccomp", "hicache_container_seccomp") in findings("vast")
    assert not any(f[1] == "uring-seccomp" for f in findings("vast", container_seccomp="/etc/hicache/seccomp-uring.json"))
    assert not any(f[1] == "uring-seccomp" for f in findings("vast", extra_config={"use_direct_io": True, "use_posix_aio": "true"}))


def test_the_seccomp_profile_reaches_docker_run():
    from helpers import deployment

    from hicachectl import launch

    argv = launch.container_argv(deployment("vast", container_seccomp="unconfined"))
    assert argv[argv.index("--security-opt") + 1] == "seccomp=unconfined"


# --- domains (issue 11) ------------------------------------------------------------------------------

def _errors(name: str, **overrides):
    return {(f.rule, f.variable) for f in rules.check_host(*_with(name, overrides))[1] if f.level == rules.ERROR}


def _with(name: str, overrides: dict):
    host, variables = _host_vars(name)
    return host, {**variables, **{f"hicache_{k}": v for k, v in overrides.items()}}


def test_every_variable_has_a_domain_a_type_that_says_it_all_or_choices():
    from hicachectl import schema

    assert [v.name for v in schema.VARIABLES if v.type != "bool" and not v.choices and v.domain is None] == []


@pytest.mark.parametrize("var", [v for v in __import__("hicachectl.schema").schema.VARIABLES if v.domain is not None], ids=lambda v: v.name)
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
    from hicachectl import schema

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
    assert len(found) >= 2000 and len(groups) == len({f.key() for f in found}) <= 3
    first, hosts = groups[0]
    assert len(hosts) == 1000
    line = first.format("vast", hosts)
    assert "1000 hosts b200-[0001:1000]" in line and len(line) < 600
    assert first.format("vast") == first.format("vast", [first.host])  # one host: as before
