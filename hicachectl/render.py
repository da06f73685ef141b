"""Turn a deployment into the exact files a host receives. The CLI and the Ansible filter both call this."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import pathlib
import shlex

import jinja2

from hicachectl import launch

TEMPLATES = pathlib.Path(__file__).resolve().parent.parent / "templates"


@dataclasses.dataclass(frozen=True)
class RenderedFile:
    name: str
    content: str
    mode: str  # octal, as Ansible takes it


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
    return env


def _start_sh(d) -> str:
    command = [" ".join(shell_word(w) for w in group) for group in launch.argv_groups(d)]
    return _environment().get_template("start.sh.j2").render(host=d.inventory_host, command=command)


def _script(d, template: str, detach: bool) -> str:
    container = launch.in_container(d)
    run = [" ".join(shell_word(w) for w in group) for group in launch.container_run_groups(d, detach)] if container else []
    return _environment().get_template(template).render(
        host=d.inventory_host, cfg_dir=d.cfg_dir, cache_dir=d.cache_dir, run=run, container=container,
        env=launch.container_env(d), runtime=d.container_runtime, name=d.container_name, unit=unit_name(d))


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
        out.append(RenderedFile(d.extra_config_file, config_text, "0644"))
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
            "served_model_name": d.served_name, "port": d.effective_port}
