from __future__ import annotations

import functools

from hicachectl import rules
from hicachectl.config import inventory
from hicachectl.plans import sglang_server


@functools.cache
def _host_vars(name: str) -> tuple[str, dict]:
    inv = inventory.load(name)
    host, variables = next(iter(inv.hosts.items()))
    return host, variables


def profile_vars(name: str) -> dict:
    """A shipped profile's group variables, as written (inventories/<name>/group_vars/all.yml)."""
    import pathlib

    import yaml

    return yaml.safe_load((pathlib.Path(__file__).resolve().parents[1] / "inventories" / name / "group_vars" / "all.yml").read_text())


def filled_in(group_vars: dict) -> dict:
    """A shipped profile's variables with its documentation placeholders filled in, as an operator must before
    validate or any command that reaches hosts accepts them (render reads the profile as it is)."""
    fills = {"vast-vip.example.com": "vast-vip.corp.net", "netapp-lif.example.com": "netapp-lif.corp.net", "192.0.2.": "10.20.0."}
    out = {}
    for name, value in group_vars.items():
        if isinstance(value, str):
            for placeholder, own in fills.items():
                value = value.replace(placeholder, own)
        out[name] = value
    return out


def deployment(name: str, **overrides):
    """The first host of a shipped inventory, with variables overridden; must be valid."""
    host, variables = _host_vars(name)
    merged = {**variables, **{f"hicache_{k}": v for k, v in overrides.items()}}
    d, findings = rules.check_host(host, merged)
    assert d is not None and not rules.has_errors(findings), [f.format() for f in findings]
    return d


def rendered(d) -> dict[str, str]:
    return {f.name: f.content for f in sglang_server.files(d)}


SEED_EXACT = {"enable_metrics": False, "enable_cache_report": False}
