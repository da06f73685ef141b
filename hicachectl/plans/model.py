"""The model role's plan: where the weights come from, their checksums, and whether the hub client is here."""

from __future__ import annotations

import dataclasses
from typing import Any

from hicachectl.config.deployment import Deployment
from hicachectl.plans.plan import has_tool

# What the model role leaves in hicache_model_dir beside the weights, named as plugins/modules/hicache_model_stamp.py
# names them (it runs on the host, without hicachectl: tests/test_model_stamp.py holds the two to each other).
STAMP = ".hicache-downloaded"  # repository, revision and every file's size, written once a download finished
MARKER = ".hicache-downloading"  # a download under way, or cut short: the next run resumes it
# The download lock of a shared directory (ops/rolling.py model_download), in the directory itself.
DOWNLOAD_LOCK = ".hicache-download.lock"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelPlan:
    source: str | None  # path, hub, or None (the server resolves the model itself)
    dir: str | None
    repo: str | None
    revision: str | None
    files: dict[str, str]  # file -> sha256 the weights must have
    strict: bool
    hub_client_found: bool | None  # `hf` is installed here (host facts); None without facts


def model_plan(d: Deployment, facts: dict[str, Any] | None = None) -> ModelPlan:
    return ModelPlan(
        source=d.model_source,
        dir=d.model_dir,
        repo=d.model_repo,
        revision=d.model_revision,
        files=dict(d.model_files),
        strict=bool(d.strict),
        hub_client_found=has_tool(facts, "hf") if facts is not None else None,
    )
