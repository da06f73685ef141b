"""`hicachectl deploy` against three real hosts over SSH (systemd containers), as a user runs it."""

from __future__ import annotations

import re

import pytest
from support import cli, cli_json

pytestmark = pytest.mark.slow


def table_row(stdout: str, host: str) -> str:
    """The host's row of the table, with the continuation lines its wrapped reason column takes (indented), one line."""
    match = re.search(rf"^{re.escape(host)}\s+(.*(?:\n[ \t]+\S.*)*)$", stdout, re.M)
    assert match, stdout
    return " ".join(match.group(1).split())


def test_deploy_converges_then_changes_nothing(fleet3):
    inventory = fleet3.inventory()  # the local profile tolerates what these hosts lack (no GPU): degraded, never ok
    first = cli("deploy", "--inventory", str(inventory), check_rc=0)
    for host in fleet3.hosts:
        assert table_row(first.stdout, host).startswith("degraded"), first.stdout
        assert "gpus: nvidia-smi not found" in table_row(first.stdout, host)
        assert f"{host}: Install start.sh, run.sh, serve.sh and the backend config ... changed" in first.stderr  # live progress
        on_host = fleet3.ssh(host, "cat /opt/sglang-hicache/cfg/start.sh; test -x /opt/sglang-hicache/cfg/run.sh")
        assert on_host.returncode == 0 and "--hicache-storage-backend file" in on_host.stdout
        # what the Molecule scenario of the whole site checked before this test was the one converge of site.yml through
        # hicachectl: the inventory's model, run.sh's mode, and both scripts parse in the host's bash
        assert "--model-path openai/gpt-oss-20b" in on_host.stdout
        scripts = fleet3.ssh(host, "stat -c %a /opt/sglang-hicache/cfg/run.sh && bash -n /opt/sglang-hicache/cfg/start.sh /opt/sglang-hicache/cfg/run.sh")
        assert scripts.returncode == 0 and scripts.stdout.split() == ["755"], scripts.stdout + scripts.stderr
    second = cli_json("deploy", "--inventory", str(inventory))
    assert second["ok"] and {h: r["changed"] for h, r in second["hosts"].items()} == dict.fromkeys(fleet3.hosts, 0)
    assert {r["status"] for r in second["hosts"].values()} == {"degraded"}


def test_a_stopped_host_fails_alone_and_converges_when_back(fleet3):
    hosts = list(fleet3.hosts)
    inventory = fleet3.inventory(extra_vars={"hicache_port": 30001})
    fleet3.stop(hosts[1])
    try:
        run = cli("deploy", "--inventory", str(inventory))
        assert run.returncode == 1, run.stdout + run.stderr
        assert table_row(run.stdout, hosts[1]).startswith("unreachable")
        assert "unreachable:" in table_row(run.stdout, hosts[1])  # the reason, in the host's row
        for host in (hosts[0], hosts[2]):
            assert table_row(run.stdout, host).startswith("degraded")
            assert "--port 30001" in fleet3.ssh(host, "cat /opt/sglang-hicache/cfg/start.sh").stdout
    finally:
        fleet3.start(hosts[1])
    again = cli_json("deploy", "--inventory", str(inventory))
    assert again["ok"]
    assert again["hosts"][hosts[1]]["changed"] > 0 and again["hosts"][hosts[0]]["changed"] == 0
    assert "--port 30001" in fleet3.ssh(hosts[1], "cat /opt/sglang-hicache/cfg/start.sh").stdout


def test_plan_over_ssh_changes_nothing(fleet3):
    inventory = fleet3.inventory(extra_vars={"hicache_port": 30002})
    report = cli_json("plan", "--inventory", str(inventory))
    assert report["ok"] and all(r["changed"] > 0 for r in report["hosts"].values())
    host = next(iter(fleet3.hosts))
    assert "--port 30002" not in fleet3.ssh(host, "cat /opt/sglang-hicache/cfg/start.sh").stdout
