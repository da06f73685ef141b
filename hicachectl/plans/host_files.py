"""Every file the roles leave on a host, role by role, from each role's own plan: what `hicachectl render` shows.

A change to a plan reaches render with no second copy of its logic. Only the fstab block's marker is the task's own
text (roles/storage/tasks/apply.yml, ansible.builtin.blockinfile). tests/test_render.py holds this list to every
file-writing task of the roles, templated with those plans.
"""

from __future__ import annotations

import dataclasses
import hashlib

import jinja2

from hicachectl.config import namespace
from hicachectl.config.deployment import Deployment
from hicachectl.config.paths import ROLES
from hicachectl.plans import container_runtime, host_limits, l3_collector, model, nic_tuning, router, sglang_server, storage

FSTAB = "/etc/fstab"


FSTAB_MARKER = "# {mark} hicache-deploy L3 tier"  # ansible.builtin.blockinfile's marker in roles/storage/tasks/apply.yml


SYSTEMD_DIR = "/etc/systemd/system"


@dataclasses.dataclass(frozen=True)
class HostFile:
    """One file a role writes on a host (or, for /etc/fstab, the block of it the role owns)."""
    role: str
    path: str
    content: str
    mode: str
    secret: bool = False
    masked: str | None = dataclasses.field(default=None, compare=False)
    part: str = ""  # "" for a whole file; else which part of a shared file the role owns

    @property
    def shown(self) -> str:
        return self.content if self.masked is None else self.masked

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content.encode()).hexdigest()

    def as_dict(self) -> dict:
        """For --json: a secret file carries its masked text, never its content (nor a digest of it)."""
        return {"role": self.role, "path": self.path, "mode": self.mode, "secret": self.secret, "part": self.part or None,
                "sha256": None if self.secret else self.sha256, "content": self.shown}


@dataclasses.dataclass(frozen=True)
class ToolFile:
    """A file a role has a vendor's tool write (its content is the tool's, so render cannot show it)."""
    role: str
    path: str
    command: str  # as the role's task runs it
    when: str

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Kept:
    """A path a role leaves on the host whose content is not known before the run (a record of what became healthy,
    a copy of what ran, an installed environment): named, so that render lists everything the roles leave."""
    role: str
    path: str
    what: str

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class HostChanges:
    """What the roles do to a host's files: the files they write, the files they remove when present, the files
    a vendor's tool writes at their request, and what else they leave (Kept)."""
    files: list[HostFile]
    removed: list[tuple[str, str]]  # (role, path)
    tool_files: list[ToolFile] = dataclasses.field(default_factory=list)
    kept: list[Kept] = dataclasses.field(default_factory=list)


def runtime_tool_files(d: Deployment) -> list[ToolFile]:
    """What roles/container_runtime/tasks/gpu_<runtime>.yml has the NVIDIA Container Toolkit write, per runtime (only where the
    runtime and nvidia-ctk are installed; tests/test_render.py holds these commands to the role's tasks)."""
    runtime = container_runtime.runtime_plan(d).runtime
    if runtime == "docker":
        return [ToolFile("container_runtime", "/etc/docker/daemon.json", "nvidia-ctk runtime configure --runtime=docker",
                         "when Docker's daemon.json has no nvidia runtime yet (then Docker is restarted)")]
    if runtime == "podman":
        return [ToolFile("container_runtime", "/etc/cdi/nvidia.yaml", "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml",
                         "when the file is not there yet")]
    return []


def nic_program_text() -> str:
    """The NIC program as roles/nic_tuning/tasks/converge.yml installs it: the role's file through lookup('ansible.builtin.file'),
    which strips trailing whitespace (its rstrip option, on by default: ansible/plugins/lookup/file.py), then the task's newline."""
    return (ROLES / "nic_tuning" / "files" / "hicache-nic-tuning").read_text().rstrip() + "\n"


def fstab_block(line: str) -> str:
    """What ansible.builtin.blockinfile keeps in /etc/fstab: the role's line between its two markers."""
    return f"{FSTAB_MARKER.format(mark='BEGIN')}\n{line}\n{FSTAB_MARKER.format(mark='END')}\n"


def _nic_files(nic) -> list[HostFile]:
    """roles/nic_tuning/tasks/converge.yml's files: the program, its desired state, its boot unit (and its udev rule)."""
    out = [HostFile("nic_tuning", nic.program, nic_program_text(), "0755"),
           HostFile("nic_tuning", nic.config_file, nic.config_text, "0644"),
           HostFile("nic_tuning", f"{SYSTEMD_DIR}/{nic.unit}", nic.unit_text, "0644")]
    if getattr(nic, "udev_rule_file", None):
        out.append(HostFile("nic_tuning", nic.udev_rule_file, nic.udev_rule_text, "0644"))
    return out


def _state_kept(d: Deployment) -> list[Kept]:
    """What the roles write on a server only where the host calls for it, or as a record of what they did there."""
    kept = [Kept("nic_tuning", nic_tuning.SELECTION_FILE, "the storage ports the last deploy selected: the only ports the boot unit tunes"),
            Kept("nic_tuning", nic_tuning.TOS_STAMP_FILE,
                 "when the RoCE ToS was set (until a reboot): whether the L3 mount's transports predate it, so it is not yet in effect"),
            Kept("nic_tuning", nic_tuning.IRQBALANCE_MARKER,
                 "only where IRQ pinning stopped irqbalance: that the toolkit did, so it starts it again when pinning is turned off"),
            Kept("sglang_server", sglang_server.URING_MARKER,
                 "only where NIXL could not create its io_uring backend: the server runs the POSIX plugin with posix_aio from then on")]
    if storage.is_nfs(d) and d.storage_read_ahead_kb is not None:
        where = "only where the host has no nfsrahead (nfs-utils before 2.6.2)"
        kept += [Kept("storage", storage.READ_AHEAD_RULE_FILE, f"the udev rule that sets the L3 mount's read-ahead when its bdi appears, {where}"),
                 Kept("storage", storage.READ_AHEAD_PROGRAM, f"the program that rule runs, {where}")]
    return kept


def _model_kept(d: Deployment) -> list[Kept]:
    """What the model role leaves in hicache_model_dir (roles/model/tasks/weights.yml): the weights, and beside them
    its stamp, its in-progress marker and, in a shared directory, its download lock."""
    if not d.model_source or not d.model_dir:
        return []
    where = d.model_dir.rstrip("/")
    if d.model_source == "path":
        return [Kept("model", f"{where}/", "the model weights, put there by the operator and checked (config.json, hicache_model_files' sha256)")]
    kept = [Kept("model", f"{where}/", f"the model weights, {d.model_repo}@{d.model_revision or 'the default revision'} downloaded from the hub "
                                       "(once: the stamp beside them says what is there)"),
            Kept("model", f"{where}/{model.STAMP}", "the download's stamp: repository, revision and every file's size (another, or a file "
                                                    "gone or resized, downloads again)"),
            Kept("model", f"{where}/{model.MARKER}", "present while a download runs, or after one was cut short: the next run resumes it")]
    if d.model_share:
        kept += [Kept("model", f"{where}/{model.DOWNLOAD_LOCK}", f"the download lock of the directory shared as {d.model_share}"),
                 Kept("model", f"{where}/{model.DOWNLOAD_LOCK}.guard", "the lock's guard file (hicache_lock takes the lock under it)")]
    return kept


def _runtime_left(d: Deployment) -> list[Kept]:
    """What the NVIDIA Container Toolkit wrote for a runtime this deployment no longer uses: the runtime's own
    configuration, which other containers may rely on, so it is left as it is and named (runtime_tool_files)."""
    runtime = container_runtime.runtime_plan(d).runtime
    left = []
    if runtime != "docker":
        left.append(Kept("container_runtime", "/etc/docker/daemon.json", "only if the server ran in Docker before: the nvidia runtime "
                         "`nvidia-ctk runtime configure` added to Docker's own config then stays (other containers may use it)"))
    if runtime != "podman":
        left.append(Kept("container_runtime", "/etc/cdi/nvidia.yaml", "only if the server ran in Podman before: the GPUs' CDI spec "
                         "`nvidia-ctk cdi generate` wrote then stays (other containers may use it)"))
    return left


def server_host_files(d: Deployment, fleet=None) -> HostChanges:
    """Every file site.yml's server play writes on a server, role by role in the play's order (nic_tuning, storage,
    host_limits, sglang_server), from each role's plan without host facts. What depends on the host (which ports
    the NIC program finds, whether the tier is mounted, a localports address the host lacks) is read by `plan`.
    `fleet`: every server of the inventory (host -> Deployment or None), which the L3 tier's collector needs: on the
    tier's collector its files, on the others what a collector left is removed."""
    out = _nic_files(nic_tuning.nic_plan(d))
    tier = storage.storage_plan(d, {})
    if tier.mount is not None:
        out.append(HostFile("storage", FSTAB, fstab_block(tier.mount.fstab_line), "0644", part="the block between the hicache-deploy markers"))
    out += [HostFile("storage", f["path"], f["content"], f["mode"]) for f in tier.files]
    removed = [("storage", path) for path in tier.absent]
    lim = host_limits.limits_plan(d)
    removed += [("host_limits", path) for path in lim.absent]
    if getattr(lim, "files", None):  # the plan's own list, as roles/host_limits/tasks/converge.yml hands it to hicache_files
        out += [HostFile("host_limits", f["path"], f["content"], f["mode"]) for f in lim.files]
    else:
        out.append(HostFile("host_limits", lim.limits_file, lim.limits_conf, "0644"))
        if lim.service is not None:
            out.append(HostFile("host_limits", lim.dropin_file, lim.dropin, "0644"))
        if lim.sysctl_conf is not None:
            out.append(HostFile("host_limits", lim.sysctl_file, lim.sysctl_conf, "0644"))
    server = sglang_server.server_plan(d)
    texts = {f.name: f for f in sglang_server.files(d)}  # the plan carries a secret file's masked text only: the real one is here
    for f in server.files:
        rendered = texts[f.name]
        out.append(HostFile("sglang_server", f"{server.cfg_dir.rstrip('/')}/{f.name}", rendered.content, f.mode, f.secret, rendered.masked))
    out.append(HostFile("sglang_server", f"{SYSTEMD_DIR}/{server.unit['name']}", server.unit["content"], "0644"))
    kept = [Kept("sglang_server", server.running_record,
                 "the record of the config and image the server last became healthy with (written after each healthy start; "
                 "status, upgrade and rollback read it)"),
            Kept("sglang_server", f"{server.previous_dir}/",
                 "the previous config, a copy of cfg/ as it ran before the last change: what a failed start and `hicachectl rollback` "
                 "put back (one, replaced at each change)")]
    if namespace.of(d) and (l3_dir := namespace.host_dir(d)):
        kept.append(Kept("sglang_server", f"{l3_dir.rstrip('/')}/", "the server's L3 directory on the tier (its namespace), the pages it writes: "
                         "made by serve.sh at each start and by a deploy where missing; only `hicachectl l3 --prune` (a namespace no "
                         "server uses) and the tier's collector (pages over a budget) remove from it"))
    kept += _state_kept(d) + _model_kept(d) + _runtime_left(d)
    if fleet is not None and d.inventory_host in fleet:
        collector = l3_collector.plan(d.inventory_host, {**fleet, d.inventory_host: d})
        out += [HostFile("sglang_server", f["path"], f["content"], f["mode"]) for f in collector.files]
        removed += [("sglang_server", path) for path in collector.absent]
        if collector.here:
            kept += [Kept("sglang_server", l3_collector.STATE_FILE, "the collector's counters and its last run (what it evicted, the tier's fill)"),
                     Kept("sglang_server", f"{l3_collector.TEXTFILE_DIR}/hicache_l3_collector.prom",
                          "the counters for Prometheus, where node_exporter's textfile directory exists"),
                     Kept("sglang_server", f"{d.cache_dir.rstrip('/')}/{l3_collector.LOCK_NAME}", "the tier's collector lock (on the tier)")]
    return HostChanges(out, removed, runtime_tool_files(d), kept)


def router_host_files(d: Deployment, servers: dict) -> list[HostFile]:
    """The files the router role writes (roles/router/tasks/main.yml): the workers file and the unit, rendered from
    the role's own template with its plan (hicachectl/plans/router.py). `servers`: each server's variables (ansible_host,
    hicache_port, hicache_worker_url, ...), as the role reads them from hostvars."""

    plan = router.plan(d, servers, list(servers))
    # trim_blocks and the kept final newline, as ansible.builtin.template renders it
    template = jinja2.Environment(loader=jinja2.FileSystemLoader(str(ROLES / "router" / "templates")), undefined=jinja2.StrictUndefined,
                                  trim_blocks=True, keep_trailing_newline=True, autoescape=False).get_template("sglang-router.service.j2")
    kept = [Kept("router", f"{plan['dir']}/", f"the router's virtualenv, {plan['requirement']} installed by pip "
                                              f"({' '.join(plan['pip_args']) or 'from the index pip is configured with'})")]
    if plan["wheelhouse"]:
        kept.append(Kept("router", f"{plan['wheelhouse']}/", f"the controller's wheelhouse {plan['wheelhouse_src']}, copied (the venv installs from it)"))
    return HostChanges([HostFile("router", plan["workers_env_path"], plan["workers_env"], "0644"),
                        HostFile("router", plan["unit_path"], template.render(__hicache_router=plan), "0644")], [], [], kept)
