"""The typed plans (hicachectl/plans/, one module per role), the one-step file module (hicache_files) and the one-task check
(hicache_gap's `tolerated`): the plans answer "can it run here" from the host facts; the module writes what differs
once, reports each labelled file it changed and changes nothing on a second run or in check mode."""

from __future__ import annotations

import grp
import json
import os
import pwd
import subprocess
import sys

import pytest
import yaml
from support import ROOT

from hicachectl import rules
from hicachectl.cli.runner import _changes
from hicachectl.plans import container_runtime, model, sglang_image, sglang_server
from hicachectl.plans.plan import as_fact

ANSIBLE_PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
# Whoever runs the tests owns the files: by name, and by numeric id (as hicache_cache_owner may give it).
OWNER = {"user": pwd.getpwuid(os.getuid()).pw_name, "group": grp.getgrgid(os.getgid()).gr_name,
         "uid": str(os.getuid()), "gid": str(os.getgid())}
LOCAL = yaml.safe_load((ROOT / "inventories/local/group_vars/all.yml").read_text())


def deployment(role: str, **overrides):
    d, findings = rules.check_host("h", {**LOCAL, **overrides}, role)
    assert not rules.has_errors(findings), [f.format() for f in findings]
    return d


def facts(*tools: str, systemd: bool = True) -> dict:
    return {"tools": {t: f"/usr/bin/{t}" for t in tools}, "systemd": systemd, "block_ids": {}}


def test_the_server_plan_says_why_no_server_can_run_here():
    d = deployment("sglang_server", hicache_container_runtime="podman")
    assert sglang_server.server_plan(d, facts=facts("podman")).cannot_run == ""
    assert sglang_server.server_plan(d, facts=facts()).cannot_run == "podman is not installed on this host"
    assert sglang_server.server_plan(d, facts=facts("podman", systemd=False)).cannot_run.startswith("systemd does not run this host")
    assert sglang_server.server_plan(d).cannot_run == ""  # without facts nothing is claimed either way
    on_host = deployment("sglang_server", hicache_container_runtime="none", hicache_cache_container_dir=None, hicache_model_dir=None)
    assert sglang_server.server_plan(on_host, facts=facts()).cannot_run == ""


def test_the_public_files_are_every_file_without_a_secret_backed_up():
    plan = as_fact(sglang_server.server_plan(deployment("sglang_server")))
    assert {f["label"] for f in plan["public_files"]} == {f["name"] for f in plan["files"] if not f["secret"]}
    assert all(f["backup"] and f["path"] == f"{plan['cfg_dir']}/{f['label']}" for f in plan["public_files"])
    json.dumps(plan)  # what set_fact keeps: plain data


def test_files_are_backed_up_only_over_files_the_toolkit_did_not_write():
    """#34: every change left a `run.sh.<pid>.<date>~` in cfg/ (11 after 5 changes), copied on into cfg.previous.
    Once our installed.json is there, cfg.previous is the one previous config, and no backup is made."""
    d = deployment("sglang_server")
    installed = f"{d.cfg_dir}/installed.json"
    ours = as_fact(sglang_server.server_plan(d, facts={**facts(), "files": {installed: '{"config_hash": "abc"}'}}))
    assert ours["public_files"] and not any(f["backup"] for f in ours["public_files"])
    for unknown in ({**facts(), "files": {installed: None}}, {**facts(), "files": {}}, None):  # absent, not read, no facts
        assert all(f["backup"] for f in as_fact(sglang_server.server_plan(d, facts=unknown))["public_files"]), unknown


def test_runtime_image_and_model_plans_read_the_host_facts():
    runtime = deployment("container_runtime", hicache_container_runtime="docker")
    assert container_runtime.runtime_plan(runtime, facts("docker", "nvidia-ctk")).missing == ""
    assert container_runtime.runtime_plan(runtime, facts("nvidia-ctk")).missing == "docker is not installed on this host"
    assert "nvidia-ctk" in container_runtime.runtime_plan(runtime, facts("docker")).missing
    image = deployment("sglang_image", hicache_container_runtime="docker")
    assert sglang_image.image_plan(image, facts("docker")).runtime_found is True
    assert sglang_image.image_plan(image, facts()).runtime_found is False
    weights = deployment("model")
    assert model.model_plan(weights, facts("hf")).hub_client_found is True and model.model_plan(weights, facts()).hub_client_found is False


def test_a_module_that_changed_several_files_reports_each_by_label():
    res = {"changed": True, "changed_items": ["start.sh", "run.sh"],
           "diff": [{"after_header": "/opt/x/cfg/start.sh", "after": "a"}, {"after_header": "/opt/x/cfg/run.sh", "after": "b"}]}
    changes = _changes("Install", res, "runner_on_ok")
    assert [(c.task, c.item) for c in changes] == [("Install", "start.sh"), ("Install", "run.sh")]
    assert [d["after"] for d in changes[0].diff] == ["a"]
    assert [(c.task, c.item) for c in _changes("Create", {"changed": True, "changed_items": []}, "runner_on_ok")] == [("Create", None)]


PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Lay down
      hicache.deploy.hicache_files:
        directories:
          - {path: "{{ base }}/etc", owner: "{{ user }}", group: "{{ group }}", mode: "0750"}
        files:
          - {path: "{{ base }}/etc/a.conf", content: "{{ a }}", owner: "{{ user }}", group: "{{ group }}", mode: "0640", backup: true, label: a.conf}
          - {path: "{{ base }}/etc/b.conf", content: "b\\n", owner: "{{ user }}", group: "{{ group }}", mode: "0644"}
          - {path: "{{ base }}/etc/link.conf", content: "l\\n", owner: "{{ uid }}", group: "{{ gid }}", mode: "0600"}
        absent: ["{{ base }}/etc/old.env"]
      register: laid
    - name: Keep the result
      ansible.builtin.copy:
        content: "{{ laid | to_json }}"
        dest: "{{ base }}/result.json"
        mode: "0600"
      check_mode: false
"""


@pytest.fixture
def play(tmp_path):
    (tmp_path / "play.yml").write_text(PLAYBOOK)

    def run(*args: str, a: str = "a\n") -> tuple[subprocess.CompletedProcess, dict]:
        proc = subprocess.run([ANSIBLE_PLAYBOOK, "-i", "localhost,", str(tmp_path / "play.yml"), "-e", f"base={tmp_path} ansible_python_interpreter={sys.executable}",
                               "-e", json.dumps({"a": a, **OWNER}), *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc, json.loads((tmp_path / "result.json").read_text())
    return run


def test_the_file_module_writes_once_keeps_a_backup_and_changes_nothing_in_check_mode(play, tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/a.conf").write_text("hand-made\n")
    (tmp_path / "etc/old.env").write_text("SECRET=1\n")
    (tmp_path / "real.conf").write_text("x\n")
    (tmp_path / "etc/link.conf").symlink_to(tmp_path / "real.conf")  # a symlinked file: written through, the link kept
    _, first = play()
    assert first["changed"] and first["changed_items"] == ["a.conf", "old.env"]
    assert (tmp_path / "etc/a.conf").read_text() == "a\n" and oct((tmp_path / "etc/a.conf").stat().st_mode & 0o777) == "0o640"
    assert oct((tmp_path / "etc").stat().st_mode & 0o777) == "0o750" and not (tmp_path / "etc/old.env").exists()
    assert [p.read_text() for p in (tmp_path / "etc").glob("a.conf.*")] == ["hand-made\n"]  # the previous content is kept
    assert (tmp_path / "etc/link.conf").is_symlink() and (tmp_path / "real.conf").read_text() == "l\n"
    _, second = play()
    assert not second["changed"] and second["changed_items"] == []
    proc, checked = play("--check", "--diff", a="new\n")
    assert checked["changed"] and checked["changed_items"] == ["a.conf"] and "+new" in proc.stdout
    assert (tmp_path / "etc/a.conf").read_text() == "a\n"  # check mode wrote nothing


LOCAL_PLAY = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
"""
GAP_PLAYBOOK = LOCAL_PLAY + """    - name: Check it
      hicache.deploy.hicache_gap:
        reason: "{{ reason }}"
        strict: "{{ strict }}"
        tolerated: "{{ tolerated }}"
"""


def gap_play(tmp_path, playbook: str, *args: str) -> subprocess.CompletedProcess:
    """`playbook` (hicache_gap tasks on localhost) run by the real ansible-playbook with the project's configuration."""
    (tmp_path / "gap.yml").write_text(playbook)
    return subprocess.run([ANSIBLE_PLAYBOOK, "-i", "localhost,", str(tmp_path / "gap.yml"), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")})


@pytest.mark.parametrize("strict, tolerated, failed", [(False, True, False), (True, True, True), (False, False, True)])
def test_one_check_task_is_a_gap_or_a_failure(tmp_path, strict, tolerated, failed):
    proc = gap_play(tmp_path, GAP_PLAYBOOK, "-e", json.dumps({"reason": "nothing is mounted at /mnt/x", "strict": strict, "tolerated": tolerated}))
    assert (proc.returncode != 0) == failed, proc.stdout
    assert "nothing is mounted at /mnt/x" in proc.stdout + proc.stderr
    assert ("degraded (hicache_strict is false)" in proc.stdout + proc.stderr) == (not failed)


def test_a_gap_the_role_always_tolerates_says_why_and_whether_the_host_was_read(tmp_path):
    """A driver gap or a ToS not in effect is tolerated whatever hicache_strict says: the warning says why, not
    "hicache_strict is false", and the result tells hicachectl a check made and not met from a check not made."""
    proc = gap_play(tmp_path, LOCAL_PLAY + """    - name: Check it
      hicache.deploy.hicache_gap:
        reason: "eth0 roce tos: set, not yet in effect on /mnt/x"
        strict: false
        checked: true
        why_tolerated: its fix interrupts the server
      register: gap
    - name: Show it
      ansible.builtin.debug:
        msg: "outcome {{ gap.hicache_gap_outcome | to_json }}"
""")
    assert proc.returncode == 0, proc.stdout
    said = " ".join((proc.stdout + proc.stderr).split())
    assert "degraded (its fix interrupts the server): eth0 roce tos" in said and "hicache_strict is false" not in said
    assert 'outcome {"checked": true, "why_tolerated": "its fix interrupts the server"}' in proc.stdout.replace('\\"', '"')
