"""Which play judges a host: the servers' last play for a server, the routers' play for a router (ansible-runner's
event stream, replayed without Ansible). And the Ansible configuration a playbook runs with: the user's, found as
Ansible finds it, with hicachectl's callbacks and collection added."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from hicachectl.cli import runner
from hicachectl.cli.runner import _Collector
from hicachectl.config import paths


def play(uuid: str, pattern: str) -> dict:
    return {"event": "playbook_on_play_start", "event_data": {"play_uuid": uuid, "play_pattern": pattern}}


def ok(host: str) -> dict:
    return {"event": "runner_on_ok", "event_data": {"host": host, "task": "t", "res": {}}}


def test_a_routers_play_at_the_end_leaves_the_servers_judged_by_their_own_last_play():
    collector = _Collector(None, routers=["router-1"])
    for name in ("gpu-1", "gpu-2", "router-1"):
        collector.host(name)
    for event in (play("validate", "all"), ok("gpu-1"), ok("gpu-2"), ok("router-1"),
                  play("pull", "all:!hicache_routers"), ok("gpu-1"), ok("gpu-2"),
                  play("deploy", "all:!hicache_routers"), ok("gpu-1"),  # a stopped rollout: gpu-2 never deployed
                  play("routers", "hicache_routers"), ok("router-1")):
        collector(event)
    assert {h: r.status for h, r in collector.hosts.items()} == {"gpu-1": "ok", "gpu-2": "not run", "router-1": "ok"}


def test_a_router_the_routers_play_never_reached_is_not_run():
    collector = _Collector(None, routers=["router-1"])
    for event in (play("validate", "all"), ok("gpu-1"), ok("router-1"), play("deploy", "all:!hicache_routers"), ok("gpu-1"),
                  play("routers", "hicache_routers")):
        collector(event)
    assert {h: r.status for h, r in collector.hosts.items()} == {"gpu-1": "ok", "router-1": "not run"}


def test_a_router_named_only_by_validate_before_a_stopped_rollout_is_not_run():
    collector = _Collector(None, routers=["router-1"])
    for event in (play("validate", "all"), ok("router-1"), ok("gpu-1"),  # validate's run-once tasks name the first host
                  play("deploy", "all:!hicache_routers"), {"event": "runner_on_failed", "event_data": {"host": "gpu-1", "task": "t", "res": {}}}):
        collector(event)
    assert collector.hosts["router-1"].status == "not run"


def test_a_gap_keeps_whether_the_host_was_read_and_why_it_is_tolerated():
    """hicache_gap's hicache_gap_outcome reaches the host's gaps (verify tells a tolerated failure from a check not
    made by it); a gap of a module that says neither (hicache_kernel_values) is a check not made under hicache_strict."""
    collector = _Collector(None)
    collector(play("deploy", "all"))
    collector({"event": "runner_on_ok", "event_data": {"host": "gpu-1", "task": "Report a ToS", "res": {
        "hicache_gaps": ["eth0 roce tos: set, not yet in effect"], "hicache_gap_outcome": {"checked": True, "why_tolerated": "its fix stops the server"}}}})
    collector({"event": "runner_on_ok", "event_data": {"host": "gpu-1", "task": "Set the values", "res": {"hicache_gaps": ["vm.x: read-only"]}}})
    tos, values = collector.hosts["gpu-1"].gaps
    assert (tos.task, tos.reason, tos.checked, tos.why_tolerated) == ("Report a ToS", "eth0 roce tos: set, not yet in effect", True, "its fix stops the server")
    assert (values.checked, values.why_tolerated) == (False, "hicache_strict is false")
    assert tos.as_dict() == {"task": "Report a ToS", "reason": "eth0 roce tos: set, not yet in effect"}  # the JSON shape kept


def test_a_failed_loop_item_is_named_in_the_reason():
    collector = _Collector(None)
    collector(play("deploy", "all"))
    collector({"event": "runner_item_on_failed", "event_data": {"host": "gpu-1", "task": "Remove it from each router",
                                                                "res": {"msg": "timed out", "_ansible_item_label": "router-2"}}})
    assert collector.hosts["gpu-1"].reasons == ["Remove it from each router (router-2): timed out"]


# --- the Ansible configuration playbooks run with (issue #24, item 3) --------------------------------------------
# hicachectl.config.paths.ansible_config mirrors Ansible's own lookup (ansible-core lib/ansible/config/manager.py
# find_ini_config_file); each layout is held to what that function itself answers, run in a fresh process.

ANSIBLES_OWN = "import json; from ansible.config.manager import find_ini_config_file; print(json.dumps(find_ini_config_file()))"


def ansible_finds(cwd: pathlib.Path, env: dict) -> str | None:
    clean = {k: v for k, v in os.environ.items() if k != "ANSIBLE_CONFIG"}
    out = subprocess.run([sys.executable, "-c", ANSIBLES_OWN], cwd=cwd, env={**clean, **env}, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def layout(tmp_path: pathlib.Path, name: str) -> tuple[pathlib.Path, dict]:
    """A working directory and an environment (HOME, maybe ANSIBLE_CONFIG) of one kind of setup."""
    home, work, elsewhere = tmp_path / "home", tmp_path / "work", tmp_path / "elsewhere"
    for d in (home, work, elsewhere):
        d.mkdir()
    env = {"HOME": str(home)}
    if name in ("env-file", "env-dir", "env-missing"):
        (elsewhere / "ansible.cfg").write_text("[defaults]\n")
        (work / "ansible.cfg").write_text("[defaults]\n")
        env["ANSIBLE_CONFIG"] = {"env-file": str(elsewhere / "ansible.cfg"), "env-dir": str(elsewhere),
                                 "env-missing": str(elsewhere / "none.cfg")}[name]
    elif name in ("cwd", "cwd-world-writable"):
        (work / "ansible.cfg").write_text("[defaults]\n")
        (home / ".ansible.cfg").write_text("[defaults]\n")
        if name == "cwd-world-writable":
            work.chmod(0o777)
    elif name == "home":
        (home / ".ansible.cfg").write_text("[defaults]\n")
    return work, env


@pytest.mark.parametrize("name", ["env-file", "env-dir", "env-missing", "cwd", "cwd-world-writable", "home", "none"])
def test_the_ansible_cfg_in_effect_is_the_one_ansibles_own_lookup_finds(tmp_path, name):
    work, env = layout(tmp_path, name)
    found = paths.ansible_config({**{k: v for k, v in os.environ.items() if k != "ANSIBLE_CONFIG"}, **env}, str(work))
    expected = ansible_finds(work, env)
    if expected is None and not pathlib.Path("/etc/ansible/ansible.cfg").exists():
        assert found.own and found.path == paths.ANSIBLE_CFG  # nothing of the user's: hicachectl's defaults
    else:
        assert str(found.path) == expected and not found.own
    assert {"env-file": "ANSIBLE_CONFIG", "env-dir": "ANSIBLE_CONFIG", "env-missing": "./ansible.cfg", "cwd": "./ansible.cfg",
            "cwd-world-writable": "~/.ansible.cfg", "home": "~/.ansible.cfg", "none": paths.OWN_CONFIG}[name] == found.found_by


def test_the_users_ansible_cfg_is_used_with_hicachectls_callbacks_and_collection_added_not_instead(tmp_path, monkeypatch):
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text("[defaults]\ncallback_plugins = my_callbacks\ncallbacks_enabled = my_timer\ncollections_path = my_collections\n"
                   "forks = 7\n[ssh_connection]\nssh_args = -o ProxyJump=bastion.example.com\n")
    for name in ("ANSIBLE_CALLBACK_PLUGINS", "ANSIBLE_CALLBACKS_ENABLED", "ANSIBLE_COLLECTIONS_PATH"):
        monkeypatch.delenv(name, raising=False)
    settings = runner.ansible_settings(paths.AnsibleConfigFile(cfg, "./ansible.cfg"))
    assert settings["ANSIBLE_CONFIG"] == str(cfg)  # the user's file: its forks, ssh_args, become, vault ids hold
    assert settings["ANSIBLE_CALLBACK_PLUGINS"].split(os.pathsep) == [str(paths.CALLBACK_PLUGINS), str(tmp_path / "my_callbacks")]
    assert settings["ANSIBLE_CALLBACKS_ENABLED"].split(",") == ["my_timer", *runner.HICACHE_CALLBACKS]
    assert settings["ANSIBLE_COLLECTIONS_PATH"].split(os.pathsep) == [str(paths.collections_dir()), str(tmp_path / "my_collections")]
    # The user's ANSIBLE_* variable is above their file (Ansible's precedence): it is what ours join.
    monkeypatch.setenv("ANSIBLE_CALLBACKS_ENABLED", "their_env_callback")
    assert runner.ansible_settings(paths.AnsibleConfigFile(cfg, "./ansible.cfg"))["ANSIBLE_CALLBACKS_ENABLED"].split(",") == [
        "their_env_callback", *runner.HICACHE_CALLBACKS]


def test_a_playbook_runs_with_the_users_ansible_cfg_found_from_hicachectls_working_directory(tmp_path, monkeypatch):
    """End to end through ansible-runner, which starts ansible-playbook in the playbooks' directory: a callback the
    user's ./ansible.cfg enables (from a directory it names) runs, and so do hicachectl's (the skips file is read)."""
    work = tmp_path / "ops"
    (work / "callbacks").mkdir(parents=True)
    marker = tmp_path / "the-users-callback-ran"
    (work / "callbacks" / "users_marker.py").write_text(
        "from ansible.plugins.callback import CallbackBase\n"
        "class CallbackModule(CallbackBase):\n"
        "    CALLBACK_VERSION = 2.0\n    CALLBACK_TYPE = 'aggregate'\n    CALLBACK_NAME = 'users_marker'\n    CALLBACK_NEEDS_ENABLED = True\n"
        f"    def v2_playbook_on_start(self, playbook):\n        open({str(marker)!r}, 'w').write('ran')\n")
    (work / "ansible.cfg").write_text("[defaults]\ncallback_plugins = callbacks\ncallbacks_enabled = users_marker\n")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    box:\n      ansible_connection: local\n      ansible_python_interpreter: " + sys.executable + "\n")
    for name in ("ANSIBLE_CONFIG", "ANSIBLE_CALLBACK_PLUGINS", "ANSIBLE_CALLBACKS_ENABLED"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(work)
    result = runner.run_playbook("unlock.yml", inventory, hosts=["box"], extravars={"__hicache_run_id": "test-run"})
    assert marker.read_text() == "ran"
    assert result.hosts["box"].status == "ok", result.hosts["box"]
