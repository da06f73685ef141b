"""One typed plan per role: what the role writes, what it runs, and what cannot be done on this host and why.

Each role asks for its plan once (a hicache filter of the collection, plugins/filter/hicache.py), keeps it with
set_fact, shows it at -v, and its tasks only apply it. A plan depends only on the host's deployment (its checked
variables) and, where the answer depends on the host, on the host facts (hicache_host_facts, read up front, not per task):
whether systemd runs the host, whether the container runtime or the hub client is installed.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from hicachectl import hoststate, image, launch, limits, nic, preflight, render, secrets, storage


def as_fact(plan: Any) -> dict[str, Any]:
    """The plan as Ansible keeps it (set_fact): plain dicts and lists. A part computed only on request (a verdict,
    the local image) is absent when not requested, so a task cannot mistake it for an empty answer."""
    optional = {f.name for f in dataclasses.fields(plan) if f.default is None}
    return {k: v for k, v in dataclasses.asdict(plan).items() if not (k in optional and v is None)}


def _tool(facts: dict[str, Any] | None, name: str | None) -> bool:
    return bool(name) and bool((facts or {}).get("tools", {}).get(name))


@dataclasses.dataclass(frozen=True)
class NicPlan:
    desired: dict[str, Any]  # what hicache-nic-tuning applies (--apply-json)
    config_file: str
    config_text: str
    program: str
    unit: str
    unit_text: str
    udev_rule_file: str  # re-applies the tuning when an RDMA device, a bond or a VLAN appears (nic.udev_rule_text)
    udev_rule_text: str
    selection: str  # which ports the program tunes and why (it finds them on the host; its report names each)
    strict: bool
    asked: bool  # the inventory asks for NIC tuning (an NFS tier, or named interfaces)
    verdict: dict[str, Any] | None = None  # with the program's report: failures, gaps, what still differs


def nic_plan(d, report: dict[str, Any] | None = None) -> NicPlan:
    asked = storage.is_nfs(d) or bool(d.nic_interfaces)
    return NicPlan(nic.desired(d), nic.CONFIG_FILE, nic.config_text(d), nic.PROGRAM, nic.UNIT, nic.unit_text(), nic.UDEV_RULE,
                   nic.udev_rule_text(), nic.selection(d), bool(d.strict), asked,
                   hoststate.nic_verdict(report, asked, bool(d.nic_ecn_required)) if report is not None else None)


@dataclasses.dataclass(frozen=True)
class LimitsPlan:
    limits_file: str
    limits_conf: str
    service: str | None  # the container runtime's systemd service, None when the server runs on the host
    dropin_dir: str | None
    dropin_file: str | None
    dropin: str | None
    memlock: str  # LimitMEMLOCK as systemd shows it
    restart: bool
    sysctl_file: str
    sysctl_conf: str | None
    sysctls: dict[str, Any]
    strict: bool
    # Every unit a container's processes inherit memlock from (with Docker: docker.service and containerd.service,
    # limits.runtime_services), each with its drop-in; the checks read each one's running process.
    services: tuple[str, ...] = ()
    proc_memlock: str = "unlimited"  # "Max locked memory" as /proc/<pid>/limits shows it
    files: tuple[dict[str, Any], ...] = ()  # everything the role writes, in one round trip (hicache_files)
    directories: tuple[dict[str, Any], ...] = ()
    server_sets_memlock: bool = False  # the server's container has its own --ulimit memlock (limits.server_sets_memlock)


def limits_plan(d) -> LimitsPlan:
    service = limits.runtime_service(d)
    services = limits.runtime_services(d)
    dropin_dir = f"/etc/systemd/system/{service}.d" if service else None
    dropin = limits.runtime_dropin(d)
    sysctl_conf = limits.sysctl_conf(d)
    root = {"owner": "root", "group": "root"}
    files = [{"path": limits.LIMITS_FILE, "content": limits.limits_conf(d), "mode": "0644", **root, "label": "limits"}]
    files += [{"path": f"/etc/systemd/system/{s}.d/{limits.DROPIN_NAME}", "content": dropin, "mode": "0644", **root, "label": f"dropin {s}"}
              for s in services]
    if sysctl_conf is not None:
        files.append({"path": limits.SYSCTL_FILE, "content": sysctl_conf, "mode": "0644", **root, "label": "sysctl"})
    return LimitsPlan(limits.LIMITS_FILE, limits.limits_conf(d), service, dropin_dir,
                      f"{dropin_dir}/{limits.DROPIN_NAME}" if service else None, dropin, limits.systemd_memlock(d),
                      bool(d.limits_restart_runtime), limits.SYSCTL_FILE, sysctl_conf, dict(d.host_sysctls), bool(d.strict),
                      services, limits.proc_memlock(d), tuple(files),
                      tuple({"path": f"/etc/systemd/system/{s}.d", "mode": "0755", **root} for s in services),
                      limits.server_sets_memlock(d))


@dataclasses.dataclass(frozen=True)
class MountPlan:
    source: str
    point: str
    fstype: str
    options: str
    fstab_line: str
    resolved_source: str | None  # the device a UUID=/LABEL= source names on this host (what mountinfo shows)


@dataclasses.dataclass(frozen=True)
class StoragePlan:
    cache_dir: str | None
    owner: str
    group: str
    mode: str
    mount: MountPlan | None
    can_mount: bool
    cannot_mount_reason: str  # why this host cannot mount it (no NFS client, no rpcrdma, no device)
    strict: bool
    nfs: bool
    read_ahead_kb: int | None
    read_ahead_persistent: bool  # nfsrahead, its udev rule and udevd are there (storage.read_ahead_persistence)
    read_ahead_not_persistent_reason: str
    nfsrahead_conf: str
    modules_load_conf: str | None  # rpcrdma loaded at boot, so that the persisted sunrpc.rdma_* values apply
    load_rpcrdma: bool  # this run loads rpcrdma before the mount (it is not loaded yet)
    after_rpcrdma: list[str]  # sysctls that exist only once rpcrdma is loaded: a dry run cannot read them before
    sysctls: dict[str, Any]  # live and persisted (sysctl.d), set before the mount: RDMA slots, multipath rp_filter
    sysctl_conf: str | None
    restored_sysctls: dict[str, str]  # live only, before the files: the kernel's TCP slot tables an older release lowered
    vastnfs_values: dict[str, str]  # live, after the mount (it loads vastnfs' sunrpc): expose_id_in_mountstats
    unknown_localports: list[str]  # localports addresses no interface of this host holds
    directories: list[dict[str, str]]  # what the role persists before the mount (hicache_files' arguments)
    files: list[dict[str, str]]
    absent: list[str]  # what it removes: its own files this tier does not need, and what older releases wrote


def storage_plan(d, facts: dict[str, Any]) -> StoragePlan:
    mount = storage.mount(d)
    can_mount, why = preflight.can_mount(facts, d) if mount else (True, "")
    nfs = storage.is_nfs(d)
    persistent, not_persistent = storage.read_ahead_persistence(facts) if nfs else (True, "")
    rdma_sysctls = storage.sunrpc_sysctls(d)
    sysctls = {**rdma_sysctls, **storage.rp_filter_sysctls(d, facts)}
    directories, files, absent = storage.host_files(d, sysctls)
    modules_load = storage.modules_load_conf(d)
    load_rpcrdma = bool(modules_load and mount and can_mount and not preflight.kernel_module(facts, "rpcrdma")["loaded"])
    return StoragePlan(
        d.cache_dir, d.cache_owner, d.cache_group, d.cache_mode,
        None if mount is None else MountPlan(mount.source, mount.point, mount.fstype, ",".join(mount.options), mount.fstab_line,
                                             storage.resolve_source(mount.source, facts.get("block_ids") or {})),
        can_mount, why, bool(d.strict), nfs, d.storage_read_ahead_kb, persistent, not_persistent,
        storage.nfsrahead_conf(d), modules_load, load_rpcrdma, sorted(rdma_sysctls) if load_rpcrdma else [], sysctls,
        storage.sysctl_conf(sysctls), storage.restored_tcp_slots(facts), storage.vastnfs_values(d),
        storage.multipath_interfaces(d, facts)[1] if d.storage_localports else [], directories, files, absent)


@dataclasses.dataclass(frozen=True)
class ImagePlan:
    runtime: str | None  # None: the server runs on the host, no image
    runtime_found: bool | None  # the runtime is installed here (host facts); None without facts
    image: str
    pull: str
    pull_argv: list[str]
    digest: str | None
    repo_digest: str | None
    accepted_digests: list[str]
    retries: int
    delay: int
    tls_verify: bool
    strict: bool
    local: dict[str, Any] | None = None  # with `<runtime> image inspect`: present, current, reason


def image_plan(d, facts: dict[str, Any] | None = None, inspect: str | None = None) -> ImagePlan:
    runtime = d.container_runtime if launch.in_container(d) else None
    return ImagePlan(runtime, _tool(facts, runtime) if facts is not None else None, d.image, image.pull_reference(d), image.pull_argv(d),
                     image.pinned_digest(d), image.repository_digest(d), list(image.accepted_digests(d)), d.image_pull_retries,
                     d.image_pull_delay, d.image_tls_verify, bool(d.strict),
                     image.local_state(d, str(inspect)) if inspect is not None else None)


@dataclasses.dataclass(frozen=True)
class RuntimePlan:
    runtime: str | None
    service: str | None
    strict: bool
    restart: bool
    missing: str  # why containers cannot get the GPUs here ('' when they can, or without facts)
    # The runtime's units to run and enable (with Docker: containerd.service, then docker.service); () for podman.
    units: tuple[str, ...] = ()


def runtime_plan(d, facts: dict[str, Any] | None = None) -> RuntimePlan:
    runtime = d.container_runtime if launch.in_container(d) else None
    missing = ""
    if runtime and facts is not None:
        if not _tool(facts, runtime):
            missing = f"{runtime} is not installed on this host"
        elif not _tool(facts, "nvidia-ctk"):
            missing = "the NVIDIA container toolkit (nvidia-ctk) is not installed, so containers cannot see the GPUs"
    units = tuple(reversed(limits.runtime_services(d))) if runtime == "docker" else ()
    return RuntimePlan(runtime, limits.runtime_service(d), bool(d.strict), bool(d.limits_restart_runtime), missing, units)


@dataclasses.dataclass(frozen=True)
class ModelPlan:
    source: str | None  # path, hub, or None (the server resolves the model itself)
    dir: str | None
    repo: str | None
    revision: str | None
    files: dict[str, str]  # file -> sha256 the weights must have
    strict: bool
    hub_client_found: bool | None  # `hf` is installed here (host facts); None without facts


def model_plan(d, facts: dict[str, Any] | None = None) -> ModelPlan:
    return ModelPlan(d.model_source, d.model_dir, d.model_repo, d.model_revision, dict(d.model_files), bool(d.strict),
                     _tool(facts, "hf") if facts is not None else None)


@dataclasses.dataclass(frozen=True)
class ServerFile:
    name: str
    content: str  # a file holding secrets carries its masked text (this plan is shown at -v and in every event)
    mode: str
    secret: bool


@dataclasses.dataclass(frozen=True)
class ServerPlan:
    cfg_dir: str
    previous_dir: str
    deployed: dict[str, Any]  # what deployed.json records once the server is healthy with these files
    deployed_name: str
    files: list[ServerFile]
    public_files: list[dict[str, Any]]  # what hicache_files writes in one step: every file without a secret, backed up
    # The secret files this config has none of (removed: an old secret does not stay on the host).
    absent_secret_files: list[str]
    uring_fallback: bool
    unit: dict[str, str]
    health_url: str
    health_timeout: int
    runtime: str | None
    uses_uring: bool
    uring_requested: bool
    strict: bool
    cannot_run: str  # why no server can run here (no systemd, no container runtime); '' when it can, or without facts


def with_uring_fallback(d, uring_fallback: bool):
    """The deployment as the server runs it: NIXL's POSIX plugin on POSIX AIO where io_uring failed on this host."""
    return launch.uring_fallback(d) if uring_fallback and launch.uses_uring(d) else d


def server_plan(d, uring_fallback: bool = False, facts: dict[str, Any] | None = None) -> ServerPlan:
    uses_uring = launch.uses_uring(d)
    d = with_uring_fallback(d, uring_fallback)
    files = render.files(d)
    unit = next(f for f in files if f.name == render.unit_name(d))
    runtime = d.container_runtime if launch.in_container(d) else None
    cannot_run = ""
    if facts is not None:
        if not facts.get("systemd"):
            cannot_run = f"systemd does not run this host; start {d.cfg_dir}/serve.sh by other means"
        elif runtime is not None and not _tool(facts, runtime):
            cannot_run = f"{runtime} is not installed on this host"
    return ServerPlan(
        d.cfg_dir, d.cfg_dir.rstrip("/") + ".previous", json.loads(next(f.content for f in files if f.name == render.INSTALLED)),
        render.DEPLOYED, [ServerFile(f.name, f.shown, f.mode, f.secret) for f in files],
        [{"path": f"{d.cfg_dir}/{f.name}", "content": f.content, "mode": f.mode, "owner": "root", "group": "root", "backup": True,
          "label": f.name} for f in files if not f.secret],
        [f"{d.cfg_dir}/{name}" for name in (secrets.SECRETS_ENV, secrets.SERVER_SECRETS_FILE) if name not in {f.name for f in files}],
        bool(uring_fallback and uses_uring), {"name": unit.name, "content": unit.content},
        f"http://{d.local_host}:{d.effective_port}/health", d.health_timeout, runtime, uses_uring and not uring_fallback, uses_uring,
        bool(d.strict), cannot_run)
