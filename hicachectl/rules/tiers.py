"""Pass 2, the cache tiers as a whole: the dynamic backend (the ADP card's limits), the L3 namespace, the host
pool against the host's RAM, and both tiers against the workload (with the model's config)."""

from __future__ import annotations

from hicachectl.model import PREFIX
from hicachectl.rules.findings import rule
from hicachectl.rules.variables import _type_ok

_DYNAMIC_REQUIRED = ("backend_name", "module_path", "class_name")


@rule
def _dynamic_backend(d, out):
    if d.storage_backend != "dynamic":
        return
    for key in _DYNAMIC_REQUIRED:
        if not isinstance(d.extra_config.get(key), str) or not d.extra_config.get(key):
            out.error(f"hicache_extra_config.{key}", "dynamic-backend", "is required by SGLang's dynamic backend loader.",
                      f"set {key} (the ADP card: backend_name xkv, module_path xkv_sglang_hicache, class_name XkvHiCacheStorage).")
    if d.extra_config.get("backend_name") == "xkv":
        _xkv_limits(d, out)


def _xkv_limits(d, out):
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
def _l3_namespace(d, out):
    if d.storage_backend is None:
        return
    if d.l3_namespace == "off":
        out.warn("hicache_l3_namespace", "l3-namespace-off",
                 "is off: pages go directly into the tier, so a server whose KV dtype, TP layout or memory layout changed reads the "
                 "old pages as its own (SGLang's keys do not hold them, sglang#33268).",
                 "set hicache_l3_namespace: auto (the seed profiles keep off only to reproduce their documents' paths).")
    elif d.storage_backend == "dynamic" and "key_namespace" in d.extra_config:
        out.error("hicache_extra_config.key_namespace", "l3-namespace",
                  "is set while hicache_l3_namespace sets the backend's key_namespace itself.",
                  "remove key_namespace and set hicache_l3_namespace to that name (or to off to keep yours).")


@rule
def _host_pool_fits(d, out):
    if d.host_ram_gb is None or d.size_gb is None:
        return
    ranks = d.tp_size or 1
    pool = d.size_gb * ranks
    available = d.host_ram_gb - d.host_ram_headroom_gb
    if pool > available:
        out.error("hicache_size_gb", "host-pool-ram",
                  f"{d.size_gb} GB x {ranks} TP ranks = {pool} GB of pinned host pool, but the host has {d.host_ram_gb} GB "
                  f"and keeps {d.host_ram_headroom_gb} GB free; SGLang stops with 'Not enough host memory available'.",
                  f"lower hicache_size_gb to {max(available // ranks, 0)} or less.")


@rule
def _working_set(d, out):
    """With the model's config, the host pool and the L3 tier are checked against the workload they must hold."""
    if d.model_config is None:
        return
    from hicachectl import sizing

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
