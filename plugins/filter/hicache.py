"""Expose the hicachectl core to Ansible, so templates and tasks never re-implement it.

The core is the Python package hicache-deploy (`pip install hicache-deploy` on the controller, beside
ansible-core); the collection carries none of it. Without it every filter fails naming the package.
"""

from __future__ import annotations

import hashlib
import json

from ansible.errors import AnsibleFilterError

try:
    from hicachectl import rules
    from hicachectl.config import schema, secrets
    from hicachectl.config.deployment import PREFIX
    from hicachectl.config.inventory import ROUTERS, SERVERS, plain
    from hicachectl.ops import metrics, verify
    from hicachectl.plans import container_runtime, host_limits, l3_collector, model, nic_tuning, preflight, sglang_image, sglang_server, storage, storage_live
    from hicachectl.plans.host_files import nic_program_text
    from hicachectl.plans.plan import as_fact
    from hicachectl.rules.variables import misspelled_variables
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


def _plain_or_none(value):
    """An optional argument (host facts, a report) as plain data; None stays None (the plan then claims nothing)."""
    return None if value is None else plain(value)


def _is_router(hostvars) -> bool:
    return ROUTERS in (hostvars.get("group_names") or [])


def hicache_findings(hostvars, host):
    """Every finding for one host, as dicts with a ready `text`; a secret value a finding quotes is ********.
    A router host (group hicache_routers) is checked for the router role's variables only."""
    _core()
    variables = _hicache_vars(hostvars)
    findings = rules.check_host(host, variables, "router" if _is_router(hostvars) else None)[1]
    if _is_router(hostvars) and SERVERS in (hostvars.get("group_names") or []):
        findings += rules.check_server_or_router([host])
    findings += misspelled_variables(host, {name: meant for name in list(hostvars) if (meant := schema.misspelled(name))})
    hidden = secrets.values(variables)
    return [secrets.mask(dict(f.as_dict(), text=f.format()), hidden) for f in findings]


def hicache_fleet_findings(all_hostvars, hosts):
    """Findings for every host of the play at once: one task on the controller instead of one per host."""
    findings = [finding for host in hosts for finding in hicache_findings(all_hostvars[host], host)]
    routers_played = [host for host in hosts if _is_router(all_hostvars[host])]  # one machine twice: among the routers too
    hosts = [host for host in hosts if not _is_router(all_hostvars[host])]  # the fleet rules: among the servers
    reach = ("ansible_connection", "ansible_host", "ansible_port")  # how Ansible reaches each host: one machine twice
    connections = {host: plain({k: all_hostvars[host][k] for k in reach if k in all_hostvars[host]}) for host in hosts}
    deployments = {host: rules.check_host(host, _hicache_vars(all_hostvars[host]))[0] for host in hosts}
    # The inventory's routers, whatever the play, with their variables (a router and a server on one machine and port).
    routers = {host: plain(_hicache_vars(all_hostvars[host])) for host in all_hostvars if _is_router(all_hostvars[host])}
    router_reach = {host: plain({k: all_hostvars[host][k] for k in reach if k in all_hostvars[host]}) for host in routers}
    fleet = (rules.check_fleet(dict.fromkeys(hosts, {}), connections)
             + rules.check_routers({host: routers[host] for host in routers_played}, router_reach)
             + rules.check_shared_tiers(deployments)
             + rules.check_routed(deployments, routers, {**connections, **router_reach}))
    return findings + [dict(f.as_dict(), text=f.format()) for f in fleet]


def hicache_files(hostvars, host, uring_fallback=False, facts=None):
    """The sglang_server role's plan (hicachectl/plans/sglang_server.py ServerPlan): the config directory and the files it holds;
    refuses invalid variables. With uring_fallback, NIXL's POSIX plugin runs on POSIX AIO (this host cannot create
    io_uring backends); with the host facts, also why no server can run here (`cannot_run`)."""
    deployment = _deployment(hostvars, host, role="sglang_server")
    return as_fact(sglang_server.server_plan(deployment, bool(uring_fallback), _plain_or_none(facts)))


def hicache_host_reads(hostvars, host, ports=False):
    """What the host facts read besides the usual (hicache_host_facts' `reads`, passed whole so that this is planned
    once per task), so that no role reads the host again: the server's deployed.json and installed.json, the container
    runtime's unit; with `ports` (site.yml's reads), the ports as the NIC tuning program sees them. A part the variables
    at hand do not define stays empty (None for the ports); the role that needs it reads it itself (a user's playbook
    may give each role only its own variables)."""
    _core()
    variables = _hicache_vars(hostvars)
    # the storage role's own sysctl.d file (storage.rp_filter_sysctls), and what an older release wrote (storage.restored_tcp_slots)
    reads = {"files": [storage.SYSCTL_FILE, storage.OLD_SUNRPC_MODPROBE_FILE], "units": [], "backups_of": [], "backup_marker": sglang_server.RENDERED_BY,
             "nic_read": None}
    server, findings = rules.check_host(host, variables, "sglang_server")
    if not rules.has_errors(findings):
        reads["files"] += [*sglang_server.record_paths(server), l3_collector.CONFIG_FILE]
        reads["backups_of"] = sglang_server.backed_up_files(server)  # what an earlier release left (sglang_server.stale_backups)
    limited, findings = rules.check_host(host, variables, "host_limits")
    if not rules.has_errors(findings) and host_limits.runtime_service(limited):
        reads["units"] += host_limits.runtime_services(limited)  # each unit a container inherits memlock from
    if ports:
        tuned, findings = rules.check_host(host, variables, "nic_tuning")
        if not rules.has_errors(findings):
            # Read by the installed program where it is the text the role installs (host_files.nic_program_text); the
            # role reads them itself only where this read does not settle them (nic_tuning.work_pending).
            reads["nic_read"] = {"program": nic_tuning.PROGRAM, "sha256": hashlib.sha256(nic_program_text().encode()).hexdigest(),
                                 "desired": json.dumps(nic_tuning.desired(tuned))}
    return reads


def hicache_nic_work_pending(read, wanted):
    """Whether the nic_tuning role reads the ports itself and applies what differs: the host facts' read (nic_read)
    is missing, of another desired state than `wanted` (the plan's), failed or found something to change
    (nic_tuning.work_pending)."""
    _core()
    return nic_tuning.work_pending(_plain_or_none(read), plain(wanted))


def hicache_secret_file(hostvars, host, name, uring_fallback=False):
    """The real content of one file of hicache_files that holds secrets (use only under no_log)."""
    deployment = sglang_server.with_uring_fallback(_deployment(hostvars, host, role="sglang_server"), bool(uring_fallback))
    for f in sglang_server.files(deployment):
        if f.name == name and f.secret:
            return f.content
    raise AnsibleFilterError(f"{host} renders no file holding secrets named {name!r}")


def hicache_secret_forms(hostvars, host):
    """Every form the host's secret values take in text (as written, JSON-escaped, shell-quoted, Python's repr):
    what a module that prints a log replaces (hicache_wait_healthy's hide)."""
    return secrets.text_forms(secrets.values(_hicache_vars(hostvars)))


def hicache_redact_server_info(info):
    """SGLang's /server_info answer without the keys it returns (secrets.redact_server_info)."""
    return secrets.redact_server_info(info)


def hicache_settings(hostvars, host, role=None):
    """Every variable of the host with defaults applied and paths resolved; with `role`, checked as that role
    alone needs them (a variable only other roles read may be unset)."""
    return _deployment(hostvars, host, role).as_vars()


def hicache_preflight(hostvars, host, facts, ansible_version=None):
    return preflight.report(plain(facts), _deployment(hostvars, host, role="preflight"), ansible_version)


def hicache_storage(hostvars, host, facts):
    """The storage role's plan (StoragePlan). The mount's `resolved_source` is the device its UUID=/LABEL= source
    names on this host (what /proc/self/mountinfo shows once mounted)."""
    return as_fact(storage.storage_plan(_deployment(hostvars, host, role="storage"), plain(facts)))


def hicache_limits(variables, host):
    """The host_limits role's plan (LimitsPlan)."""
    return as_fact(host_limits.limits_plan(_deployment(variables, host, role="host_limits")))


def hicache_nic(variables, host, report=None):
    """The nic_tuning role's plan (NicPlan). With `report` (the host program's --check-json output) also `verdict`:
    what fails the host, what is a gap, what still differs (nic_tuning.nic_verdict)."""
    return as_fact(nic_tuning.nic_plan(_deployment(variables, host, role="nic_tuning"), _plain_or_none(report)))


def hicache_image(variables, host, inspect=None, facts=None):
    """The sglang_image role's plan (ImagePlan). With `inspect` (stdout of `<runtime> image inspect <image>`, '' when
    it failed) also `local`: whether the image is there and is the pinned one (RepoDigests compared fully qualified);
    with the host facts, whether the runtime is installed (`runtime_found`)."""
    return as_fact(sglang_image.image_plan(_deployment(variables, host, role="sglang_image"), _plain_or_none(facts), inspect))


def hicache_runtime(variables, host, facts=None):
    """The container_runtime role's plan (RuntimePlan); with the host facts, why containers cannot get the GPUs here."""
    return as_fact(container_runtime.runtime_plan(_deployment(variables, host, role="container_runtime"), _plain_or_none(facts)))


def hicache_model(variables, host, facts=None):
    """The model role's plan (ModelPlan); with the host facts, whether the hub client is installed here."""
    return as_fact(model.model_plan(_deployment(variables, host, role="model"), _plain_or_none(facts)))


def hicache_limits_findings(units, plan):
    """The runtime units' memlock judged (host_limits.runtime_unit_findings), from the host facts' `units`."""
    _core()
    return host_limits.runtime_unit_findings(plan, _plain_or_none(units) or {})


def hicache_mount_state(mountinfo_text, plan, vastnfs_version=None, mountstats_text=None, rpc_clnt_stats_text=None):
    """The live mount at the plan's mount point, judged by storage_live.mount_state (hicachectl/plans/storage_live.py)."""
    _core()
    return storage_live.mount_state(mountinfo_text, plan, vastnfs_version, mountstats_text, rpc_clnt_stats_text)


def _verify_writer(host, deployment, all_hostvars, play_hosts):
    """The Deployment of the host whose server writes this host's L3 proof (verify.writers over the play's hosts)."""
    if not deployment.l3_share or all_hostvars is None or not play_hosts:
        return deployment
    # Only the hosts of this host's share are read in full (their model decides the ring); the others have no say.
    rings = {name: verify.ring_key(_deployment(all_hostvars[name], name)) if all_hostvars[name].get("hicache_l3_share") == deployment.l3_share else None
             for name in play_hosts if name != host}
    writer = verify.writers({**rings, host: verify.ring_key(deployment)})[host]
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
    """A metric's total in /metrics text (0 when absent), counted once across the TP, PP and attention-CP ranks of a server (hicachectl/metrics.total)."""
    _core()
    return metrics.total(text, name) or 0


class FilterModule:
    def filters(self):
        return {f.__name__: f for f in (hicache_findings, hicache_fleet_findings, hicache_files, hicache_host_reads, hicache_secret_file,
                                        hicache_secret_forms, hicache_redact_server_info, hicache_settings, hicache_preflight,
                                        hicache_storage, hicache_limits, hicache_limits_findings, hicache_nic, hicache_nic_work_pending,
                                        hicache_image, hicache_model, hicache_runtime, hicache_mount_state, hicache_verify_plan,
                                        hicache_verify_judge, hicache_metric)}
