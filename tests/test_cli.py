"""The CLI as a new user meets it: Vault, one-line errors (never a traceback), exit codes, the first hour.
No host is contacted: every inventory here points at 127.0.0.1:1, or the command stops before a run."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from support import ROOT, cli
from typer.testing import CliRunner

from hicachectl.cli import main as hicli
from hicachectl.cli import readme

PASSWORD = "correct horse battery staple"
TOKEN = "hf_vaulted_token_0123456789"
VAULTED_NAME = "served-from-vault"
ANSIBLE_VAULT = pathlib.Path(sys.executable).parent / "ansible-vault"


def _one_line_error(proc: subprocess.CompletedProcess, rc: int) -> str:
    """The command failed with `rc`, said so in one `error:` line, and printed no traceback."""
    assert proc.returncode == rc, f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "Traceback" not in proc.stderr + proc.stdout
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def _local_copy(dest: pathlib.Path, hosts: dict | None = None) -> pathlib.Path:
    """The shipped `local` inventory, with SSH hosts at 127.0.0.1:1 (nothing listens there)."""
    shutil.copytree(ROOT / "inventories/local", dest)
    hosts = hosts or {"gpu-a": {"ansible_host": "127.0.0.1", "ansible_port": 1, "ansible_user": "root"}}
    (dest / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"hicache_servers": {"hosts": hosts}}}}))
    return dest


@pytest.fixture(scope="module")
def vault_inventory(tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path]:
    """(inventory, password file): an inline `!vault` value made by `ansible-vault encrypt_string`, and an
    encrypted vars file made by `ansible-vault encrypt`."""
    tmp = tmp_path_factory.mktemp("vault")
    password_file = tmp / "vault-pass"
    password_file.write_text(PASSWORD + "\n")
    inventory = _local_copy(tmp / "inv")
    (inventory / "group_vars/all").mkdir()
    (inventory / "group_vars/all.yml").rename(inventory / "group_vars/all/main.yml")
    inline = subprocess.run([str(ANSIBLE_VAULT), "encrypt_string", "--vault-password-file", str(password_file), TOKEN,
                             "--name", "hicache_model_hub_token"], capture_output=True, text=True, check=True).stdout
    assert "!vault" in inline and TOKEN not in inline
    with (inventory / "group_vars/all/main.yml").open("a") as handle:
        handle.write("\n" + inline)
    encrypted = inventory / "group_vars/all/vault.yml"
    encrypted.write_text(f"hicache_served_model_name: {VAULTED_NAME}\n")
    subprocess.run([str(ANSIBLE_VAULT), "encrypt", "--vault-password-file", str(password_file), str(encrypted)], capture_output=True, check=True)
    assert encrypted.read_text().startswith("$ANSIBLE_VAULT;")
    return inventory, password_file


@pytest.mark.parametrize("how", ["env", "--vault-password-file", "--vault-id"])
def test_vault_password_from_the_environment_or_an_option(vault_inventory, how):
    inventory, password_file = vault_inventory
    env = {"ANSIBLE_VAULT_PASSWORD_FILE": str(password_file)} if how == "env" else {}
    options = {"env": [], "--vault-password-file": ["--vault-password-file", str(password_file)],
               "--vault-id": ["--vault-id", f"default@{password_file}"]}[how]
    validate = cli("validate", "-i", str(inventory), *options, env=env, check_rc=0)
    assert "valid." in validate.stdout
    rendered = cli("render", "-i", str(inventory), *options, env=env, check_rc=0)
    assert f"--served-model-name {VAULTED_NAME}" in rendered.stdout  # from the encrypted vars file


def test_vault_without_a_password_is_one_line_naming_the_file(vault_inventory, tmp_path):
    inventory, password_file = vault_inventory
    for command in ("validate", "render"):
        line = _one_line_error(cli(command, "-i", str(inventory), env={"ANSIBLE_VAULT_PASSWORD_FILE": ""}), 1)
        assert "encrypted with Ansible Vault" in line and "group_vars/all/" in line and "--vault-password-file" in line
    wrong = tmp_path / "wrong"
    wrong.write_text("not the password\n")
    line = _one_line_error(cli("validate", "-i", str(inventory), "--vault-password-file", str(wrong)), 1)
    assert "cannot be decrypted" in line
    line = _one_line_error(cli("validate", "-i", str(inventory), "--vault-password-file", str(tmp_path / "absent")), 2)
    assert "no such file" in line


def test_vault_secrets_reach_ansible_playbook_too(vault_inventory, monkeypatch):
    """The runner gets the same secrets: absolute paths in its arguments and environment."""
    from hicachectl.config import inventory

    _, password_file = vault_inventory
    monkeypatch.chdir(password_file.parent)
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", password_file.name)
    monkeypatch.setenv("ANSIBLE_VAULT_IDENTITY_LIST", f"prod@{password_file.name}")
    inventory.use_vault(inventory.VaultOptions(password_files=(password_file.name,), vault_ids=(f"dev@{password_file.name}", "ops@prompt")))
    try:
        args, answers, env = inventory.vault_for_runner()
    finally:
        inventory.use_vault(inventory.VaultOptions())
    assert args == ["--vault-password-file", str(password_file), "--vault-id", f"dev@{password_file}", "--vault-id", "ops@prompt"]
    assert env == {"ANSIBLE_VAULT_PASSWORD_FILE": str(password_file), "ANSIBLE_VAULT_IDENTITY_LIST": f"prod@{password_file}"}
    assert [re.match(p, "Vault password (ops): ") is not None for p in answers] == [True]


def test_yaml_errors_name_file_and_line(tmp_path):
    broken_vars = _local_copy(tmp_path / "vars")
    with (broken_vars / "group_vars/all.yml").open("a") as handle:
        handle.write("hicache_extra_args: [\n")
    line = _one_line_error(cli("validate", "-i", str(broken_vars)), 1)
    assert re.search(r"group_vars/all\.yml line \d+: .*", line), line
    broken_hosts = _local_copy(tmp_path / "hosts")
    (broken_hosts / "hosts.yml").write_text("all:\n  children: [\n")
    line = _one_line_error(cli("validate", "-i", str(broken_hosts)), 1)
    assert re.search(r"hosts\.yml line \d+", line), line
    assert "[WARNING]" not in cli("validate", "-i", str(broken_hosts)).stderr


def test_a_key_written_twice_is_refused_naming_file_line_and_key(tmp_path):
    inventory = _local_copy(tmp_path / "dup")
    with (inventory / "group_vars/all.yml").open("a") as handle:
        handle.write("hicache_page_size: 64\nhicache_page_size: 128\n")
    proc = cli("validate", "-i", str(inventory))
    line = _one_line_error(proc, 1)
    assert re.search(r"group_vars/all\.yml line \d+: hicache_page_size is written twice", line), line
    assert "[WARNING]" not in proc.stderr and "[DEPRECATION WARNING]" not in proc.stderr


def test_unknown_inventory_says_where_it_looked_and_how_to_make_one(tmp_path):
    line = _one_line_error(cli("deploy", "--inventory", "prod", cwd=str(tmp_path)), 2)
    assert str(tmp_path / "inventories" / "prod") in line and "hicachectl init --profile" in line and "--out inventories/prod" in line


def test_init_in_an_ops_folder_then_use_it_by_name(tmp_path):
    proc = cli("init", "--profile", "local", "--hosts", "gpu1,gpu2,localhost", "--out", "inventories/prod", cwd=str(tmp_path), check_rc=0)
    assert "hicachectl validate -i prod" in proc.stdout
    hosts = yaml.safe_load((tmp_path / "inventories/prod/hosts.yml").read_text())["all"]["children"]["hicache_servers"]["hosts"]
    assert not (hosts["gpu1"] or {}).get("ansible_connection") and not (hosts["gpu2"] or {}).get("ansible_connection")
    assert hosts["localhost"]["ansible_connection"] == "local"
    report = cli("validate", "-i", "prod", "--json", cwd=str(tmp_path), check_rc=0)
    assert '"gpu1"' in report.stdout and str(tmp_path / "inventories/prod") in report.stdout


def test_version():
    proc = cli("--version", check_rc=0)
    assert re.fullmatch(r"hicachectl \d+\.\d+\.\d+\S*\n", proc.stdout), proc.stdout


def test_an_unexpected_error_is_one_line_and_a_file(tmp_path):
    crash = ("import sys\nfrom hicachectl.cli.main import app\n"
             "@app.command()\ndef boom() -> None:\n    raise RuntimeError('it broke')\n"
             "app(prog_name='hicachectl')\n")
    env = {"HICACHE_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", crash, "boom"], capture_output=True, text=True, env={**__import__("os").environ, **env})
    line = _one_line_error(proc, 1)
    assert "unexpected RuntimeError: it broke" in line and "--debug" in line
    details = pathlib.Path(re.search(r"details in (\S+?)[;)]", line).group(1))
    assert details.parent == tmp_path / "cache" and "Traceback" in details.read_text() and oct(details.stat().st_mode & 0o777) == "0o600"
    debug = subprocess.run([sys.executable, "-c", crash, "--debug", "boom"], capture_output=True, text=True, env={**__import__("os").environ, **env})
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "RuntimeError: it broke" in debug.stderr


def test_render_out_never_over_existing_files_without_force(tmp_path):
    out = tmp_path / "out"
    cli("render", "-i", "local", "--out", str(out), check_rc=0)
    line = _one_line_error(cli("render", "-i", "local", "--out", str(out)), 2)
    assert "already there" in line and "--force" in line
    cli("render", "-i", "local", "--out", str(out), "--force", check_rc=0)
    a_file = tmp_path / "file"
    a_file.write_text("mine\n")
    assert "not a directory" in _one_line_error(cli("render", "-i", "local", "--out", str(a_file)), 2)
    assert a_file.read_text() == "mine\n"


def test_bench_to_a_closed_port_says_nothing_answers():
    line = _one_line_error(cli("bench", "--url", "http://127.0.0.1:1", "--concurrency", "1", "--input-len", "10"), 1)
    assert "nothing answers at http://127.0.0.1:1 (connection refused)" in line


# --- exit codes of every command, in process (fast); nothing here reaches a host -------------------------

INVENTORY_COMMANDS = {
    "validate": [], "render": [], "plan": [], "doctor": [], "deploy": [], "status": [], "verify": [],
    "upgrade": ["--image", "lmsysorg/sglang:v0.5.21"], "restart": [], "rollback": [],
    "bench": ["--concurrency", "1"], "size": ["--config", str(ROOT / "tests/model_configs/llama-3.1-8b-instruct.json")],
}


def _run(*args: str, cwd: pathlib.Path | None = None):
    result = CliRunner().invoke(hicli.app, list(args), catch_exceptions=False)
    assert "Traceback" not in result.output
    return result


@pytest.mark.parametrize("command", sorted(INVENTORY_COMMANDS))
def test_exit_codes_of_every_command_that_reads_an_inventory(command, tmp_path):
    extra = INVENTORY_COMMANDS[command]
    assert _run(command, "-i", str(tmp_path / "no-such-inventory"), *extra).exit_code == hicli.EXIT_USAGE
    broken = _local_copy(tmp_path / "broken")
    (broken / "group_vars/all.yml").write_text("hicache_image: [\n")
    assert _run(command, "-i", str(broken), *extra).exit_code == hicli.EXIT_INVALID
    assert _run(command, "-i", "local", *extra, "--no-such-option").exit_code == hicli.EXIT_USAGE


@pytest.mark.parametrize("args, code", [
    (["validate", "-i", "local"], 0),
    (["render", "-i", "local", "--json"], 0),
    (["size", "--config", str(ROOT / "tests/model_configs/llama-3.1-8b-instruct.json")], 0),
    (["size", "--config", str(ROOT / "tests/model_configs/llama-3.1-8b-instruct.json"), "--tp", "0"], 2),
    (["size", "--config", str(ROOT / "tests/model_configs/llama-3.1-8b-instruct.json"), "--kv-cache-dtype", "fp3"], 2),
    (["size", "--config", "/nonexistent/config.json"], 2),
    (["size", "--config", str(ROOT / "tests/model_configs/README.md")], 1),
    (["bench", "--url", "http://127.0.0.1:1", "--concurrency", "1,x"], 2),
    (["bench", "--url", "http://127.0.0.1:1", "--concurrency", "0"], 2),
    (["bench", "--concurrency", "1"], 2),
    (["init", "--profile", "nope", "--hosts", "a", "--out", "x"], 2),
    (["validate"], 2),
    (["no-such-command"], 2),
    (["--version"], 0),
])
def test_exit_codes_without_hosts(args, code):
    assert _run(*args).exit_code == code


def test_readme_exit_codes_are_the_codes_table():
    text = readme.README.read_text()
    assert readme.wanted(text) == text, "README's exit codes drifted: python -m hicachectl.cli.readme --write"
    for code, meaning in hicli.EXIT_CODES.items():
        assert f"| `{code}` | {meaning} |" in text


def test_a_refused_init_writes_nothing_and_a_file_as_out_is_a_usage_error(tmp_path):
    bad_router = cli("init", "--profile", "local", "--hosts", "gpu-01", "--routers", "bad name!", "--out", str(tmp_path / "inv"))
    assert bad_router.returncode == 2 and "not a host name" in bad_router.stdout + bad_router.stderr
    assert not (tmp_path / "inv").exists()  # nothing written: the same command, mended, runs
    (tmp_path / "afile").write_text("x")
    on_a_file = cli("init", "--profile", "local", "--hosts", "gpu-01", "--out", str(tmp_path / "afile"))
    assert on_a_file.returncode == 2 and "is a file" in on_a_file.stdout + on_a_file.stderr, on_a_file.stdout + on_a_file.stderr
    assert "unexpected" not in on_a_file.stdout + on_a_file.stderr
    mended = cli("init", "--profile", "local", "--hosts", "gpu-01", "--routers", "router-01", "--out", str(tmp_path / "inv"))
    assert mended.returncode == 0, mended.stdout + mended.stderr


def test_an_inventory_named_by_an_empty_string_is_refused(tmp_path):
    run = cli("validate", "-i", "", cwd=str(tmp_path))
    assert run.returncode != 0 and "empty string" in run.stdout + run.stderr, run.stdout + run.stderr


def test_a_group_vars_file_of_no_group_is_warned(tmp_path):
    inventory = tmp_path / "inv"
    shutil.copytree(ROOT / "inventories/local", inventory)
    (inventory / "group_vars/hicache_server.yml").write_text("hicache_page_size: 32\n")  # hicache_servers meant
    run = cli("validate", "-i", str(inventory))
    assert "group-vars-orphan" in run.stdout + run.stderr and "hicache_server.yml" in run.stdout + run.stderr, run.stdout + run.stderr


def test_a_value_given_as_vault_is_never_printed_whichever_variable_holds_it(tmp_path):
    """An inline `!vault` is the user's word that the value is secret: in hicache_served_model_name or a container
    environment value (no catalogue secret, no hicache_secret_keys), it is masked in every output as a secret is."""
    password_file = tmp_path / "vault-pass"
    password_file.write_text(PASSWORD + "\n")
    inventory = _local_copy(tmp_path / "inv")
    vaulted = {"hicache_served_model_name": "Acme/TopSecret_Model.V2", "VAULTED_ENV": "VaultedEnvValue654"}
    blocks = {name: subprocess.run([str(ANSIBLE_VAULT), "encrypt_string", "--vault-password-file", str(password_file), value,
                                    "--name", name], capture_output=True, text=True, check=True).stdout for name, value in vaulted.items()}
    env_block = "hicache_container_env:\n" + "".join("  " + line + "\n" for line in blocks["VAULTED_ENV"].splitlines())
    with (inventory / "group_vars/all.yml").open("a") as handle:
        handle.write("\n" + blocks["hicache_served_model_name"] + "\n" + env_block)
    options = ["--vault-password-file", str(password_file)]
    for command in (["validate"], ["validate", "--json"], ["render"], ["render", "--json"]):
        run = cli(*command, "-i", str(inventory), *options)
        printed = run.stdout + run.stderr
        assert run.returncode == 0, printed
        for value in vaulted.values():
            assert value not in printed and value.lower() not in printed, (command, value)
        assert "topsecret_model.v2" not in printed, command  # the namespace's model part, derived from the vaulted name
    rendered = cli("render", "-i", str(inventory), *options, check_rc=0).stdout
    assert "--served-model-name ********" in rendered  # masked, not left out
    written = tmp_path / "files"
    cli("render", "-i", str(inventory), *options, "--out", str(written), check_rc=0)  # files meant to hold them do
    assert "Acme/TopSecret_Model.V2" in "".join(p.read_text() for p in written.rglob("*") if p.is_file())


def test_the_command_list_shows_each_commands_summary_as_one_flowing_line():
    from hicachectl.cli.main import COMMANDS

    shown = cli("--help", env={"COLUMNS": "400"}, check_rc=0).stdout
    for command in COMMANDS:
        summary = " ".join(command.__doc__.split("\n\n")[0].split())
        assert summary in shown, (command.__name__, summary)  # not cut where the docstring's own lines end
