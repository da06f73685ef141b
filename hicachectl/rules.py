"""Cross-field validation of one host's variables, before any host is touched.

Two passes: `check_variables` looks at the raw inventory values (unknown names, types, choices,
pasted non-breaking spaces); when that pass finds no error, `check_deployment` checks the rules
SGLang, NIXL, the storage and the host impose on the combination. Each finding names the host,
the variable, the rule and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import math
import posixpath
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from hicachectl import schema
from hicachectl.model import PREFIX, build, version_tuple

ERROR, WARNING = "error", "warning"
_VARIABLE = re.compile(PREFIX + r"[a-z0-9_]+")  # the variable a finding's path starts with (hicache_x.key[0])


@dataclasses.dataclass(frozen=True)
class Finding:
    level: str
    host: str
    variable: str
    rule: str
    message: str
    fix: str

    def format(self, inventory: str = "", hosts: list[str] | None = None) -> str:
        """One line; with `hosts` (group_findings), the same finding on all of them, named compactly."""
        where = f"inventory {inventory}, " if inventory else ""
        who = f"host {self.host}" if not hosts or len(hosts) < 2 else f"{len(hosts)} hosts {compact_hosts(hosts)}"
        return (f"{self.level.upper()} [{self.rule}] {where}{who}, {self.variable}: "
                f"{self.message} Fix: {self.fix}")

    def key(self) -> tuple[str, str, str, str, str]:
        """What makes two hosts' findings the same finding."""
        return self.level, self.variable, self.rule, self.message, self.fix

    def as_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


class _Collector:
    def __init__(self, host: str):
        self.host = host
        self.findings: list[Finding] = []

    def error(self, variable: str, rule: str, message: str, fix: str) -> None:
        self.findings.append(Finding(ERROR, self.host, variable, rule, message, fix))

    def warn(self, variable: str, rule: str, message: str, fix: str) -> None:
        self.findings.append(Finding(WARNING, self.host, variable, rule, message, fix))


def has_errors(findings: Iterable[Finding]) -> bool:
    return any(f.level == ERROR for f in findings)


def check_host(host: str, raw: Mapping[str, Any], role: str | None = None) -> tuple[Any, list[Finding]]:
    """Both passes for one host: (deployment or None when the variables are unusable, findings).

    With `role`, what one role of the collection needs when it runs alone (a user's playbook): a variable only
    other roles read need not be set, and only findings on the role's own variables count; every value that is
    set is still checked against its type and domain."""
    scope = None if role is None else {v.name for v in schema.role_variables(role)}
    findings = _check_host_name(host) + check_variables(host, raw, scope)
    if has_errors(findings):
        return None, findings
    deployment = build(host, raw)
    findings += check_deployment(deployment)
    if scope is not None:
        findings = [f for f in findings if (named := _VARIABLE.match(f.variable)) is None or named.group(0) in scope]
    return deployment, findings


# --- the fleet: what no single host shows --------------------------------------------------------

def _machine(host: str, connection: Mapping[str, Any]) -> tuple[str, str]:
    """Where Ansible reaches a host: (address, SSH port); every local connection is this machine."""
    if str(connection.get("ansible_connection") or "") == "local":
        return "this machine (ansible_connection: local)", ""
    address = str(connection.get("ansible_host") or host).strip().lower().rstrip(".")
    return address, str(connection.get("ansible_port") or 22)


def check_fleet(hosts: Mapping[str, Mapping[str, Any]], connections: Mapping[str, Mapping[str, Any]] | None = None) -> list[Finding]:
    """Findings across the hosts of one inventory, once per run: two inventory hosts Ansible reaches at the same
    address and port are one machine, which would get the same unit, container, server port and deploy lock twice.

    `hosts` maps each host to its variables; how it is reached (ansible_host, ansible_port, ansible_connection)
    is read from `connections[host]` when given, else from the variables; a host without ansible_host is reached by its name.
    """
    machines: dict[tuple[str, str], list[str]] = {}
    for host, variables in hosts.items():
        connection = {k: v for k, v in variables.items() if k.startswith("ansible_")}
        connection.update((connections or {}).get(host) or {})
        machines.setdefault(_machine(host, connection), []).append(host)
    findings = []
    for (address, port), names in machines.items():
        if len(names) < 2:
            continue
        where = address if not port else f"{address}, port {port}"
        for host in names:
            findings.append(Finding(
                ERROR, host, "ansible_host", "duplicate-host",
                f"{len(names)} hosts ({compact_hosts(names)}) are all reached at {where}: one machine, which would get the same unit, "
                "container, server port and deploy lock twice.",
                f"give each of {compact_hosts(names)} its own ansible_host (or ansible_port), or keep only one of them."))
    return findings


def check_shared_tiers(deployments: Mapping[str, Any]) -> list[Finding]:
    """Hosts that share an L3 tier (hicache_l3_share) and one directory of it (the same namespace, or the namespace
    off) read each other's pages. Two such servers whose page format differs in what SGLang's keys do not hold (KV
    dtype, memory layout, the weights behind one served name: sglang#33268) would read each other's pages as their
    own: refused. Hosts of one tier in different namespaces share nothing: a warning."""
    from hicachectl import namespace

    tiers: dict[str, list[str]] = {}
    for host, d in deployments.items():
        if d is not None and d.l3_share and d.storage_backend is not None:
            tiers.setdefault(d.l3_share, []).append(host)
    findings = []
    for share, hosts in tiers.items():
        directories: dict[str | None, list[str]] = {}
        for host in hosts:
            directories.setdefault(namespace.of(deployments[host]), []).append(host)
        for name, together in directories.items():
            first = deployments[together[0]]
            for host in together[1:]:
                clash = namespace.collisions(first, deployments[host])
                if clash:
                    where = f"namespace {name}" if name else "the tier itself (namespace off)"
                    findings.append(Finding(
                        ERROR, host, "hicache_l3_namespace", "l3-shared-format",
                        f"writes into {where} on L3 tier {share} with {together[0]}, but their pages differ ({', '.join(clash)}) "
                        "in what SGLang's keys do not hold: each would read the other's pages as its own.",
                        "set hicache_l3_namespace: auto on the hosts of the tier (or make their page formats equal)."))
        if len(directories) > 1:
            names = ", ".join(f"{name or 'off'} ({compact_hosts(together)})" for name, together in directories.items())
            for host in hosts:
                findings.append(Finding(
                    WARNING, host, "hicache_l3_share", "l3-share-split",
                    f"the hosts of L3 tier {share} use {len(directories)} namespaces ({names}): pages are shared only within each.",
                    "give the servers of one tier one page format (see `hicachectl validate` for what each namespace is derived from)."))
    return findings


def check_routed(deployments: Mapping[str, Any], routers: Iterable[str]) -> list[Finding]:
    """With routers in the inventory, every restart drains the server first, reading its running and queued requests
    on /metrics: a server without metrics could only be restarted blind (requests cut), so it is refused here."""
    routers = list(routers)
    if not routers:
        return []
    findings = [Finding(ERROR, host, "hicache_enable_metrics", "router-drain-metrics",
                        f"is false, but the inventory has routers ({compact_hosts(routers)}): a restart takes the server out of them and "
                        "waits for its running and queued requests on /metrics, which it would not serve.",
                        "set hicache_enable_metrics: true.")
                for host, d in deployments.items() if d is not None and not d.enable_metrics]
    findings += [Finding(ERROR, host, "hicache_host", "router-reach",
                         f"the server listens on {d.effective_host} (loopback), which the routers ({compact_hosts(routers)}) cannot reach at "
                         "its default worker URL http://<ansible_host>:<port>.",
                         "set hicache_host: 0.0.0.0 (or an address the routers reach), or hicache_worker_url for a router on the same machine.")
                 for host, d in deployments.items()
                 if d is not None and d.worker_url is None and d.effective_host in ("127.0.0.1", "localhost", "::1")]
    return findings


# --- fleet-sized output ---------------------------------------------------------------------------

def group_findings(findings: Iterable[Finding]) -> list[tuple[Finding, list[str]]]:
    """The same finding on many hosts once: (the first host's finding, every host that has it), in order of first
    appearance. `Finding.format(inventory, hosts)` prints a group on one line."""
    groups: dict[tuple, tuple[Finding, list[str]]] = {}
    for finding in findings:
        group = groups.setdefault(finding.key(), (finding, []))
        if finding.host not in group[1]:
            group[1].append(finding.host)
    return list(groups.values())


_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def compact_hosts(hosts: Iterable[str], limit: int = 6) -> str:
    """Host names, numbered runs folded as Ansible writes them (b200-[01:16]); beyond `limit` parts, a count of the rest."""
    parts: list[str] = []
    runs: list[tuple[str, int, int, int]] = []  # prefix, width, first, last
    for name in hosts:
        match = _NUMBERED.match(name)
        if match:
            prefix, digits = match.groups()
            width, number = len(digits), int(digits)
            if runs and runs[-1][0] == prefix and runs[-1][1] == width and runs[-1][3] + 1 == number:
                runs[-1] = (prefix, width, runs[-1][2], number)
                continue
            runs.append((prefix, width, number, number))
            parts.append(f"\0{len(runs) - 1}")
        else:
            parts.append(name)

    def shown(part: str) -> str:
        if not part.startswith("\0"):
            return part
        prefix, width, first, last = runs[int(part[1:])]
        if first == last:
            return f"{prefix}{first:0{width}d}"
        return f"{prefix}[{first:0{width}d}:{last:0{width}d}]"

    text = ", ".join(shown(p) for p in parts[:limit])
    return text + (f" and {len(parts) - limit} more" if len(parts) > limit else "")


# --- pass 1: the variables themselves -------------------------------------------------------------

_TYPE_WORDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "a boolean",
               "list": "a list", "dict": "a mapping"}
_SUSPECT_CHARS = {"\u00a0": "a non-breaking space (U+00A0)", "\u200b": "a zero-width space (U+200B)",
                  "\u2013": "an en dash (U+2013)", "\u2014": "an em dash (U+2014)",
                  "\u201c": "a curly quote (U+201C)", "\u201d": "a curly quote (U+201D)"}


def _type_ok(kind: str, value: Any) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, {"str": str, "list": list, "dict": dict}[kind])


def _char_name(char: str) -> str:
    names = {"\n": "a line feed (\\n)", "\r": "a carriage return (\\r)", "\t": "a tab (\\t)", "\x00": "a NUL byte",
             "\x1b": "an escape character (ESC)", "\u2028": "a line separator (U+2028)", "\u2029": "a paragraph separator (U+2029)"}
    if char in names:
        return names[char]
    if unicodedata.category(char) == "Cf":
        return f"an invisible format character (U+{ord(char):04X})"
    return f"the control character U+{ord(char):04X}"


def _control_characters(out, path: str, text: str) -> None:
    found = [(i, c) for i, c in schema.refused_characters(text) if c not in _SUSPECT_CHARS]
    if found:
        i, char = found[0]
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        out.error(path, "control-character",
                  f"contains {_char_name(char)} at position {i}{more}. The value is written into line-oriented files (systemd unit, "
                  "env file, script, fstab, sysctl.d, modprobe.d, nfs.conf, limits.conf), where it would end a line and start one of "
                  "its own, or hide what the value is.",
                  "write the value on one line, without control or invisible characters.")


def _shown(value: Any, secret: bool) -> str:
    if secret:
        return "the value"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _domain_text(dom) -> str:
    if dom.choices and len(dom.choices) <= 16:
        return f"{dom.text} (one of {', '.join(map(str, dom.choices))})"
    return dom.text


def _type_words(kinds: tuple[str, ...]) -> str:
    return " or ".join(_TYPE_WORDS[k] for k in kinds)


def _check_domain(out, path: str, dom, value: Any, secret: bool) -> None:
    """Findings for a value outside its catalogue domain (schema.Domain), down into list items and mapping keys/values."""
    if isinstance(value, list):
        if len(value) < dom.min_items:
            out.error(path, dom.rule, f"has {len(value)} item(s); it needs at least {dom.min_items}.", f"give {dom.text}, e.g. {dom.example!r}.")
        for i, item in enumerate(value):
            _check_member(out, f"{path}[{i}]", dom, item, secret)
    elif isinstance(value, dict):
        for key, item in value.items():
            sub = f"{path}.{key}"
            if dom.keys is not None:
                if not isinstance(key, str):
                    out.error(sub, "type", f"the key {key!r} is {type(key).__name__}; keys are text.", f"quote the key: '{key}'.")
                    continue
                problem = dom.keys.problem(key)
                if problem:
                    out.error(sub, dom.keys.rule, f"the key {key!r} {problem}: it must be {_domain_text(dom.keys)}.",
                              f"rename it to {_domain_text(dom.keys)}, e.g. {dom.keys.example!r}.")
            _check_member(out, sub, dom, item, secret)
    else:
        problem = dom.problem(value)
        if problem:
            out.error(path, dom.rule, f"{_shown(value, secret)} {problem}: it must be {_domain_text(dom)}.",
                      f"use {_domain_text(dom)}, e.g. {dom.example!r}.")


def _check_member(out, path: str, dom, item: Any, secret: bool) -> None:
    if dom.item_types and (item is None or not any(_type_ok(k, item) for k in dom.item_types)):
        out.error(path, "type", f"is {type(item).__name__} {_shown(item, secret)}; it must be {_type_words(dom.item_types)}.",
                  f"give {_type_words(dom.item_types)}, e.g. {(dom.items.example if dom.items else dom.example)!r}.")
    elif dom.items is not None:
        _check_domain(out, path, dom.items, item, secret)


def _check_host_name(host: str) -> list[Finding]:
    """The inventory's host name is written into the header of every script; it must be one line too."""
    out = _Collector(host.encode("unicode_escape").decode() if schema.refused_characters(host) else host)
    _control_characters(out, "inventory_hostname", host)
    return out.findings


def _strings(value: Any, path: str) -> Iterable[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k, f"{path}.{k}")
            yield from _strings(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, f"{path}[{i}]")


def check_variables(host: str, raw: Mapping[str, Any], scope: set[str] | None = None) -> list[Finding]:
    """Types, choices and domains of every hicache_* value; the required ones (within `scope`, if given) set."""
    out = _Collector(host)
    for name, value in raw.items():
        if not name.startswith(PREFIX):
            continue
        var = schema.BY_NAME.get(name)
        if var is None:
            close = difflib.get_close_matches(name, schema.BY_NAME, n=1)
            out.error(name, "unknown-variable", "is not a hicache-deploy variable, so it would be ignored.",
                      f"rename it to {close[0]}." if close else "remove it, or see the README's variable list.")
            continue
        if value is None:
            continue
        before = len(out.findings)
        if not _type_ok(var.type, value):
            hint = ""
            if var.type in ("bool", "int", "float") and isinstance(value, str):
                hint = " Write it without quotes."
            elif var.type == "str" and isinstance(value, (int, float)) and not isinstance(value, bool):
                hint = f" Quote it: '{value}'."
            out.error(name, "type", f"is {type(value).__name__} {value!r}, expected {_TYPE_WORDS[var.type]}.",
                      f"give {_TYPE_WORDS[var.type]}.{hint}")
            continue
        if var.choices and value not in var.choices:
            close = difflib.get_close_matches(str(value), [str(c) for c in var.choices], n=1)
            out.error(name, "choice", f"{value!r} is not one of {', '.join(map(str, var.choices))}.",
                      f"use {close[0]!r}." if close else f"use one of {', '.join(map(str, var.choices))}.")
        for path, text in _strings(value, name):
            for char, what in _SUSPECT_CHARS.items():
                if char in text:
                    out.error(path, "pasted-character",
                              f"contains {what}, usually copied from a web page; shells and parsers do not treat it as the character it looks like.",
                              "retype the value with plain ASCII spaces, dashes and quotes.")
            _control_characters(out, path, text)
        if var.domain is not None and not has_errors(out.findings[before:]):
            _check_domain(out, name, var.domain, value, getattr(var, "secret", False))
    for var in schema.VARIABLES:
        if var.required and raw.get(var.name) is None and (scope is None or var.name in scope):
            out.error(var.name, "required", "is not set.", f"set {var.name} ({var.doc})")
    return out.findings


# --- pass 2: the combination ----------------------------------------------------------------------

_RULES: list[Callable[[Any, _Collector], None]] = []


def rule(fn: Callable[[Any, _Collector], None]) -> Callable[[Any, _Collector], None]:
    _RULES.append(fn)
    return fn


def check_deployment(d) -> list[Finding]:
    out = _Collector(d.inventory_host)
    for fn in _RULES:
        fn(d, out)
    return out.findings


@rule
def _image_pinned(d, out):
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
def _image_source(d, out):
    if (d.image_mirror or d.image_digest) and d.container_runtime == "none":
        out.error("hicache_image_mirror" if d.image_mirror else "hicache_image_digest", "no-container", "there is no image to pull with hicache_container_runtime: none.", "remove it.")


@rule
def _model_source(d, out):
    if d.model_source and not d.model_dir:
        out.error("hicache_model_dir", "model-dir-required", f"hicache_model_source {d.model_source} needs a directory for the weights.", "set hicache_model_dir (mounted at hicache_model_path).")
    if d.model_source == "hub" and not d.model_repo:
        out.error("hicache_model_repo", "model-repo-required", "is needed to download from the hub.", "set it, e.g. Qwen/Qwen3-8B.")
    if d.model_dir and d.model_path is not None and d.container_runtime != "none" and not re.fullmatch(r"/[^:]*", d.model_path):
        out.error("hicache_model_path", "mount-path", f"{d.model_path!r} is where hicache_model_dir is mounted in the container (-v DIR:PATH:ro), "
                  "so it must be an absolute path without ':'.", "use a container path such as /models/weights, or remove hicache_model_dir.")


@rule
def _sglang_version_known(d, out):
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
def _served_name(d, out):
    if d.served_model_name is not None and ":" in d.served_model_name:
        out.error("hicache_served_model_name", "served-name-colon",
                  f"{d.served_model_name!r} contains ':', which SGLang reserves for 'model:adapter' and refuses at start.",
                  f"use {d.served_model_name.replace(':', '-')!r}.")
    if d.served_model_name is None and d.storage_backend is not None:
        out.warn("hicache_served_model_name", "served-name-stable",
                 "is unset, so the model path becomes part of every L3 key; moving the weights invalidates the whole cache.",
                 "set a stable served name.")


@rule
def _gpus(d, out):
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
def _chunked_prefill(d, out):
    chunk, page = d.chunked_prefill_size, d.page_size or 1
    if chunk is not None and chunk == 0:
        out.error("hicache_chunked_prefill_size", "chunked-prefill-page", "is 0.", "use a positive multiple of the page size, or -1 to disable chunking.")
    elif chunk is not None and chunk > 0 and chunk % page:
        out.error("hicache_chunked_prefill_size", "chunked-prefill-page",
                  f"{chunk} is not a multiple of the page size {page}; SGLang refuses it at start.",
                  f"use {max(page, chunk // page * page)} or another multiple of {page}, or -1.")


@rule
def _size_and_ratio(d, out):
    if d.size_gb is not None and d.ratio is not None:
        out.warn("hicache_ratio", "size-overrides-ratio", f"is ignored: hicache_size_gb={d.size_gb} sets the host pool.", "remove one of the two.")


@rule
def _host_memory_mode(d, out):
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
def _io_layout(d, out):
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
}


@rule
def _extra_args(d, out):
    for i, arg in enumerate(d.extra_args):
        if not isinstance(arg, (str, int, float)) or isinstance(arg, bool):
            out.error(f"hicache_extra_args[{i}]", "type", f"is {type(arg).__name__}; each extra argument is one word.", "quote it as a string.")
            continue
        flag = str(arg).split("=", 1)[0]
        if flag in _INCOMPATIBLE_FLAGS:
            out.error(f"hicache_extra_args[{i}]", "incompatible-flag", f"{flag}: {_INCOMPATIBLE_FLAGS[flag]}", f"remove {flag}.")
        elif flag.startswith("--") and _managed(flag):
            out.error(f"hicache_extra_args[{i}]", "managed-flag", f"{flag} is rendered from {_managed(flag)}; giving it twice makes the last one win silently.",
                      f"remove it and set {_managed(flag)}.")
    if "--enable-kv-cache-sharding" in map(str, d.extra_args) and d.storage_backend:
        out.error("hicache_extra_args", "incompatible-flag", "--enable-kv-cache-sharding cannot be used with an L3 storage backend.", "remove it or the storage backend.")


@rule
def _storage_backend_needs(d, out):
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
def _service(d, out):
    if d.container_runtime == "none":
        if d.cache_container_dir and d.cache_container_dir != d.cache_dir:
            out.error("hicache_cache_container_dir", "no-container", "is set, but with hicache_container_runtime: none there is no container to map it into.",
                      "remove it; the server uses hicache_cache_dir directly.")
        if d.model_dir:
            out.error("hicache_model_dir", "no-container", "is mounted into the container, and hicache_container_runtime is none.",
                      "point hicache_model_path at the weights on the host and remove hicache_model_dir.")


_EXTRA_CONFIG_EXTENSIONS = (".json", ".toml", ".yaml", ".yml")


@rule
def _extra_config_file(d, out):
    name = d.extra_config_file
    if name is None:
        return
    reserved = ("start.sh", "run.sh", "serve.sh", "installed.json", "deployed.json", "secrets.env", f"{d.service_name}.service")
    if "/" in name or name in reserved:
        out.error("hicache_extra_config_file", "extra-config-file", f"{name!r} must be a plain file name in the config directory, other than {', '.join(reserved)}.",
                  "use e.g. nixl_backend_config.toml.")
    ext = posixpath.splitext(name)[1].lower()
    if ext not in _EXTRA_CONFIG_EXTENSIONS:
        out.error("hicache_extra_config_file", "extra-config-file", f"SGLang reads only {', '.join(_EXTRA_CONFIG_EXTENSIONS)} files; {ext or 'no extension'} fails at start.",
                  "name it *.toml, *.json or *.yaml.")
    if ext == ".toml":
        from hicachectl.tomlwriter import TomlError, dumps
        try:
            dumps(dict(d.extra_config))
        except TomlError as exc:
            out.error("hicache_extra_config", "extra-config-file", f"cannot be written as TOML: {exc}.", "use a .json or .yaml file name.")


# Keys SGLang pops from the extra config and type-checks itself (parse_storage_backend_extra_config).
_SGLANG_KEYS = {"prefetch_threshold": ("int",), "prefetch_timeout_base": ("int", "float"),
                "prefetch_timeout_per_ki_token": ("int", "float"), "hicache_storage_pass_prefix_keys": ("bool",)}


@rule
def _extra_config_sglang_keys(d, out):
    for key, kinds in _SGLANG_KEYS.items():
        if key in d.extra_config and not any(_type_ok(k, d.extra_config[key]) for k in kinds):
            out.error(f"hicache_extra_config.{key}", "extra-config-type",
                      f"is {type(d.extra_config[key]).__name__} {d.extra_config[key]!r}; SGLang requires {' or '.join(_TYPE_WORDS[k] for k in kinds)} and refuses to start.",
                      f"give {_TYPE_WORDS[kinds[0]]} without quotes.")


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


_DYNAMIC_REQUIRED = ("backend_name", "module_path", "class_name")


@rule
def _uring_in_container(d, out):
    from hicachectl.launch import uses_uring

    if uses_uring(d) and d.container_runtime == "docker" and not d.container_seccomp:
        out.warn("hicache_container_seccomp", "uring-seccomp",
                 "NIXL's POSIX plugin is asked for io_uring, which Docker's default seccomp profile blocks (io_uring_setup/enter/register); "
                 "NIXL then fails to create its backend and the deploy falls back to posix_aio.",
                 "set hicache_container_seccomp to a profile that allows the io_uring syscalls (or unconfined), or use posix_aio.")


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


# --- storage -------------------------------------------------------------------------------------

def remote_port_count(spec: str | None) -> int | None:
    """Count VAST `remoteports`: 'a-b' ranges joined by '~'; None for 'dns' or unparsable."""
    if not spec or spec == "dns":
        return None
    total = 0
    for part in spec.split("~"):
        first, _, last = part.partition("-")
        try:
            low = ipaddress.ip_address(first)
            high = ipaddress.ip_address(last) if last else low
        except ValueError:
            return None
        if int(high) < int(low):
            return None
        total += int(high) - int(low) + 1
    return total


@rule
def _storage(d, out):
    kind = d.storage_type
    if kind in ("vast", "netapp"):
        for name in ("storage_server", "storage_export"):
            if not getattr(d, name):
                out.error(PREFIX + name, "storage-required", f"is required for a {kind} mount.", f"set {PREFIX + name}.")
        if not d.cache_dir:
            out.error("hicache_cache_dir", "storage-required", f"a {kind} mount needs a mount point.", "set hicache_cache_dir.")
    if kind == "netapp":
        if d.storage_nconnect is not None:
            out.error("hicache_storage_nconnect", "pnfs-nconnect",
                      "NetApp pNFS and session trunking do not work properly together with nconnect (ONTAP docs).",
                      "remove hicache_storage_nconnect; pNFS spreads I/O over the data LIFs itself.")
        if d.storage_remoteports or d.storage_localports:
            out.error("hicache_storage_remoteports", "vast-only-option", "remoteports/localports are options of the VAST NFS driver.", "remove them for NetApp.")
        if d.storage_rsize is not None and d.storage_rsize > 65536:
            out.warn("hicache_storage_rsize", "netapp-rdma-rsize", f"{d.storage_rsize}: ONTAP reports unstable performance above 64 KiB over RDMA.", "use 65536.")
    if kind == "local" and (d.storage_nconnect or d.storage_remoteports or d.storage_localports):
        out.error("hicache_storage_type", "nfs-option-on-local", "NFS options are set but the L3 tier is local.", "remove them, or set hicache_storage_type: vast or netapp.")
    if kind == "vast":
        _vast(d, out)


def _vast(d, out):
    ports = remote_port_count(d.storage_remoteports)
    if d.storage_remoteports and d.storage_remoteports != "dns" and ports is None:
        out.error("hicache_storage_remoteports", "remoteports-syntax", f"{d.storage_remoteports!r} is not 'dns' or IP ranges like 172.16.0.1-172.16.0.8~172.16.1.1-172.16.1.8.",
                  "fix the ranges.")
    if d.storage_localports and not d.storage_remoteports:
        out.error("hicache_storage_localports", "localports-needs-remoteports", "localports only applies to a multipath mount.", "set hicache_storage_remoteports too.")
    nconnect = d.storage_nconnect
    if nconnect is None:
        return
    if nconnect < 1:
        out.error("hicache_storage_nconnect", "range", f"{nconnect} must be at least 1.", "use e.g. 8.")
        return
    if ports and nconnect % ports:
        out.warn("hicache_storage_nconnect", "nconnect-ports", f"{nconnect} connections over {ports} remote ports load them unevenly.",
                 f"use a multiple of {ports}, e.g. {max(ports, round(nconnect / ports) * ports)}.")
    if d.storage_link_gbps:
        per_100g = d.storage_link_gbps / 100
        low, high = max(1, math.floor(2 * per_100g)), max(8, math.ceil(8 * per_100g))
        if nconnect < low:
            out.warn("hicache_storage_nconnect", "nconnect-link", f"{nconnect} is below VAST's RDMA guidance of 2 per 100 Gb/s ({low} for {d.storage_link_gbps} Gb/s).", f"use at least {low}.")
        elif nconnect > high:
            out.warn("hicache_storage_nconnect", "nconnect-link", f"{nconnect} is above even VAST's TCP guidance of 8 per 100 Gb/s ({high} for {d.storage_link_gbps} Gb/s).", f"use at most {high}.")


# Secrets (hicache_secret_keys, env-file values, keys that look secret): hicachectl/secrets.py.
from hicachectl import secrets as _secrets  # noqa: E402

rule(_secrets.check)
