"""A typed description of one host's deployment, with every default applied. No I/O.

The fields are the catalogue's variables without the `hicache_` prefix (`hicache_page_size` is
`Deployment.page_size`), so a variable is declared once, in `schema.py`. A few fields are resolved
here from others: `cfg_dir`, `cache_container_dir` and `sglang_version`.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from collections.abc import Mapping
from typing import Any

from hicachectl.config import schema

PREFIX = "hicache_"
# Where the config directory appears inside the server's container (run.sh: -v CFG_DIR:/cfg:ro).
CONTAINER_CFG_DIR = "/cfg"


def field_name(var_name: str) -> str:
    return var_name[len(PREFIX):]


class _DeploymentBase:
    @property
    def effective_port(self) -> int:
        return self.port if self.port is not None else 30000  # SGLang's default

    @property
    def effective_host(self) -> str:
        return self.host or "127.0.0.1"  # SGLang's default

    @property
    def local_host(self) -> str:
        """The address that reaches the server from its own host (a wildcard bind is reached on loopback)."""
        return "127.0.0.1" if self.effective_host in ("0.0.0.0", "::", "127.0.0.1", "localhost") else self.effective_host

    @property
    def served_name(self) -> str:
        """The model name the server answers to (--served-model-name, else --model-path); part of every L3 key."""
        return self.served_model_name or self.model_path

    def as_vars(self) -> dict[str, Any]:
        """Back to inventory variable names (for reports and `--json`)."""
        return {PREFIX + f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "inventory_host"}


Deployment = dataclasses.make_dataclass(
    "Deployment",
    [("inventory_host", str)]
    + [(field_name(v.name), Any) for v in schema.VARIABLES],
    bases=(_DeploymentBase,),
    frozen=True,
)
Deployment.__doc__ = "One host's deployment: every catalogue variable, defaults applied (see module doc)."

_TAG_VERSION = re.compile(r":v?(\d+\.\d+\.\d+)(?:[-.+@]|$)")


def version_from_image(image: str) -> str | None:
    """`lmsysorg/sglang:v0.5.20-cu130` -> `0.5.20`; a digest-only reference has no version."""
    match = _TAG_VERSION.search(image.split("@", 1)[0])
    return match.group(1) if match else None


def build(inventory_host: str, raw: Mapping[str, Any]) -> Any:
    """Apply defaults and resolve derived paths. Assumes `rules.check_variables` found no error."""
    values: dict[str, Any] = {}
    for var in schema.VARIABLES:
        values[field_name(var.name)] = schema.value_in(raw, var)
    if values["cfg_dir"] is None:
        values["cfg_dir"] = posixpath.join(values["base_dir"], "cfg")
    if values["cache_container_dir"] is None:
        values["cache_container_dir"] = values["cache_dir"]
    if values["sglang_version"] is None and values["image"]:
        values["sglang_version"] = version_from_image(values["image"])
    return Deployment(inventory_host=inventory_host, **values)


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


_URING_KEYS = ("use_uring", "use_aio")


def uses_uring(d: Deployment) -> bool:
    """Whether the NIXL POSIX plugin is asked for io_uring (flat config or its plugin.posix section)."""
    if d.storage_backend != "nixl":
        return False
    section = d.extra_config.get("plugin", {}).get("posix", {}) if isinstance(d.extra_config.get("plugin"), dict) else d.extra_config
    return str(section.get("use_uring", "")).lower() in ("true", "1", "yes", "y", "on", "enable")
