"""site.yml plans every role of a host in one step (two: the pull play's and the deploy play's), and enters each role
past its own plan. Each value it sets must be the text of the role's own plan (roles/*/tasks/plan.yml, preflight's
judge.yml), which a role used on its own runs: one plan, written in the role, copied into site.yml for speed only.
These tests fail when the two drift apart, when a role's plan sets something site.yml does not, and when site.yml
enters a role anywhere but past its plan."""

from __future__ import annotations

import pathlib
import re

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
SITE = ROOT / "playbooks/site.yml"

# The role plans site.yml sets in one step, by the play that does it; the file of each role that holds its plan.
PLANS = {
    "Plan the server image and the model weights": {"sglang_image": "plan.yml", "model": "plan.yml"},
    "Judge the host and plan every role on it": {"preflight": "judge.yml", "nic_tuning": "plan.yml", "storage": "plan.yml",
                                                 "host_limits": "plan.yml", "container_runtime": "plan.yml",
                                                 "sglang_server": "plan.yml"},
}
# Where site.yml enters each role once its plan is set: the tasks after the plan.
ENTRIES = {"sglang_image": "converge", "model": "converge", "preflight": "require", "nic_tuning": "converge",
           "storage": "converge", "host_limits": "converge", "container_runtime": "converge", "sglang_server": "converge"}


def _tasks(items):
    """Every task of a task list, the tasks of blocks (block, rescue, always) included."""
    for item in items or []:
        yield item
        for part in ("block", "rescue", "always"):
            yield from _tasks(item.get(part))


def _site_tasks():
    return [task for play in yaml.safe_load(SITE.read_text()) for task in _tasks(play.get("tasks"))]


def _text(value) -> str:
    return re.sub(r"\s+", " ", str(value)).strip()


def _role_plan(role: str, file: str) -> tuple[dict, dict]:
    """The set_fact of the role's plan file: what it sets and the task's vars."""
    tasks = [t for t in yaml.safe_load((ROOT / "roles" / role / "tasks" / file).read_text()) if "ansible.builtin.set_fact" in t]
    assert len(tasks) == 1, f"roles/{role}/tasks/{file}: one set_fact expected, found {len(tasks)}"
    return tasks[0]["ansible.builtin.set_fact"], tasks[0].get("vars") or {}


@pytest.mark.parametrize("name", list(PLANS))
def test_site_sets_each_roles_plan_as_the_role_writes_it(name):
    site = [t for t in _site_tasks() if t.get("name") == name]
    assert len(site) == 1, f"site.yml has no single task named {name!r}"
    facts, site_vars = site[0]["ansible.builtin.set_fact"], site[0].get("vars") or {}
    expected = {}
    for role, file in PLANS[name].items():
        role_facts, role_vars = _role_plan(role, file)
        for key, value in role_facts.items():
            assert key not in expected, f"{key} is set by two roles' plans"
            expected[key] = value
        for key, value in role_vars.items():  # a helper the plan's values read (storage's plan before its live mount)
            assert key in site_vars, f"site.yml's {name!r} lacks the vars {key} of roles/{role}/tasks/{file}"
            assert _text(site_vars[key]) == _text(value), f"site.yml's {key} is not roles/{role}/tasks/{file}'s"
    assert sorted(facts) == sorted(expected), f"site.yml's {name!r} sets {sorted(facts)}, the roles' plans {sorted(expected)}"
    for key, value in expected.items():
        assert _text(facts[key]) == _text(value), f"site.yml's {key} differs from its role's plan:\n  {facts[key]}\n  {value}"
    # Whatever --tags or --skip-tags: a task of any role may read them.
    # (A step tagged with two roles' tags would be skipped whole by --skip-tags of either, failing the other role.)
    assert "always" in site[0].get("tags", [])


def test_site_enters_each_planned_role_past_its_plan():
    entered = {}
    for task in _site_tasks():
        imported = task.get("ansible.builtin.import_role") or task.get("ansible.builtin.include_role")
        if imported and imported["name"].removeprefix("hicache.deploy.") in ENTRIES:
            entered.setdefault(imported["name"].removeprefix("hicache.deploy."), []).append(imported.get("tasks_from", "main"))
    assert {role: sorted(set(entries) - {"facts", "refresh"}) for role, entries in entered.items()} == \
        {role: [entry] for role, entry in ENTRIES.items()}


@pytest.mark.parametrize("role", [r for r, entry in ENTRIES.items() if entry == "converge"])
def test_a_role_used_on_its_own_plans_then_converges(role):
    """apply.yml (main.yml's, after the host facts) is the role's plan and then converge.yml: nothing else, so that
    site.yml, entering at converge.yml after its own planning, runs the same tasks."""
    apply = yaml.safe_load((ROOT / "roles" / role / "tasks/apply.yml").read_text())
    assert [next(v for k, v in t.items() if k.endswith("import_tasks")) for t in apply] == ["plan.yml", "converge.yml"]
