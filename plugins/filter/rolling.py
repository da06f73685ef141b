# Copyright: hicache-deploy developers
# SPDX-License-Identifier: Apache-2.0
"""The filters of a server's restart behind the routers (roles/sglang_server/tasks/restart.yml, hicachectl/ops/rolling.py):
the routers to take it out of and how to tell that it is drained; and whether the inventory's image is a downgrade of
what a server runs (roles/sglang_image/tasks/apply.yml); which host downloads a model shared by several
(roles/model/tasks/weights.yml).

The core is the Python package hicache-deploy on the controller (see plugins/filter/hicache.py).
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

try:
    from hicachectl import rules
    from hicachectl.config import schema
    from hicachectl.config.deployment import PREFIX
    from hicachectl.config.inventory import plain
    from hicachectl.ops import rolling
except ImportError as error:  # pragma: no cover - exercised by ansible-test's import sanity test
    CORE_MISSING = (f"hicache.deploy needs the Python package hicache-deploy on the controller (it provides hicachectl): "
                    f"pip install its wheel into the Python that runs Ansible, see COLLECTION.md ({error})")
else:
    CORE_MISSING = None


def _core():
    if CORE_MISSING is not None:
        raise AnsibleFilterError(CORE_MISSING)


def hicache_rolling(variables, host, all_hostvars, routers):
    """The restart plan of server `host` (`variables`: the hicache_vars lookup) behind `routers` (groups['hicache_routers'],
    their variables in `all_hostvars`, i.e. hostvars): router URLs, the worker URL, the metrics URL, the drain timeout."""
    _core()
    hicache = plain({k: variables[k] for k in list(variables) if k.startswith(PREFIX) and k not in schema.FACTS})
    deployment, findings = rules.check_host(host, hicache)
    errors = [f.format() for f in findings if f.level == rules.ERROR]
    if errors or deployment is None:
        raise AnsibleFilterError("invalid hicache variables:\n" + "\n".join(errors))
    names = list(routers or [])
    router_vars = {name: plain({k: all_hostvars[name][k] for k in list(all_hostvars[name]) if k.startswith(PREFIX) and k not in schema.FACTS})
                   for name in names}
    host_vars = dict(hicache, **({"ansible_host": plain(all_hostvars[host]["ansible_host"])} if "ansible_host" in all_hostvars[host] else {}))
    try:
        return rolling.plan(deployment, host, host_vars, router_vars, names)
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def hicache_downgrade(variables, host, facts):
    """Why the inventory's image is a downgrade of what the server of `host` runs ('' when it is not, or cannot be
    told): its deployed.json as the host facts read it (hicache_facts.files) against the inventory's SGLang version.
    Variables that do not describe a whole server (a role used alone with its own) make no claim."""
    _core()
    import json

    from hicachectl.plans import sglang_server

    hicache = plain({k: variables[k] for k in list(variables) if k.startswith(PREFIX) and k not in schema.FACTS})
    deployment, findings = rules.check_host(host, hicache)
    if deployment is None or rules.has_errors(findings):
        return ""
    text = ((facts or {}).get("files") or {}).get(sglang_server.record_paths(deployment)[0])
    try:
        running = json.loads(text) if isinstance(text, str) and text.strip() else None
    except ValueError:  # a damaged record: the restart tasks replace it; no claim about it here
        running = None
    return rolling.downgrade(deployment, running)


def _deployment_or_none(variables, host):
    hicache = plain({k: variables[k] for k in list(variables) if k.startswith(PREFIX) and k not in schema.FACTS})
    deployment, findings = rules.check_host(host, hicache, "model")
    return None if rules.has_errors(findings) else deployment


def hicache_model_download(variables, host, all_hostvars, play_hosts):
    """Who downloads the hub model of `host` (`variables`: its hicache_vars lookup) among the hosts of the run
    (`play_hosts`: ansible_play_hosts_all, their variables in `all_hostvars`, i.e. hostvars): hicachectl/ops/rolling.py
    model_download. A host whose variables do not check out is left out of the others' sharing (it fails on its own)."""
    _core()
    deployment = _deployment_or_none(variables, host)
    if deployment is None:
        raise AnsibleFilterError(f"{host}: invalid hicache variables for the model role")
    names = list(play_hosts or [])
    deployments = {name: _deployment_or_none(all_hostvars[name], name) for name in names if name != host and name in all_hostvars}
    deployments[host] = deployment
    try:
        return rolling.model_download(host, deployments, [*names, host])
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def hicache_in_flight(text):
    """Requests a server runs or queues, from its /metrics text (every rank); -1 when the text has no such gauge."""
    _core()
    value = rolling.in_flight(text)
    return -1 if value is None else value


class FilterModule:
    def filters(self):
        return {f.__name__: f for f in (hicache_rolling, hicache_in_flight, hicache_downgrade, hicache_model_download)}
