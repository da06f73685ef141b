"""Turn a deployment into the exact files a host receives. The CLI and the Ansible filter both call this."""

from __future__ import annotations

import dataclasses
import functools
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


def _run_sh(d) -> str:
    run = [" ".join(shell_word(w) for w in group) for group in launch.container_run_groups(d)]
    return _environment().get_template("run.sh.j2").render(
        host=d.inventory_host, cfg_dir=d.cfg_dir, cache_dir=d.cache_dir, run=run
    )


def files(d) -> list[RenderedFile]:
    """Every file of the host's config directory, in a stable order."""
    out = [RenderedFile("start.sh", _start_sh(d), "0755"), RenderedFile("run.sh", _run_sh(d), "0755")]
    config_text = launch.extra_config_file_text(d)
    if config_text is not None:
        out.append(RenderedFile(d.extra_config_file, config_text, "0644"))
    return out
