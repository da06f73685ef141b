"""Where the server's image comes from: the reference to pull (mirror, digest), the name it runs under,
and whether the image on a host is the one the inventory pins. No I/O.

Runtimes spell the same image differently: Docker reports `ubuntu@sha256:...` and
`lmsysorg/sglang@sha256:...` (it drops `docker.io` and `library/`), Podman reports
`docker.io/library/ubuntu@sha256:...`. Both sides of every comparison are therefore made fully
qualified first (`qualify`): registry (default docker.io, lowercase), repository path (`library/` for a
one-component Docker Hub name), tag, digest.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from hicachectl.config.deployment import Deployment
from hicachectl.plans import launch
from hicachectl.plans.plan import has_tool

DEFAULT_REGISTRY = "docker.io"
_DOCKER_HUB = {"docker.io", "index.docker.io", "registry-1.docker.io"}


@dataclasses.dataclass(frozen=True)
class Reference:
    """A fully qualified image reference: `registry/path[:tag][@digest]`."""

    registry: str
    path: str
    tag: str | None = None
    digest: str | None = None

    @property
    def repository(self) -> str:
        return f"{self.registry}/{self.path}"

    def __str__(self) -> str:
        return self.repository + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")


def _split(reference: str) -> tuple[str, str | None, str | None]:
    """`name[:tag][@digest]` -> (name as written, tag, digest)."""
    rest, _, digest = reference.strip().partition("@")
    if ":" in rest.rsplit("/", 1)[-1]:
        name, _, tag = rest.rpartition(":")
    else:
        name, tag = rest, None
    return name, tag or None, digest or None


def _registry_and_path(name: str) -> tuple[str | None, str]:
    """The first component is a registry if it has a '.' or ':', is localhost, or has capitals (Docker's rule)."""
    first, sep, rest = name.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost" or first != first.lower()):
        return first, rest
    return None, name


def parse(reference: str) -> Reference:
    """`ubuntu:24.04` -> docker.io/library/ubuntu:24.04; `Reg:5000/a/b@sha256:..` -> reg:5000/a/b@sha256:..."""
    name, tag, digest = _split(reference)
    registry, path = _registry_and_path(name)
    registry = (registry or DEFAULT_REGISTRY).lower()
    if registry in _DOCKER_HUB:
        registry = DEFAULT_REGISTRY
    if registry == DEFAULT_REGISTRY and "/" not in path:
        path = f"library/{path}"
    return Reference(registry, path, tag, digest)


def qualify(reference: str) -> str:
    """The fully qualified spelling of an image reference (see module doc)."""
    return str(parse(reference))


def pinned_digest(d: Deployment) -> str | None:
    """hicache_image_digest, else a digest written into hicache_image itself (`name@sha256:...`)."""
    return d.image_digest or _split(d.image)[2]


def pull_reference(d: Deployment) -> str:
    """What to pull: the name as the inventory writes it, or on the mirror (the path fully qualified, so a
    Docker Hub name keeps its `library/`); by digest when one is pinned, else by tag."""
    name, tag, _ = _split(d.image)
    if d.image_mirror:
        name = f"{d.image_mirror}/{parse(d.image).path}"
    digest = pinned_digest(d)
    if digest:
        return f"{name}@{digest}"
    return f"{name}:{tag}" if tag else name


def accepted_digests(d: Deployment) -> list[str]:
    """The fully qualified RepoDigests entries that prove the pinned image is there: the pinned digest in
    the repository it was pulled from (the mirror, if any) or in the one the inventory names (Podman lists
    every name of the image, Docker only where it pulled from). [] when nothing is pinned."""
    digest = pinned_digest(d)
    if not digest:
        return []
    wanted = [f"{parse(pull_reference(d)).repository}@{digest}", f"{parse(d.image).repository}@{digest}"]
    return list(dict.fromkeys(wanted))


def repository_digest(d: Deployment) -> str | None:
    """The fully qualified RepoDigests entry of a correctly pinned image pulled from where the role pulls."""
    accepted = accepted_digests(d)
    return accepted[0] if accepted else None


def has_pinned_digest(d: Deployment, repo_digests) -> bool:
    """Whether RepoDigests as a runtime reports them (Docker's or Podman's spelling) include the pin."""
    accepted = set(accepted_digests(d))
    return bool(accepted) and any(qualify(entry) in accepted for entry in repo_digests or [] if "@" in entry)


def local_state(d: Deployment, inspect_output: str | None) -> dict:
    """Judge `<runtime> image inspect <hicache_image>`'s stdout ('' or None when it failed): is the image
    there, and is it the pinned one? {'present', 'current', 'repo_digests', 'reason'}."""
    try:
        entries = json.loads(inspect_output) if inspect_output and inspect_output.strip() else []
    except ValueError:
        entries = []
    if not entries or not isinstance(entries, list) or not isinstance(entries[0], dict):
        return {"present": False, "current": False, "repo_digests": [], "reason": f"{d.image} is not on this host"}
    seen = list(entries[0].get("RepoDigests") or [])
    digest = pinned_digest(d)
    if not digest or has_pinned_digest(d, seen):
        return {"present": True, "current": True, "repo_digests": seen, "reason": ""}
    return {"present": True, "current": False, "repo_digests": seen,
            "reason": f"{d.image} on this host is not {digest} (its repository digests: {', '.join(seen) or 'none'})"}


def pull_argv(d: Deployment) -> list[str]:
    """podman takes --tls-verify per pull; docker takes insecure registries from its daemon config."""
    insecure = ["--tls-verify=false"] if d.container_runtime == "podman" and not d.image_tls_verify else []
    return [d.container_runtime, "pull", *insecure, pull_reference(d)]


@dataclasses.dataclass(frozen=True, kw_only=True)
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


def image_plan(d: Deployment, facts: dict[str, Any] | None = None, inspect: str | None = None) -> ImagePlan:
    runtime = d.container_runtime if launch.in_container(d) else None
    return ImagePlan(
        runtime=runtime,
        runtime_found=has_tool(facts, runtime) if facts is not None else None,
        image=d.image,
        pull=pull_reference(d),
        pull_argv=pull_argv(d),
        digest=pinned_digest(d),
        repo_digest=repository_digest(d),
        accepted_digests=list(accepted_digests(d)),
        retries=d.image_pull_retries,
        delay=d.image_pull_delay,
        tls_verify=d.image_tls_verify,
        strict=bool(d.strict),
        local=local_state(d, str(inspect)) if inspect is not None else None,
    )
