"""`hicachectl validate` refuses bad inventories with a precise message, and contacts no host."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest
import yaml
from helpers import filled_in, profile_vars
from support import ROOT, cli, cli_json

VALID = filled_in(profile_vars("vast"))
ADP = yaml.safe_load((ROOT / "inventories/adp/group_vars/all.yml").read_text())
NETAPP = yaml.safe_load((ROOT / "inventories/netapp/group_vars/all.yml").read_text())
GDS_MT_MANY = {"plugin": {"gds_mt": {"thread_count": "many", "active": True}}}


def make_inventory(tmp: pathlib.Path, group_vars: dict, host_vars: dict | None = None, port: int = 22) -> pathlib.Path:
    """A two-host inventory; the hosts point at 127.0.0.1:<port> and 127.0.0.2:<port> (two machines, as the fleet
    rule wants) so any contact would be seen."""
    (tmp / "group_vars").mkdir(parents=True)
    (tmp / "host_vars").mkdir()
    hosts = {h: {"ansible_host": address, "ansible_port": port, "ansible_user": "root"} for h, address in (("gpu-a", "127.0.0.1"), ("gpu-b", "127.0.0.2"))}
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
    # ONTAP: pNFS with nconnect or with session trunking, not both (pnfs/pnfs-plan-concept.adoc).
    ("pNFS with nconnect and trunking", {**VALID, "hicache_storage_type": "netapp", "hicache_storage_remoteports": None, "hicache_storage_localports": [],
                                         "hicache_storage_options": ["max_connect=4"]}, None, "pnfs-nconnect-trunking", "hicache_storage_nconnect", "gpu-a"),
    ("ADP with pipeline parallel", ADP | {"hicache_pp_size": 2}, None, "xkv-limits", "hicache_pp_size", "gpu-a"),
    ("dynamic backend without class", ADP | {"hicache_extra_config": {"backend_name": "xkv", "module_path": "xkv_sglang_hicache"}}, None, "dynamic-backend", "hicache_extra_config.class_name", "gpu-a"),
    ("host pool over RAM on one host", VALID, {"hicache_host_ram_gb": 1024}, "host-pool-ram", "hicache_size_gb", "gpu-b"),
    # SGLang's L3 keys (#23): what the CLI says for each, with host, variable and fix, not only what the rule finds
    ("nixl with pipeline parallel", {**VALID, "hicache_pp_size": 2}, None, "nixl-rank-keys", "hicache_pp_size", "gpu-a"),
    ("nixl with context parallel on one host", VALID, {"hicache_attn_cp_size": 2}, "nixl-rank-keys", "hicache_attn_cp_size", "gpu-b"),
    ("two nixl io queues on one host", VALID, {"hicache_extra_config": {**VALID["hicache_extra_config"], "use_posix_aio": True}},
     "nixl-io-queue", "hicache_extra_config.use_posix_aio", "gpu-b"),
    ("a backend's own variable in the container env", VALID, {"hicache_container_env": {"SGLANG_HICACHE_NIXL_BACKEND_STORAGE_DIR": "/elsewhere"}},
     "backend-env", "hicache_container_env.SGLANG_HICACHE_NIXL_BACKEND_STORAGE_DIR", "gpu-b"),
    ("namespace that reads as a nixl bucket", {**VALID, "hicache_l3_namespace": "ab"}, None, "l3-namespace-bucket", "hicache_l3_namespace", "gpu-a"),
    ("nixl cleaner watermarks out of order", {**VALID, "hicache_extra_config": {**VALID["hicache_extra_config"], "l3_cleaner_high_watermark": 70,
                                                                               "l3_cleaner_low_watermark": 80}},
     None, "nixl-cleaner", "hicache_extra_config.l3_cleaner_low_watermark", "gpu-a"),
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
    ("PFC priority out of range", {**VALID, "hicache_nic_pfc_priorities": [3, 9]}, None, "range", "hicache_nic_pfc_priorities[1]", "gpu-a"),
    ("MaxReadReq not a PCIe size", {**VALID, "hicache_nic_max_read_request": 3000}, None, "choice", "hicache_nic_max_read_request", "gpu-a"),
    ("toml extension unknown", NETAPP | {"hicache_extra_config_file": "nixl.ini"}, None, "extra-config-file", "hicache_extra_config_file", "gpu-a"),
    # Every value has a domain, and nothing injects into a line-oriented file (issue 11). The file each reaches:
    # the systemd unit
    ("newline in the served name", {**VALID, "hicache_served_model_name": "m\nExecStartPre=/bin/touch /tmp/pwned"}, None, "control-character", "hicache_served_model_name", "gpu-a"),
    ("newline in the container name", VALID, {"hicache_container_name": "c\nExecStartPre=/bin/id"}, "control-character", "hicache_container_name", "gpu-b"),
    ("container name Docker refuses", {**VALID, "hicache_container_name": "-sglang hicache"}, None, "container-name", "hicache_container_name", "gpu-a"),
    ("service name systemd refuses", {**VALID, "hicache_service_name": "-sglang/../x"}, None, "unit-name", "hicache_service_name", "gpu-a"),
    ("newline in the service name", {**VALID, "hicache_service_name": "sglang\nhicache"}, None, "control-character", "hicache_service_name", "gpu-a"),
    ("carriage return in the model path", {**without("hicache_model_dir"), "hicache_model_path": "org/model\rExecStart=/bin/sh"}, None, "control-character", "hicache_model_path", "gpu-a"),
    ("empty model path", {**VALID, "hicache_model_path": ""}, None, "non-empty", "hicache_model_path", "gpu-a"),
    ("TP larger than the container's GPUs", {**VALID, "hicache_container_gpus": '"device=0,1,2,3"'}, None, "tp-gpus", "hicache_tp_size", "gpu-a"),
    ("unquoted GPU device list", {**VALID, "hicache_container_gpus": "device=0,1"}, None, "container-gpus", "hicache_container_gpus", "gpu-a"),
    ("server port out of range", {**VALID, "hicache_port": 70000}, None, "range", "hicache_port", "gpu-a"),
    ("malformed image reference", {**VALID, "hicache_image": "lmsysorg/sglang v0.5.20"}, None, "image-reference", "hicache_image", "gpu-a"),
    ("newline in a flag value", {**VALID, "hicache_extra_args": ["--log-level", "info\n--enable-lmcache"]}, None, "control-character", "hicache_extra_args[1]", "gpu-a"),
    ("ulimit name misspelt", {**VALID, "hicache_container_ulimits": {"memlok": -1}}, None, "ulimit", "hicache_container_ulimits.memlok", "gpu-a"),
    # the drop-in and limits.conf
    ("memlock misspelt", {**VALID, "hicache_limits_memlock": "unlimted"}, None, "memlock", "hicache_limits_memlock", "gpu-a"),
    ("runtime service without .service", {**VALID, "hicache_limits_runtime_service": "docker"}, None, "unit-name", "hicache_limits_runtime_service", "gpu-a"),
    # the environment (docker -e, the env file)
    ("env name with a dash", {**VALID, "hicache_container_env": {"MY-VAR": "1"}}, None, "env-name", "hicache_container_env.MY-VAR", "gpu-a"),
    ("newline in an env value", {**VALID, "hicache_container_env": {"NCCL_DEBUG": "INFO\nLD_PRELOAD=/tmp/x.so"}}, None, "control-character", "hicache_container_env.NCCL_DEBUG", "gpu-a"),
    ("newline in an extra-config leaf", {**VALID, "hicache_extra_config": {**VALID["hicache_extra_config"], "use_aio": "false\n"}}, None, "control-character", "hicache_extra_config.use_aio", "gpu-a"),
    # fstab
    ("NFS export with a space", {**VALID, "hicache_storage_export": "/kv cache"}, None, "fstab-field", "hicache_storage_export", "gpu-a"),
    ("mount option with a comma", {**VALID, "hicache_storage_options": ["noatime,exec"]}, None, "mount-option", "hicache_storage_options[0]", "gpu-a"),
    ("IPv6 NFS server without brackets", {**VALID, "hicache_storage_server": "fd00::1"}, None, "address", "hicache_storage_server", "gpu-a"),
    ("cache dir with a space", {**VALID, "hicache_cache_dir": "/mnt/kv cache"}, None, "unit-safe-path", "hicache_cache_dir", "gpu-a"),
    # modprobe.d, nfs.conf
    ("sunrpc slots below the kernel's minimum", {**VALID, "hicache_storage_sunrpc_slots": 1}, None, "range", "hicache_storage_sunrpc_slots", "gpu-a"),
    ("negative NFS read-ahead", {**VALID, "hicache_storage_read_ahead_kb": -8}, None, "range", "hicache_storage_read_ahead_kb", "gpu-a"),
    # sysctl.d
    ("sysctl name with a space", {**VALID, "hicache_host_sysctls": {"vm.max map count": 1048576}}, None, "sysctl", "hicache_host_sysctls.vm.max map count", "gpu-a"),
    ("newline in a sysctl value", {**VALID, "hicache_host_sysctls": {"net.core.rmem_max": "1\nkernel.sysrq = 1"}}, None, "control-character", "hicache_host_sysctls.net.core.rmem_max", "gpu-a"),
    # the NIC tuning config, the cache directory, the model download
    ("interface name too long", {**VALID, "hicache_nic_interfaces": ["enp1s0f0np0-vlan100"]}, None, "interface-name", "hicache_nic_interfaces[0]", "gpu-a"),
    ("cache mode not octal", {**VALID, "hicache_cache_mode": "rwxr-xr-x"}, None, "file-mode", "hicache_cache_mode", "gpu-a"),
    ("hub repo with a space", {**VALID, "hicache_model_source": "hub", "hicache_model_repo": "Qwen/Qwen3 8B"}, None, "model-repo", "hicache_model_repo", "gpu-a"),
    ("shared tier, namespace off, two KV dtypes", {**VALID, "hicache_l3_share": "vast-a"}, {"hicache_kv_cache_dtype": "fp8_e4m3"},
     "l3-shared-format", "hicache_l3_namespace", "gpu-b"),
    ("a key_namespace beside the L3 namespace", {**ADP, "hicache_l3_namespace": "auto", "hicache_extra_config": {**ADP["hicache_extra_config"], "key_namespace": "x"}},
     None, "l3-namespace", "hicache_extra_config.key_namespace", "gpu-a"),
    ("TP size again under SGLang's alias", {**VALID, "hicache_extra_args": ["--tensor-parallel-size", "4"]}, None, "managed-flag", "hicache_extra_args[0]", "gpu-a"),
    ("TP size again as an abbreviation argparse expands", {**VALID, "hicache_extra_args": ["--tp=4"]}, None, "managed-flag", "hicache_extra_args[0]", "gpu-a"),
    ("KV dtype in extra args", {**VALID, "hicache_extra_args": ["--kv-cache-dtype", "fp8_e4m3"]}, None, "managed-flag", "hicache_extra_args[0]", "gpu-a"),
    ("an L3 namespace with a slash", {**VALID, "hicache_l3_namespace": "../other"}, None, "l3-namespace", "hicache_l3_namespace", "gpu-a"),
    # null only where it leaves the setting alone (or means "not set"): elsewhere the role's argument validation refuses it
    ("null MTU", VALID, {"hicache_nic_mtu": None}, "null", "hicache_nic_mtu", "gpu-b"),
    ("null PFC priorities", {**VALID, "hicache_nic_pfc_priorities": None}, None, "null", "hicache_nic_pfc_priorities", "gpu-a"),
]


@pytest.mark.parametrize("case,group_vars,host_vars,rule,variable,host", CASES, ids=[c[0] for c in CASES])
def test_invalid_inventory_is_refused_with_a_precise_message(tmp_path, case, group_vars, host_vars, rule, variable, host):
    """The CLI's own command, run in this process (an interpreter start per case would keep the fast tier over a
    minute); test_an_invalid_inventory_through_the_real_entry_point runs the installed entry point."""
    inventory = make_inventory(tmp_path, group_vars, {"gpu-b": host_vars} if host_vars else None)
    as_json = validate_here(inventory, "--json")
    assert as_json.exit_code == 1, as_json.output
    report = json.loads(as_json.stdout)
    assert report["ok"] is False
    matches = [f for f in report["findings"] if f["rule"] == rule and f["variable"] == variable and f["host"] == host and f["level"] == "error"]
    assert matches, report["findings"]
    assert matches[0]["fix"], "every error says how to fix it"
    as_text = validate_here(inventory)
    assert as_text.exit_code == 1
    text = as_text.stderr
    assert f"[{rule}]" in text and host in text and variable in text and "Fix:" in text and str(inventory) in text


def validate_here(inventory: pathlib.Path, *args: str):
    from typer.testing import CliRunner

    from hicachectl.cli import main as hicachectl_cli

    result = CliRunner().invoke(hicachectl_cli.app, ["validate", "--inventory", str(inventory), *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    return result


def test_an_invalid_inventory_through_the_real_entry_point(tmp_path):
    inventory = make_inventory(tmp_path, {**VALID, "hicache_served_model_name": "m\nExecStartPre=/bin/id"})
    proc = cli("validate", "--inventory", str(inventory), check_rc=1)
    assert "[control-character]" in proc.stderr and "hicache_served_model_name" in proc.stderr and "Fix:" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert cli_json("validate", "--inventory", str(inventory), check_rc=1)["ok"] is False


def test_the_summary_counts_findings_as_they_are_printed(tmp_path):
    """#34: one finding on both hosts is one printed line, and one error in the summary (it said 2)."""
    inventory = make_inventory(tmp_path, {**VALID, "hicache_served_model_name": "m\nExecStartPre=/bin/id"})
    proc = cli("validate", "--inventory", str(inventory), check_rc=1)
    printed = [line for line in proc.stderr.splitlines() if "[control-character]" in line]
    assert len(printed) == 1 and "gpu-a" in printed[0] and "gpu-b" in printed[0], proc.stderr
    assert ", 1 error(s), 0 warning(s): invalid" in proc.stdout, proc.stdout


def test_the_cases_are_distinct():
    assert len(CASES) >= 40
    assert len({(c[3], c[4]) for c in CASES}) >= 40


def test_shipped_inventories_are_valid_but_for_the_placeholders_an_operator_fills_in():
    for name in ("adp", "local"):
        assert cli_json("validate", "--inventory", name)["ok"] is True
    for name in ("vast", "netapp"):
        report = cli_json("validate", "--inventory", name, check_rc=1)
        assert {f["rule"] for f in report["findings"] if f["level"] == "error"} == {"placeholder"}, report["findings"]


def test_the_nulls_that_leave_a_setting_alone_are_valid(tmp_path):
    """hicache_nic_rings: null and the others whose description says None leaves it (tests/test_nullable.py: the role's
    own argument validation takes them as well)."""
    nulls = dict.fromkeys(("hicache_nic_rings", "hicache_nic_qos_trust", "hicache_nic_cpu_governor", "hicache_nic_roce_dscp",
                           "hicache_nic_max_read_request", "hicache_nic_channels", "hicache_storage_sunrpc_slots"))
    result = validate_here(make_inventory(tmp_path, {**VALID, **nulls}), "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["ok"] is True, result.output


def test_validate_usage_errors_exit_2():
    assert cli("validate", "--inventory", "no-such-inventory").returncode == 2
    assert cli("validate").returncode == 2


@pytest.fixture
def listener():
    """A TCP port on 127.0.0.1 and 127.0.0.2 that counts connections: the inventory's hosts point at it."""
    first = socket.socket()
    first.bind(("127.0.0.1", 0))
    second = socket.socket()
    second.bind(("127.0.0.2", first.getsockname()[1]))
    for server in (first, second):
        server.listen(16)
        server.settimeout(0.5)
    yield first, second

    first.close()
    second.close()


def _connections(servers) -> int:
    count = 0
    for server in servers:
        while True:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                break
            conn.close()
            count += 1
    return count


def test_no_host_is_contacted_when_the_inventory_is_invalid(tmp_path, listener):
    port = listener[0].getsockname()[1]
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
    port = listener[0].getsockname()[1]
    inventory = make_inventory(tmp_path, VALID, port=port)
    subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(inventory),
                    "playbooks/site.yml", "-e", "ansible_ssh_timeout=2"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert _connections(listener) > 0


def test_with_routers_every_server_must_serve_metrics_the_drain_reads(tmp_path):
    inventory = make_inventory(tmp_path, {**VALID, "hicache_enable_metrics": False, "hicache_host": "0.0.0.0"})
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    assert validate_here(inventory).exit_code == 0  # no router: metrics are the user's choice
    hosts["all"]["children"]["hicache_routers"] = {"hosts": {"router-1": {"ansible_host": "127.0.0.3", "ansible_user": "root"}}}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    result = validate_here(inventory, "--json")
    assert result.exit_code == 1
    found = [(f["host"], f["rule"]) for f in json.loads(result.stdout)["findings"] if f["level"] == "error"]
    assert found == [("gpu-a", "router-drain-metrics"), ("gpu-b", "router-drain-metrics")]


def test_with_routers_a_server_on_loopback_needs_a_worker_url_the_routers_reach(tmp_path):
    inventory = make_inventory(tmp_path, {**VALID, "hicache_host": "127.0.0.1"}, {"gpu-b": {"hicache_worker_url": "http://127.0.0.2:30000"}})
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    hosts["all"]["children"]["hicache_routers"] = {"hosts": {"router-1": {"ansible_host": "127.0.0.3", "ansible_user": "root"}}}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    result = validate_here(inventory, "--json")
    assert result.exit_code == 1
    assert [(f["host"], f["rule"]) for f in json.loads(result.stdout)["findings"] if f["level"] == "error"] == [("gpu-a", "router-reach")]


def _with_routers(inventory: pathlib.Path, routers: dict, **server_changes: dict) -> None:
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    for host, changes in server_changes.items():
        hosts["all"]["children"]["hicache_servers"]["hosts"][host.replace("_", "-")].update(changes)
    hosts["all"]["children"]["hicache_routers"] = {"hosts": routers}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))


def _errors(inventory: pathlib.Path) -> list[tuple[str, str, str]]:
    result = validate_here(inventory, "--json")
    found = [(f["host"], f["variable"], f["rule"]) for f in json.loads(result.stdout)["findings"] if f["level"] == "error"]
    assert (result.exit_code == 1) == bool(found), result.stdout
    return found


def test_with_routers_two_servers_behind_one_address_and_port_are_refused(tmp_path):
    """Two machines behind one address (a NAT, containers: SSH on two ports) whose servers both listen on 30000 are one
    worker URL: the router lists one worker and sends every request to it. Validated clean before (#34's audit)."""
    inventory = make_inventory(tmp_path, {**VALID, "hicache_host": "0.0.0.0"})
    _with_routers(inventory, {"router-1": {"ansible_host": "127.0.0.3", "ansible_user": "root"}},
                  gpu_b={"ansible_host": "127.0.0.1", "ansible_port": 2222})
    assert _errors(inventory) == [("gpu-a", "hicache_worker_url", "worker-url-shared"), ("gpu-b", "hicache_worker_url", "worker-url-shared")]
    inventory = make_inventory(tmp_path / "own-port", {**VALID, "hicache_host": "0.0.0.0"}, {"gpu-b": {"hicache_port": 30001}})
    _with_routers(inventory, {"router-1": {"ansible_host": "127.0.0.3", "ansible_user": "root"}},
                  gpu_b={"ansible_host": "127.0.0.1", "ansible_port": 2222})
    assert _errors(inventory) == []  # a port of its own: two workers


def test_with_routers_a_worker_url_on_loopback_is_refused_where_a_router_is_elsewhere(tmp_path):
    """hicache_worker_url on loopback reaches only a router on the server's own machine; one reached at another
    address cannot reach it. It skipped the router-reach rule before (#34's audit)."""
    inventory = make_inventory(tmp_path, {**VALID, "hicache_host": "0.0.0.0"}, {"gpu-b": {"hicache_worker_url": "http://127.0.0.1:30000"}})
    _with_routers(inventory, {"router-1": {"ansible_host": "10.20.30.40", "ansible_user": "root"}},
                  gpu_a={"ansible_host": "10.20.30.41"}, gpu_b={"ansible_host": "10.20.30.42"})
    assert _errors(inventory) == [("gpu-b", "hicache_worker_url", "router-reach")]
    inventory = make_inventory(tmp_path / "reachable", {**VALID, "hicache_host": "0.0.0.0"}, {"gpu-b": {"hicache_worker_url": "http://10.20.30.42:30000"}})
    _with_routers(inventory, {"router-1": {"ansible_host": "10.20.30.40", "ansible_user": "root"}},
                  gpu_a={"ansible_host": "10.20.30.41"}, gpu_b={"ansible_host": "10.20.30.42"})
    assert _errors(inventory) == []


def test_routers_get_the_fleet_checks_too(tmp_path):
    """Two routers on one machine with the same unit and ports would replace each other; a router at a documentation
    address is a placeholder, one at 'a b' no address. Routers skipped the fleet rules before (#34's audit). Two
    routers on one machine, each with its own unit, directory and ports, are fine (helper audit)."""
    inventory = make_inventory(tmp_path, {**VALID, "hicache_host": "0.0.0.0"})
    _with_routers(inventory, {"router-1": {"ansible_host": "10.20.30.40", "ansible_user": "root"},
                              "router-2": {"ansible_host": "10.20.30.40", "ansible_user": "root"},
                              "router-3": {"ansible_host": "192.0.2.7", "ansible_user": "root"},
                              "router-4": {"ansible_host": "a b", "ansible_user": "root"}})
    assert sorted(_errors(inventory)) == [("router-2", "ansible_host", "duplicate-host"), ("router-3", "ansible_host", "documentation-address"),
                                          ("router-4", "ansible_host", "host-address")]
    inventory = make_inventory(tmp_path / "two-units", {**VALID, "hicache_host": "0.0.0.0"},
                               {"router-2": {"hicache_router_service_name": "sglang-router-b", "hicache_router_dir": "/opt/sglang-router-b",
                                             "hicache_router_port": 8100, "hicache_router_prometheus_port": 29100}})
    _with_routers(inventory, {"router-1": {"ansible_host": "10.20.30.40", "ansible_user": "root"},
                              "router-2": {"ansible_host": "10.20.30.40", "ansible_user": "root"}})
    assert _errors(inventory) == []


def test_a_host_in_the_servers_and_the_routers_group_is_refused(tmp_path):
    """It silently ran the router only (every host outside hicache_routers is a server; #34's operator audit). Refused
    by validate and by the collection's own validate play (plain ansible-playbook), before any host is contacted."""
    inventory = make_inventory(tmp_path, {**VALID, "hicache_host": "0.0.0.0"})
    _with_routers(inventory, {"gpu-b": None, "router-1": {"ansible_host": "127.0.0.3", "ansible_user": "root"}})
    assert _errors(inventory) == [("gpu-b", "groups", "server-and-router")]
    played = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(inventory), "playbooks/site.yml"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert played.returncode != 0 and "[server-and-router]" in played.stdout and "gpu-b is in hicache_servers and in hicache_routers" in played.stdout, played.stdout[-3000:]


def test_a_misspelled_variable_is_refused_not_ignored(tmp_path):
    """HICACHE_STRICT, hicache-strict or hicahce_... are read by no role: their values were lost without a word and the
    defaults used (#34's operator audit). Refused by validate and the collection's validate play, naming the variable
    meant; names nothing like ours are left alone."""
    # a helper of the user's own, templated into a catalogue variable, is not a misspelling (helper audit)
    inventory = make_inventory(tmp_path, {**VALID, "HICACHE_STRICT": False, "my_own_setting": 1, "_hicache_base_dir": "/srv/hicache",
                                          "hicache_base_dir": "{{ _hicache_base_dir }}"}, {"gpu-b": {"hicahce_port": 30001}})
    found = sorted(_errors(inventory))
    assert found == [("gpu-a", "HICACHE_STRICT", "variable-name"), ("gpu-b", "HICACHE_STRICT", "variable-name")], found
    report = json.loads(validate_here(inventory, "--json").stdout)
    near = [(f["host"], f["variable"], f["level"]) for f in report["findings"] if f["rule"] == "variable-name" and f["level"] == "warning"]
    assert near == [("gpu-b", "hicahce_port", "warning")], near  # a near miss may be a name of the user's own: a warning
    shown = validate_here(inventory).output
    assert "rename it to hicache_port" in shown and "rename it to hicache_strict" in shown and "my_own_setting" not in shown, shown
    assert "_hicache_base_dir" not in shown, shown
    played = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(inventory), "playbooks/site.yml"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert played.returncode != 0 and "[variable-name]" in played.stdout and "rename it to hicache_strict" in played.stdout, played.stdout[-3000:]


def test_host_vars_of_no_host_are_named(tmp_path):
    """host_vars/<name>.yml of a name the inventory does not hold is read by Ansible for nobody (#34's operator audit:
    a renamed host's settings lost without a word): a warning naming the file; a host's own host_vars are not."""
    # localhost.yml is Ansible's implicit localhost's (the playbooks' controller plays): not an orphan (helper audit)
    inventory = make_inventory(tmp_path, VALID, {"gpu-b": {"hicache_port": 30001}, "gpu-99": {"hicache_port": 30002},
                                                 "localhost": {"ansible_python_interpreter": "/usr/bin/python3"}})
    (inventory / "host_vars/gpu-98").mkdir()
    report = json.loads(validate_here(inventory, "--json").stdout)
    orphans = sorted((f["host"], f["level"], f["rule"]) for f in report["findings"] if f["rule"] == "host-vars-orphan")
    assert orphans == [("gpu-98", "warning", "host-vars-orphan"), ("gpu-99", "warning", "host-vars-orphan")], report["findings"]
    assert any(str(inventory / "host_vars/gpu-99.yml") in f["message"] for f in report["findings"]), report["findings"]


def test_a_server_address_no_worker_url_can_hold_or_an_unspecified_one_is_refused_with_routers(tmp_path):
    """Helper audit of #34's rules: an IPv6 link-local address with its zone (fe80::1%eth0) is a valid ansible_host,
    but no worker URL holds it (the router keeps URLs verbatim): validate passed and the router's deploy failed.
    And a hicache_worker_url at 0.0.0.0 is this machine to a router elsewhere, as loopback is."""
    inventory = make_inventory(tmp_path, {**VALID, "hicache_host": "0.0.0.0"}, {"gpu-b": {"hicache_worker_url": "http://0.0.0.0:30000"}})
    _with_routers(inventory, {"router-1": {"ansible_host": "10.20.30.40", "ansible_user": "root"}},
                  gpu_a={"ansible_host": "fe80::1%eth0"}, gpu_b={"ansible_host": "10.20.30.42"})
    assert sorted(_errors(inventory)) == [("gpu-a", "ansible_host", "router-reach"), ("gpu-b", "hicache_worker_url", "router-reach")]
