"""Pass 2, the NIXL backend: the plugin sections and parameters of hicache_extra_config, the ranks its keys hold,
its L3 cleaner, and io_uring in Docker."""

from __future__ import annotations

import difflib
import posixpath
from collections.abc import Mapping
from typing import Any

from hicachectl.config.deployment import PREFIX, Deployment
from hicachectl.rules.findings import rule
from hicachectl.rules.sglang import _SGLANG_KEYS
from hicachectl.rules.variables import _type_ok

# NIXL plugin parameters (ai-dynamo/nixl); SGLang hands each one to NIXL as str(value).
_NIXL_TOP_LEVEL = {"use_direct_io", "l3_cleaner_enabled", "l3_cleaner_high_watermark", "l3_cleaner_low_watermark"}
# NIXL's bool conversion (src/utils/common/config_traits.h; NIXL 1.5.1's own message: "known are y, yes, on, 1,
# true, enable as positive and n, no, off, 0, false, disable as negative (case insensitive)"). A JSON true reaches
# NIXL as SGLang's str(True), 'True', which is positive.
_NIXL_TRUE_WORDS = {"y", "yes", "on", "1", "true", "enable"}
_NIXL_BOOL_WORDS = _NIXL_TRUE_WORDS | {"n", "no", "off", "0", "false", "disable"}
_NIXL_POSIX_BOOLS = ("use_aio", "use_uring", "use_posix_aio")
_NIXL_POSIX_RANGES = {"ios_pool_size": (64, 65536), "kernel_queue_size": (16, 1024)}
_NIXL_SECTIONS = {"posix", "gds_mt", "gds", "hf3fs", "obj"}


def plugin_in_effect(d: Deployment) -> str:
    """The NIXL plugin SGLang 0.5.23 picks for this server (storage/nixl/nixl_utils.py get_specified_plugin): with a
    'plugin' section in the extra config, its first section marked active (True, "true" or "True"), upper-cased;
    without one, SGLANG_HICACHE_NIXL_BACKEND_PLUGIN (hicache_nixl_plugin), else "auto"."""
    sections = (d.extra_config or {}).get("plugin")
    if isinstance(sections, dict):
        for name, params in sections.items():
            if isinstance(params, dict) and params.get("active", False) in (True, "true", "True"):
                return str(name).upper()
        return ""  # none active: SGLang then fails to pick one (nixl-plugin-section)
    return (d.nixl_plugin or "auto").upper()


def nixl_true(value: Any) -> bool:
    """Whether NIXL reads the value SGLang hands it (str(value)) as true."""
    return str(value).lower() in _NIXL_TRUE_WORDS


def _nixl_plugin_params(d: Deployment, out, plugin: str, params: Mapping[str, Any], where: str) -> None:
    plugin = plugin.upper()
    # NIXL 1.5.1's POSIX plugin picks one io queue and refuses two asked for at once: "POSIX I/O queue parameters
    # use_aio, use_uring, and use_posix_aio are mutually exclusive" (backend creation fails, so SGLang does not start).
    # A key set to false is no request. Seen with nixl-cu12 1.5.1's POSIX plugin (agent.createBackend), see
    # tests/test_nixl_io_queue.py.
    queues = [key for key in _NIXL_POSIX_BOOLS if key in params and nixl_true(params[key])]
    if len(queues) > 1:
        out.error(f"{where}.{queues[1]}", "nixl-io-queue",
                  f"{' and '.join(queues)} are both true; NIXL's POSIX plugin takes at most one io queue and refuses to start "
                  "('mutually exclusive').",
                  f"keep one of {', '.join(queues)} (none: NIXL picks libaio, which also works where io_uring is blocked).")
    for key, value in params.items():
        path = f"{where}.{key}"
        if key in _NIXL_POSIX_BOOLS:
            if plugin not in ("POSIX", "AUTO"):
                out.error(path, "nixl-param-plugin", f"is a POSIX plugin parameter but the plugin is {plugin}.", "remove it or select the POSIX plugin.")
            if isinstance(value, bool):
                continue  # SGLang hands NIXL 'True'/'False', which NIXL reads case-insensitively
            if not isinstance(value, (str, int)) or str(value).lower() not in _NIXL_BOOL_WORDS:
                out.error(path, "nixl-param-type", f"{value!r} is not a value NIXL reads as a boolean; the backend fails to start.",
                          "use true or false.")
        elif key in _NIXL_POSIX_RANGES:
            low, high = _NIXL_POSIX_RANGES[key]
            if not _type_ok("int", value):
                out.error(path, "nixl-param-type", f"{value!r} is not an integer.", f"use an integer from {low} to {high}.")
            elif not low <= value <= high:
                out.warn(path, "nixl-param-range", f"{value} is outside {low}-{high}; NIXL clamps it.", f"use a value from {low} to {high}.")
        elif key == "thread_count":
            if plugin not in ("GDS_MT", "AUTO"):
                out.error(path, "nixl-param-plugin", f"is a GDS_MT parameter but the plugin is {plugin}.", "remove it or select GDS_MT.")
            if not _type_ok("int", value) or value < 1:
                out.error(path, "nixl-param-type", f"{value!r} is not a positive integer.", "use e.g. 32.")
        elif key in ("batch_pool_size", "batch_limit", "max_request_size", "iopool_size"):
            if not _type_ok("int", value) or value < 1:
                out.error(path, "nixl-param-type", f"{value!r} is not a positive integer.", "use a positive integer.")
        elif key == "active":
            if value not in (True, "true", "True") and value not in (False, "false", "False"):
                out.error(path, "nixl-param-type", f"{value!r}: SGLang treats only true/'true'/'True' as active.", "use true or false.")
        elif isinstance(value, (dict, list)):
            out.error(path, "nixl-param-type", "is nested; NIXL parameters are flat text values.", "give a scalar value.")


@rule
def _nixl_config(d: Deployment, out):
    if d.storage_backend != "nixl":
        return
    config = d.extra_config
    if "use_direct_io" in config and not isinstance(config["use_direct_io"], bool):
        out.error("hicache_extra_config.use_direct_io", "nixl-param-type", f"{config['use_direct_io']!r}: SGLang takes bool(value), so any non-empty text means true.",
                  "use true or false without quotes.")
    if "l3_cleaner_enabled" in config and not isinstance(config["l3_cleaner_enabled"], bool):
        out.error("hicache_extra_config.l3_cleaner_enabled", "nixl-param-type", "must be a real boolean; SGLang raises ValueError otherwise.", "use true or false without quotes.")
    for key in ("l3_cleaner_high_watermark", "l3_cleaner_low_watermark"):
        if key in config and not _type_ok("float", config[key]):
            out.error(f"hicache_extra_config.{key}", "nixl-param-type", f"{config[key]!r} is not a number.", "use a percentage such as 80.")
    if "plugin" in config:
        sections = config["plugin"]
        if not isinstance(sections, dict) or not sections:
            out.error("hicache_extra_config.plugin", "nixl-plugin-section", "must map plugin names to their parameters.", "e.g. plugin: {gds_mt: {thread_count: 32, active: true}}.")
            return
        if d.nixl_plugin:
            out.warn("hicache_nixl_plugin", "nixl-plugin-ignored", "is ignored: SGLang takes the plugin from the 'plugin' section of the extra config.", "remove hicache_nixl_plugin.")
        active = [name for name, params in sections.items() if isinstance(params, dict) and params.get("active", False) in (True, "true", "True")]
        if not active:
            out.error("hicache_extra_config.plugin", "nixl-plugin-section", "has no section with active: true; SGLang then fails to pick a plugin.", "add active: true to the plugin to use.")
        for name, params in sections.items():
            if name not in _NIXL_SECTIONS:
                close = difflib.get_close_matches(name, _NIXL_SECTIONS, n=1)
                out.error(f"hicache_extra_config.plugin.{name}", "nixl-plugin-section", f"is not a NIXL file plugin ({', '.join(sorted(_NIXL_SECTIONS))}).",
                          f"use {close[0]}." if close else "use one of those names (3FS is hf3fs).")
            elif isinstance(params, dict):
                _nixl_plugin_params(d, out, name, params, f"hicache_extra_config.plugin.{name}")
    else:
        params = {k: v for k, v in config.items() if k not in _NIXL_TOP_LEVEL and k not in _SGLANG_KEYS}
        _nixl_plugin_params(d, out, d.nixl_plugin or "auto", params, "hicache_extra_config")


@rule
def _nixl_rank_keys(d: Deployment, out):
    """NIXL's keys end in _{model}_{tp_rank}_{tp_size} only (sglang 0.5.23 nixl/hicache_nixl.py, tp_config_suffix;
    MLA: _{model}): the ranks of another pipeline stage or attention-CP group write the same file names, so each
    overwrites the others' pages and a reader loads another stage's layers as its own."""
    if d.storage_backend != "nixl":
        return
    for name, what in (("pp_size", "pipeline parallelism"), ("attn_cp_size", "attention context parallelism")):
        value = getattr(d, name)
        if value is not None and value > 1:
            out.error(PREFIX + name, "nixl-rank-keys",
                      f"{what} {value} with the nixl backend: NIXL's keys hold only the TP rank and size "
                      f"(_{{model}}_{{tp_rank}}_{{tp_size}}), so the ranks of each {'stage' if name == 'pp_size' else 'CP group'} "
                      "overwrite each other's pages.",
                      f"set {PREFIX + name}: 1, or use hicache_storage_backend: file (its keys hold the PP and CP ranks).")


def _under(path: str | None, base: str | None) -> bool:
    if not path or not base:
        return False
    path, base = posixpath.normpath(path), posixpath.normpath(base)
    return path == base or path.startswith(base.rstrip("/") + "/")


@rule
def _nixl_cleaner(d: Deployment, out):
    """NIXL's L3 cleaner (sglang 0.5.23 nixl/nixl_utils.py get_l3_cleaner_config, nixl/nixl_cleaner.py): on unless
    l3_cleaner_enabled is false; every 30 s, once the *filesystem* of its base directory is at high_watermark % (80)
    used (statvfs), it deletes the oldest pages it finds down to low_watermark % (70). It finds only the 2-hex bucket
    directories directly under its own base directory (this server's namespace), so on a tier that also holds other
    servers' namespaces, old namespaces or the model's weights, it empties the live namespace to free space that
    others hold. Old namespaces are `hicachectl l3 --prune`'s (docs/sglang-rules.md)."""
    if d.storage_backend != "nixl":
        return
    config = d.extra_config
    enabled = config.get("l3_cleaner_enabled", True)
    high, low = config.get("l3_cleaner_high_watermark", 80.0), config.get("l3_cleaner_low_watermark", 70.0)
    if _type_ok("float", high) and _type_ok("float", low) and not low < high:
        out.error("hicache_extra_config.l3_cleaner_low_watermark", "nixl-cleaner",
                  f"{low} is not below l3_cleaner_high_watermark {high}; SGLang's cleaner raises ValueError and the server does not start.",
                  "keep the low watermark below the high one (defaults 70 and 80).")
    if d.l3_budget_gb is not None:
        if "l3_cleaner_enabled" in config and enabled is not False:
            out.error("hicache_extra_config.l3_cleaner_enabled", "nixl-cleaner-budget",
                      f"is {enabled!r} on a tier with a budget (hicache_l3_budget_gb {d.l3_budget_gb}): the tier's collector keeps it "
                      "within the budget across every server, and NIXL's cleaner would evict this server's pages for space the others hold.",
                      "remove hicache_extra_config.l3_cleaner_enabled (the toolkit turns NIXL's cleaner off on a tier with a budget).")
        return
    if enabled is not True:
        return
    fix = ("give the tier a budget (hicache_l3_budget_gb: its collector keeps every namespace in bounds and turns NIXL's cleaner off), "
           "or set hicache_extra_config.l3_cleaner_enabled: false and keep the tier in bounds with `hicachectl l3 --prune` "
           "(it removes namespaces no server uses), or give this server an export of its own.")
    if d.l3_share:
        out.warn("hicache_extra_config.l3_cleaner_enabled", "nixl-cleaner-shared",
                 f"NIXL's L3 cleaner is on (its default) on the shared L3 tier {d.l3_share}: it watches the whole filesystem's "
                 f"usage ({high}% -> {low}%) but deletes only in its own directory, so each server evicts its live pages for space "
                 "the other servers' pages hold.", fix)
    if _under(d.model_dir, d.cache_dir):
        out.warn("hicache_extra_config.l3_cleaner_enabled", "nixl-cleaner-weights",
                 f"NIXL's L3 cleaner is on (its default) and hicache_model_dir {d.model_dir} lies on the L3 tier {d.cache_dir}: the weights "
                 f"count toward its {high}% watermark, so it evicts live pages for space the weights hold (and never below it, if they alone pass it).",
                 "move hicache_model_dir off the L3 tier, or " + fix)
