"""Expose the hicachectl core to Ansible, so templates and tasks never re-implement it.

The core is the Python package hicache-deploy (`pip install hicache-deploy` on the controller, beside
ansible-core); the collection carries none of it. Without it every filter fails naming the package.
"""

from __future__ import annotations

import json

from ansible.errors import AnsibleFilterError

try:
    from hicachectl import hoststate, image, launch, limits, metrics, nic, preflight, render, rules, schema, secrets, storage, verify
    from hicachectl.inventory import ROUTERS, plain
    from hicachectl.model import PREFIX
except ImportError as error:  # pragma: no cover - exercised by ansible-test's import sanity test
    CORE_MISSING = (f"hicache.deploy needs the Python package hicache-deploy on the controller (it provides hicachectl): "
                    f"pip install its wheel into the Python that runs Ansible, see COLLECTION.md ({error})")
else:
    CORE_MISSING = None


def _core():
    if CORE_MISSING is not None:
        raise AnsibleFilterError(CORE_MISSING)


def _hicache_vars(variables):
    """The `hicache_*` items of a mapping: the hicache_vars lookup's result, or hostvars[host]
    (reading a hostvars item templates it)."""
    return plain({name: variables[name] for name in list(variables) if name.startswith(PREFIX) and name not in schema.FACTS})


def _deployment(hostvars, host, role=None):
    """The host's deployment; with `role`, as that role alone needs it (rules.check_host)."""
    _core()
    deployment, findings = rules.check_host(host, _hicache_vars(hostvars), role)
    errors = [f.format() for f in findings if f.level == rules.ERROR]
    if errors:
        raise AnsibleFilterError("invalid hicache variables:\n" + "\n".join(errors))
    return deployment


def _is_router(hostvars) -> bool:
    return ROUTERS in (hostvars.get("group_names") or [])


def hicache_findings(hostvars, host):
    """Every finding for one host, as dicts with a ready `text`; a secret value a finding quotes is ********.
    A router host (group hicache_routers) is checked for the router role's variables only."""
    _core()
    variables = _hicache_vars(hostvars)
    findings = rules.check_host(host, variables, "router" if _is_router(hostvars) else None)[1]
    hidden = secrets.values(variables)
    return [secrets.mask(dict(f.as_dict(), text=f.format()), hidden) for f in findings]


def hicache_fleet_findings(all_hostvars, hosts):
    """Findings for every host of the play at once: one task on the controller instead of one per host."""
    findings = [finding for host in hosts for finding in hicache_findings(all_hostvars[host], host)]
    hosts = [host for host in hosts if not _is_router(all_hostvars[host])]  # the fleet rules: among the servers
    reach = ("ansible_connection", "ansible_host", "ansible_port")  # how Ansible reaches each host: one machine twice
    connections = {host: plain({k: all_hostvars[host][k] for k in reach if k in all_hostvars[host]}) for host in hosts}
    deployments = {host: rules.check_host(host, _hicache_vars(all_hostvars[host]))[0] for host in hosts}
    routers = [host for host in all_hostvars if _is_router(all_hostvars[host])]  # the inventory's, whatever the play
    fleet = (rules.check_fleet(dict.fromkeys(hosts, {}), connections) + rules.check_shared_tiers(deployments)
             + rules.check_routed(deployments, routers))
    return findings + [dict(f.as_dict(), text=f.format()) for f in fleet]


def hicache_files(hostvars, host, uring_fallback=False):
    """The host's config directory and the files it holds; refuses invalid variables. With
    uring_fallback, NIXL's POSIX plugin runs on POSIX AIO (this host cannot create io_uring backends)."""
    deployment = _deployment(hostvars, host, role="sglang_server")
    uses_uring = launch.uses_uring(deployment)
    if uring_fallback and uses_uring:
        deployment = launch.uring_fallback(deployment)
    files = render.files(deployment)
    unit = next(f for f in files if f.name == render.unit_name(deployment))
    return {
        "cfg_dir": deployment.cfg_dir,
        "previous_dir": deployment.cfg_dir.rstrip("/") + ".previous",
        "deployed": json.loads(next(f.content for f in files if f.name == render.INSTALLED)),
        "deployed_name": render.DEPLOYED,
        # A file holding secrets carries its masked text here (this fact is shown at -v and in every event);
        # the task installing it reads the real text through hicache_secret_file, under no_log.
        "files": [{"name": f.name, "content": f.shown, "mode": f.mode, "secret": f.secret} for f in files],
        "uring_fallback": bool(uring_fallback and uses_uring),
        "unit": {"name": unit.name, "content": unit.content},
        "health_url": f"http://{deployment.local_host}:{deployment.effective_port}/health",
        "health_timeout": deployment.health_timeout,
        "runtime": deployment.container_runtime if launch.in_container(deployment) else None,
        "uses_uring": uses_uring and not uring_fallback,
        "uring_requested": uses_uring,
        "strict": bool(deployment.strict),
    }


def hicache_secret_file(hostvars, host, name, uring_fallback=False):
    """The real content of one file of hicache_files that holds secrets (use only under no_log)."""
    deployment = _deployment(hostvars, host, role="sglang_server")
    if uring_fallback and launch.uses_uring(deployment):
        deployment = launch.uring_fallback(deployment)
    for f in render.files(deployment):
        if f.name == name and f.secret:
            return f.content
    raise AnsibleFilterError(f"{host} renders no file holding secrets named {name!r}")


def hicache_settings(hostvars, host, role=None):
    """Every variable of the host with defaults applied and paths resolved; with `role`, checked as that role
    alone needs them (a variable only other roles read may be unset)."""
    return _deployment(hostvars, host, role).as_vars()


def hicache_preflight(hostvars, host, facts, ansible_version=None):
    return preflight.report(plain(facts), _deployment(hostvars, host, role="preflight"), ansible_version)


def hicache_storage(hostvars, host, facts):
    """Everything the storage role does on this host, decided here. The mount's `resolved_source` is the
    device its UUID=/LABEL= source names on this host (what /proc/self/mountinfo shows once mounted)."""
    d = _deployment(hostvars, host, role="storage")
    facts = plain(facts)
    mount = storage.mount(d)
    can_mount, why = preflight.can_mount(facts, d) if mount else (True, "")
    return {
        "cache_dir": d.cache_dir, "owner": d.cache_owner, "group": d.cache_group, "mode": d.cache_mode,
        "mount": None if mount is None else {"source": mount.source, "point": mount.point, "fstype": mount.fstype,
                                             "options": ",".join(mount.options), "fstab_line": mount.fstab_line,
                                             "resolved_source": storage.resolve_source(mount.source, facts.get("block_ids") or {})},
        "can_mount": can_mount, "cannot_mount_reason": why, "strict": bool(d.strict),
        "nfs": storage.is_nfs(d), "read_ahead_kb": d.storage_read_ahead_kb, "sunrpc_slots": d.storage_sunrpc_slots,
        "nfsrahead_conf": storage.nfsrahead_conf(d), "sunrpc_conf": storage.sunrpc_modprobe_conf(d),
        "sysctls": storage.rp_filter_sysctls(d),
    }


def hicache_limits(variables, host):
    d = _deployment(variables, host, role="host_limits")
    service = limits.runtime_service(d)
    return {
        "limits_file": limits.LIMITS_FILE, "limits_conf": limits.limits_conf(d),
        "service": service, "dropin_dir": f"/etc/systemd/system/{service}.d" if service else None,
        "dropin_file": f"/etc/systemd/system/{service}.d/{limits.DROPIN_NAME}" if service else None,
        "dropin": limits.runtime_dropin(d), "memlock": limits.systemd_memlock(d), "restart": bool(d.limits_restart_runtime),
        "sysctl_file": limits.SYSCTL_FILE, "sysctl_conf": limits.sysctl_conf(d), "sysctls": dict(d.host_sysctls),
        "strict": bool(d.strict),
    }


def hicache_nic(variables, host, report=None):
    """What the nic_tuning role does. With `report` (the host program's --check-json output) also `verdict`:
    what fails the host, what is a gap, what still differs (hoststate.nic_verdict)."""
    d = _deployment(variables, host, role="nic_tuning")
    asked = storage.is_nfs(d) or bool(d.nic_interfaces)
    plan = {"desired": nic.desired(d), "config_file": nic.CONFIG_FILE, "config_text": nic.config_text(d),
            "program": nic.PROGRAM, "unit": nic.UNIT, "unit_text": nic.unit_text(), "strict": bool(d.strict), "asked": asked}
    if report is not None:
        plan["verdict"] = hoststate.nic_verdict(plain(report), asked)
    return plan


def hicache_image(variables, host, inspect=None):
    """What the sglang_image role does. With `inspect` (stdout of `<runtime> image inspect <image>`, '' when
    it failed) also `local`: whether the image is there and is the pinned one (RepoDigests compared fully qualified)."""
    d = _deployment(variables, host, role="sglang_image")
    plan = {"runtime": d.container_runtime if launch.in_container(d) else None, "image": d.image,
            "pull": image.pull_reference(d), "pull_argv": image.pull_argv(d), "digest": image.pinned_digest(d),
            "repo_digest": image.repository_digest(d), "accepted_digests": image.accepted_digests(d),
            "retries": d.image_pull_retries, "delay": d.image_pull_delay, "tls_verify": d.image_tls_verify, "strict": bool(d.strict)}
    if inspect is not None:
        plan["local"] = image.local_state(d, str(inspect))
    return plan


def hicache_runtime(variables, host):
    d = _deployment(variables, host, role="container_runtime")
    return {"runtime": d.container_runtime if launch.in_container(d) else None, "service": limits.runtime_service(d),
            "strict": bool(d.strict), "restart": bool(d.limits_restart_runtime)}


def hicache_model(variables, host):
    d = _deployment(variables, host, role="model")
    return {"source": d.model_source, "dir": d.model_dir, "repo": d.model_repo, "revision": d.model_revision,
            "files": dict(d.model_files), "strict": bool(d.strict)}


def hicache_mount_state(mountinfo_text, plan):
    """The live mount at the plan's mount point: problems ([] = as wanted) and its read-ahead file."""
    _core()
    mount = plan.get("mount")
    if not mount:
        return {"mounted": False, "problems": [], "read_ahead_path": None}
    entry = hoststate.mount_at(hoststate.parse_mountinfo(mountinfo_text), mount["point"])
    problems = hoststate.compare_mount(entry, tuple(mount["options"].split(",")), mount["source"], mount["fstype"],
                                       mount.get("resolved_source"))
    return {"mounted": entry is not None, "problems": problems,
            "read_ahead_path": hoststate.bdi_read_ahead_path(entry) if entry is not None else None}


def _verify_writer(host, deployment, all_hostvars, play_hosts):
    """The Deployment of the host whose server writes this host's L3 proof (verify.writers over the play's hosts)."""
    if not deployment.l3_share or all_hostvars is None or not play_hosts:
        return deployment
    shares = {name: all_hostvars[name].get("hicache_l3_share") for name in play_hosts if name != host}
    writer = verify.writers({**shares, host: deployment.l3_share})[host]
    return deployment if writer == host else _deployment(all_hostvars[writer], writer)


def hicache_verify_plan(hostvars, host, salt, all_hostvars=None, play_hosts=None):
    """What verify sends to this host's server and, for the L3 proof, to its writer: with `all_hostvars`
    (hostvars) and `play_hosts` (every server of the inventory, whatever --limit: a writer outside the limit still
    runs), the host before it among the servers of its hicache_l3_share."""
    deployment = _deployment(hostvars, host)
    return verify.plan(deployment, str(salt), _verify_writer(host, deployment, all_hostvars, play_hosts))


def hicache_verify_judge(observations, hostvars, host, l3=False, writer_hostvars=None, writer=None):
    """verify's checks for this host from what its server (and its writer's, `writer_hostvars` = hostvars[writer]) answered."""
    deployment = _deployment(hostvars, host)
    writer_deployment = _deployment(writer_hostvars, writer) if writer and writer != host and writer_hostvars is not None else None
    return verify.judge(deployment, plain(observations), bool(l3), writer_deployment)


def hicache_metric(text, name):
    """A metric's total in /metrics text (0 when absent), counted once across TP ranks."""
    _core()
    return metrics.total(text, name) or 0


class FilterModule:
    def filters(self):
        return {f.__name__: f for f in (hicache_findings, hicache_fleet_findings, hicache_files, hicache_secret_file, hicache_settings, hicache_preflight,
                                        hicache_storage, hicache_limits, hicache_nic, hicache_image, hicache_model, hicache_runtime, hicache_mount_state,
                                        hicache_verify_plan, hicache_verify_judge, hicache_metric)}
