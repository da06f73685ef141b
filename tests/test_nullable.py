"""null in an inventory: "not set" where a variable's default is None, "leave the setting as the host has it" where
the catalogue says None leaves it (schema.Var.nullable), refused everywhere else, by validate and by Ansible alike.

Ansible's role argument validation (ansible/module_utils/common/parameters.py, ansible-core 2.19) checks the type of
a null unless the option has no default (_validate_argument_types), and checks a null against `choices` whatever the
default (_validate_argument_values): the generated argument_specs must let the nulls the catalogue allows through,
with the real defaults still in them for ansible-doc (tests/test_collection.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from support import ROOT

from hicachectl import rules
from hicachectl.config import schema

ANSIBLE_PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
# What the NIC variables' descriptions say null leaves (issue 22's VM test set the first three)
NIC_NULLS = ("hicache_nic_rings", "hicache_nic_qos_trust", "hicache_nic_cpu_governor", "hicache_nic_roce_dscp",
             "hicache_nic_max_read_request", "hicache_nic_channels")


def spec_options(role: str) -> dict:
    """The role's real meta/argument_specs.yml, as Ansible reads it for its "Validating arguments" task."""
    path = ROOT / "roles" / role / "meta" / "argument_specs.yml"
    return yaml.safe_load(path.read_text())["argument_specs"]["main"]["options"]


def ansible_errors(role: str, values: dict) -> list[str]:
    """What the role's own argument validation says of `values` over the role's defaults (as a play sees them):
    the validate_argument_spec action's call (ansible/plugins/action/validate_argument_spec.py)."""
    params = schema.role_defaults(role) | values
    return ArgumentSpecValidator(spec_options(role)).validate(params, validate_role_argument_spec=True).error_messages


def validate_errors(values: dict) -> list[str]:
    return [f.format() for f in rules.check_variables("h", values, scope=set()) if f.level == rules.ERROR]


def test_the_nic_variables_that_say_none_leaves_take_null():
    assert all(schema.BY_NAME[name].takes_none for name in NIC_NULLS)
    for var in schema.VARIABLES:
        if "None leaves" in var.doc:
            assert var.takes_none, f"{var.name} says None leaves it, but the catalogue does not take null"
        if var.nullable:  # null differs from "not set" only where the default is not None
            assert var.default is not None and "None leaves" in var.doc, var.name


@pytest.mark.parametrize("role, name", [("nic_tuning", n) for n in NIC_NULLS]
                         + [(r, "hicache_storage_sunrpc_slots") for r in ("storage", "preflight")])
def test_the_real_spec_file_takes_the_null_of_a_setting_left_alone(role, name):
    """The VM test's failure (issue 21/22): `hicache_nic_rings: null` refused at "Validating arguments" by Ansible's
    own validation of roles/nic_tuning/meta/argument_specs.yml ("argument 'hicache_nic_rings' is of type NoneType and
    we were unable to convert to int"; a null qos_trust or governor: "must be one of")."""
    assert [e for e in ansible_errors(role, {name: None}) if name in e] == []


@pytest.mark.parametrize("role", schema.ROLES)
def test_the_role_argument_spec_takes_null_where_the_catalogue_does(role):
    """Every null the catalogue takes, in every role: "None leaves it", and "not set" (a default of None) too, which
    the choices refused (hicache_nic_max_read_request, hicache_sglang_version...)."""
    refused = {}
    for var in schema.role_variables(role):
        if var.takes_none:
            errors = [e for e in ansible_errors(role, {var.name: None}) if var.name in e]
            if errors:
                refused[var.name] = errors[0]
    assert not refused, refused


@pytest.mark.parametrize("role", schema.ROLES)
def test_validate_refuses_every_null_the_role_refuses(role):
    """Never `validate` ok and then the deploy refused at the role's first task: a null the catalogue does not take is
    refused by validate, one line naming the variable and the default it gets without the line."""
    by_ansible, by_validate = set(), set()
    for var in schema.role_variables(role):
        if [e for e in ansible_errors(role, {var.name: None}) if var.name in e]:
            by_ansible.add(var.name)
        mine = validate_errors({var.name: None})
        if mine:
            assert len(mine) == 1 and "[null]" in mine[0] and repr(var.default) in mine[0], (var.name, mine)
            by_validate.add(var.name)
    assert by_ansible <= by_validate, sorted(by_ansible - by_validate)
    assert by_validate == {v.name for v in schema.role_variables(role) if not v.takes_none and not v.required}


def test_null_is_taken_by_validate_where_the_catalogue_takes_it():
    values = {var.name: None for var in schema.VARIABLES if var.takes_none}
    assert validate_errors(values) == []


def test_value_in_keeps_a_null_that_leaves_the_setting_and_defaults_the_rest():
    # hicache_nic_roce_dscp: a setting with a real default that null leaves (hicache_nic_rings was the example until its
    # default became None, #34)
    dscp, mtu, channels = (schema.BY_NAME[n] for n in ("hicache_nic_roce_dscp", "hicache_nic_mtu", "hicache_nic_channels"))
    assert schema.value_in({}, dscp) == 26  # not set: the default
    assert schema.value_in({"hicache_nic_roce_dscp": None}, dscp) is None  # null: left as it is
    assert schema.value_in({"hicache_nic_roce_dscp": 10}, dscp) == 10
    assert schema.value_in({"hicache_nic_rings": None}, schema.BY_NAME["hicache_nic_rings"]) is None  # its default: left
    assert schema.value_in({"hicache_nic_mtu": None}, mtu) == 9000  # validate refuses it; the default if it got here
    assert schema.value_in({"hicache_nic_channels": None}, channels) is None and schema.value_in({}, channels) is None
    assert schema.value_in({}, schema.BY_NAME["hicache_image"]) is None  # required: no default


def test_the_spec_keeps_the_real_default_and_says_the_type():
    options = spec_options("nic_tuning")
    assert options["hicache_nic_roce_dscp"]["default"] == 26 and options["hicache_nic_qos_trust"]["default"] == "dscp"
    assert options["hicache_nic_roce_dscp"]["type"] == "raw" and "Type: int, or null." in options["hicache_nic_roce_dscp"]["description"]
    assert options["hicache_nic_qos_trust"]["choices"] == ["dscp", "pcp", None]
    assert options["hicache_nic_mtu"]["type"] == "int"  # a variable without a null of its own keeps Ansible's type check
    assert ansible_errors("nic_tuning", {"hicache_nic_qos_trust": "cos"})  # the choices still hold for a value


def test_the_role_passes_validating_arguments_with_the_nulls(tmp_path):
    """ansible-playbook itself: the role hicache.deploy.nic_tuning with the nulls, in check mode on this machine, only
    its always-tagged tasks (argument validation, the host facts, the plan); the plan's desired state is written to
    tmp_path. Nothing else runs."""
    nulls = {name: None for name in NIC_NULLS} | {"hicache_storage_sunrpc_slots": None}
    out_file = tmp_path / "desired.json"
    play = [{"name": "The nic_tuning role with nulls", "hosts": "all", "gather_facts": False, "vars": nulls,
             "roles": [{"role": "hicache.deploy.nic_tuning"}],
             "post_tasks": [{"name": "Write the desired state", "tags": ["always"], "check_mode": False,
                             "ansible.builtin.copy": {"content": "{{ __hicache_nic.desired | to_json }}", "dest": str(out_file), "mode": "0600"}}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    proc = subprocess.run([ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}",
                           "--check", "--tags", "hicache-validation-only", str(tmp_path / "play.yml")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert re.search(r"TASK \[hicache\.deploy\.nic_tuning : Validating arguments against arg spec 'main'[^\n]*\n+ok: \[localhost\]", out), out[-4000:]
    desired = json.loads(out_file.read_text())
    assert desired["max_read_request"] is None and desired["channels"] is None  # None by default: left already
    assert {"max_read_request", "channels"} <= set(desired["left"])


def test_the_same_playbook_check_can_fail():
    """The argument validation above does refuse a null it does not take (hicache_nic_mtu): what it proves is real."""
    assert [e for e in ansible_errors("nic_tuning", {"hicache_nic_mtu": None}) if "hicache_nic_mtu" in e]


def test_a_null_in_the_inventory_reaches_the_plan_as_left():
    import importlib.util

    spec = importlib.util.spec_from_file_location("hicache_filters_nullable", ROOT / "plugins/filter/hicache.py")
    filters = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(filters)
    variables = yaml.safe_load((ROOT / "inventories/vast/group_vars/all.yml").read_text())
    variables |= {name: None for name in NIC_NULLS} | {"hicache_storage_sunrpc_slots": None}
    desired = filters.hicache_nic(variables, "gpu-01")["desired"]
    assert {k: desired[k] for k in ("rings", "qos_trust", "cpu_governor", "roce_tos")} == dict.fromkeys(("rings", "qos_trust", "cpu_governor", "roce_tos"))
    assert set(desired["left"]) == {"rings", "channels", "qos_trust", "ecn_priorities", "roce_tos", "max_read_request", "cpu_governor"}
    deployment, findings = rules.check_host("gpu-01", variables)
    assert deployment is not None and deployment.storage_sunrpc_slots is None
