"""`hicachectl validate` refuses bad inventories with a precise message, and contacts no host."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys

import pytest
import yaml
from support import ROOT, cli, cli_json

VALID = yaml.safe_load((ROOT / "inventories/vast/group_vars/all.yml").read_text())
ADP = yaml.safe_load((ROOT / "inventories/adp/group_vars/all.yml").read_text())
NETAPP = yaml.safe_load((ROOT / "inventories/netapp/group_vars/all.yml").read_text())
GDS_MT_MANY = {"plugin": {"gds_mt": {"thread_count": "many", "active": True}}}


def make_inventory(tmp: pathlib.Path, group_vars: dict, host_vars: dict | None = None, port: int = 22) -> pathlib.Path:
    """A two-host inventory; the hosts point at 127.0.0.1:<port> so any contact would be seen."""
    (tmp / "group_vars").mkdir(parents=True)
    (tmp / "host_vars").mkdir()
    hosts = {h: {"ansible_host": "127.0.0.1", "ansible_port": port, "ansible_user": "root"} for h in ("gpu-a", "gpu-b")}
    (tmp / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"hicache_servers": {"hosts": hosts}}}}))
    (tmp / "group_vars/all.yml").write_text(yaml.safe_dump(group_vars))
    for host, values in (host_vars or {}).items():
        (tmp / "host_vars" / f"{host}.yml").write_text(yaml.safe_dump(values))
    return tmp


def without(*names):
    return {k: v for k, v in VALID.items() if k not in names}


# (case, group_vars, host_vars for gpu-b, expected rule, expected variable, expected host)
CASES = [
    ("served name with colon", {**VALID, "hicache_served_model_name": "llama:4"}, None, "served-name-colon", "hicache_served_model_name", "gpu-a"),
    ("chunk not a page multiple", {**VALID, "hicache_chunked_prefill_size": 10000}, None, "chunked-prefill-page", "hicache_chunked_prefill_size", "gpu-a"),
    ("buffer_only without L3", {**without("hicache_storage_backend", "hicache_nixl_plugin", "hicache_extra_config")}, None, "buffer-only-needs-storage", "hicache_host_memory_mode", "gpu-a"),
    ("buffer_only with write_back", {**VALID, "hicache_write_policy": "write_back"}, None, "buffer-only-write-back", "hicache_write_policy", "gpu-a"),
    ("page_first with direct io", {**VALID, "hicache_mem_layout": "page_first"}, None, "io-layout-pair", "hicache_mem_layout", "gpu-a"),
    ("page_first_direct with kernel io", {**VALID, "hicache_io_backend": "kernel"}, None, "io-layout-pair", "hicache_mem_layout", "gpu-a"),
    ("NIXL boolean word", {**VALID, "hicache_extra_config": {"use_direct_io": True, "use_uring": "maybe"}}, None, "nixl-param-type", "hicache_extra_config.use_uring", "gpu-a"),
    ("NIXL l3 cleaner as text", {**VALID, "hicache_extra_config": {"use_uring": "true", "l3_cleaner_enabled": "false"}}, None, "nixl-param-type", "hicache_extra_config.l3_cleaner_enabled", "gpu-a"),
    ("GDS_MT thread count", {**VALID, "hicache_nixl_plugin": None, "hicache_extra_config": GDS_MT_MANY}, None, "nixl-param-type", "hicache_extra_config.plugin.gds_mt.thread_count", "gpu-a"),
    ("no active NIXL plugin", {**VALID, "hicache_nixl_plugin": None, "hicache_extra_config": {"plugin": {"posix": {"use_uring": "true"}}}}, None, "nixl-plugin-section", "hicache_extra_config.plugin", "gpu-a"),
    ("extra-config key typed wrong", {**VALID, "hicache_extra_config": {"use_uring": "true", "prefetch_threshold": "256"}}, None, "extra-config-type", "hicache_extra_config.prefetch_threshold", "gpu-a"),
    ("pNFS with nconnect", {**VALID, "hicache_storage_type": "netapp", "hicache_storage_remoteports": None, "hicache_storage_localports": []}, None, "pnfs-nconnect", "hicache_storage_nconnect", "gpu-a"),
    ("ADP with pipeline parallel", ADP | {"hicache_pp_size": 2}, None, "xkv-limits", "hicache_pp_size", "gpu-a"),
    ("dynamic backend without class", ADP | {"hicache_extra_config": {"backend_name": "xkv", "module_path": "xkv_sglang_hicache"}}, None, "dynamic-backend", "hicache_extra_config.class_name", "gpu-a"),
    ("host pool over RAM on one host", VALID, {"hicache_host_ram_gb": 1024}, "host-pool-ram", "hicache_size_gb", "gpu-b"),
    ("boolean as a string", {**VALID, "hicache_skip_server_warmup": "true"}, None, "type", "hicache_skip_server_warmup", "gpu-a"),
    ("misspelt variable", {**VALID, "hicache_page_sise": 64}, None, "unknown-variable", "hicache_page_sise", "gpu-a"),
    ("pasted non-breaking space", {**VALID, "hicache_served_model_name": "llama4\u00a0maverick"}, None, "pasted-character", "hicache_served_model_name", "gpu-a"),
    ("unpinned image", {**VALID, "hicache_image": "lmsysorg/sglang:latest"}, None, "image-pinned", "hicache_image", "gpu-a"),
    ("flag newer than the image", {**VALID, "hicache_host_memory_fraction": 0.5}, None, "sglang-version", "hicache_host_memory_fraction", "gpu-a"),
    ("radix cache disabled", {**VALID, "hicache_extra_args": ["--disable-radix-cache"]}, None, "incompatible-flag", "hicache_extra_args[0]", "gpu-a"),
    ("managed flag in extra args", {**VALID, "hicache_extra_args": ["--page-size", "64"]}, None, "managed-flag", "hicache_extra_args[0]", "gpu-a"),
    ("bad layout name", {**VALID, "hicache_mem_layout": "page_frist"}, None, "choice", "hicache_mem_layout", "gpu-a"),
    ("missing model path", without("hicache_model_path"), None, "required", "hicache_model_path", "gpu-a"),
    ("nixl without a cache dir", without("hicache_cache_dir", "hicache_cache_container_dir"), None, "cache-dir-required", "hicache_cache_dir", "gpu-a"),
    ("remoteports garbage", {**VALID, "hicache_storage_remoteports": "10.0.0.9-10.0.0.1"}, None, "remoteports-syntax", "hicache_storage_remoteports", "gpu-a"),
    ("PFC priority out of range", {**VALID, "hicache_nic_pfc_priorities": [3, 9]}, None, "range", "hicache_nic_pfc_priorities", "gpu-a"),
    ("MaxReadReq not a PCIe size", {**VALID, "hicache_nic_max_read_request": 3000}, None, "range", "hicache_nic_max_read_request", "gpu-a"),
    ("toml extension unknown", NETAPP | {"hicache_extra_config_file": "nixl.ini"}, None, "extra-config-file", "hicache_extra_config_file", "gpu-a"),
]


@pytest.mark.parametrize("case,group_vars,host_vars,rule,variable,host", CASES, ids=[c[0] for c in CASES])
def test_invalid_inventory_is_refused_with_a_precise_message(tmp_path, case, group_vars, host_vars, rule, variable, host):
    inventory = make_inventory(tmp_path, group_vars, {"gpu-b": host_vars} if host_vars else None)
    report = cli_json("validate", "--inventory", str(inventory), check_rc=1)
    assert report["ok"] is False
    matches = [f for f in report["findings"] if f["rule"] == rule and f["variable"] == variable and f["host"] == host and f["level"] == "error"]
    assert matches, report["findings"]
    assert matches[0]["fix"], "every error says how to fix it"
    text = cli("validate", "--inventory", str(inventory), check_rc=1).stderr
    assert f"[{rule}]" in text and f"host {host}" in text and variable in text and "Fix:" in text and str(inventory) in text


def test_the_cases_are_distinct():
    assert len({(c[3], c[4]) for c in CASES}) >= 15


def test_shipped_inventories_are_valid():
    for name in ("vast", "netapp", "adp", "local"):
        assert cli_json("validate", "--inventory", name)["ok"] is True


def test_validate_usage_errors_exit_2():
    assert cli("validate", "--inventory", "no-such-inventory").returncode == 2
    assert cli("validate").returncode == 2


@pytest.fixture
def listener():
    """A TCP port on 127.0.0.1 that counts connections: the inventory's hosts point at it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.5)
    yield server

    server.close()


def _connections(server) -> int:
    count = 0
    while True:
        try:
            conn, _ = server.accept()
        except TimeoutError:
            return count
        conn.close()
        count += 1


def test_no_host_is_contacted_when_the_inventory_is_invalid(tmp_path, listener):
    port = listener.getsockname()[1]
    inventory = make_inventory(tmp_path, {**VALID, "hicache_chunked_prefill_size": 1000}, port=port)
    assert cli("validate", "--inventory", str(inventory)).returncode == 1
    plan = cli("plan", "--inventory", str(inventory))
    assert plan.returncode == 1 and "no host was contacted" in plan.stderr
    # Plain Ansible too: the validation play runs on the controller and stops every host.
    playbook = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(inventory),
                               "playbooks/site.yml"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert playbook.returncode != 0
    assert "chunked-prefill-page" in playbook.stdout
    assert _connections(listener) == 0


def test_the_listener_does_see_a_contact(tmp_path, listener):
    """The contact check above can fail: a valid inventory's deploy does reach the hosts."""
    port = listener.getsockname()[1]
    inventory = make_inventory(tmp_path, VALID, port=port)
    subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(inventory),
                    "playbooks/site.yml", "-e", "ansible_ssh_timeout=2"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert _connections(listener) > 0
