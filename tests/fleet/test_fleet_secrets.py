"""Secrets on real hosts: plan and deploy never print them, the server receives them through cfg/secrets.env
(0600, no backups), and no process listing, script or readable file on the host carries them.

SGLang cannot run without a GPU: start.sh execs the SGLang stand-in on the host (runtime none), which reads its
secret environment the way serve.sh exports it from secrets.env.
"""

from __future__ import annotations

import json
import pathlib
import shlex
import subprocess
import sys
import threading

import pytest
from fleet import HEALTH_TIMEOUT, SGLANG_MOUNT, STANDIN
from support import cli, cli_json

pytestmark = pytest.mark.slow

TOKEN = "hf_FLEETtokenSECRET0123456789"
ENV_SECRET = "fleet s3cret$VALUE=42\\z"
NEW_SECRET = "rotated-FLEET-secret-9876"
ADMIN_KEY = "fleet-ADMIN-key_31337"  # hicache_admin_api_key: SGLang's --admin-api-key, through server_secrets.yaml
CFG = "/opt/sglang-hicache/cfg"


def variables(secret: str) -> dict:
    return {
        "hicache_container_runtime": "none",
        "hicache_launcher": ["python3", STANDIN],
        "hicache_served_model_name": "gpt-oss-20b",
        "hicache_page_size": 16,
        "hicache_health_timeout": HEALTH_TIMEOUT,
        "hicache_model_hub_token": TOKEN,
        "hicache_container_env": {"STANDIN_LOAD_SECONDS": "2", "OBJECT_STORE_SECRET": secret},
        "hicache_secret_keys": ["OBJECT_STORE_SECRET"],
        "hicache_admin_api_key": ADMIN_KEY,
    }


def assert_hidden(text: str, *values: str) -> None:
    for value in values:
        assert value not in text and json.dumps(value)[1:-1] not in text, f"a secret is shown:\n{text}"


@pytest.fixture(scope="module")
def secret_fleet(fleet3):
    return fleet3.install_standin()


def test_plan_and_deploy_never_show_a_secret_and_the_server_gets_it(secret_fleet):
    inventory = secret_fleet.inventory(extra_vars=variables(ENV_SECRET), name="secrets")
    for args in (("plan", "--diff"), ("plan", "--json")):  # --diff: every file's content, the old and the new
        proc = cli(*args, "--inventory", str(inventory))
        assert_hidden(proc.stdout + proc.stderr, TOKEN, ENV_SECRET, ADMIN_KEY)
    deploy = cli("deploy", "--inventory", str(inventory), "--diff", check_rc=0)
    assert_hidden(deploy.stdout + deploy.stderr, TOKEN, ENV_SECRET, ADMIN_KEY)
    for host in secret_fleet.hosts:
        pid = secret_fleet.ssh(host, "systemctl show --property=MainPID --value sglang-hicache.service").stdout.strip()
        assert pid not in ("", "0")
        # Delivered: the server's environment holds the value verbatim.
        environ = secret_fleet.ssh(host, f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout
        assert f"OBJECT_STORE_SECRET={ENV_SECRET}" in environ.splitlines()
        # Kept: 0600 root, no backups; nothing else on the host holds it; no argv shows it.
        listing = secret_fleet.ssh(host, f"stat -c '%a %U %n' {CFG}/secrets.env; ls -a {CFG}").stdout
        assert listing.startswith(f"600 root {CFG}/secrets.env"), listing
        assert not [n for n in listing.split() if n.startswith("secrets.env.")], listing
        grep = secret_fleet.ssh(host, f"grep -rlF -e {shlex.quote(ENV_SECRET)} -e {TOKEN} -e {ADMIN_KEY} /opt/sglang-hicache /etc/systemd/system 2>/dev/null")
        assert sorted(grep.stdout.split()) == [f"{CFG}/secrets.env", f"{CFG}/server_secrets.yaml"], grep.stdout
        assert secret_fleet.ssh(host, f"stat -c '%a %U' {CFG}/server_secrets.yaml").stdout.split() == ["600", "root"]
        ps = secret_fleet.ssh(host, "ps -eo args")
        assert ps.returncode == 0
        assert_hidden(ps.stdout, TOKEN, ENV_SECRET, ADMIN_KEY)
    again = cli_json("deploy", "--inventory", str(inventory))
    assert again["ok"] and all(r["changed"] == 0 for r in again["hosts"].values()), again
    assert_hidden(json.dumps(again), TOKEN, ENV_SECRET)
    # The server has the admin key (its admin endpoint answers status's request, which sends it), and neither status
    # nor verify shows it, though /server_info, as SGLang answers it, carries it whole.
    for args in (("status", "--json"), ("status",), ("verify", "--json"), ("verify",)):
        proc = cli(*args, "--inventory", str(inventory))
        assert proc.returncode in (0, 1), proc.stderr[-2000:]
        assert_hidden(proc.stdout + proc.stderr, TOKEN, ENV_SECRET, ADMIN_KEY)
        if args == ("status", "--json"):
            hosts = json.loads(proc.stdout)["hosts"]
            assert {h: e["storage_backend"]["status"] for h, e in hosts.items()} == dict.fromkeys(secret_fleet.hosts, 200), hosts
            assert all(e["server_info"]["admin_api_key"] == "********" for e in hosts.values()), hosts


def test_a_rotated_secret_restarts_the_server_and_leaves_no_copy_of_the_old_one(secret_fleet):
    host = next(iter(secret_fleet.hosts))
    inventory = secret_fleet.inventory(extra_vars=variables(NEW_SECRET), name="secrets-rotated")
    plan = cli("plan", "--inventory", str(inventory), "--limit", host, "--diff")
    assert_hidden(plan.stdout + plan.stderr, TOKEN, ENV_SECRET, NEW_SECRET)
    report = cli_json("deploy", "--inventory", str(inventory), "--limit", host)
    assert report["ok"], report
    assert_hidden(json.dumps(report), TOKEN, NEW_SECRET)
    pid = secret_fleet.ssh(host, "systemctl show --property=MainPID --value sglang-hicache.service").stdout.strip()
    assert f"OBJECT_STORE_SECRET={NEW_SECRET}" in secret_fleet.ssh(host, f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout.splitlines()
    # The previous config (for rollback) keeps the old secrets.env, 0600 like the current one; nothing else does.
    old = secret_fleet.ssh(host, f"grep -rlF -e {shlex.quote(ENV_SECRET)} /opt/sglang-hicache 2>/dev/null").stdout.split()
    assert old in ([], [f"{CFG}.previous/secrets.env"]), old
    for path in old:
        assert secret_fleet.ssh(host, f"stat -c %a {path}").stdout.strip() == "600"


def test_without_secrets_their_files_are_removed(secret_fleet):
    host = next(iter(secret_fleet.hosts))
    plain = variables(NEW_SECRET)
    plain["hicache_container_env"] = {"STANDIN_LOAD_SECONDS": "2"}
    plain["hicache_secret_keys"] = []
    plain["hicache_admin_api_key"] = None
    inventory = secret_fleet.inventory(extra_vars=plain, name="secrets-none")
    assert cli_json("deploy", "--inventory", str(inventory), "--limit", host)["ok"]
    assert secret_fleet.ssh(host, f"test -e {CFG}/secrets.env").returncode == 1
    assert secret_fleet.ssh(host, f"test -e {CFG}/server_secrets.yaml").returncode == 1


VAULT_PASSWORD = "fleet vault password"
VAULT_TOKEN = "hf_VAULTEDfleetTOKEN_5150"
VAULT_ENV_SECRET = "vaulted-object-store-secret-2718"


def vault_inventory(fleet, tmp):
    """The fleet's inventory with the hub token as an inline `!vault` value and the secret env in a vars file
    encrypted whole with `ansible-vault encrypt`."""
    vault = str(pathlib.Path(sys.executable).parent / "ansible-vault")
    password = tmp / "vault-pass"
    password.write_text(VAULT_PASSWORD + "\n")
    base = {k: v for k, v in variables(VAULT_ENV_SECRET).items() if k not in ("hicache_model_hub_token", "hicache_container_env")}
    inventory = fleet.inventory(extra_vars=base, name="secrets-vault")
    inline = subprocess.run([vault, "encrypt_string", "--vault-password-file", str(password), VAULT_TOKEN, "--name", "hicache_model_hub_token"],
                            capture_output=True, text=True, check=True).stdout
    (inventory / "group_vars/all/zz_token.yml").write_text(inline)
    encrypted = inventory / "group_vars/all/zz_secrets.yml"
    encrypted.write_text(json.dumps({"hicache_container_env": {"STANDIN_LOAD_SECONDS": "2", "OBJECT_STORE_SECRET": VAULT_ENV_SECRET}}) + "\n")
    subprocess.run([vault, "encrypt", "--vault-password-file", str(password), str(encrypted)], capture_output=True, check=True)
    assert VAULT_TOKEN not in inline and encrypted.read_text().startswith("$ANSIBLE_VAULT;")
    return inventory, password


def test_a_vault_inventory_deploys_and_no_output_log_file_or_process_shows_its_secrets(secret_fleet, tmp_path):
    inventory, password = vault_inventory(secret_fleet, tmp_path)
    by_env = {"ANSIBLE_VAULT_PASSWORD_FILE": str(password)}
    # Without a password: one line naming the encrypted source, nothing contacted.
    locked = cli("validate", "--inventory", str(inventory), env={"ANSIBLE_VAULT_PASSWORD_FILE": ""})
    assert locked.returncode == 1 and "Traceback" not in locked.stderr and "vault" in locked.stderr.lower(), locked.stderr
    outputs = [cli("validate", "--inventory", str(inventory), "--vault-password-file", str(password), check_rc=0),
               cli("render", "--inventory", str(inventory), "--vault-password-file", str(password), check_rc=0),
               cli("render", "--inventory", str(inventory), "--json", env=by_env, check_rc=0),
               cli("plan", "--inventory", str(inventory), "--vault-password-file", str(password), "--diff", check_rc=0)]
    listings, done = [], threading.Event()

    def sample_processes():  # the controller's and every host's process list, while the deploy runs
        while not done.is_set():
            listings.append(subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout)
            for host in secret_fleet.hosts:
                listings.append(secret_fleet.ssh(host, "ps -eo args").stdout)
            done.wait(0.5)

    sampler = threading.Thread(target=sample_processes, daemon=True)
    sampler.start()
    try:
        deploy = cli("deploy", "--inventory", str(inventory), "--diff", env={**by_env, "ANSIBLE_LOG_PATH": str(tmp_path / "ansible.log")})
    finally:
        done.set()
        sampler.join(timeout=30)
    assert deploy.returncode == 0, deploy.stdout[-3000:] + deploy.stderr[-2000:]
    outputs.append(deploy)
    assert len(listings) > 3
    for proc in outputs:
        assert_hidden(proc.stdout + proc.stderr, VAULT_TOKEN, VAULT_ENV_SECRET)
    assert_hidden("\n".join(listings), VAULT_TOKEN, VAULT_ENV_SECRET)
    if (tmp_path / "ansible.log").exists():
        assert_hidden((tmp_path / "ansible.log").read_text(), VAULT_TOKEN, VAULT_ENV_SECRET)
    for host in secret_fleet.hosts:
        pid = secret_fleet.ssh(host, "systemctl show --property=MainPID --value sglang-hicache.service").stdout.strip()
        environ = secret_fleet.ssh(host, f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout.splitlines()
        assert f"OBJECT_STORE_SECRET={VAULT_ENV_SECRET}" in environ  # delivered, from the encrypted vars file
        # Only root can read where it lies: every file holding it is 0600.
        # Not the test bed's read-only mount of SGLang's environment (/opt/sglang, 2.4 GB that no deploy can write: grep
        # over it outlasted the 60 s ssh timeout on a loaded machine, 2026-12-03).
        where = f"$(find /opt -mindepth 1 -maxdepth 1 ! -path {SGLANG_MOUNT}) /etc /root /tmp /var /run"
        holders = secret_fleet.ssh(host, f"grep -rlF -e {VAULT_ENV_SECRET} -e {VAULT_TOKEN} {where} 2>/dev/null").stdout.split()
        assert holders, "the secret did not reach the host"
        for path in holders:
            assert secret_fleet.ssh(host, f"stat -c %a {shlex.quote(path)}").stdout.strip() == "600", path
