"""Where the server's image comes from: the reference to pull (mirror, digest) and the name it runs under. No I/O."""

from __future__ import annotations

import re

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def split(image: str) -> tuple[str | None, str, str | None]:
    """`reg:5000/a/b:tag` -> ('reg:5000', 'a/b', 'tag'); the first part is a registry only if it looks like one."""
    name, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", None)
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first, rest, tag or None
    return None, name, tag or None


def pull_reference(d) -> str:
    registry, repository, tag = split(d.image.split("@", 1)[0])
    registry = d.image_mirror or registry
    base = f"{registry}/{repository}" if registry else repository
    if d.image_digest:
        return f"{base}@{d.image_digest}"
    return f"{base}:{tag}" if tag else base


def repository_digest(d) -> str | None:
    """What the runtime lists in RepoDigests for a correctly pinned image."""
    if not d.image_digest:
        return None
    return pull_reference(d)


def valid_digest(value: str) -> bool:
    return bool(_DIGEST.match(value))


def pull_argv(d) -> list[str]:
    """podman takes --tls-verify per pull; docker takes insecure registries from its daemon config."""
    insecure = ["--tls-verify=false"] if d.container_runtime == "podman" and not d.image_tls_verify else []
    return [d.container_runtime, "pull", *insecure, pull_reference(d)]
