"""SGLang's command line, its environment, the backend config and the container command, built once.

Everything here is a list or a mapping; quoting for the shell happens only in `render.py`.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
from typing import Any

import yaml

from hicachectl.config import namespace, schema, secrets
from hicachectl.config.deployment import _URING_KEYS, CONTAINER_CFG_DIR, PREFIX, Deployment, field_name
from hicachectl.formats.tomlwriter import dumps as toml_dumps

# HiCache is what this product deploys: the flag is always on, placed where the HiCache flags start.
_FIRST_HICACHE_VAR = "hicache_size_gb"
# Rendered after the seed's flags so a seed's command line stays a prefix of ours.
OBSERVABILITY = {"enable_metrics": "--enable-metrics", "enable_cache_report": "--enable-cache-report"}


def flag_pairs(d: Deployment) -> list[tuple[str, str | None]]:
    """SGLang flags as (flag, value) pairs in catalogue order; value None for a boolean flag."""
    pairs: list[tuple[str, str | None]] = []
    for var in schema.VARIABLES:
        if var.name == _FIRST_HICACHE_VAR:
            pairs.append(("--enable-hierarchical-cache", None))
        if var.flag is None or var.secret:  # a secret flag is in server_secrets.yaml, read with --config
            continue
        value = extra_config_arg(d) if var.name == "hicache_extra_config" else getattr(d, field_name(var.name))
        if value is None or value is False:
            continue
        pairs.append((var.flag, None if value is True else str(value)))
    for name, flag in OBSERVABILITY.items():
        if getattr(d, name):
            pairs.append((flag, None))
    if server_secrets_path(d):
        pairs.append((secrets.CONFIG_FLAG, server_secrets_path(d)))
    return pairs


def server_secrets_path(d: Deployment) -> str | None:
    """Where the server reads its secret flags (secrets.SERVER_SECRETS_FILE), when it has any."""
    return posixpath.join(server_cfg_dir(d), secrets.SERVER_SECRETS_FILE) if secrets.server_secret_flags(d) else None


def flag_words(flag: str, value: str | None) -> list[str]:
    """`--flag value` as words; `--flag=value` when argparse would read the value as an option."""
    if value is None:
        return [flag]
    if value.startswith("-"):
        return [f"{flag}={value}"]
    return [flag, value]


def argv_groups(d: Deployment) -> list[list[str]]:
    """The argv start.sh execs, grouped as it is laid out: launcher, one group per flag, extra args."""
    groups = [list(d.launcher)] + [flag_words(flag, value) for flag, value in flag_pairs(d)]
    return groups + [[str(a)] for a in d.extra_args]


def sglang_argv(d: Deployment) -> list[str]:
    return [word for group in argv_groups(d) for word in group]


def server_args(d: Deployment) -> list[str]:
    """Only the SGLang arguments (no launcher): what SGLang's parser receives."""
    return sglang_argv(d)[len(d.launcher):]


def uring_fallback(d: Deployment):
    """The same deployment with the POSIX plugin on POSIX AIO instead of io_uring, O_DIRECT kept (the VAST
    document's fix for 'NIXL fails to create the uring backend')."""
    config = json.loads(json.dumps(d.extra_config))
    section = config["plugin"]["posix"] if isinstance(config.get("plugin"), dict) and "posix" in config["plugin"] else config
    for key in _URING_KEYS:
        section.pop(key, None)
    section["use_posix_aio"] = "true"
    config.setdefault("use_direct_io", True)
    return dataclasses.replace(d, extra_config=config)


def extra_config(d: Deployment) -> dict | None:
    """The backend's extra config; the dynamic backend's key_namespace is the L3 namespace (hicachectl/config/namespace.py)."""
    config = dict(d.extra_config) if d.extra_config else {}
    if d.storage_backend == "dynamic" and namespace.of(d):
        config["key_namespace"] = namespace.of(d)
    if d.storage_backend == "nixl" and d.l3_budget_gb is not None:
        # The tier's collector keeps it within its budget (plans/l3_collector.py); NIXL's own cleaner, on by default,
        # would evict this server's pages for space the others hold (rules/nixl.py _nixl_cleaner). A true the
        # inventory gives is refused there.
        config.setdefault("l3_cleaner_enabled", False)
    return config or None


def in_container(d: Deployment) -> bool:
    return d.container_runtime != "none"


def server_cfg_dir(d: Deployment) -> str:
    """The config directory as the server sees it: /cfg in a container, the host path otherwise."""
    return CONTAINER_CFG_DIR if in_container(d) else d.cfg_dir


def server_cache_dir(d: Deployment) -> str | None:
    """The server's L3 directory as it sees it: its namespace under the tier's mount point (see namespace.py)."""
    return namespace.server_dir(d, d.cache_container_dir if in_container(d) else d.cache_dir)


def extra_config_file_name(d: Deployment) -> str | None:
    """The file in cfg/ the extra config is written to: hicache_extra_config_file, or extra_config.json when the
    config holds a secret (a secret never goes inline into argv); None: inline JSON."""
    if d.extra_config_file:
        return d.extra_config_file
    if extra_config(d) is not None and secrets.extra_config_has_secrets(d):
        return secrets.DEFAULT_SECRET_EXTRA_CONFIG_FILE
    return None


def extra_config_arg(d: Deployment) -> str | None:
    """Inline JSON, or `@<cfg>/<file>` when the config is written to a file."""
    config = extra_config(d)
    if config is None:
        return None
    name = extra_config_file_name(d)
    if name:
        return "@" + posixpath.join(server_cfg_dir(d), name)
    return json.dumps(config)


def extra_config_file_text(d: Deployment, config: dict | None = None) -> str | None:
    """The extra config file's text (of `config` instead of the host's, e.g. a masked copy, when given)."""
    config = extra_config(d) if config is None else config
    name = extra_config_file_name(d)
    if config is None or not name:
        return None
    ext = posixpath.splitext(name)[1].lower()
    if ext == ".toml":
        return toml_dumps(config)
    if ext == ".json":
        return json.dumps(config, indent=2) + "\n"
    return yaml.safe_dump(config, sort_keys=False)


def container_env(d: Deployment) -> dict[str, str]:
    """Environment inside the container that may be shown: the backend's own variables, then the inventory's
    (those named in hicache_secret_keys excepted: see secret_env)."""
    env: dict[str, str] = {}
    cache = server_cache_dir(d)
    if d.storage_backend == "nixl" and cache:
        env["SGLANG_HICACHE_NIXL_BACKEND_STORAGE_DIR"] = cache
    if d.storage_backend == "nixl" and d.nixl_plugin:
        env["SGLANG_HICACHE_NIXL_BACKEND_PLUGIN"] = d.nixl_plugin
    if d.storage_backend == "file" and cache:
        env["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = cache
    secret = secrets.secret_keys(d)
    env.update({str(k): _env_text(v) for k, v in d.container_env.items() if str(k) not in secret})
    return env


def secret_env(d: Deployment) -> dict[str, str]:
    """The container's secret environment: written to cfg/secrets.env (0600), passed with --env-file."""
    return secrets.container_secret_env(d)


def secret_env_file(d: Deployment) -> str | None:
    """secrets.env on the host, when the host has secret env (docker/podman read --env-file on the host)."""
    return posixpath.join(d.cfg_dir, secrets.SECRETS_ENV) if secret_env(d) else None


def _env_text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def container_run_groups(d: Deployment, detach: bool = True) -> list[list[str]]:
    """`<runtime> run ...` as groups of words; each group is one line of run.sh (detached, as the VAST
    document runs it) or of serve.sh (in the foreground, removed on exit, for systemd)."""
    groups: list[list[str]] = [
        [d.container_runtime, "run", "--name", d.container_name, "-d" if detach else "--rm"],
        ["--network", "host", "--ipc", "host", "--gpus", d.container_gpus],
        [w for k, v in d.container_ulimits.items() for w in ("--ulimit", f"{k}={v}")],
    ]
    if d.model_dir:
        groups.append(["-v", f"{d.model_dir}:{d.model_path}:ro"])
    if d.cache_dir:
        groups.append(["-v", f"{d.cache_dir}:{d.cache_container_dir}:rw"])
    groups.append(["-v", f"{d.cfg_dir}:{CONTAINER_CFG_DIR}:ro"])
    groups.extend(["-e", f"{k}={v}"] for k, v in container_env(d).items())
    if secret_env_file(d):
        groups.append(["--env-file", secret_env_file(d)])
    if d.container_seccomp:
        groups.append(["--security-opt", f"seccomp={d.container_seccomp}"])
    if d.container_extra_args:
        groups.append([str(a) for a in d.container_extra_args])
    groups.append(["--entrypoint", "bash"])
    groups.append([d.image, posixpath.join(CONTAINER_CFG_DIR, "start.sh")])
    return [g for g in groups if g]


def container_argv(d: Deployment, detach: bool = True) -> list[str]:
    return [word for group in container_run_groups(d, detach) for word in group]


def summary(d: Deployment) -> dict[str, Any]:
    """What `render --json` and reports show of one host."""
    return {
        "host": d.inventory_host,
        "image": d.image,
        "sglang_version": d.sglang_version,
        "argv": sglang_argv(d),
        "env": container_env(d),
        "secret_env": {k: secrets.MASK for k in secret_env(d)},
        "container": container_argv(d) if in_container(d) else None,
        "extra_config": secrets.mask_config(extra_config(d), secrets.secret_keys(d)),
        "vars": {k: v for k, v in secrets.mask_vars(d).items() if k.startswith(PREFIX)},
    }
