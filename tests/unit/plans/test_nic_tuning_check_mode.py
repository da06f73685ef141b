"""The nic_tuning role under ansible-playbook --check (what `hicachectl plan` runs), on this machine (connection local)
against the inbox-mlx5 sample tree (tests/samples/nic/README.md) with iproute2's dcb as its stand-in
(tests/samples/dcb/README.md): the host program reads the sample through HICACHE_SYSFS_ROOT, which the local
connection passes to it. In check mode nothing may change, and a port that differs must show as a change.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

from support import ROOT

SAMPLES = ROOT / "tests/samples/nic"
DCB = ROOT / "tests/samples/dcb"
ANSIBLE_PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
PLAY = """
- name: The NIC role alone
  hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - role: hicache.deploy.nic_tuning
"""


def test_check_mode_shows_a_port_that_differs_as_a_change_and_changes_nothing(tmp_path):
    """ansible.builtin.script does nothing in check mode and reports a skip, so `plan` showed no change for a port
    whose MTU, trust and PFC all differ (an audit found it; the role's apply task was skipped, filed as not asked for)."""
    root = tmp_path / "inbox-mlx5"
    shutil.copytree(SAMPLES / "inbox-mlx5/root", root, symlinks=True)
    state = tmp_path / "dcb-state"
    state.mkdir()
    shutil.copy(DCB / "dcb-app-dscp-prio-none.json", state / "app-ens1f0np0.json")
    shutil.copy(DCB / "dcb-pfc-prio-pfc-off.json", state / "pfc-ens1f0np0.json")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dcb").write_text(f"#!/bin/sh\nHICACHE_DCB_STATE={state} exec {sys.executable} {DCB / 'bin/dcb'} \"$@\"\n")
    (bin_dir / "dcb").chmod(0o755)
    (tmp_path / "play.yml").write_text(PLAY)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    env = {**os.environ, "HICACHE_SYSFS_ROOT": str(root), "HICACHE_SAMPLE_TOOL": str(SAMPLES / "inbox-mlx5/tool"),
           "PATH": f"{SAMPLES / 'bin'}:{bin_dir}:{os.environ['PATH']}", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FACT_CACHING": "memory"}
    variables = {"hicache_nic_interfaces": ["ens1f0np0"], "hicache_storage_type": "local", "hicache_strict": False,
                 "ansible_python_interpreter": sys.executable}
    proc = subprocess.run([ANSIBLE_PLAYBOOK, "-i", "localhost,", str(tmp_path / "play.yml"), "--check", "-e", json.dumps(variables)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
    said = re.search(r"TASK \[hicache\.deploy\.nic_tuning : Say what would change on the ports\].*?\n(changed: .*?)(?:\n\n|\Z)",
                     proc.stdout, re.S)
    assert said, proc.stdout[-5000:]
    assert "ens1f0np0 mtu" in said.group(1) and "ens1f0np0 qos trust" in said.group(1) and "ens1f0np0 qos pfc" in said.group(1), said.group(1)
    # nothing changed: the sample tree, and dcb was only read
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    calls = [json.loads(line) for line in (state / "argv.log").read_text().splitlines()]
    assert calls and all(call[1] == "-j" for call in calls), calls
