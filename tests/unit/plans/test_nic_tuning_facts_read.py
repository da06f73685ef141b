"""The ports read once, with the host facts (hicache_host_facts' nic_read): the installed program, where it is this
collection's byte for byte, run as the role's own read runs it; the role reads the ports itself and applies what
differs only where that read does not settle them (nic_tuning.work_pending). Run on the inbox-mlx5 sample tree
(tests/samples/nic/README.md) with the samples' `ip` and iproute2's `dcb` stand-in (tests/samples/dcb/README.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

from helpers import deployment, load_plugin
from support import ROOT

from hicachectl.plans import host_files, nic_tuning

SOURCE = ROOT / "roles/nic_tuning/files/hicache-nic-tuning"
SAMPLES = ROOT / "tests/samples/nic"
DCB = ROOT / "tests/samples/dcb"


class RunsCommands:
    """What hicache_host_facts' nic_read uses of AnsibleModule: run_command, here with the sample tree's environment."""

    def __init__(self, env):
        self.env, self.argv = env, []

    def get_bin_path(self, name):
        return shutil.which(name, path=self.env["PATH"])

    def run_command(self, argv):
        self.argv.append(argv)
        proc = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60)
        return proc.returncode, proc.stdout, proc.stderr


def inbox_host(tmp_path, dcb_state=("dcb-app-dscp-prio-none.json", "dcb-pfc-prio-pfc-off.json")):
    root = tmp_path / "inbox-mlx5"
    shutil.copytree(SAMPLES / "inbox-mlx5/root", root, symlinks=True)
    state = tmp_path / "dcb-state"
    state.mkdir()
    for name, kind in zip(dcb_state, ("app", "pfc"), strict=True):
        shutil.copy(DCB / name, state / f"{kind}-ens1f0np0.json")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    env = {**os.environ, "HICACHE_SYSFS_ROOT": str(root), "HICACHE_SAMPLE_TOOL": str(SAMPLES / "inbox-mlx5/tool"),
           "HICACHE_DCB_STATE": str(state), "PATH": f"{SAMPLES / 'bin'}:{DCB / 'bin'}:{bin_dir}"}
    return env


def installed(tmp_path, text: bytes):
    program = tmp_path / "sbin/hicache-nic-tuning"
    program.parent.mkdir()
    program.write_bytes(text)
    return program


def test_the_facts_read_is_the_roles_own_read_where_the_installed_program_is_the_collections(tmp_path):
    facts = load_plugin("plugins/modules/hicache_host_facts.py")
    d = deployment("vast", storage_localports=["ens1f0np0"])
    env = inbox_host(tmp_path)
    program = installed(tmp_path, host_files.nic_program_text().encode())
    desired = json.dumps(nic_tuning.desired(d))
    module = RunsCommands(env)
    wanted = hashlib.sha256(host_files.nic_program_text().encode()).hexdigest()
    read = facts.nic_read(module, {"program": str(program), "sha256": wanted, "desired": desired})
    # python3 from PATH, as the role's own read and the boot unit run it, not the module's own interpreter
    assert module.argv == [[str(tmp_path / "bin/python3"), "-I", str(program), "--check-json", desired]] and read["desired"] == desired
    # the role's own read: the controller's copy on stdin (read.yml)
    own = subprocess.run(["python3", "-I", "-", "--check-json", desired], input=SOURCE.read_text(), env=env, capture_output=True, text=True)
    assert read["rc"] == own.returncode == 0 and json.loads(read["stdout"]) == json.loads(own.stdout)
    # the sample's ports differ (MTU, trust, PFC): the role reads and applies itself
    assert json.loads(read["stdout"])["changes"] and nic_tuning.work_pending(read, nic_tuning.desired(d))
    assert nic_tuning.nic_plan(d, read).verdict == nic_tuning.nic_plan(d, {"rc": own.returncode, "stdout": own.stdout, "stderr": ""}).verdict


def test_another_program_or_none_installed_is_never_run_and_leaves_the_read_to_the_role(tmp_path):
    facts = load_plugin("plugins/modules/hicache_host_facts.py")
    module = RunsCommands(inbox_host(tmp_path))
    wanted = hashlib.sha256(host_files.nic_program_text().encode()).hexdigest()
    older = installed(tmp_path, SOURCE.read_bytes().replace(b"TOOL_TIMEOUT = ", b"TOOL_TIMEOUT  = ", 1))
    assert facts.nic_read(module, {"program": str(older), "sha256": wanted, "desired": "{}"}) is None
    assert facts.nic_read(module, {"program": str(tmp_path / "absent"), "sha256": wanted, "desired": "{}"}) is None
    assert facts.nic_read(module, None) is None
    assert module.argv == []
    assert nic_tuning.work_pending(None, {})


def test_a_failed_or_unreadable_read_a_pending_change_or_another_desired_state_make_the_role_read_again():
    wanted = nic_tuning.desired(deployment("vast"))
    settled = {"rc": 0, "stdout": json.dumps({"changes": [], "failed": []}), "stderr": "", "desired": json.dumps(wanted)}
    assert not nic_tuning.work_pending(settled, wanted)
    assert nic_tuning.work_pending({**settled, "rc": 1, "stdout": "", "stderr": "Traceback"}, wanted)
    assert nic_tuning.work_pending({**settled, "stdout": "not json"}, wanted)
    assert nic_tuning.work_pending({**settled, "stdout": json.dumps({"changes": [{"what": "ens1f0np0 mtu"}]})}, wanted)
    # read with other variables (a play's vars, another inventory): never taken for the role's own
    assert nic_tuning.work_pending(settled, nic_tuning.desired(deployment("vast", nic_mtu=4200)))
    assert nic_tuning.work_pending({key: value for key, value in settled.items() if key != "desired"}, wanted)


def test_the_facts_ask_for_the_program_the_role_installs_with_the_roles_desired_state():
    """The role installs the file as `lookup('file')` (trailing whitespace stripped) and one newline: the SHA-256 the
    facts compare is that of what the role wrote."""
    installed_text = SOURCE.read_text().rstrip() + "\n"
    assert host_files.nic_program_text() == installed_text
    filters = load_plugin("plugins/filter/hicache.py")
    d = deployment("vast")
    variables = {k: v for k, v in d.as_vars().items() if v is not None}
    request = filters.hicache_host_reads(variables, "h", ports=True)["nic_read"]
    assert request == {"program": nic_tuning.PROGRAM, "sha256": hashlib.sha256(installed_text.encode()).hexdigest(),
                       "desired": json.dumps(nic_tuning.desired(d))}
    assert filters.hicache_nic_work_pending(None, nic_tuning.desired(d)) is True
    # invalid NIC variables: no read asked; the role, which refuses them, reads nothing either
    assert filters.hicache_host_reads({**variables, "hicache_nic_mtu": "huge"}, "h", ports=True)["nic_read"] is None
    # facts read outside site.yml (a role used alone): no ports asked for
    assert filters.hicache_host_reads(variables, "h")["nic_read"] is None


def test_only_site_yml_reads_the_ports_with_the_facts_just_before_its_nic_role():
    """A role used alone reads the facts when no one has (main.yml) and the ports itself: facts read by another role may
    be older than what that role changed (an L3 mount the ToS judgement reads). site.yml reads them in its pull play
    and again when stale, and runs nic_tuning first among the roles that change the host."""
    import yaml

    site = yaml.safe_load((ROOT / "playbooks/site.yml").read_text())

    def tasks(node):
        for task in node if isinstance(node, list) else []:
            yield task
            for key in ("block", "rescue", "always"):
                yield from tasks(task.get(key))

    reads = [t for play in site for t in tasks(play.get("tasks")) if (t.get("ansible.builtin.import_role") or {}).get("tasks_from") in ("facts", "refresh")]
    assert len(reads) == 2 and all(t["vars"]["__hicache_facts_read_ports"] is True for t in reads)
    deploy = next(play for play in site if play.get("name") == "Deploy SGLang HiCache servers")
    roles = [(t.get("ansible.builtin.import_role") or {}).get("name") for t in tasks(deploy["tasks"])]
    roles = [r for r in roles if r and r != "hicache.deploy.preflight"]
    assert roles[0] == "hicache.deploy.nic_tuning", roles
    facts = yaml.safe_load((ROOT / "roles/preflight/tasks/facts.yml").read_text())[0]
    assert "hicache_host_reads(inventory_hostname, __hicache_facts_read_ports | default(false))" in facts["hicache.deploy.hicache_host_facts"]["reads"]
