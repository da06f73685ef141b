"""The sglang_server role's plan: the exact files the server's config directory and unit receive (start.sh, run.sh,
serve.sh, the backend config, the env files, the unit), the record deployed.json keeps, and what keeps a server from
running here. The CLI and the Ansible filter both call this."""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import json
import posixpath
from typing import Any

import jinja2

from hicachectl.config import namespace, secrets
from hicachectl.config.deployment import Deployment, uses_uring
from hicachectl.config.paths import TEMPLATES
from hicachectl.formats.quoting import shell_word, unit_value, unit_word
from hicachectl.plans import host_limits, l3_collector, launch, storage, storage_live
from hicachectl.plans.plan import has_tool


@dataclasses.dataclass(frozen=True)
class RenderedFile:
    name: str
    content: str
    mode: str  # octal, as Ansible takes it
    secret: bool = False  # holds secrets: mode 0600, never shown, logged, diffed or backed up
    masked: str | None = dataclasses.field(default=None, compare=False)  # the content with every secret as ********

    @property
    def shown(self) -> str:
        """What may be printed of this file."""
        return self.content if self.masked is None else self.masked


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        autoescape=False,
    )
    env.filters["shq"] = shell_word
    env.filters["unit_value"] = unit_value
    env.filters["unit_word"] = unit_word
    env.filters["mount_unit_name"] = mount_unit_name  # only [A-Za-z0-9:_.\\-]: a unit list takes it as it is
    return env


def compile_templates() -> None:
    """Compile every template of the server's files now, into the environment's cache. Ansible forks a worker per task
    and host, and a worker that plans the server (its files, its record paths) would compile them again for itself;
    compiled in the controller process before the forks (the callback hicache_preload calls this), they are inherited."""
    environment = _environment()
    for name in environment.list_templates():
        environment.get_template(name)


def mount_unit_name(path) -> str:
    """The name systemd gives the mount unit of `path` (systemd-escape --path --suffix=mount, systemd.unit(5)):
    slashes become dashes, any byte but ASCII letters, digits, ':', '_' and '.' (and a leading '.') becomes \\xNN."""
    inner = "/".join(part for part in str(path).split("/") if part)
    if not inner:
        return "-.mount"
    out = []
    for i, byte in enumerate(inner.encode()):
        char = chr(byte)
        if char == "/":
            out.append("-")
        elif (char.isascii() and (char.isalnum() or char in ":_.")) and not (i == 0 and char == "."):
            out.append(char)
        else:
            out.append(f"\\x{byte:02x}")
    return "".join(out) + ".mount"


def _start_sh(d: Deployment) -> str:
    command = [" ".join(shell_word(w) for w in group) for group in launch.argv_groups(d)]
    return _environment().get_template("start.sh.j2").render(host=d.inventory_host, command=command)


def _script(d: Deployment, template: str, detach: bool) -> str:
    container = launch.in_container(d)
    run = [" ".join(shell_word(w) for w in group) for group in launch.container_run_groups(d, detach)] if container else []
    return _environment().get_template(template).render(
        # the server's own L3 directory (its namespace under the tier) exists before it starts
        host=d.inventory_host, cfg_dir=d.cfg_dir, cache_dir=namespace.host_dir(d) or d.cache_dir, run=run, container=container,
        namespace_dir=namespace.host_dir(d) if namespace.of(d) else None,
        env=launch.container_env(d), secret_env_file=launch.secret_env_file(d), runtime=d.container_runtime,
        name=d.container_name, unit=unit_name(d))


def unit_name(d: Deployment) -> str:
    return f"{d.service_name}.service"


def _limit(value) -> str:
    return "infinity" if int(value) < 0 else str(value)


def unit(d: Deployment) -> RenderedFile:
    """The systemd unit that keeps the server running (serve.sh in the foreground)."""
    ulimits = d.container_ulimits
    text = _environment().get_template("sglang-hicache.service.j2").render(
        host=d.inventory_host, served=d.served_name, cfg_dir=d.cfg_dir,
        cache_dir=d.cache_dir, l3_mount=storage.mount_point(d),
        container=launch.in_container(d), runtime=d.container_runtime, name=d.container_name,
        runtime_service=host_limits.runtime_service(d) if launch.in_container(d) else None,
        memlock=_limit(ulimits.get("memlock", -1)), stack=_limit(ulimits.get("stack", 67108864)))
    return RenderedFile(unit_name(d), text, "0644")


def files(d: Deployment) -> list[RenderedFile]:
    """Every file of the host's config directory, in a stable order."""
    out = [RenderedFile("start.sh", _start_sh(d), "0755"), RenderedFile("run.sh", _script(d, "run.sh.j2", True), "0755"),
           RenderedFile("serve.sh", _script(d, "serve.sh.j2", False), "0755")]
    config_text = launch.extra_config_file_text(d)
    if config_text is not None:
        if secrets.extra_config_has_secrets(d):
            masked = launch.extra_config_file_text(d, secrets.mask_config(launch.extra_config(d), secrets.secret_keys(d)))
            out.append(RenderedFile(launch.extra_config_file_name(d), config_text, secrets.SECRET_MODE, True, masked))
        else:
            out.append(RenderedFile(launch.extra_config_file_name(d), config_text, "0644"))
    secret_flags = secrets.server_secret_flags(d)
    if secret_flags:
        out.append(RenderedFile(secrets.SERVER_SECRETS_FILE, secrets.server_secrets_text(secret_flags), secrets.SECRET_MODE, True,
                                secrets.server_secrets_text(dict.fromkeys(secret_flags, secrets.MASK))))
    secret_env = launch.secret_env(d)
    if secret_env:
        out.append(RenderedFile(secrets.SECRETS_ENV, secrets.env_file_text(secret_env), secrets.SECRET_MODE, True,
                                secrets.env_file_text(dict.fromkeys(secret_env, secrets.MASK))))
    out.append(unit(d))  # kept with the config, so a rollback restores the unit that ran with it
    return out + [RenderedFile(INSTALLED, json.dumps(deployed(d, out), indent=2, sort_keys=True) + "\n", "0644")]


# installed.json describes the files in cfg/; the role copies it to deployed.json only once a server started
# with them and answered /health, so deployed.json always describes what runs (status, rollback read it).
INSTALLED, DEPLOYED = "installed.json", "deployed.json"


def record_paths(d: Deployment) -> tuple[str, str]:
    """deployed.json and installed.json in the host's config directory: where the role writes them, the host facts read
    them, and every reader (status, rollback, a downgrade's judgement) looks for them."""
    return posixpath.join(d.cfg_dir, DEPLOYED), posixpath.join(d.cfg_dir, INSTALLED)


RENDERED_BY = "Rendered by hicache-deploy"  # the first lines of every file the templates render (templates/*.j2)


def config_hash(rendered: list[RenderedFile]) -> str:
    digest = hashlib.sha256()
    for f in rendered:
        digest.update(f"{f.name}\0{f.mode}\0{f.content}\0".encode())
    return digest.hexdigest()[:16]


def deployed(d: Deployment, rendered: list[RenderedFile]) -> dict:
    """The record of a config: installed.json beside its files, deployed.json once it runs. Changes only with the config."""
    return {"config_hash": config_hash(rendered), "image": d.image, "sglang_version": d.sglang_version,
            "served_model_name": d.served_name, "port": d.effective_port,
            # where its pages go: `hicachectl l3 --prune` keeps what a running server uses, whatever the inventory says now
            "l3_namespace": namespace.of(d), "l3_dir": namespace.host_dir(d)}


# --- every file a host receives -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ServerFile:
    name: str
    content: str  # a file holding secrets carries its masked text (this plan is shown at -v and in every event)
    mode: str
    secret: bool


# Read back by the host facts module (plugins/modules/hicache_host_facts.py URING_MARKER, which cannot import this).
URING_MARKER = "/etc/hicache/nixl-uring-unavailable"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerPlan:
    cfg_dir: str
    previous_dir: str
    deployed: dict[str, Any]  # what deployed.json records once the server is healthy with these files
    # deployed.json (the config the server runs: written once it is healthy with it) and installed.json (the config cfg/
    # holds), by path; `records` is both: the host facts' copies a restart makes stale (restart.yml, the io_uring fallback).
    running_record: str
    installed_record: str
    # Each as the host facts read it, in slurp's shape ({'content': base64} when the file is there, {} when it is not),
    # or None where the facts did not read it (facts read by another role with other variables): converge.yml reads it then.
    running: dict[str, str] | None
    installed: dict[str, str] | None
    files: list[ServerFile]
    # What hicache_files writes in one step: every file without a secret. Backed up only over files this toolkit did not
    # write (no installed.json of ours yet: first_install): after that, cfg.previous is the one previous config.
    public_files: list[dict[str, Any]]
    directories: list[dict[str, Any]]  # the config directory
    # The server's L3 directory where it may be made now (l3_directory), in the same step as a data directory: last,
    # as serve.sh makes it, never beneath an unmounted fstab mount, never hanging on a hung one (hicache_files).
    data_directories: list[dict[str, Any]]
    records: list[str]
    # The secret files this config has none of (removed: an old secret does not stay on the host), and the backups an
    # earlier release left of files it wrote (stale_backups), removed in the same step.
    absent_secret_files: list[str]
    uring_fallback: bool
    uring_marker: str  # written when NIXL could not create its io_uring backend here: the POSIX plugin then runs posix_aio
    unit: dict[str, str]
    health_url: str
    health_timeout: int
    runtime: str | None
    container_name: str  # the server's container, where it runs in one: its processes answer /health for the unit
    uses_uring: bool
    uring_requested: bool
    strict: bool
    cannot_run: str  # why no server can run here (no systemd, no container runtime); '' when it can, or without facts
    # The L3 tier's collector (plans/l3_collector.py): whether this server's tier has a budget, and the config file
    # whose presence (the host facts read it) says a collector runs here. Neither: its tasks are not even included.
    l3_budget: bool = False
    collector_config: str = l3_collector.CONFIG_FILE
    # The changed items of that step that change what the server runs (a restart): the files' labels, not a removed backup.
    restart_items: list[str] = dataclasses.field(default_factory=list)


def backed_up_files(d: Deployment) -> list[str]:
    """The files whose backups the host facts list (hicache_host_facts' reads.backups_of, each with whether it carries
    RENDERED_BY): every file without a secret that the role writes in cfg/, and the same in cfg.previous/ (its copy for
    rollback)."""
    names = [f.name for f in files(d) if not f.secret] + [DEPLOYED]
    previous = d.cfg_dir.rstrip("/") + ".previous"
    return [f"{folder}/{name}" for folder in (d.cfg_dir.rstrip("/"), previous) for name in names]


def stale_backups(d: Deployment, facts: dict[str, Any] | None) -> list[str]:
    """The backups (Ansible's FILE.PID.DATE@TIME~) of files this toolkit wrote that an earlier release left in cfg/ and
    cfg.previous/ (before #34 each change left one): toolkit-written when the file is one only the toolkit writes
    (installed.json, deployed.json) or the backup's first lines carry the header of every file it renders (the host
    facts say whether: no backup's text leaves the host, an operator's own may hold a secret). A backup
    of the operator's own file (the first install's) has neither, and stays."""
    stale = []
    for path, marked in sorted(((facts or {}).get("backups") or {}).items()):
        original = posixpath.basename(path).rsplit(".", 2)[0]  # FILE of FILE.PID.YYYY-MM-DD@HH:MM:SS~
        if original in (INSTALLED, DEPLOYED) or marked is True:  # marked: its first lines hold RENDERED_BY (the host judged)
            stale.append(path)
    return stale


def first_install(d: Deployment, facts: dict[str, Any] | None) -> bool:
    """Whether cfg/ may hold files this toolkit did not write (an operator's own start.sh, kept as a backup when
    replaced): true unless the host facts read our installed.json there. Without that read (no facts, or facts that
    did not read the file) it is taken as true, so nothing of the operator's is lost."""
    return not ((facts or {}).get("files") or {}).get(record_paths(d)[1])


def l3_directory(d: Deployment, facts: dict[str, Any] | None) -> str | None:
    """The server's own L3 directory (its namespace under the tier) where the role may make it now: the tier is a local
    directory, or its mount is there (the host facts' mountinfo). serve.sh makes it at every start; a deploy makes it
    again when something removed it under a running server (a prune, SGLang's clear, an operator), whose writes fail
    until then. Never under a mount point without its mount (the pages would go to the disk beneath it), never without
    host facts (render, plan without a host), and never the tier itself (namespace off: the storage role makes it).
    hicache_files checks again on the host when it makes it: every fstab mount above it mounted, its parent there."""
    if facts is None or not namespace.of(d) or not (where := namespace.host_dir(d)):
        return None
    point = storage.mount_point(d)
    if point is not None and storage_live.mount_at(storage_live.parse_mountinfo(str(facts.get("mountinfo") or "")), point) is None:
        return None
    return where


def as_read(facts: dict[str, Any] | None, path: str) -> dict[str, str] | None:
    """A file as the host facts read it, in slurp's shape: {'content': its text in base64} when it is there, {} when it is
    not, None when the facts did not read it (or there are none)."""
    read = (facts or {}).get("files") or {}
    if path not in read:
        return None
    text = read[path]
    return {"content": base64.b64encode(text.encode()).decode()} if isinstance(text, str) else {}


def with_uring_fallback(d: Deployment, uring_fallback: bool):
    """The deployment as the server runs it: NIXL's POSIX plugin on POSIX AIO where io_uring failed on this host."""
    return launch.uring_fallback(d) if uring_fallback and uses_uring(d) else d


def server_plan(d: Deployment, uring_fallback: bool = False, facts: dict[str, Any] | None = None) -> ServerPlan:
    asks_uring = uses_uring(d)
    d = with_uring_fallback(d, uring_fallback)
    rendered = files(d)
    unit = next(f for f in rendered if f.name == unit_name(d))
    runtime = d.container_runtime if launch.in_container(d) else None
    running_record, installed_record = record_paths(d)
    cannot_run = ""
    if facts is not None:
        if not facts.get("systemd"):
            cannot_run = f"systemd does not run this host; start {d.cfg_dir}/serve.sh by other means"
        elif runtime is not None and not has_tool(facts, runtime):
            cannot_run = f"{runtime} is not installed on this host"
    return ServerPlan(
        cfg_dir=d.cfg_dir,
        previous_dir=d.cfg_dir.rstrip("/") + ".previous",
        deployed=json.loads(next(f.content for f in rendered if f.name == INSTALLED)),
        running_record=running_record,
        installed_record=installed_record,
        running=as_read(facts, running_record),
        installed=as_read(facts, installed_record),
        uring_marker=URING_MARKER,
        files=[ServerFile(f.name, f.shown, f.mode, f.secret) for f in rendered],
        public_files=[{"path": f"{d.cfg_dir}/{f.name}", "content": f.content, "mode": f.mode, "owner": "root", "group": "root", "backup": first_install(d, facts),
          "label": f.name} for f in rendered if not f.secret],
        absent_secret_files=[f"{d.cfg_dir}/{name}" for name in (secrets.SECRETS_ENV, secrets.SERVER_SECRETS_FILE) if name not in {f.name for f in rendered}]
        + stale_backups(d, facts),
        uring_fallback=bool(uring_fallback and asks_uring),
        unit={"name": unit.name, "content": unit.content},
        directories=[{"path": d.cfg_dir, "owner": "root", "group": "root", "mode": "0755", "label": "config directory"}],
        data_directories=[{"path": ns_dir, "label": "L3 namespace directory"}] if (ns_dir := l3_directory(d, facts)) else [],
        records=[running_record, installed_record],
        health_url=f"http://{d.local_host}:{d.effective_port}/health",
        health_timeout=d.health_timeout,
        runtime=runtime,
        container_name=d.container_name,
        uses_uring=asks_uring and not uring_fallback,
        uring_requested=asks_uring,
        strict=bool(d.strict),
        cannot_run=cannot_run,
        l3_budget=l3_collector.budgeted(d),
        restart_items=[f.name for f in rendered if not f.secret] + [secrets.SECRETS_ENV, secrets.SERVER_SECRETS_FILE],
    )
