"""A host reached only through a bastion that the user's own ansible.cfg sets (issue #24, item 3).

hicachectl runs its playbooks with the ansible.cfg Ansible's own lookup finds from where hicachectl is run
(ANSIBLE_CONFIG, ./ansible.cfg, ~/.ansible.cfg, /etc/ansible/ansible.cfg: ansible-core lib/ansible/config/manager.py
find_ini_config_file), and adds its callbacks and collection on top through ANSIBLE_* variables. Here the operator's
directory holds an ansible.cfg whose [ssh_connection] ssh_args send every connection through a bastion
(ProxyCommand ssh -W %h:%p, OpenSSH's jump through a host). The target's name resolves only on the bastion (its
/etc/hosts, the target's address on the test network), so the machine running hicachectl has no way to it but
through the bastion: a run that ignores the user's file cannot reach it.
"""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml
from fleet import ROOT, Fleet
from support import cli

pytestmark = pytest.mark.slow

HOST_KEYS_OFF = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"  # the test bed's opt-out (tests/infra/fleet.py)


@pytest.fixture(scope="module")
def behind_bastion(tmp_path_factory):
    """(bastion fleet, target fleet, the target's name as only the bastion knows it, the operator's directory)."""
    work = tmp_path_factory.mktemp("bastion")
    bastion = Fleet(work, 1, prefix="hicache-bastion").up()
    target = Fleet(work, 1, prefix="hicache-behind").up()  # the same key (work/id_ed25519)
    try:
        (bastion_name,), (target_name,) = bastion.hosts, target.hosts
        alias = f"behind-bastion-{os.getpid()}.test"
        added = bastion.ssh(bastion_name, f"echo '{target.address(target_name)} {alias}' >> /etc/hosts")
        assert added.returncode == 0, added.stderr
        ops = work / "ops"
        ops.mkdir()
        proxy = (f"ssh -q -i {bastion.key} -p {bastion.hosts[bastion_name]} -o BatchMode=yes {HOST_KEYS_OFF} "
                 "-W %h:%p root@127.0.0.1")
        (ops / "ansible.cfg").write_text(
            "[defaults]\nforks = 5\n\n[ssh_connection]\n"
            f'ssh_args = -o ControlMaster=auto -o ControlPersist=30s -o ProxyCommand="{proxy}"\n')
        yield bastion, target, target_name, alias, ops
    finally:
        target.down()
        bastion.down()


def inventory(target, target_name: str, alias: str, ops):
    path = ops / "inventories" / "behind"
    path.mkdir(parents=True, exist_ok=True)
    (path / "group_vars").mkdir(exist_ok=True)
    (path / "group_vars" / "all.yml").write_text((ROOT / "inventories/local/group_vars/all.yml").read_text())
    hosts = {"all": {"vars": {"ansible_user": "root", "ansible_ssh_private_key_file": str(target.key),
                              "ansible_python_interpreter": "/usr/bin/python3", "ansible_ssh_common_args": HOST_KEYS_OFF},
                     "children": {"hicache_servers": {"hosts": {target_name: {"ansible_host": alias, "ansible_port": 22}}}}}}
    (path / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    return path


def test_the_target_is_reachable_only_through_the_bastion(behind_bastion):
    _, target, _, alias, _ = behind_bastion
    direct = subprocess.run(["ssh", "-q", "-i", str(target.key), "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", *HOST_KEYS_OFF.split(),
                             f"root@{alias}", "true"], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert direct.returncode != 0  # no name, no route: only the bastion resolves it


def test_a_host_behind_the_bastion_of_the_users_ansible_cfg_deploys(behind_bastion):
    _, target, target_name, alias, ops = behind_bastion
    inv = inventory(target, target_name, alias, ops)
    assert "ANSIBLE_CONFIG" not in os.environ  # the operator's ./ansible.cfg is the file Ansible's lookup finds
    run = cli("deploy", "--inventory", str(inv), cwd=str(ops))
    assert run.returncode == 0, run.stdout + run.stderr
    on_host = subprocess.run(["podman", "exec", target_name, "cat", "/opt/sglang-hicache/cfg/start.sh"], capture_output=True, text=True)
    assert on_host.returncode == 0 and "--hicache-storage-backend" in on_host.stdout
    # The file in effect is named by the run and, before any run, by --help.
    assert f"Ansible settings: {ops / 'ansible.cfg'} (found as ./ansible.cfg" in run.stderr
    shown = " ".join(cli("deploy", "--help", cwd=str(ops)).stdout.split())
    assert f"Ansible settings: {ops / 'ansible.cfg'} (found as ./ansible.cfg" in shown, shown
