"""Each role of the collection lists, defaults and checks every variable it reads (schema.role_variables), so it
runs alone from a user's playbook with only its own variables set.

What a role reads is recorded, not assumed: each role's plan filter runs on every host of every shipped profile
with a Deployment that notes each field read (the rules' pass and the full record written to installed.json
excluded: they read everything by design)."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import yaml
from helpers import BARE, FULL
from support import ROOT

from hicachectl import rules
from hicachectl.config import inventory, schema
from hicachectl.config.deployment import PREFIX, Deployment

_spec = importlib.util.spec_from_file_location("hicache_filters", ROOT / "plugins/filter/hicache.py")
filters = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(filters)
_router_spec = importlib.util.spec_from_file_location("hicache_router_filters", ROOT / "plugins/filter/router.py")
router_filters = importlib.util.module_from_spec(_router_spec)
_router_spec.loader.exec_module(router_filters)
SERVERS = {"gpu-01": {"ansible_host": "10.0.0.11", "hicache_port": 30000, "hicache_model_path": "/models/m"}}

FACTS = FULL
PLANS = {
    "preflight": lambda v, h: [filters.hicache_settings(v, h, "preflight")] + [filters.hicache_preflight(v, h, facts) for facts in (FULL, BARE)],
    "nic_tuning": lambda v, h: filters.hicache_nic(v, h),
    "storage": lambda v, h: [filters.hicache_storage(v, h, facts) for facts in (FULL, BARE)],
    "host_limits": lambda v, h: filters.hicache_limits(v, h),
    "container_runtime": lambda v, h: filters.hicache_runtime(v, h),
    "sglang_image": lambda v, h: filters.hicache_image(v, h, ""),
    "model": lambda v, h: filters.hicache_model(v, h),
    "sglang_server": lambda v, h: filters.hicache_files(v, h),
    "router": lambda v, h: router_filters.hicache_router_plan(v, h, SERVERS),
}
PROFILES = sorted(p.name for p in (ROOT / "inventories").iterdir() if p.is_dir())


def test_every_role_has_a_plan_here():
    assert set(PLANS) == set(schema.ROLES)


def _recorded_reads(monkeypatch, role: str, variables: dict, host: str) -> set[str]:
    reads: set[str] = set()
    recording = [False]

    class Recorded(Deployment):
        def __getattribute__(self, name):
            if recording[0] and schema.BY_NAME.get(PREFIX + name) is not None:
                reads.add(PREFIX + name)
            return object.__getattribute__(self, name)

        def as_vars(self):  # the record of everything (installed.json, secret masking): not a read of the plan
            recording[0], was = False, recording[0]
            try:
                return Deployment.as_vars(self)
            finally:
                recording[0] = was

    real_build, real_rules = rules.build, rules.check_deployment

    def build(h, raw):
        d = real_build(h, raw)
        return Recorded(**{f.name: getattr(d, f.name) for f in dataclasses.fields(d)})

    def check_deployment(d):
        recording[0] = False
        try:
            return real_rules(d)
        finally:
            recording[0] = True

    monkeypatch.setattr(rules, "build", build)
    monkeypatch.setattr(rules, "check_deployment", check_deployment)
    recording[0] = True
    try:
        PLANS[role](variables, host)
    finally:
        recording[0] = False
        monkeypatch.undo()
    return reads


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("role", schema.ROLES)
def test_a_role_reads_only_the_variables_it_lists(monkeypatch, profile, role):
    inv = inventory.load(ROOT / "inventories" / profile)
    listed = {v.name for v in schema.role_variables(role)}
    for host, variables in inv.hosts.items():
        unlisted = _recorded_reads(monkeypatch, role, variables, host) - listed
        assert not unlisted, f"{role} reads {sorted(unlisted)} on {profile}/{host}: add them to schema.ALSO_READS[{role!r}]"


@pytest.mark.parametrize("role", schema.ROLES)
def test_a_role_runs_alone_with_only_its_required_variables(role):
    """No variable another role reads is needed (hicache_image for storage was, before)."""
    required = {v.name: ("lmsysorg/sglang:v0.5.21" if v.name == "hicache_image" else "/models/m")
                for v in schema.role_variables(role) if v.required}
    variables = {**schema.role_defaults(role), **required}
    assert PLANS[role](variables, "h") is not None


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("role", schema.ROLES)
def test_a_role_runs_alone_with_a_profiles_values_of_only_its_variables(profile, role):
    """Each shipped profile, cut down to what the role lists (a user's playbook giving the role only its own)."""
    listed = {v.name for v in schema.role_variables(role)}
    for host, variables in inventory.load(ROOT / "inventories" / profile).hosts.items():
        own = {name: value for name, value in variables.items() if name in listed}
        assert PLANS[role](own, host) is not None


def test_a_role_alone_still_refuses_its_own_bad_values():
    with pytest.raises(Exception, match="hicache_storage_mount_timeout"):
        filters.hicache_storage({"hicache_storage_mount_timeout": 0}, "h", FACTS)
    with pytest.raises(Exception, match="hicache_image.*is not set"):
        filters.hicache_files({"hicache_model_path": "/models/m"}, "h")


def test_a_role_alone_is_not_refused_for_what_only_others_read():
    _, findings = rules.check_host("h", {"hicache_storage_type": "local", "hicache_cache_dir": "/mnt/kv"}, role="storage")
    assert not rules.has_errors(findings), [f.format() for f in findings]
    _, findings = rules.check_host("h", {"hicache_storage_type": "local", "hicache_cache_dir": "/mnt/kv"})
    assert {f.variable for f in findings if f.level == rules.ERROR} >= {"hicache_image", "hicache_model_path"}


@pytest.mark.parametrize("role", schema.ROLES)
def test_defaults_and_argument_specs_carry_the_real_defaults(role):
    """What ansible-doc shows is what the role uses: defaults/main.yml and the spec's default agree with the catalogue."""
    defaults = yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text()) or {}
    options = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    for var in schema.role_variables(role):
        assert var.name in options, f"{role}'s argument_specs leave out {var.name}, which it reads"
        if var.required:
            assert options[var.name].get("required") is True and var.name not in defaults
            continue
        if var.default is None:  # unset: derived from others, or not used; validation skips an undefined variable
            assert var.name not in defaults and "default" not in options[var.name]
            continue
        assert defaults[var.name] == var.default
        assert options[var.name].get("default") == var.default
