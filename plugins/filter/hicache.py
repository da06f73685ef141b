"""Expose the hicachectl core to Ansible, so templates and tasks never re-implement it."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from hicachectl import render, rules
from hicachectl.inventory import plain
from hicachectl.model import PREFIX


def _hicache_vars(hostvars):
    """A host's `hicache_*` variables, templated (reading a hostvars item templates it)."""
    return plain({name: hostvars[name] for name in list(hostvars) if name.startswith(PREFIX)})


def hicache_findings(hostvars, host):
    """Every finding for one host, as dicts with a ready `text`."""
    _, findings = rules.check_host(host, _hicache_vars(hostvars))
    return [dict(f.as_dict(), text=f.format()) for f in findings]


def hicache_fleet_findings(all_hostvars, hosts):
    """Findings for every host of the play at once: one task on the controller instead of one per host."""
    return [finding for host in hosts for finding in hicache_findings(all_hostvars[host], host)]


def hicache_files(hostvars, host):
    """The host's config directory and the files it holds; refuses invalid variables."""
    deployment, findings = rules.check_host(host, _hicache_vars(hostvars))
    errors = [f.format() for f in findings if f.level == rules.ERROR]
    if errors:
        raise AnsibleFilterError("invalid hicache variables:\n" + "\n".join(errors))
    return {
        "cfg_dir": deployment.cfg_dir,
        "files": [{"name": f.name, "content": f.content, "mode": f.mode} for f in render.files(deployment)],
    }


class FilterModule:
    def filters(self):
        return {"hicache_findings": hicache_findings, "hicache_fleet_findings": hicache_fleet_findings, "hicache_files": hicache_files}
