"""What a CI job can gate on: plan --detailed-exitcode's code from a dry run's per-host results, and the servers'
order that keeps a no-op plan clean (issue #34)."""

from __future__ import annotations

import pathlib
import re

import pytest

from hicachectl.cli.common import REFUSAL_FACT, plan_exit_code
from hicachectl.cli.runner import HostResult, Record, RunResult
from hicachectl.config.inventory import ROUTERS, server_hosts

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run(*hosts: HostResult, rc: int = 0) -> RunResult:
    return RunResult(rc, {h.host: h for h in hosts})


def test_nothing_to_change_is_0_pending_changes_2():
    assert plan_exit_code(run(HostResult("a", ok=9, reached=True), HostResult("b", ok=9, reached=True))) == 0
    assert plan_exit_code(run(HostResult("a", ok=9, reached=True), HostResult("b", ok=9, changed=1, reached=True))) == 2


def test_a_gap_tolerated_by_the_inventory_is_not_a_change():
    degraded = HostResult("a", ok=9, reached=True, gaps=[Record("Check the GPUs", "nvidia-smi not found")])
    assert plan_exit_code(run(degraded)) == 0


@pytest.mark.parametrize("host", [
    HostResult("a", ok=3, failed=1, reached=True, failures=[Record("Pull", "no such image")]),
    HostResult("a", unreachable=True, failures=[Record("unreachable", "ssh: connect refused")]),
    HostResult("a"),  # never reached
    HostResult("a", ok=9, changed=2, reached=True, facts={REFUSAL_FACT: "a downgrade; deploy refuses it without --allow-downgrade"}),
], ids=["failed", "unreachable", "not run", "deploy would refuse"])
def test_an_error_or_a_change_deploy_would_refuse_is_1(host):
    assert plan_exit_code(run(host, HostResult("b", ok=9, changed=1, reached=True))) == 1


def test_an_interrupted_run_is_1():
    assert plan_exit_code(RunResult(0, {"a": HostResult("a", ok=1, reached=True)}, interrupted="SIGINT")) == 1


def test_the_servers_keep_the_inventorys_order_each_once_without_the_routers():
    groups = {"all": ["gpu-10", "router-b", "gpu-02", "gpu-33", "router-a", "gpu-01", "gpu-02"], ROUTERS: ["router-a", "router-b"],
              "hicache_servers": ["gpu-33"]}
    assert server_hosts(groups) == ["gpu-10", "gpu-02", "gpu-33", "gpu-01"]
    assert server_hosts({"all": ["b", "a"]}) == ["b", "a"]  # no router group


def test_no_host_list_goes_through_a_set_based_filter():
    """Ansible's difference, union, intersect and symmetric_difference filters return list(set(...))
    (ansible/plugins/filter/mathstuff.py), whose order changes with the hash seed from run to run: a list of hosts built
    with them reordered the router's workers file, so a no-op deploy reported a change and plan was never clean."""
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for path in sorted([*ROOT.glob("roles/*/tasks/*.yml"), *ROOT.glob("roles/*/templates/*"), *ROOT.glob("playbooks/*.yml")])
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"\|\s*(difference|union|intersect|symmetric_difference)\b", line)]
    assert found == [], found


def test_with_the_flag_an_error_before_the_plan_is_1_never_the_2_of_pending_changes(tmp_path):
    """An operator's try: an inventory that does not exist, or a vault password file that does not, exited 2 ("changes
    pending") under --detailed-exitcode, and docs/operations.md's gate then deployed. Without the flag: 2 (usage)."""
    from support import cli

    missing = str(tmp_path / "nosuchinv")
    assert cli("plan", "-i", missing, "--detailed-exitcode").returncode == 1
    assert cli("plan", "-i", "local", "--vault-password-file", str(tmp_path / "nofile"), "--detailed-exitcode").returncode == 1
    assert cli("plan", "-i", missing).returncode == 2
