"""Pass 2, SGLang's command line: image and model, SGLang version, served name, GPUs, chunked prefill, the host
pool, io backend x layout, hicache_extra_args (incompatible and managed flags, with their aliases), what a storage
backend needs, the service without a container, the extra config file and the keys SGLang reads from it."""

from __future__ import annotations

import ipaddress
import math
import posixpath
import re

from hicachectl.config import schema, secrets
from hicachectl.config.deployment import CONTAINER_CFG_DIR, PREFIX, Deployment, version_tuple
from hicachectl.rules.findings import rule
from hicachectl.rules.variables import _TYPE_WORDS, _type_ok


@rule
def _image_pinned(d: Deployment, out):
    image = d.image
    if image is None:  # a role that does not read it, run alone (check_host's role)
        return
    if "@sha256:" in image:
        return
    tag = image.rsplit("/", 1)[-1].partition(":")[2]
    if not tag or tag == "latest":
        out.error("hicache_image", "image-pinned", f"{image!r} is not pinned to a version, so hosts may run different servers.",
                  "name a version tag (e.g. lmsysorg/sglang:v0.5.20-cu130) or a digest (@sha256:...).")


@rule
def _image_source(d: Deployment, out):
    if (d.image_mirror or d.image_digest) and d.container_runtime == "none":
        out.error("hicache_image_mirror" if d.image_mirror else "hicache_image_digest", "no-container", "there is no image to pull with hicache_container_runtime: none.", "remove it.")


@rule
def _model_source(d: Deployment, out):
    if d.model_source and not d.model_dir:
        out.error("hicache_model_dir", "model-dir-required", f"hicache_model_source {d.model_source} needs a directory for the weights.",
                  "set hicache_model_dir to hicache_model_path (no container: the server reads the weights where they are put)."
                  if d.container_runtime == "none" else "set hicache_model_dir (mounted at hicache_model_path).")
    if d.model_source == "hub" and not d.model_repo:
        out.error("hicache_model_repo", "model-repo-required", "is needed to download from the hub.", "set it, e.g. Qwen/Qwen3-8B.")
    if d.model_dir and d.model_path is not None and d.container_runtime != "none" and not re.fullmatch(r"/[^:]*", d.model_path):
        out.error("hicache_model_path", "mount-path", f"{d.model_path!r} is where hicache_model_dir is mounted in the container (-v DIR:PATH:ro), "
                  "so it must be an absolute path without ':'.", "use a container path such as /models/weights, or remove hicache_model_dir.")


@rule
def _sglang_version_known(d: Deployment, out):
    if d.sglang_version is None:
        out.error("hicache_sglang_version", "sglang-version", f"cannot be read from the image {d.image!r}.",
                  f"set hicache_sglang_version to one of {', '.join(schema.SGLANG_VERSIONS)}.")
    elif d.sglang_version not in schema.SGLANG_VERSIONS:
        out.error("hicache_sglang_version", "sglang-version", f"{d.sglang_version} is outside the versions this release was checked against.",
                  f"use an image with SGLang {', '.join(schema.SGLANG_VERSIONS)}, or set hicache_sglang_version to the nearest of them if you know the flags match.")
        return
    else:
        for var in schema.VARIABLES:
            value = getattr(d, var.name[len(PREFIX):])
            if var.min_sglang and value not in (None, False, [], {}) and version_tuple(d.sglang_version) < version_tuple(var.min_sglang):
                out.error(var.name, "sglang-version", f"needs SGLang {var.min_sglang} or newer; the image has {d.sglang_version}.",
                          f"remove {var.name} or use a newer image.")


@rule
def _served_name(d: Deployment, out):
    if d.served_model_name is not None and ":" in d.served_model_name:
        out.error("hicache_served_model_name", "served-name-colon",
                  f"{d.served_model_name!r} contains ':', which SGLang reserves for 'model:adapter' and refuses at start.",
                  f"use {d.served_model_name.replace(':', '-')!r}.")
    if d.served_model_name is None and d.storage_backend is not None:
        out.warn("hicache_served_model_name", "served-name-stable",
                 "is unset, so the model path becomes part of every L3 key; moving the weights invalidates the whole cache.",
                 "set a stable served name.")


@rule
def _gpus(d: Deployment, out):
    """The container must get the GPUs its ranks need: TP x PP on one node (hicache_container_gpus, when it counts them)."""
    if d.container_runtime not in ("docker", "podman"):
        return
    spec = d.container_gpus
    try:
        count = schema.docker_gpus(spec) if d.container_runtime == "docker" else schema.podman_gpus(spec)
    except ValueError as exc:
        example = '\'"device=0,1"\' (a device list in double quotes), a count such as \'8\', or all' if d.container_runtime == "docker" else "all, or GPU indices such as 0,1"
        out.error("hicache_container_gpus", "container-gpus", f"{spec!r} {exc}; `{d.container_runtime} run --gpus` refuses it.", f"use {example}.")
        return
    tp, pp = d.tp_size or 1, d.pp_size or 1
    need = tp * pp
    if count is not None and count < need:
        devices = ",".join(map(str, range(need)))
        wanted = (f"'\"device={devices}\"'" if "device=" in spec else f"'{need}'") if d.container_runtime == "docker" else f"'{devices}'"
        out.error("hicache_tp_size", "tp-gpus",
                  f"TP {tp} x PP {pp} needs {need} GPUs, but hicache_container_gpus {spec!r} gives the container {count}; SGLang fails at start.",
                  f"set hicache_container_gpus: {wanted} (or all), or lower hicache_tp_size x hicache_pp_size to at most {count}.")


@rule
def _chunked_prefill(d: Deployment, out):
    chunk, page = d.chunked_prefill_size, d.page_size or 1
    if chunk is not None and chunk == 0:
        out.error("hicache_chunked_prefill_size", "chunked-prefill-page", "is 0.", "use a positive multiple of the page size, or -1 to disable chunking.")
    elif chunk is not None and chunk > 0 and chunk % page:
        out.error("hicache_chunked_prefill_size", "chunked-prefill-page",
                  f"{chunk} is not a multiple of the page size {page}; SGLang refuses it at start.",
                  f"use {max(page, chunk // page * page)} or another multiple of {page}, or -1.")


@rule
def _size_and_ratio(d: Deployment, out):
    if d.size_gb is not None and d.ratio is not None:
        out.warn("hicache_ratio", "size-overrides-ratio", f"is ignored: hicache_size_gb={d.size_gb} sets the host pool.", "remove one of the two.")


@rule
def _host_memory_mode(d: Deployment, out):
    if d.host_memory_mode == "buffer_only":
        if d.storage_backend is None:
            out.error("hicache_host_memory_mode", "buffer-only-needs-storage",
                      "buffer_only keeps nothing in host memory, so it needs an L3 tier; SGLang refuses it without one.",
                      "set hicache_storage_backend, or use hicache_host_memory_mode: cache.")
        if d.write_policy == "write_back":
            out.error("hicache_write_policy", "buffer-only-write-back",
                      "write_back with buffer_only is silently rewritten by SGLang to write_through.",
                      "set hicache_write_policy: write_through, which is what would run.")


# The io backend x layout pairs the MHA host pool runs (reference §3); SGLang rewrites some others.
_WORKING_PAIRS = {"kernel": ("layer_first", "page_first", "page_head"), "direct": ("layer_first", "page_first_direct")}


@rule
def _io_layout(d: Deployment, out):
    io = d.io_backend or "kernel"
    layout = d.mem_layout or "page_first"
    if layout in _WORKING_PAIRS[io]:
        return
    if layout == "page_first" and io == "direct":
        detail = "SGLang silently switches the layout to page_first_direct."
        fix = "set hicache_mem_layout: page_first_direct with the direct io backend."
    elif layout == "page_first_direct" and io == "kernel":
        detail = "SGLang silently switches the io backend to direct."
        fix = "set hicache_io_backend: direct with page_first_direct."
    else:
        detail = "the host pool does not run this pair."
        fix = f"with io {io} use one of: {', '.join(_WORKING_PAIRS[io])}."
    out.error("hicache_mem_layout", "io-layout-pair", f"layout {layout} with io backend {io}: {detail}", fix)


_MANAGED_FLAGS = {v.flag: v.name for v in schema.VARIABLES if v.flag} | {
    "--enable-hierarchical-cache": "(always on)", "--enable-hicache": "(always on)",
    "--enable-metrics": "hicache_enable_metrics", "--enable-cache-report": "hicache_enable_cache_report"}
# SGLang's other spellings of those flags (0.5.21's parser): the same setting given twice under another name.
_FLAG_ALIASES = {"--model": "--model-path", "--tensor-parallel-size": "--tp-size", "--pipeline-parallel-size": "--pp-size",
                 "--data-parallel-size": "--dp-size", "--attention-context-parallel-size": "--attn-cp-size"}
_MANAGED_FLAGS |= {alias: _MANAGED_FLAGS[flag] for alias, flag in _FLAG_ALIASES.items()}


def _managed(flag: str) -> str | None:
    """The variable a flag of hicache_extra_args would set twice: the flag itself, an alias, or an abbreviation
    argparse expands (SGLang's parser takes `--tp` for `--tp-size`)."""
    if flag in _MANAGED_FLAGS:
        return _MANAGED_FLAGS[flag]
    expanded = {name for managed, name in _MANAGED_FLAGS.items() if len(flag) > 3 and managed.startswith(flag)}
    return expanded.pop() if len(expanded) == 1 else None


_INCOMPATIBLE_FLAGS = {
    "--disable-radix-cache": "HiCache needs the radix cache; SGLang refuses the combination.",
    "--enable-lmcache": "LMCache and HiCache are exclusive; SGLang refuses the combination.",
    "--enable-int8-mamba-checkpoint": "SGLang refuses it together with HiCache.",
    "--enable-unified-cache-external-linker": "it is exclusive with --enable-hierarchical-cache.",
    # sglang 0.5.23 ships mem_cache/hicache_key_scheme.py, whose docstring names this flag, but no server argument
    # takes it (server_args.py): SGLang's parser refuses it. Its unified keys (`{page_hash}_{digest}_L{start}-{end}`)
    # are not what the L3 namespace, `hicachectl l3` and the shared-tier rules read either.
    "--hicache-storage-key-scheme": "SGLang 0.5.23's command line has no such option (its unified key scheme module is not wired "
                                    "to it), and hicache-deploy's L3 rules know only the rank-suffix keys.",
}


# SGLang flags whose value is a secret: in hicache_extra_args it would be written into start.sh, shown by every --diff
# and in the process list. The variable that carries it instead, or None (what hicache-deploy cannot deploy yet).
_SECRET_FLAGS = {flag: next((v.name for v in schema.VARIABLES if v.flag == flag), None) for flag in secrets.SECRET_SERVER_FLAGS}
_SECRET_ON_ARGV = "a secret here is written into start.sh, shown by every --diff and in the process list"


def _secret_flag(flag: str) -> str | None:
    """The secret flag `flag` spells, itself or as an abbreviation argparse expands (`--admin-api` for --admin-api-key)."""
    if flag in _SECRET_FLAGS:
        return flag
    spelled = [secret for secret in _SECRET_FLAGS if len(flag) > 3 and secret.startswith(flag)]
    return spelled[0] if len(spelled) == 1 else None


def _secret_flag_error(out, where: str, flag: str, secret: str) -> None:
    if _SECRET_FLAGS[secret]:
        out.error(where, "secret-flag", f"{flag}: {_SECRET_ON_ARGV}.",
                  f"remove it and its value, and set {_SECRET_FLAGS[secret]} (keep it in Ansible Vault): it reaches SGLang in a file of mode 0600.")
    elif secret == "--api-key":
        out.error(where, "secret-flag", f"{flag}: {_SECRET_ON_ARGV}; and verify, status and bench send no API key, "
                  "so SGLang would refuse each of their requests (401).", "remove it and its value: hicache-deploy cannot deploy a server "
                  "that requires an API key yet (its admin endpoints' key is hicache_admin_api_key).")
    else:
        out.error(where, "secret-flag", f"{flag}: {_SECRET_ON_ARGV}.", "remove it and its value: hicache-deploy has no secret variable for it yet.")


def _secret_words(words) -> list[tuple[int, str, str]]:
    """(index, flag, the secret flag it spells) for each word that gives a secret flag; a word holding spaces is read
    word by word, as a shell or a careless quote would split it."""
    found = []
    for i, word in enumerate(words):
        for part in str(word).split():
            flag = part.split("=", 1)[0]
            secret = _secret_flag(flag) if flag.startswith("--") else None
            if secret:
                found.append((i, flag, secret))
                break
    return found


@rule
def _secret_launcher(d: Deployment, out):
    for i, flag, secret in _secret_words(d.launcher or ()):
        _secret_flag_error(out, f"hicache_launcher[{i}]", flag, secret)


@rule
def _extra_args(d: Deployment, out):
    secret_at = {i: (flag, secret) for i, flag, secret in _secret_words(
        [a if isinstance(a, (str, int, float)) and not isinstance(a, bool) else "" for a in d.extra_args])}
    for i, arg in enumerate(d.extra_args):
        if not isinstance(arg, (str, int, float)) or isinstance(arg, bool):
            out.error(f"hicache_extra_args[{i}]", "type", f"is {type(arg).__name__}; each extra argument is one word.", "quote it as a string.")
            continue
        flag = str(arg).split("=", 1)[0]
        if i in secret_at:
            _secret_flag_error(out, f"hicache_extra_args[{i}]", *secret_at[i])
        elif flag == secrets.CONFIG_FLAG and secrets.server_secret_flags(d):
            out.error(f"hicache_extra_args[{i}]", "managed-flag", f"{flag}: SGLang reads one --config file, and "
                      f"{', '.join(v.name for v in schema.VARIABLES if v.secret and v.flag)} is passed in one.",
                      "give those options in hicache_extra_args themselves.")
        elif flag in _INCOMPATIBLE_FLAGS:
            out.error(f"hicache_extra_args[{i}]", "incompatible-flag", f"{flag}: {_INCOMPATIBLE_FLAGS[flag]}", f"remove {flag}.")
        elif flag.startswith("--") and _managed(flag):
            out.error(f"hicache_extra_args[{i}]", "managed-flag", f"{flag} is rendered from {_managed(flag)}; giving it twice makes the last one win silently.",
                      f"remove it and set {_managed(flag)}.")
    if "--enable-kv-cache-sharding" in map(str, d.extra_args) and d.storage_backend:
        out.error("hicache_extra_args", "incompatible-flag", "--enable-kv-cache-sharding cannot be used with an L3 storage backend.", "remove it or the storage backend.")


@rule
def _storage_backend_needs(d: Deployment, out):
    if d.storage_backend in ("file", "nixl") and not d.cache_dir:
        out.error("hicache_cache_dir", "cache-dir-required", f"the {d.storage_backend} backend writes to a directory, and none is set.",
                  "set hicache_cache_dir to the L3 mount point, e.g. /mnt/kvcache.")
    if d.storage_backend is None and d.extra_config:
        out.error("hicache_extra_config", "extra-config-without-backend", "is set but there is no storage backend to read it.",
                  "set hicache_storage_backend or remove hicache_extra_config.")
    if d.nixl_plugin and d.storage_backend != "nixl":
        out.error("hicache_nixl_plugin", "nixl-plugin-without-nixl", f"is set but the storage backend is {d.storage_backend}.",
                  "remove it, or set hicache_storage_backend: nixl.")
    for name in ("cache_dir", "cache_container_dir", "model_dir", "cfg_dir", "base_dir"):
        value = getattr(d, name)
        if value and not posixpath.isabs(value):
            out.error(PREFIX + name, "absolute-path", f"{value!r} is relative; it would depend on the directory a task runs in.", "give an absolute path.")


@rule
def _service(d: Deployment, out):
    if d.container_runtime == "none":
        if d.cache_container_dir and d.cache_container_dir != d.cache_dir:
            out.error("hicache_cache_container_dir", "no-container", "is set, but with hicache_container_runtime: none there is no container to map it into.",
                      "remove it; the server uses hicache_cache_dir directly.")
        # Without a container the server reads hicache_model_path on the host: the weights are put there or nowhere it looks.
        if d.model_dir and (d.model_path is None or posixpath.normpath(d.model_dir) != posixpath.normpath(d.model_path)):
            out.error("hicache_model_dir", "no-container", "is mounted into the container, and hicache_container_runtime is none.",
                      "point hicache_model_path at the weights on the host and remove hicache_model_dir, or (to have the weights put "
                      "there) set hicache_model_dir to the same path.")


@rule
def _container_mounts(d: Deployment, out):
    """Each -v of run.sh at its own path in the container: Docker refuses two at one (\"Duplicate mount point\"),
    and one over another would hide the config or the weights."""
    if d.container_runtime == "none":
        return
    mounts = {schema.clean_path(CONTAINER_CFG_DIR): "the config directory (/cfg)"}
    for name, host_dir, inside in (("hicache_model_path", d.model_dir, d.model_path), ("hicache_cache_container_dir", d.cache_dir, d.cache_container_dir)):
        if not host_dir or not inside:
            continue
        where = schema.clean_path(inside)  # Docker cleans the path the same way: //cfg is /cfg
        if where in mounts:
            out.error(name, "container-mount", f"{inside} is where {mounts[where]} is mounted in the container too.",
                      f"give {name} a path of its own in the container.")
        mounts.setdefault(where, name)


_EXTRA_CONFIG_EXTENSIONS = (".json", ".toml", ".yaml", ".yml")


def _not_json(value, where: str) -> tuple[str, str] | None:
    """(where, what) of the first value JSON cannot hold (a YAML date or binary, a key that is not a string, NaN)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{where} key {key!r}", f"is a key of type {type(key).__name__}"
            found = _not_json(item, f"{where}.{key}")
            if found:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = _not_json(item, f"{where}[{i}]")
            if found:
                return found
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return where, f"is {value!r}"
    if value is None or isinstance(value, (str, bool, int, float)):
        return None
    return where, f"is a {type(value).__name__.lstrip('_').removeprefix('AnsibleTagged').lower() or 'value'} ({value!r})"


@rule
def _extra_config_json(d: Deployment, out):
    """SGLang reads the extra config as JSON (or TOML, YAML files): every value one those hold alike."""
    found = _not_json(dict(d.extra_config), "hicache_extra_config")
    if found:
        where, what = found
        out.error("hicache_extra_config", "extra-config-type", f"{where} {what}: SGLang reads the config as JSON, which has no such value.",
                  "write it as a string in quotes (or a number, true/false, a list or a mapping with string keys).")


@rule
def _extra_config_file(d: Deployment, out):
    name = d.extra_config_file
    if name is None:
        return
    reserved = ("start.sh", "run.sh", "serve.sh", "installed.json", "deployed.json", secrets.SECRETS_ENV, secrets.SERVER_SECRETS_FILE,
                f"{d.service_name}.service")
    if "/" in name or name in reserved:
        out.error("hicache_extra_config_file", "extra-config-file", f"{name!r} must be a plain file name in the config directory, other than {', '.join(reserved)}.",
                  "use e.g. nixl_backend_config.toml.")
    ext = posixpath.splitext(name)[1].lower()
    if ext not in _EXTRA_CONFIG_EXTENSIONS:
        out.error("hicache_extra_config_file", "extra-config-file", f"SGLang reads only {', '.join(_EXTRA_CONFIG_EXTENSIONS)} files; {ext or 'no extension'} fails at start.",
                  "name it *.toml, *.json or *.yaml.")
    if ext == ".toml" and not _not_json(dict(d.extra_config), "hicache_extra_config"):
        from hicachectl.formats.tomlwriter import TomlError, dumps
        try:
            dumps(dict(d.extra_config))
        except TomlError as exc:
            out.error("hicache_extra_config", "extra-config-file", f"cannot be written as TOML: {exc}.", "use a .json or .yaml file name.")


# Keys SGLang pops from the extra config and type-checks itself (parse_storage_backend_extra_config).
_SGLANG_KEYS = {"prefetch_threshold": ("int",), "prefetch_timeout_base": ("int", "float"),
                "prefetch_timeout_per_ki_token": ("int", "float"), "hicache_storage_pass_prefix_keys": ("bool",)}


@rule
def _extra_config_sglang_keys(d: Deployment, out):
    for key, kinds in _SGLANG_KEYS.items():
        if key in d.extra_config and not any(_type_ok(k, d.extra_config[key]) for k in kinds):
            out.error(f"hicache_extra_config.{key}", "extra-config-type",
                      f"is {type(d.extra_config[key]).__name__} {d.extra_config[key]!r}; SGLang requires {' or '.join(_TYPE_WORDS[k] for k in kinds)} and refuses to start.",
                      f"give {_TYPE_WORDS[kinds[0]]} without quotes.")


# The backends' own variables (sglang 0.5.23 environ.py; read by mem_cache/hicache_storage.py HiCacheFile and
# storage/nixl/hicache_nixl.py, nixl_utils.py) that launch.container_env sets from the inventory. Given again in
# hicache_container_env they win silently (they come later), and the server then writes where `l3`, `--prune` and
# `verify --l3` never look, or with another plugin or O_DIRECT setting than the inventory says.
_BACKEND_ENV = {
    "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": "hicache_cache_dir (and hicache_l3_namespace)",
    "SGLANG_HICACHE_NIXL_BACKEND_STORAGE_DIR": "hicache_cache_dir (and hicache_l3_namespace)",
    "SGLANG_HICACHE_NIXL_BACKEND_PLUGIN": "hicache_nixl_plugin",
    "SGLANG_HICACHE_NIXL_USE_DIRECT_IO": "hicache_extra_config.use_direct_io",
}
_STORAGE_DIR_ENV = re.compile(r"SGLANG_HICACHE_\w*_STORAGE_DIR")


@rule
def _container_env_backend(d: Deployment, out):
    for key in d.container_env:
        name = str(key)
        instead = _BACKEND_ENV.get(name) or ("hicache_cache_dir (and hicache_l3_namespace)" if _STORAGE_DIR_ENV.fullmatch(name) else None)
        if instead:
            out.error(f"hicache_container_env.{name}", "backend-env",
                      f"is the storage backend's own variable, which hicache-deploy sets from {instead}; set here it wins silently, "
                      "so the server writes where `l3`, `--prune` and `verify --l3` do not look.",
                      f"remove {name} and set {instead.split(' ')[0]}.")


def _spells(word, flag: str, shortest: str) -> bool:
    """`word` gives `flag`, itself, as `flag=value` or as an abbreviation argparse expands (at least `shortest`)."""
    given = str(word).split("=", 1)[0]
    return given == flag or (len(given) >= len(shortest) and flag.startswith(given))


@rule
def _grpc_port_with_admin_key(d: Deployment, out):
    """SGLang refuses to start its native gRPC server with an admin key (0.5.21 and 0.5.23 arg_groups/serving_hook.py:
    "the native gRPC listener bypasses HTTP auth middleware"); --smg-grpc-mode or --grpc-mode start the legacy one
    instead, which it allows. SGLANG_GRPC_PORT is the flag's environment fallback (environ.py)."""
    if d.admin_api_key is None:
        return
    words = {i: a for i, a in enumerate(d.extra_args) if isinstance(a, (str, int, float)) and not isinstance(a, bool)}
    if any(_spells(w, "--smg-grpc-mode", "--smg") or _spells(w, "--grpc-mode", "--grpc-m") for w in words.values()):
        return
    # "--grpc-p": SGLang's flags starting "--grpc-" are --grpc-port, --grpc-mode, --grpc-http-sidecar-port, ...
    where = next((f"hicache_extra_args[{i}]" for i, w in words.items() if _spells(w, "--grpc-port", "--grpc-p")), None)
    if where is None and "SGLANG_GRPC_PORT" in map(str, d.container_env):
        where = "hicache_container_env.SGLANG_GRPC_PORT"
    if where:
        out.error(where, "incompatible-flag", "SGLang's native gRPC server cannot run with an admin API key (hicache_admin_api_key): "
                  "it refuses to start, since that listener bypasses its HTTP auth.", "remove the gRPC port, or hicache_admin_api_key.")


@rule
def _admin_key_exposed(d: Deployment, out):
    """SGLang answers /server_info to any caller when it has no --api-key (0.5.23 utils/auth.py decide_request_auth:
    NORMAL endpoints need a key only when api_key is set), and that answer holds admin_api_key (http_server.py
    server_info, build_server_info) and the merged argv in launch_command: whoever reaches the port reads the key."""
    host = d.effective_host
    if d.admin_api_key is None or host == "localhost" or (schema._is_ip(host) and ipaddress.ip_address(host).is_loopback):
        return
    out.warn("hicache_admin_api_key", "admin-key-exposed",
             f"SGLang serves {host}:{d.effective_port}/server_info to any caller, and its answer holds the admin key.",
             "let only the routers and the operators reach the port (a firewall), or serve on 127.0.0.1.")
