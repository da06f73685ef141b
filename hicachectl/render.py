"""Turn a deployment into the exact files a host receives. The CLI and the Ansible filter both call this."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
import shlex

import jinja2

from hicachectl import launch, namespace, secrets
from hicachectl.paths import TEMPLATES


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


def shell_word(word: str) -> str:
    return shlex.quote(str(word))


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


def _one_line(text: str) -> str:
    """The rules refuse line breaks and control characters in every value; one reaching a unit is a bug, never written."""
    if any(ord(c) < 32 or ord(c) == 127 or c in "\x85\u2028\u2029" for c in text):
        raise ValueError(f"{text!r} cannot be written on one line of a systemd unit")
    return text


def unit_value(value) -> str:
    """A value of a systemd unit setting that is not split into words (Description=, After=): specifiers escaped."""
    return _one_line(str(value)).replace("%", "%%")


_UNIT_PLAIN_WORD = re.compile(r"[A-Za-z0-9/._+:=@,-]+")


def unit_word(word) -> str:
    """One word of a setting systemd splits into words (Exec*=, RequiresMountsFor=): specifiers (%), variables ($),
    quotes and backslashes escaped, so systemd reads back exactly `word`."""
    text = _one_line(str(word)).replace("%", "%%")
    if _UNIT_PLAIN_WORD.fullmatch(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$") + '"'


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


def _start_sh(d) -> str:
    command = [" ".join(shell_word(w) for w in group) for group in launch.argv_groups(d)]
    return _environment().get_template("start.sh.j2").render(host=d.inventory_host, command=command)


def _script(d, template: str, detach: bool) -> str:
    container = launch.in_container(d)
    run = [" ".join(shell_word(w) for w in group) for group in launch.container_run_groups(d, detach)] if container else []
    return _environment().get_template(template).render(
        # the server's own L3 directory (its namespace under the tier) exists before it starts
        host=d.inventory_host, cfg_dir=d.cfg_dir, cache_dir=namespace.host_dir(d) or d.cache_dir, run=run, container=container,
        namespace_dir=namespace.host_dir(d) if namespace.of(d) else None,
        env=launch.container_env(d), secret_env_file=launch.secret_env_file(d), runtime=d.container_runtime,
        name=d.container_name, unit=unit_name(d))


def unit_name(d) -> str:
    return f"{d.service_name}.service"


def _limit(value) -> str:
    return "infinity" if int(value) < 0 else str(value)


def unit(d) -> RenderedFile:
    """The systemd unit that keeps the server running (serve.sh in the foreground)."""
    from hicachectl import limits, storage

    ulimits = d.container_ulimits
    text = _environment().get_template("sglang-hicache.service.j2").render(
        host=d.inventory_host, served=d.served_name, cfg_dir=d.cfg_dir,
        cache_dir=d.cache_dir, l3_mount=storage.mount_point(d),
        container=launch.in_container(d), runtime=d.container_runtime, name=d.container_name,
        runtime_service=limits.runtime_service(d) if launch.in_container(d) else None,
        memlock=_limit(ulimits.get("memlock", -1)), stack=_limit(ulimits.get("stack", 67108864)))
    return RenderedFile(unit_name(d), text, "0644")


def files(d) -> list[RenderedFile]:
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


def config_hash(rendered: list[RenderedFile]) -> str:
    digest = hashlib.sha256()
    for f in rendered:
        digest.update(f"{f.name}\0{f.mode}\0{f.content}\0".encode())
    return digest.hexdigest()[:16]


def deployed(d, rendered: list[RenderedFile]) -> dict:
    """The record of a config: installed.json beside its files, deployed.json once it runs. Changes only with the config."""
    return {"config_hash": config_hash(rendered), "image": d.image, "sglang_version": d.sglang_version,
            "served_model_name": d.served_name, "port": d.effective_port,
            # where its pages go: `hicachectl l3 --prune` keeps what a running server uses, whatever the inventory says now
            "l3_namespace": namespace.of(d), "l3_dir": namespace.host_dir(d)}


# --- every file a host receives -------------------------------------------------------------------------
# `hicachectl render` shows these per host, offline. Each comes from the plan the role itself asks for
# (hicachectl/plans.py for the server roles, hicachectl/router.py for the router) and applies: a change to a plan
# reaches render with no second copy of its logic. Only the fstab block's marker is the task's own text
# (roles/storage/tasks/apply.yml, ansible.builtin.blockinfile). tests/test_render.py holds this list to every
# file-writing task of the roles, templated with those plans.

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
class HostChanges:
    """What the roles do to a host's files: the files they write, the files they remove when present, and the files
    a vendor's tool writes at their request."""
    files: list[HostFile]
    removed: list[tuple[str, str]]  # (role, path)
    tool_files: list[ToolFile] = dataclasses.field(default_factory=list)


def runtime_tool_files(d) -> list[ToolFile]:
    """What roles/container_runtime/tasks/apply.yml has the NVIDIA Container Toolkit write, per runtime (only where the
    runtime and nvidia-ctk are installed; tests/test_render.py holds these commands to the role's tasks)."""
    from hicachectl import plans

    runtime = plans.runtime_plan(d).runtime
    if runtime == "docker":
        return [ToolFile("container_runtime", "/etc/docker/daemon.json", "nvidia-ctk runtime configure --runtime=docker",
                         "when Docker's daemon.json has no nvidia runtime yet (then Docker is restarted)")]
    if runtime == "podman":
        return [ToolFile("container_runtime", "/etc/cdi/nvidia.yaml", "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml",
                         "when the file is not there yet")]
    return []


def nic_program_text() -> str:
    """The NIC program as roles/nic_tuning/tasks/apply.yml installs it: the role's file through lookup('ansible.builtin.file'),
    which strips trailing whitespace (its rstrip option, on by default: ansible/plugins/lookup/file.py), then the task's newline."""
    from hicachectl.paths import ROLES

    return (ROLES / "nic_tuning" / "files" / "hicache-nic-tuning").read_text().rstrip() + "\n"


def fstab_block(line: str) -> str:
    """What ansible.builtin.blockinfile keeps in /etc/fstab: the role's line between its two markers."""
    return f"{FSTAB_MARKER.format(mark='BEGIN')}\n{line}\n{FSTAB_MARKER.format(mark='END')}\n"


def _nic_files(nic) -> list[HostFile]:
    """roles/nic_tuning/tasks/apply.yml's files: the program, its desired state, its boot unit (and its udev rule)."""
    out = [HostFile("nic_tuning", nic.program, nic_program_text(), "0755"),
           HostFile("nic_tuning", nic.config_file, nic.config_text, "0644"),
           HostFile("nic_tuning", f"{SYSTEMD_DIR}/{nic.unit}", nic.unit_text, "0644")]
    if getattr(nic, "udev_rule_file", None):
        out.append(HostFile("nic_tuning", nic.udev_rule_file, nic.udev_rule_text, "0644"))
    return out


def server_host_files(d) -> HostChanges:
    """Every file site.yml's server play writes on a server, role by role in the play's order (nic_tuning, storage,
    host_limits, sglang_server), from each role's plan without host facts. What depends on the host (which ports
    the NIC program finds, whether the tier is mounted, a localports address the host lacks) is read by `plan`."""
    from hicachectl import plans

    out = _nic_files(plans.nic_plan(d))
    storage = plans.storage_plan(d, {})
    if storage.mount is not None:
        out.append(HostFile("storage", FSTAB, fstab_block(storage.mount.fstab_line), "0644", part="the block between the hicache-deploy markers"))
    out += [HostFile("storage", f["path"], f["content"], f["mode"]) for f in storage.files]
    removed = [("storage", path) for path in storage.absent]
    lim = plans.limits_plan(d)
    if getattr(lim, "files", None):  # the plan's own list, as roles/host_limits/tasks/apply.yml hands it to hicache_files
        out += [HostFile("host_limits", f["path"], f["content"], f["mode"]) for f in lim.files]
    else:
        out.append(HostFile("host_limits", lim.limits_file, lim.limits_conf, "0644"))
        if lim.service is not None:
            out.append(HostFile("host_limits", lim.dropin_file, lim.dropin, "0644"))
        if lim.sysctl_conf is not None:
            out.append(HostFile("host_limits", lim.sysctl_file, lim.sysctl_conf, "0644"))
    server = plans.server_plan(d)
    texts = {f.name: f for f in files(d)}  # the plan carries a secret file's masked text only: the real one is here
    for f in server.files:
        rendered = texts[f.name]
        out.append(HostFile("sglang_server", f"{server.cfg_dir.rstrip('/')}/{f.name}", rendered.content, f.mode, f.secret, rendered.masked))
    out.append(HostFile("sglang_server", f"{SYSTEMD_DIR}/{server.unit['name']}", server.unit["content"], "0644"))
    return HostChanges(out, removed, runtime_tool_files(d))


def router_host_files(d, servers: dict) -> list[HostFile]:
    """The files the router role writes (roles/router/tasks/main.yml): the workers file and the unit, rendered from
    the role's own template with its plan (hicachectl/router.py). `servers`: each server's variables (ansible_host,
    hicache_port, hicache_worker_url, ...), as the role reads them from hostvars."""
    from hicachectl import router
    from hicachectl.paths import ROLES

    plan = router.plan(d, servers, list(servers))
    # trim_blocks and the kept final newline, as ansible.builtin.template renders it
    template = jinja2.Environment(loader=jinja2.FileSystemLoader(str(ROLES / "router" / "templates")), undefined=jinja2.StrictUndefined,
                                  trim_blocks=True, keep_trailing_newline=True, autoescape=False).get_template("sglang-router.service.j2")
    return HostChanges([HostFile("router", plan["workers_env_path"], plan["workers_env"], "0644"),
                        HostFile("router", plan["unit_path"], template.render(__hicache_router=plan), "0644")], [])
