"""Pass 2, the cache tiers as a whole: the dynamic backend (the ADP card's limits), the L3 namespace, the host
pool against the host's RAM, and both tiers against the workload (with the model's config)."""

from __future__ import annotations

import re

from hicachectl.config import namespace
from hicachectl.config.deployment import PREFIX, Deployment
from hicachectl.rules import nixl
from hicachectl.rules.findings import rule
from hicachectl.rules.variables import _type_ok

_DYNAMIC_REQUIRED = ("backend_name", "module_path", "class_name")


@rule
def _dynamic_backend(d: Deployment, out):
    if d.storage_backend != "dynamic":
        return
    for key in _DYNAMIC_REQUIRED:
        if not isinstance(d.extra_config.get(key), str) or not d.extra_config.get(key):
            out.error(f"hicache_extra_config.{key}", "dynamic-backend", "is required by SGLang's dynamic backend loader.",
                      f"set {key} (the ADP card: backend_name xkv, module_path xkv_sglang_hicache, class_name XkvHiCacheStorage).")
    if d.extra_config.get("backend_name") == "xkv":
        _xkv_limits(d, out)


def _xkv_limits(d: Deployment, out):
    for name, flag in (("pp_size", "pipeline parallelism"), ("dp_size", "data parallelism"), ("attn_cp_size", "context parallelism")):
        value = getattr(d, name)
        if value is not None and value > 1:
            out.error(PREFIX + name, "xkv-limits", f"{flag} {value}: the ADP backend supports tensor parallelism only and refuses to start.", f"set {PREFIX + name}: 1.")
    if d.enable_dp_attention:
        out.error("hicache_enable_dp_attention", "xkv-limits", "DP attention is not supported by the ADP backend.", "set it to false.")
    if d.extra_config.get("hicache_storage_pass_prefix_keys") is not True:
        out.warn("hicache_extra_config.hicache_storage_pass_prefix_keys", "xkv-prefix-keys",
                 "is not true, so the ADP backend cannot find the dialog of a page.", "set it to true.")
    namespace = d.extra_config.get("key_namespace")
    if isinstance(namespace, str) and len(namespace.encode()) > 64:
        out.error("hicache_extra_config.key_namespace", "xkv-limits", "is longer than 64 bytes.", "shorten it.")
    max_io = d.extra_config.get("max_io_bytes")
    if max_io is not None and (not _type_ok("int", max_io) or max_io > 131072):
        out.error("hicache_extra_config.max_io_bytes", "xkv-limits", f"{max_io!r}: the card takes at most 131072 bytes in one transfer.", "keep 131072.")


@rule
def _l3_namespace(d: Deployment, out):
    if d.storage_backend is None:
        return
    if d.storage_backend in ("file", "nixl") and namespace.looks_like_bucket(d.l3_namespace):
        out.error("hicache_l3_namespace", "l3-namespace-bucket",
                  f"{d.l3_namespace!r} has the form of a NIXL bucket directory (two hex digits, sglang nixl/nixl_routing.py): "
                  "`hicachectl l3`, `--prune` and NIXL's cleaner would take the namespace for a bucket of pages.",
                  "use a name of three or more characters, or auto.")
    if d.l3_namespace == "off":
        out.warn("hicache_l3_namespace", "l3-namespace-off",
                 "is off: pages go directly into the tier, so a server whose KV dtype, TP layout or memory layout changed reads the "
                 "old pages as its own (SGLang's keys do not hold them, sglang#33268).",
                 "set hicache_l3_namespace: auto (the shipped profiles keep off only to reproduce their vendors' documents' paths).")
    elif d.storage_backend == "dynamic" and "key_namespace" in d.extra_config:
        out.error("hicache_extra_config.key_namespace", "l3-namespace",
                  "is set while hicache_l3_namespace sets the backend's key_namespace itself.",
                  "remove key_namespace and set hicache_l3_namespace to that name (or to off to keep yours).")


def host_pool_ranks(d: Deployment) -> tuple[int, str]:
    """How many host pools of --hicache-size one server pins, and how: one per rank (sglang's size is per rank,
    #14282): TP x PP, times DP when DP is a set of replicas (with DP attention the DP ranks are the TP ranks)."""
    tp, pp, dp = d.tp_size or 1, d.pp_size or 1, d.dp_size or 1
    if d.enable_dp_attention:
        dp = 1
    parts = [f"{n} {what}" for n, what in ((tp, "TP"), (pp, "PP"), (dp, "DP")) if n > 1 or what == "TP"]
    return tp * pp * dp, " x ".join(parts) + " ranks"


@rule
def _host_pool_fits(d: Deployment, out):
    if d.host_ram_gb is None or d.size_gb is None:
        return
    ranks, how = host_pool_ranks(d)
    pool = d.size_gb * ranks
    available = d.host_ram_gb - d.host_ram_headroom_gb
    if pool > available:
        out.error("hicache_size_gb", "host-pool-ram",
                  f"{d.size_gb} GB x {how} = {pool} GB of pinned host pool, but the host has {d.host_ram_gb} GB "
                  f"and keeps {d.host_ram_headroom_gb} GB free; SGLang stops with 'Not enough host memory available'.",
                  f"lower hicache_size_gb to {max(available // ranks, 0)} or less.")


# The file backend's bounds (sglang 0.5.23 mem_cache/storage/file/lru_file_evictor.py, LRUFileEvictor._load_config):
# extra-config keys first, else the environment. Without a size cap or a free-space floor the tier grows without
# bound. A size is bytes or human_readable_int's (sglang/srt/utils/common.py) SI k/M/G/T (decimals allowed) or IEC
# Ki/Mi/Gi/Ti (integers); anything else is logged and turns eviction off, a ratio outside (0, 1] becomes 0.9.
_FILE_BOUNDS = {"max_size": "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE", "min_free_space": "SGLANG_HICACHE_FILE_BACKEND_MIN_FREE_SPACE"}
_FILE_RATIO = ("eviction_ratio", "SGLANG_HICACHE_FILE_BACKEND_EVICTION_RATIO")
_SIZE = re.compile(r"\d+|\d+(?:\.\d+)?[kMGT]|\d+(?:Ki|Mi|Gi|Ti)")


def _file_bound(d: Deployment, key: str, env: str):
    """(where it is set, the value) of one bound: the extra config's key, else the container's environment."""
    if d.extra_config.get(key) is not None:
        return f"hicache_extra_config.{key}", d.extra_config[key]
    if env in d.container_env:
        return f"hicache_container_env.{env}", d.container_env[env]
    return None, None


def _size_set(value) -> bool:
    return value is not None and str(value).strip() not in ("", "0")


@rule
def _file_backend_bounds(d: Deployment, out):
    if d.storage_backend != "file":
        return
    bounded = False
    for key, env in _FILE_BOUNDS.items():
        where, value = _file_bound(d, key, env)
        if where is None:
            continue
        if isinstance(value, bool) or not (_type_ok("int", value) and value >= 0 or isinstance(value, str) and _SIZE.fullmatch(value.strip())):
            out.error(where, "file-backend-size",
                      f"{value!r} is not a size SGLang's file backend reads; it logs 'Invalid size' and stores without bound.",
                      "give bytes or a number with k, M, G, T (powers of 1000) or Ki, Mi, Gi, Ti (powers of 1024), e.g. '800G'.")
        bounded = bounded or _size_set(value)
    where, ratio = _file_bound(d, *_FILE_RATIO)
    if where is not None:
        try:
            ok = not isinstance(ratio, bool) and 0.0 < float(ratio) <= 1.0
        except (TypeError, ValueError):
            ok = False
        if not ok:
            out.error(where, "file-backend-size", f"{ratio!r} is not a fraction in (0, 1]; SGLang's file backend uses 0.9 instead.",
                      "give e.g. 0.9 (evict down to 90% of max_size).")
    if bounded and d.l3_budget_gb is not None:
        out.warn("hicache_extra_config.max_size", "file-lru-with-budget",
                 "SGLang's file LRU is set on an L3 tier with a budget (hicache_l3_budget_gb): it evicts only "
                 "this server's own files, by its own count, beside the tier's collector that judges every namespace together.",
                 "leave max_size and min_free_space unset on a tier with a budget (the collector bounds it).")
    if not bounded and d.l3_budget_gb is None:
        out.warn("hicache_extra_config.max_size", "file-backend-unbounded",
                 "SGLang's file backend stores pages without bound unless max_size or min_free_space is set (extra config, or "
                 "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE / _MIN_FREE_SPACE): the tier fills up and every write then fails.",
                 "give the tier a budget (hicache_l3_budget_gb: the toolkit's collector keeps it), or set hicache_extra_config.max_size "
                 "(e.g. '800G', below the tier's size) or min_free_space (e.g. '50G').")


@rule
def _l3_budget(d: Deployment, out):
    """A budget needs pages in files on the host's tier (the file and nixl backends under hicache_cache_dir)."""
    if d.l3_budget_gb is None:
        if d.l3_namespace_share_pct is not None:
            out.warn("hicache_l3_namespace_share_pct", "l3-budget", "is set without hicache_l3_budget_gb: there is no budget to share.",
                     "set hicache_l3_budget_gb on the servers of the tier, or remove the share.")
        return
    if namespace.host_dir(d) is None:
        out.error("hicache_l3_budget_gb", "l3-budget",
                  f"needs the server's pages in files under hicache_cache_dir (the file or nixl backend); the {d.storage_backend or 'unset'} "
                  "backend keeps them where the collector cannot see them.",
                  "remove hicache_l3_budget_gb, or use the file or nixl backend with hicache_cache_dir.")
    elif d.storage_backend == "nixl" and nixl.plugin_in_effect(d) == "OBJ":
        # SGLang 0.5.23 makes no file manager for an OBJ plugin (storage/nixl/hicache_nixl.py HiCacheNixl.__init__): no file on the tier
        out.error("hicache_l3_budget_gb", "l3-budget",
                  "needs the server's pages in files under hicache_cache_dir, but NIXL's OBJ plugin (hicache_nixl_plugin or the "
                  "extra config's plugin section) keeps them in an object store, where the collector cannot see them.",
                  "remove hicache_l3_budget_gb (bound the bucket with the object store's own lifecycle rules), or use a file plugin (POSIX).")


@rule
def _working_set(d: Deployment, out):
    """With the model's config, the host pool and the L3 tier are checked against the workload they must hold."""
    if d.model_config is None:
        return
    from hicachectl.config import sizing

    try:
        s = sizing.size(sizing.model_shape(sizing.load_config(d.model_config)), sizing.workload_for(d))
    except sizing.SizingError as exc:
        out.error("hicache_model_config", "model-config", str(exc), "point it at the model's config.json on this machine.")
        return
    w = s.workload
    if d.size_gb is not None and d.size_gb * sizing.GB < s.host_pool_per_rank:
        out.warn("hicache_size_gb", "host-pool-working-set",
                 f"{d.size_gb} GB per rank holds {d.size_gb * sizing.GB // s.page_bytes_per_rank} pages of "
                 f"{sizing.human(s.page_bytes_per_rank)}, but {w.concurrency} request(s) x {w.context_tokens} tokens need "
                 f"{s.host_pool_per_rank / sizing.GB:.0f} GB; pages beyond it are dropped (fewer L3 hits).",
                 f"raise hicache_size_gb to {-(-s.host_pool_per_rank // sizing.GB)} or lower hicache_workload_concurrency.")
    if d.storage_capacity_gb is not None and d.workload_prefixes and d.storage_capacity_gb * sizing.GB < s.l3_capacity:
        out.warn("hicache_storage_capacity_gb", "l3-capacity",
                 f"{d.storage_capacity_gb} GB cannot keep {w.prefixes} prefixes of {w.context_tokens} tokens "
                 f"({s.l3_bytes_per_prefix / sizing.GB:.1f} GB each, {s.l3_capacity / sizing.GB:.0f} GB in all).",
                 f"give the tier {-(-s.l3_capacity // sizing.GB)} GB or lower hicache_workload_prefixes.")
