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
    from hicachectl import limits

    ulimits = d.container_ulimits
    text = _environment().get_template("sglang-hicache.service.j2").render(
        host=d.inventory_host, served=d.served_name, cfg_dir=d.cfg_dir,
        cache_dir=d.cache_dir, container=launch.in_container(d), runtime=d.container_runtime, name=d.container_name,
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
