"""The router role's plan and verify's judgement of a router, computed by the hicachectl core (hicachectl/plans/router.py)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

try:
    from hicachectl import rules
    from hicachectl.config import inventory, schema
    from hicachectl.config.deployment import PREFIX
    from hicachectl.config.inventory import plain
    from hicachectl.plans import router
except ImportError as error:  # pragma: no cover - exercised by ansible-test's import sanity test
    CORE_MISSING = (f"hicache.deploy needs the Python package hicache-deploy on the controller (it provides hicachectl): "
                    f"pip install its wheel into the Python that runs Ansible, see COLLECTION.md ({error})")
else:
    CORE_MISSING = None

# What the plan reads of each server's variables (hostvars[server]): where it is reached and what it serves.
SERVER_KEYS = ("ansible_host", "hicache_port", "hicache_worker_url", "hicache_served_model_name", "hicache_model_path")


def _core():
    if CORE_MISSING is not None:
        raise AnsibleFilterError(CORE_MISSING)


def _router(variables, host):
    """The router host's deployment, checked as the router role alone needs it."""
    _core()
    own = plain({name: variables[name] for name in list(variables) if name.startswith(PREFIX) and name not in schema.FACTS})
    deployment, findings = router.check_router_host(host, own)
    errors = [f.format() for f in findings if f.level == rules.ERROR]
    if errors:
        raise AnsibleFilterError("invalid hicache variables:\n" + "\n".join(errors))
    return deployment


def _servers(servers, all_hostvars):
    """{server: the variables the plan reads}: `servers` is a mapping server -> variables, or server names read from all_hostvars."""
    if isinstance(servers, dict):
        return {str(h): plain({k: v for k, v in dict(values).items() if k in SERVER_KEYS}) for h, values in servers.items()}
    if all_hostvars is None:
        raise AnsibleFilterError("hicache_router_plan: give the servers as a mapping, or their names and hostvars")
    found = {}
    for host in servers or ():
        values = all_hostvars[host]
        found[str(host)] = plain({k: values[k] for k in SERVER_KEYS if k in values})
    return found


def hicache_router_dir(variables, host):
    """The router's directory (hicache_router_dir, its default applied): where doctor measures the free space."""
    return _router(variables, host).router_dir


def hicache_router_doctor(variables, host, facts, python_missing=""):
    """doctor's report of a router host (hicachectl/plans/router.py doctor_report), preflight's shape."""
    return router.doctor_report(_router(variables, host), plain(facts), str(python_missing or ""))


def hicache_router_plan(variables, host, servers, all_hostvars=None):
    """What the router role does on `host` (its variables: the hicache_vars lookup) for the servers."""
    d = _router(variables, host)
    known = _servers(servers, all_hostvars)
    try:
        return router.plan(d, known, list(known))
    except ValueError as exc:
        raise AnsibleFilterError(f"{host}: {exc} (set hicache_worker_url on the server)") from exc


def hicache_servers(groups):
    """The inventory's servers (every host outside hicache_routers) in the inventory's order: `groups | hicache_servers`."""
    _core()
    return inventory.server_hosts(plain(dict(groups)))


def hicache_router_extra_workers(listed, plan):
    """The worker URLs the router lists (GET /workers) that the plan does not name."""
    _core()
    return router.extra_workers(plain(listed or []), plain(plan).get("worker_urls") or [])


def hicache_router_verify_requests(plan, salt):
    """What verify asks on a router host, as hicache_probe's requests (router.verify_requests)."""
    _core()
    return router.verify_requests(plain(plan), str(salt))


def hicache_router_judge(answers, plan):
    """verify's checks of a router from hicache_probe's answers to hicache_router_verify_requests (`plan`:
    hicache_router_plan's result)."""
    _core()
    return router.judge(plain(plan), router.observed(plain(plan), plain(answers)))


class FilterModule:
    def filters(self):
        return {f.__name__: f for f in (hicache_servers, hicache_router_plan, hicache_router_extra_workers, hicache_router_verify_requests,
                                        hicache_router_judge, hicache_router_dir, hicache_router_doctor)}
