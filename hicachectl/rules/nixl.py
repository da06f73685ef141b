"""Pass 2, the NIXL backend: the plugin sections and parameters of hicache_extra_config, and io_uring in Docker."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from hicachectl.rules.findings import rule
from hicachectl.rules.sglang import _SGLANG_KEYS
from hicachectl.rules.variables import _type_ok

# NIXL plugin parameters (ai-dynamo/nixl); SGLang hands each one to NIXL as str(value).
_NIXL_TOP_LEVEL = {"use_direct_io", "l3_cleaner_enabled", "l3_cleaner_high_watermark", "l3_cleaner_low_watermark"}
_NIXL_BOOL_WORDS = {"y", "yes", "on", "1", "true", "enable", "n", "no", "off", "0", "false", "disable"}
_NIXL_POSIX_BOOLS = ("use_aio", "use_uring", "use_posix_aio")
_NIXL_POSIX_RANGES = {"ios_pool_size": (64, 65536), "kernel_queue_size": (16, 1024)}
_NIXL_SECTIONS = {"posix", "gds_mt", "gds", "hf3fs", "obj"}


def _nixl_plugin_params(d, out, plugin: str, params: Mapping[str, Any], where: str) -> None:
    plugin = plugin.upper()
    for key, value in params.items():
        path = f"{where}.{key}"
        if key in _NIXL_POSIX_BOOLS:
            if plugin not in ("POSIX", "AUTO"):
                out.error(path, "nixl-param-plugin", f"is a POSIX plugin parameter but the plugin is {plugin}.", "remove it or select the POSIX plugin.")
            if isinstance(value, bool):
                if value:
                    out.warn(path, "nixl-bool-text", "is a JSON boolean, which reaches NIXL as the text 'True'; NIXL releases that compare with 'true' or '1' exactly then ignore it.",
                             'write the string "true" to be sure (the seed documents use the boolean).')
            elif not isinstance(value, str) or value.lower() not in _NIXL_BOOL_WORDS:
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
def _nixl_config(d, out):
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
def _uring_in_container(d, out):
    from hicachectl.launch import uses_uring

    if uses_uring(d) and d.container_runtime == "docker" and not d.container_seccomp:
        out.warn("hicache_container_seccomp", "uring-seccomp",
                 "NIXL's POSIX plugin is asked for io_uring, which Docker's default seccomp profile blocks (io_uring_setup/enter/register); "
                 "NIXL then fails to create its backend and the deploy falls back to posix_aio.",
                 "set hicache_container_seccomp to a profile that allows the io_uring syscalls (or unconfined), or use posix_aio.")
