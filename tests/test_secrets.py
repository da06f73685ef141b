"""Secrets stay secret: the grep test over every offline command, the 0600 env file, masking, host keys.

An inventory with a hub token and secret container env / extra-config values goes through validate, render
(text, --json, --out); no secret value may appear in any output, nor in any rendered file but the 0600 ones
(secrets.env, an extra config holding a secret). The fleet version (deploy, plan, `ps`) is
tests/fleet/test_fleet_secrets.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import stat
import subprocess

import pytest
import yaml
from helpers import filled_in, profile_vars
from support import ROOT, cli

from hicachectl import rules
from hicachectl.config import secrets
from hicachectl.ops import tunnel
from hicachectl.plans import launch, sglang_server

TOKEN = "hf_TOKENsecretVALUE1234567890"
ENV_SECRET = "p@ss w0rd$HOME=1\\x'q"  # spaces, $, =, a backslash and a quote: verbatim through the env file
OBJ_SECRET = "OBJsecretKEY9876543210"
ADMIN_KEY = "adminKEY'\"$x:5566"  # quotes, $ and : : verbatim through server_secrets.yaml (JSON, read by SGLang as YAML)
SECRET_VALUES = (TOKEN, ENV_SECRET, OBJ_SECRET, ADMIN_KEY)

VAST = filled_in(profile_vars("vast"))
SECRET_VARS = {
    **VAST,
    "hicache_model_hub_token": TOKEN,
    "hicache_container_env": {"SAFETENSORS_FAST_GPU": "1", "AWS_SECRET_ACCESS_KEY": ENV_SECRET},
    "hicache_extra_config": {**VAST["hicache_extra_config"], "secret_key": OBJ_SECRET},
    "hicache_secret_keys": ["AWS_SECRET_ACCESS_KEY", "secret_key"],
    "hicache_admin_api_key": ADMIN_KEY,
}


def make_inventory(tmp: pathlib.Path, group_vars: dict) -> pathlib.Path:
    """Two hosts at 127.0.0.1:9 and 127.0.0.2:9 (discard): any contact would fail loudly."""
    (tmp / "group_vars").mkdir(parents=True)
    hosts = {h: {"ansible_host": address, "ansible_port": 9, "ansible_user": "root"}
             for h, address in (("gpu-a", "127.0.0.1"), ("gpu-b", "127.0.0.2"))}
    (tmp / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"hicache_servers": {"hosts": hosts}}}}))
    (tmp / "group_vars/all.yml").write_text(yaml.safe_dump(group_vars))
    return tmp


def assert_no_secret(text: str, where: str) -> None:
    for value in SECRET_VALUES:
        for form in {value, json.dumps(value)[1:-1], value.replace("'", "'\"'\"'")}:
            assert form not in text, f"{where} shows a secret ({form!r}):\n{text}"


def deployment(variables: dict):
    d, findings = rules.check_host("gpu-a", variables)
    assert d is not None and not rules.has_errors(findings), [f.format() for f in findings]
    return d


@pytest.fixture(scope="module")
def inventory(tmp_path_factory) -> pathlib.Path:
    return make_inventory(tmp_path_factory.mktemp("secrets") / "inv", SECRET_VARS)


def test_validate_shows_no_secret(inventory):
    for args in (("validate", "-i", str(inventory)), ("validate", "-i", str(inventory), "--json")):
        proc = cli(*args, check_rc=0)
        assert_no_secret(proc.stdout + proc.stderr, " ".join(args[:1] + args[3:]))


def test_render_text_and_json_show_no_secret(inventory):
    text = cli("render", "-i", str(inventory), check_rc=0)
    assert_no_secret(text.stdout + text.stderr, "render")
    assert "==> gpu-a/secrets.env <==" in text.stdout and f"AWS_SECRET_ACCESS_KEY={secrets.MASK}" in text.stdout
    proc = cli("render", "-i", str(inventory), "--json", check_rc=0)
    assert_no_secret(proc.stdout + proc.stderr, "render --json")
    host = json.loads(proc.stdout)["hosts"]["gpu-a"]
    assert host["vars"]["hicache_model_hub_token"] == secrets.MASK
    assert host["vars"]["hicache_container_env"]["AWS_SECRET_ACCESS_KEY"] == secrets.MASK
    assert host["vars"]["hicache_extra_config"]["secret_key"] == secrets.MASK
    assert host["secret_env"] == {"AWS_SECRET_ACCESS_KEY": secrets.MASK} and "AWS_SECRET_ACCESS_KEY" not in host["env"]
    assert host["files"]["secrets.env"].splitlines()[-1] == f"AWS_SECRET_ACCESS_KEY={secrets.MASK}"
    assert json.loads(host["files"]["extra_config.json"])["secret_key"] == secrets.MASK


def test_render_out_keeps_secrets_in_0600_files_only(inventory, tmp_path):
    out = tmp_path / "out"
    proc = cli("render", "-i", str(inventory), "--out", str(out), check_rc=0)
    assert_no_secret(proc.stdout + proc.stderr, "render --out")
    cfg = out / "gpu-a"
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in cfg.iterdir()}
    assert modes["secrets.env"] == modes["extra_config.json"] == modes["server_secrets.yaml"] == 0o600
    assert modes["start.sh"] == modes["run.sh"] == modes["serve.sh"] == 0o755
    assert "--config /cfg/server_secrets.yaml" in (cfg / "start.sh").read_text()
    for path in cfg.iterdir():
        if path.name not in ("secrets.env", "extra_config.json", "server_secrets.yaml"):
            assert_no_secret(path.read_text(), str(path))
    assert (cfg / "secrets.env").read_text().splitlines()[-1] == f"AWS_SECRET_ACCESS_KEY={ENV_SECRET}"
    assert json.loads((cfg / "extra_config.json").read_text())["secret_key"] == OBJ_SECRET
    run_sh = (cfg / "run.sh").read_text()
    assert "--env-file /root/vastdata/cfg/secrets.env" in run_sh and "SAFETENSORS_FAST_GPU=1" in run_sh
    assert "@/cfg/extra_config.json" in (cfg / "start.sh").read_text()  # never inline JSON in argv


def test_no_secret_in_any_argv():
    d = deployment(SECRET_VARS)
    for argv in (launch.sglang_argv(d), launch.container_argv(d), launch.container_argv(d, detach=False)):
        assert_no_secret(" ".join(argv), "argv")
    assert launch.container_argv(d)[-3:-2] == ["bash"]  # --env-file goes before the entrypoint and image
    assert ["--env-file", "/root/vastdata/cfg/secrets.env"] in launch.container_run_groups(d)


def test_without_secrets_nothing_changes():
    """The seeds have no secrets: no secrets.env, no --env-file, inline extra config as before."""
    d = deployment(VAST)
    names = [f.name for f in sglang_server.files(d)]
    assert "secrets.env" not in names and "--env-file" not in launch.container_argv(d)
    assert not any(f.secret for f in sglang_server.files(d))


def test_runtime_none_exports_the_secret_env_verbatim(tmp_path):
    """With runtime none serve.sh and run.sh read secrets.env line by line, as `docker run --env-file` does."""
    cfg = tmp_path / "out" / "gpu-a"
    variables = {k: v for k, v in SECRET_VARS.items() if k not in ("hicache_cache_container_dir", "hicache_model_dir")}
    variables.update(hicache_container_runtime="none", hicache_cfg_dir=str(cfg))
    cli("render", "-i", str(make_inventory(tmp_path / "inv", variables)), "--out", str(tmp_path / "out"), check_rc=0)
    assert_no_secret((cfg / "serve.sh").read_text() + (cfg / "run.sh").read_text(), "serve.sh/run.sh")
    (cfg / "start.sh").write_text('#!/usr/bin/env bash\nprintf "%s" "$AWS_SECRET_ACCESS_KEY"\n')
    for script in ("serve.sh", "run.sh"):
        proc = subprocess.run(["bash", str(cfg / script)], capture_output=True, text=True, timeout=30,
                              env={"PATH": os.environ["PATH"], "HOME": "/nonexistent"})
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == ENV_SECRET, script


@pytest.mark.parametrize("value, problem", [("'quoted'", "starts with a quote"), (" padded", "starts with a quote or a space")])
def test_env_file_refuses_values_it_cannot_hold(value, problem):
    variables = {**SECRET_VARS, "hicache_container_env": {"AWS_SECRET_ACCESS_KEY": value}}
    _, findings = rules.check_host("gpu-a", variables)
    found = [f for f in findings if f.rule == "secret-env-file"]
    assert found and problem in found[0].message and rules.has_errors(found)
    assert value not in found[0].format()


def test_a_secret_looking_key_not_marked_is_a_warning():
    variables = {**VAST, "hicache_container_env": {"HF_TOKEN": "abcd1234"}, "hicache_secret_keys": ["HF_TOKN"]}
    _, findings = rules.check_host("gpu-a", variables)
    by_rule = {(f.rule, f.variable): f for f in findings}
    assert by_rule[("secret-not-marked", "hicache_container_env.HF_TOKEN")].level == rules.WARNING
    assert by_rule[("secret-key-unused", "hicache_secret_keys")].level == rules.WARNING
    assert not rules.has_errors(findings)


def test_mask_finds_secrets_in_any_structure_and_form():
    values = secrets.values(SECRET_VARS)
    assert set(values) == set(SECRET_VALUES)
    data = {"diff": f"-  'AWS_SECRET_ACCESS_KEY={ENV_SECRET.replace(chr(39), chr(39) + chr(34) + chr(39) + chr(34) + chr(39))}'",
            "json": json.dumps({"k": ENV_SECRET}), "list": [TOKEN, 1, None, True], OBJ_SECRET: "key"}
    masked = secrets.mask(data, values)
    assert_no_secret(json.dumps(masked), "mask")
    assert masked["list"] == [secrets.MASK, 1, None, True] and secrets.MASK in masked


def _filter_module():
    spec = importlib.util.spec_from_file_location("hicache_filter", ROOT / "plugins/filter/hicache.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_role_fact_carries_masked_text_and_the_secret_file_filter_the_real_one():
    module = _filter_module()
    rendered = module.hicache_files(SECRET_VARS, "gpu-a")
    assert_no_secret(json.dumps(rendered), "hicache_files")
    secret_files = [f["name"] for f in rendered["files"] if f["secret"]]
    assert sorted(secret_files) == ["extra_config.json", "secrets.env", "server_secrets.yaml"]
    assert yaml.safe_load(module.hicache_secret_file(SECRET_VARS, "gpu-a", "server_secrets.yaml")) == {"admin-api-key": ADMIN_KEY}
    assert rendered["absent_secret_files"] == []
    assert module.hicache_files(VAST, "gpu-a")["absent_secret_files"] == ["/root/vastdata/cfg/secrets.env", "/root/vastdata/cfg/server_secrets.yaml"]
    assert ENV_SECRET in module.hicache_secret_file(SECRET_VARS, "gpu-a", "secrets.env")
    with pytest.raises(Exception, match="no file holding secrets"):
        module.hicache_secret_file(SECRET_VARS, "gpu-a", "start.sh")


def test_the_role_never_logs_diffs_or_backs_up_secret_files():
    tasks = yaml.safe_load((ROOT / "roles/sglang_server/tasks/config.yml").read_text())[0]["block"]
    public = next(t for t in tasks if t["name"] == "Install start.sh, run.sh, serve.sh and the backend config")
    secret = next(t for t in tasks if t["name"] == "Install the files holding secrets")
    # The public files (written and diffed in one step) are the core's public_files: never a file holding a secret.
    assert public["hicache.deploy.hicache_files"]["files"] == "{{ __hicache_server_rendered.public_files }}"
    rendered = _filter_module().hicache_files(SECRET_VARS, "gpu-a")
    assert {f["label"] for f in rendered["public_files"]} == {f["name"] for f in rendered["files"] if not f["secret"]}
    assert_no_secret(json.dumps(rendered["public_files"]), "public_files")
    assert "selectattr('secret')" in secret["loop"]
    assert secret["no_log"] is True and secret["diff"] is False and secret["ansible.builtin.copy"]["backup"] is False
    assert "hicache_secret_file" in secret["ansible.builtin.copy"]["content"]
    service = (ROOT / "roles/sglang_server/tasks/service.yml").read_text()
    assert "hicache_secret_file(inventory_hostname, item.name, true)" in service  # the io_uring fallback too


# --- host keys ---------------------------------------------------------------------------------------

def test_ansible_cfg_checks_host_keys():
    text = (ROOT / "ansible.cfg").read_text()
    assert "host_key_checking = False" not in text and "UserKnownHostsFile=/dev/null" not in text
    assert "StrictHostKeyChecking=no" not in text
    options = tunnel.ssh_options({}, ROOT / "ansible.cfg")
    assert options["stricthostkeychecking"] == "accept-new"


def test_the_test_bed_opts_out_explicitly(tmp_path):
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "infra"))
    from fleet import Fleet

    fleet = Fleet(tmp_path, 1)
    hosts = yaml.safe_load((fleet.inventory() / "hosts.yml").read_text())
    args = hosts["all"]["vars"]["ansible_ssh_common_args"]
    assert args == "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"
    mode, _, users = tunnel.host_key_policy(tunnel.ssh_options({"ansible_ssh_common_args": args}, ROOT / "ansible.cfg"))
    assert mode == "accept" and users == ["/dev/null"]


def test_tunnel_options_follow_ssh_first_value_wins(tmp_path):
    cfg = ROOT / "ansible.cfg"
    strict = tunnel.ssh_options({"ansible_ssh_common_args": "-o StrictHostKeyChecking=yes -oUserKnownHostsFile='~/a b'"}, cfg)
    mode, systems, users = tunnel.host_key_policy(strict)
    assert mode == "reject" and users == [os.path.expanduser("~/a"), "b"]  # ssh too reads two files there
    assert systems == list(tunnel.SYSTEM_KNOWN_HOSTS)
    # ansible_ssh_extra_args come after the common args: the common args' value wins, as in ssh.
    both = tunnel.ssh_options({"ansible_ssh_common_args": "-o StrictHostKeyChecking=yes",
                               "ansible_ssh_extra_args": "-o StrictHostKeyChecking=no"}, cfg)
    assert tunnel.host_key_policy(both)[0] == "reject"
    assert tunnel.host_key_policy(tunnel.ssh_options({}, None))[0] == "reject"  # no config at all: unknown keys refused


def test_tunnel_policy_refuses_unknown_keys_and_records_accept_new(tmp_path):
    paramiko = pytest.importorskip("paramiko")
    key = paramiko.RSAKey.generate(1024)
    with pytest.raises(tunnel.HostKeyError, match="not in known_hosts"):
        tunnel._policy("reject", None, []).missing_host_key(None, "[127.0.0.1]:2222", key)
    known = tmp_path / "ssh" / "known_hosts"
    tunnel._policy("accept-new", str(known), []).missing_host_key(None, "[127.0.0.1]:2222", key)
    assert stat.S_IMODE(known.stat().st_mode) == 0o600
    loaded = paramiko.HostKeys(str(known))
    assert loaded.lookup("[127.0.0.1]:2222")["ssh-rsa"] == key


def test_tunnel_refuses_a_host_whose_key_is_unknown(tmp_path):
    """A real SSH handshake against a paramiko server: the default refuses, the test bed's opt-out accepts."""
    paramiko = pytest.importorskip("paramiko")
    import socket
    import threading

    host_keys = [paramiko.RSAKey.generate(1024)]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]

    class Server(paramiko.ServerInterface):
        def get_allowed_auths(self, username):
            return "publickey"

        def check_auth_publickey(self, username, key):
            return paramiko.AUTH_SUCCESSFUL

    def serve() -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            transport = paramiko.Transport(sock)
            transport.add_server_key(host_keys[-1])
            try:
                transport.start_server(server=Server())
            except Exception:  # noqa: BLE001 - the client hung up on purpose
                pass

    threading.Thread(target=serve, daemon=True).start()
    client_key = tmp_path / "id_rsa"
    paramiko.RSAKey.generate(1024).write_private_key_file(str(client_key))
    conn = {"ansible_host": "127.0.0.1", "ansible_port": port, "ansible_user": "root", "ansible_ssh_private_key_file": str(client_key),
            "ansible_ssh_common_args": f"-o StrictHostKeyChecking=yes -o UserKnownHostsFile={tmp_path / 'known'} "
                                       "-o GlobalKnownHostsFile=/dev/null"}
    with pytest.raises(tunnel.HostKeyError, match="not in known_hosts"):
        tunnel.client(conn, "gpu-a", ROOT / "ansible.cfg")
    opted_out = dict(conn, ansible_ssh_common_args="-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null")
    tunnel.client(opted_out, "gpu-a", ROOT / "ansible.cfg").close()
    # accept-new: the first contact records the key; then a changed key (a man in the middle) is refused.
    new = dict(conn, ansible_ssh_common_args=f"-o StrictHostKeyChecking=accept-new -o UserKnownHostsFile={tmp_path / 'known'}")
    tunnel.client(new, "gpu-a", ROOT / "ansible.cfg").close()
    assert f"[127.0.0.1]:{port} ssh-rsa " in (tmp_path / "known").read_text()
    tunnel.client(conn, "gpu-a", ROOT / "ansible.cfg").close()  # now known: accepted under StrictHostKeyChecking=yes
    host_keys.append(paramiko.RSAKey.generate(1024))
    with pytest.raises(tunnel.HostKeyError, match="differs from the one in known_hosts"):
        tunnel.client(new, "gpu-a", ROOT / "ansible.cfg")
    listener.close()


def test_a_finding_never_quotes_a_secret(tmp_path):
    """A finding may quote the value it refuses (a token given as a number): never a secret one."""
    inventory = make_inventory(tmp_path / "inv", {**SECRET_VARS, "hicache_model_hub_token": 98765432123})
    for args in ((), ("--json",)):
        proc = cli("validate", "-i", str(inventory), *args, check_rc=1)
        assert "98765432123" not in proc.stdout + proc.stderr and "hicache_model_hub_token" in proc.stdout + proc.stderr
    findings = _filter_module().hicache_findings({**SECRET_VARS, "hicache_model_hub_token": 98765432123}, "gpu-a")
    assert findings and "98765432123" not in json.dumps(findings)


# --- secret SGLang flags ----------------------------------------------------------------------------

@pytest.mark.parametrize("words", [["--admin-api-key", "k3y-value"], ["--admin-api-key=k3y-value"], ["--admin-api", "k3y-value"],
                                   ["--api-key", "k3y-value"], ["--api-key=k3y-value"]])
def test_a_secret_flag_in_extra_args_is_refused_naming_the_variable_and_never_the_value(words):
    d, findings = rules.check_host("gpu-a", {**VAST, "hicache_extra_args": ["--log-level", "info", *words]})
    errors = [f for f in findings if f.level == "error"]
    assert [(f.variable, f.rule) for f in errors] == [("hicache_extra_args[2]", "secret-flag")], [f.format() for f in findings]
    assert "k3y-value" not in errors[0].format()
    assert errors[0].fix.startswith("remove it and its value, and set hicache_admin_api_key") == ("admin" in words[0])


def test_sglangs_one_config_file_is_the_secrets_file_when_there_is_one():
    d, findings = rules.check_host("gpu-a", {**VAST, "hicache_admin_api_key": "k" * 16, "hicache_extra_args": ["--config", "/etc/x.yaml"]})
    assert [(f.variable, f.rule) for f in findings if f.level == "error"] == [("hicache_extra_args[0]", "managed-flag")]
    d, findings = rules.check_host("gpu-a", {**VAST, "hicache_extra_args": ["--config", "/etc/x.yaml"]})
    assert not rules.has_errors(findings)
    d, findings = rules.check_host("gpu-a", {**VAST, "hicache_extra_config_file": "server_secrets.yaml"})
    assert "hicache_extra_config_file" in [f.variable for f in findings if f.level == "error"]


def test_the_admin_key_is_in_its_0600_file_only_and_argv_names_the_file():
    d = deployment(SECRET_VARS)
    assert launch.server_args(d)[-2:] == ["--config", "/cfg/server_secrets.yaml"]
    (secret_file,) = [f for f in sglang_server.files(d) if f.name == "server_secrets.yaml"]
    assert secret_file.secret and secret_file.mode == "0600" and ADMIN_KEY not in secret_file.shown
    assert json.loads(secret_file.content) == {"admin-api-key": ADMIN_KEY}  # JSON: YAML reads it as the same mapping
    assert yaml.safe_load(secret_file.content) == {"admin-api-key": ADMIN_KEY}
    from helpers import deployment as profile
    runtime_none = profile("local", admin_api_key="k" * 16, container_runtime="none")  # the server reads the host's own cfg/
    assert runtime_none.container_runtime == "none" and launch.server_args(runtime_none)[-1] == f"{runtime_none.cfg_dir}/server_secrets.yaml"
    rotated = deployment({**SECRET_VARS, "hicache_admin_api_key": "another-admin-key-0042"})
    assert sglang_server.deployed(rotated, sglang_server.files(rotated))["config_hash"] != sglang_server.deployed(d, sglang_server.files(d))["config_hash"]


def test_server_info_as_sglang_answers_it_is_shown_without_its_keys():
    info = {"admin_api_key": "adm1n", "api_key": None, "model_path": "m",
            "launch_command": "--model-path m --admin-api-key adm1n --api-key=k2y --page-size 16"}
    shown = secrets.redact_server_info(info)
    assert shown["admin_api_key"] == secrets.MASK and shown["api_key"] is None and shown["model_path"] == "m"
    assert "adm1n" not in json.dumps(shown) and "k2y" not in json.dumps(shown) and "--page-size 16" in shown["launch_command"]
    assert "adm1n" not in json.dumps(secrets.redact_server_info({**info, "launch_command": info["launch_command"].split()}))
    assert secrets.redact_server_info(None) is None


@pytest.mark.parametrize(("where", "variables"), [
    ("hicache_launcher[3]", {"hicache_launcher": ["python3", "-m", "sglang.launch_server", "--admin-api-key", "k3y-value-0123456789"]}),
    ("hicache_extra_args[0]", {"hicache_extra_args": ["--admin-api-key k3y-value-0123456789"]}),  # one word holding two
    ("hicache_extra_args[1]", {"hicache_extra_args": ["--log-level=info", "--ssl-keyfile-password=k3y-value-0123456789"]}),
])
def test_a_secret_flag_is_refused_wherever_start_sh_would_write_it(where, variables):
    d, findings = rules.check_host("gpu-a", {**VAST, **variables})
    errors = [f for f in findings if f.level == "error"]
    assert [(f.variable, f.rule) for f in errors] == [(where, "secret-flag")], [f.format() for f in findings]
    assert "k3y-value" not in errors[0].format()


def test_an_admin_key_is_long_and_served_beyond_loopback_it_is_a_warning():
    d, findings = rules.check_host("gpu-a", {**VAST, "hicache_admin_api_key": "short"})
    assert [(f.variable, f.level) for f in findings if f.variable == "hicache_admin_api_key"] == [("hicache_admin_api_key", "error")]
    assert "short" not in " ".join(f.format() for f in findings)
    for host, warned in (("0.0.0.0", True), ("127.0.0.1", False), (None, False)):
        d, findings = rules.check_host("gpu-a", {**VAST, "hicache_admin_api_key": "k" * 16, "hicache_host": host})
        assert any(f.rule == "admin-key-exposed" for f in findings) == warned, host


def test_sglangs_internal_states_and_its_log_form_of_a_key_are_masked_too():
    info = {"internal_states": [{"admin_api_key": "adm1n-key", "ssl_keyfile_password": "pw", "dp": 0}], "api_key": "k"}
    shown = secrets.redact_server_info(info)
    assert shown == {"internal_states": [{"admin_api_key": secrets.MASK, "ssl_keyfile_password": secrets.MASK, "dp": 0}], "api_key": secrets.MASK}
    both_quotes = "a'b\"c-secret"
    log_line = f"server_args=ServerArgs(admin_api_key={both_quotes!r}, page_size=16)"  # as SGLang logs it at start
    assert both_quotes not in secrets.mask_text(log_line, [both_quotes])
    assert repr(both_quotes)[1:-1] not in secrets.mask_text(log_line, [both_quotes]) and "page_size=16" in secrets.mask_text(log_line, [both_quotes])


def test_the_health_waits_journal_hides_the_hosts_secrets(monkeypatch):
    spec = importlib.util.spec_from_file_location("hicache_wait_healthy", ROOT / "plugins/modules/hicache_wait_healthy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    key = "a'b\"c-admin-key-0123"
    logged = f"[2026-12-01] server_args=ServerArgs(admin_api_key={key!r}, host='0.0.0.0')\nLoading weights\n"
    monkeypatch.setattr(module.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, logged, ""))
    text = module.journal("sglang-hicache.service", secrets.text_forms([key]))
    assert key not in text and repr(key)[1:-1] not in text and "admin_api_key='********'" in text and "Loading weights" in text
    # Ansible's own scrubbing of no_log values applies to it as well: the option is no_log.
    assert re.search(r'"hide": \{[^}]*"no_log": True', (ROOT / "plugins/modules/hicache_wait_healthy.py").read_text())
    for path in ("roles/sglang_server/tasks/service.yml", "roles/sglang_server/tasks/restart.yml", "playbooks/rollback.yml"):
        text = (ROOT / path).read_text()
        assert text.count("hicache.deploy.hicache_wait_healthy:") == text.count("hicache_secret_forms(inventory_hostname)"), path


@pytest.mark.parametrize(("variables", "refused"), [
    ({"hicache_extra_args": ["--grpc-port", "50051"]}, "hicache_extra_args[0]"),
    ({"hicache_extra_args": ["--log-level=info", "--grpc-po=50051"]}, "hicache_extra_args[1]"),  # argparse expands it
    ({"hicache_container_env": {"SGLANG_GRPC_PORT": "50051"}}, "hicache_container_env.SGLANG_GRPC_PORT"),
    ({"hicache_extra_args": ["--grpc-port", "50051", "--smg-grpc-mode"]}, None),  # the legacy gRPC server: SGLang allows it
    ({"hicache_extra_args": ["--grpc-http-sidecar-port", "50052"]}, None),
])
def test_sglangs_native_grpc_port_is_refused_with_an_admin_key(variables, refused):
    """SGLang 0.5.21 and 0.5.23 refuse --grpc-port with --admin-api-key (arg_groups/serving_hook.py,
    handle_deprecated_args). Read there, not run: the conformance tier's parse runs the HiCache hooks and
    check_server_args, not that hook, whose other resolutions it would report as rewrites."""
    _, with_key = rules.check_host("gpu-a", {**VAST, "hicache_admin_api_key": "k" * 16, **variables})
    _, without = rules.check_host("gpu-a", {**VAST, **variables})
    assert [f.variable for f in with_key if f.level == "error"] == ([refused] if refused else []), [f.format() for f in with_key]
    assert not [f for f in without if f.level == "error"]
