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
