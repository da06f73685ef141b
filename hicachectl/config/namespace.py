"""The L3 namespace of a server: where on the L3 tier its pages live, so pages are reused only where they are valid.

SGLang's L3 keys hash the model name, the page size and the tokens, but not everything that changes what a page
holds: the file backend's keys omit the KV dtype (sglang#33268), a page written by TP 8 is not the page TP 4 reads,
and the memory layout decides the bytes' order. With `hicache_l3_namespace: auto` every such setting goes into the
name of a directory under hicache_cache_dir (the dynamic backend's `key_namespace`), so a changed config starts an
empty namespace instead of reading stale pages, and identical servers share theirs. `off` keeps SGLang's own
behaviour (the seed documents': pages directly in hicache_cache_dir); any other value is the name itself.
No I/O.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re

from hicachectl.config.deployment import Deployment

OFF, AUTO = "off", "auto"
# SGLang's defaults (0.5.21's parser), so a value left unset and the same value set explicitly share a namespace.
_DEFAULTS = {"kv_cache_dtype": "auto", "tp_size": 1, "pp_size": 1, "attn_cp_size": 1, "mem_layout": "page_first"}
# What `auto` derives: (Deployment field, the words a finding or explanation uses).
COMPONENTS = (
    ("served_name", "model"),
    ("weights", "model weights"),
    ("model_revision", "model revision"),
    ("kv_cache_dtype", "KV dtype"),
    ("page_size", "page size"),
    ("tp_size", "TP size"),
    ("pp_size", "PP size"),
    ("attn_cp_size", "attention CP size"),
    ("mem_layout", "memory layout"),
    ("storage_backend", "backend"),
)
# Flags without a variable of their own that change the page bytes when given in hicache_extra_args: the model
# dtype decides what KV dtype auto becomes, quantization and the weights' revision what the KV holds.
EXTRA_FLAGS = ("--dtype", "--quantization", "--revision")
# The derivation's own version: part of every hash, raised only when what it hashes must change (every server then
# starts an empty namespace), never by rewording COMPONENTS.
FORMAT = 1
HASH_CHARS = 12
# The form of a derived name: the model's slug, '-', HASH_CHARS hex digits (is_derived tells one from a literal).
_DERIVED = re.compile(rf"[a-z0-9][a-z0-9._-]{{0,40}}-[0-9a-f]{{{HASH_CHARS}}}")


def _value(d: Deployment, field: str):
    if field == "served_name":
        return d.served_name
    if field == "weights":  # the weights behind the name: the hub repository, else the path the server loads
        return d.model_repo or d.model_path
    value = getattr(d, field)
    return _DEFAULTS.get(field) if value is None else value


def _fields(d: Deployment) -> dict[str, str | None]:
    return {field: None if _value(d, field) is None else str(_value(d, field)) for field, _ in COMPONENTS} | _extra_flags(d)


def components(d: Deployment) -> dict[str, str]:
    """Everything that changes the page format, as display strings (words of COMPONENTS -> value)."""
    words = dict(COMPONENTS) | {flag: flag for flag in EXTRA_FLAGS}
    return {words[field]: "default" if value is None else value for field, value in _fields(d).items()}


def _extra_flags(d: Deployment) -> dict[str, str]:
    """The flags of EXTRA_FLAGS that hicache_extra_args gives (`--flag value` or `--flag=value`)."""
    found, args = {}, [str(a) for a in d.extra_args]
    for i, arg in enumerate(args):
        flag, _, value = arg.partition("=")
        if flag in EXTRA_FLAGS:
            found[flag] = value if value else (args[i + 1] if i + 1 < len(args) else "")
    return found


def _slug(d: Deployment) -> str:
    return slug_of(str(d.served_name))


def slug_of(served_name: str) -> str:
    """The model's part of a namespace name: the served name's last component, lower case, other characters as -."""
    base = posixpath.basename(served_name.rstrip("/")) or "model"
    slug = re.sub(r"[^a-z0-9._-]+", "-", base.lower()).strip("-._") or "model"
    return slug[:40].rstrip("-._") or "model"


def derived(d: Deployment) -> str:
    """The name `auto` gives: the model's slug and a hash of every component (stable across runs and hosts)."""
    digest = hashlib.sha256(json.dumps({"format": FORMAT, **_fields(d)}, sort_keys=True).encode()).hexdigest()[:HASH_CHARS]
    return f"{_slug(d)}-{digest}"


def is_derived(name: str) -> bool:
    """Whether a directory name has the form `auto` gives (a literal namespace may have any form)."""
    return bool(_DERIVED.fullmatch(name))


def of(d: Deployment) -> str | None:
    """This server's namespace; None when the namespace is off or the server has no L3 tier."""
    if d.storage_backend is None or d.l3_namespace == OFF:
        return None
    return derived(d) if d.l3_namespace in (None, AUTO) else d.l3_namespace


def _join(base: str | None, name: str | None) -> str | None:
    return posixpath.join(base, name) if base and name else base


def host_dir(d: Deployment) -> str | None:
    """The server's L3 directory on its host: <hicache_cache_dir>/<namespace>, or hicache_cache_dir when off."""
    return _join(d.cache_dir, of(d)) if d.storage_backend in ("file", "nixl") else None


def server_dir(d: Deployment, cache_dir: str | None) -> str | None:
    """The same directory as the server sees it, under `cache_dir` (the container's mount point of the tier)."""
    return _join(cache_dir, of(d))


def explain(d: Deployment) -> str:
    """One line for `validate`: the namespace and what it is derived from."""
    if d.storage_backend is None:
        return "no L3 tier (hicache_storage_backend unset)"
    name = of(d)
    where = f"{host_dir(d)}" if host_dir(d) else "the dynamic backend's key_namespace"
    if name is None:
        return (f"off: pages go directly into {d.cache_dir or 'the backend'}; a server with another KV dtype, TP layout or "
                "memory layout on this tier reads them as its own")
    parts = ", ".join(f"{k} {v}" for k, v in components(d).items())
    how = f"derived from {parts}" if d.l3_namespace in (None, AUTO) else "set by hicache_l3_namespace"
    return f"{name} ({how}) at {where}"


def differences(a, b) -> list[str]:
    """What differs between two servers' page formats and namespaces, one phrase each ("KV dtype auto vs fp8_e4m3")."""
    left, right = components(a), components(b)
    found = [f"{words} {left.get(words, 'default')} vs {right.get(words, 'default')}"
             for words in dict.fromkeys([*left, *right]) if left.get(words, "default") != right.get(words, "default")]
    if of(a) != of(b):
        found.append(f"namespace {of(a) or 'off'} vs {of(b) or 'off'}")
    return found


# What SGLang's own keys hold, by backend and attention type: the page hash chain starts from the model name and the
# page size, and the backend adds a suffix (sglang 0.5.23, python/sglang/srt/mem_cache/):
#   file  `<hash>[.<pool>]_<served name>_<tp_rank>_<tp_size>[_<pp>_<rank>][_cp<r>_<s>].bin` (hicache_storage.py,
#         HiCacheFile): TP, PP and attention CP are keyed; for an MLA model the KV is replicated across TP ranks
#         and the suffix is `_<served name>[_<pp>_<rank>][_cp<r>_<s>]` (config_suffix): TP is not keyed, unless
#         decode context parallel (--dcp-size > 1) adds `_tp<tp_size>_dcp<r>_<s>_page<n>` to every key;
#   nixl  `_{model}_{tp_rank}_{tp_size}` only (storage/nixl/hicache_nixl.py, tp_config_suffix), `_{model}` for an MLA
#         model (config_suffix): PP and CP ranks are not keyed, so rules/nixl.py refuses PP > 1 and attention CP > 1;
#   any other backend: its own scheme, unknown here, so only what the hash chain holds counts.
# Servers differing in one of these never read each other's pages, even in one directory; servers of different
# backends neither (a .bin file is not a bucket directory's page).
_CHAIN = ("model", "page size")
KEYED_BY_BACKEND = {
    "file": _CHAIN + ("TP size", "PP size", "attention CP size"),
    "nixl": _CHAIN + ("TP size",),
}


def dcp_size(d: Deployment) -> int:
    """--dcp-size in hicache_extra_args (`--dcp-size N` or `--dcp-size=N`), 1 when not given or not a number."""
    args = [str(a) for a in d.extra_args]
    for i, arg in enumerate(args):
        flag, _, value = arg.partition("=")
        if flag == "--dcp-size":
            value = value or (args[i + 1] if i + 1 < len(args) else "")
            return int(value) if value.isdigit() else 1
    return 1


def keyed(backend: str | None, mla: bool | None = False, dcp: bool = False) -> tuple[str, ...]:
    """What `backend`'s own keys hold (the words of COMPONENTS), for an MLA model or not. `mla` None (the attention
    type is not known) counts as MLA: TP size is then not taken for a key. `dcp`: decode context parallel (file)."""
    words = KEYED_BY_BACKEND.get(backend or "", _CHAIN)
    if mla is not False and not (dcp and backend == "file"):
        words = tuple(w for w in words if w != "TP size")
    return words


def collisions(a, b, mla: bool | None = False) -> list[str]:
    """How two servers writing into ONE directory would read each other's pages as their own: what differs in
    their page format that SGLang's keys do not hold ([] when the keys themselves differ, or nothing does).
    `mla`: whether the model is MLA (None: not known, judged as MLA, where TP is not in the keys)."""
    left, right = components(a), components(b)
    if left["backend"] != right["backend"]:
        return []
    dcp_a, dcp_b = dcp_size(a), dcp_size(b)
    if dcp_a != dcp_b and a.storage_backend == "file":
        return []  # the DCP suffix keys the size: their files differ
    if any(left[words] != right[words] for words in keyed(a.storage_backend, mla, dcp_a > 1)):
        return []
    return [f"{words} {left.get(words, 'default')} vs {right.get(words, 'default')}"
            for words in dict.fromkeys([*left, *right]) if left.get(words, "default") != right.get(words, "default")]


# NIXL's files sit in bucket directories named by BUCKET_HEX_CHARS (2) lower-case hex digits directly under its base
# directory (nixl/nixl_routing.py route_key, nixl_cleaner.py _BUCKET_NAME_RE): a namespace of that form cannot be
# told from a bucket by `l3`, `--prune` or NIXL's cleaner.
BUCKET = re.compile(r"[0-9a-fA-F]{2}")


def looks_like_bucket(name: str | None) -> bool:
    return bool(name) and BUCKET.fullmatch(name) is not None
