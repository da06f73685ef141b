"""Pass 1: the variables themselves, as the inventory gives them: unknown names, types, choices and domains,
pasted and control characters, the required ones set."""

from __future__ import annotations

import difflib
import ipaddress
import re
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

from hicachectl.config import schema
from hicachectl.config.deployment import PREFIX
from hicachectl.rules.findings import ERROR, WARNING, Finding, _Collector, has_errors

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


# Addresses and names reserved for documentation, which the shipped profiles use where the user's own belong:
# IPv4 TEST-NET-1/2/3 (RFC 5737), IPv6 2001:db8::/32 (RFC 3849), the .example/.invalid names and
# example.com/.net/.org (RFC 2606). No real host answers them. RFC 2606's .test is not among them: it is reserved for
# testing, and a lab's own DNS (or a bastion's /etc/hosts) may really serve it.
DOCUMENTATION_NETWORKS = tuple(ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32"))
_IPV4 = re.compile(r"(?<![\w.])\d{1,3}(?:\.\d{1,3}){3}(?![\w.])")
_IPV6 = re.compile(r"(?<![\w:])2001:0?db8:[0-9A-Fa-f:]*", re.IGNORECASE)
_DOC_NAME = re.compile(r"(?<![\w.-])(?:[A-Za-z0-9-]+\.)*(?:example\.(?:com|net|org)|[A-Za-z0-9-]+\.(?:example|invalid))(?![\w-])",
                       re.IGNORECASE)


def documentation_address(address: Any) -> bool:
    """`address` is one IP address of a documentation range (RFC 5737, RFC 3849) or a reserved name (RFC 2606)."""
    text = str(address or "").strip().strip("[]").rstrip(".")
    try:
        return any(ipaddress.ip_address(text) in net for net in DOCUMENTATION_NETWORKS)
    except ValueError:
        return bool(_DOC_NAME.fullmatch(text))


PLACEHOLDER = "placeholder"


def refuse_placeholders(findings: list[Finding]) -> list[Finding]:
    """A documentation address or name in a value is a warning for what only shows files (render, monitoring, size,
    init: a shipped profile is read as it is) and an error for validate and every command that reaches hosts: a
    deploy there mounts, pulls or connects to an address no machine answers."""
    import dataclasses

    return [dataclasses.replace(f, level=ERROR) if f.rule == PLACEHOLDER else f for f in findings]


def placeholders(text: str) -> list[str]:
    """The documentation addresses and reserved names in a value (a server, a port range, a URL), each once."""
    found = [m.group(0) for m in _DOC_NAME.finditer(text)]
    for pattern in (_IPV4, _IPV6):
        found += [m.group(0) for m in pattern.finditer(text) if documentation_address(m.group(0).rstrip(":"))]
    return list(dict.fromkeys(found))


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
    # It also names the host's directory under `render --out` and on the controller: never a path.
    if "/" in host or "\\" in host or host in (".", ".."):
        out.error("inventory_hostname", "host-name", "is a path, not a host name: it names the host's own directory (render --out).",
                  "name the host without / or \\ (its address goes in ansible_host).")
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
            # null: "not set" where the default is None, "leave it" where the catalogue says so (Var.takes_none).
            # Elsewhere the role's argument validation refuses it (ansible/module_utils/common/parameters.py,
            # _validate_argument_types, for a spec with a default), so it is refused here first, not at deploy.
            if not var.takes_none and not var.required:
                out.error(name, "null", "is null, which it does not take: null leaves a setting alone only where the variable's "
                                        "description says None leaves it.",
                          f"remove the line to use the default {var.default!r}, or give {_TYPE_WORDS[var.type]}.")
            continue
        before = len(out.findings)
        if not _type_ok(var.type, value):
            hint = ""
            if var.type in ("bool", "int", "float") and isinstance(value, str):
                hint = " Write it without quotes."
            elif var.type == "str" and isinstance(value, int) and not isinstance(value, bool) and var.domain is not None \
                    and var.domain.rule == "file-mode" and 0 <= value <= 0o7777:
                # YAML reads an unquoted 0755 as the octal number 493: the fix is the mode as written, quoted.
                hint = f" Quote it: '{value:04o}'."
            elif var.type == "str" and isinstance(value, (int, float)) and not isinstance(value, bool) and not var.secret:
                hint = f" Quote it: '{value}'."
            out.error(name, "type", f"is {type(value).__name__} {'(a secret: not shown)' if var.secret else _shown(value, False)}, expected {_TYPE_WORDS[var.type]}.",
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
            found = [] if getattr(var, "secret", False) else placeholders(text)
            if found:  # a warning here (render shows a profile as it is); refused where hosts are reached (refuse_placeholders)
                out.warn(path, PLACEHOLDER,
                         f"holds {', '.join(found)}: reserved for documentation (RFC 5737/3849/2606), a placeholder of the shipped profile "
                         "where your own value belongs; no real host answers it, so the deploy would fail there.",
                         f"write your own value for {path}.")
        if var.domain is not None and not has_errors(out.findings[before:]):
            _check_domain(out, name, var.domain, value, getattr(var, "secret", False))
    for var in schema.VARIABLES:
        if var.required and raw.get(var.name) is None and (scope is None or var.name in scope):
            out.error(var.name, "required", "is not set.", f"set {var.name} ({var.doc})")
    return out.findings


def _credential_free_url(value: Any) -> bool:
    """A URL without a user, password or query in it (a plain pip mirror as hicache_router_index_url): nothing to hide."""
    import urllib.parse

    if not isinstance(value, str) or "://" not in value:
        return False
    try:
        parts = urllib.parse.urlsplit(value)
    except ValueError:
        return False
    return bool(parts.netloc) and "@" not in parts.netloc and not parts.query


def _leaf(raw: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path (hicache_extra_config.a.0.secret_key), or None."""
    value: Any = raw
    for part in path.split("."):
        if isinstance(value, Mapping):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def plain_text_secrets(host: str, written: Mapping[str, Any], raw: Mapping[str, Any]) -> list[Finding]:
    """A warning for each secret an inventory file holds in plain text (`written`: path -> hicachectl.config.inventory.Written,
    as the loader records it in Inventory.plain_secrets), naming the host, the variable and the file, never the value.
    A value from Ansible Vault (`!vault`, or a file encrypted whole) or from a lookup (the environment) is not among
    them. The fix is Ansible's own (`ansible-vault encrypt_string --prompt` asks for the name, then the value hidden:
    ansible/cli/vault.py)."""
    out = _Collector(host)
    for path, where in sorted(written.items()):
        if _credential_free_url(_leaf(raw, path)):
            continue
        key = path.rsplit(".", 1)[-1]  # what the value is called where it is written: the variable, or its key
        if where.referenced:  # `{{ hf_token }}`: that variable is the one to encrypt
            said, named, block = f"from a variable written in plain text in {where}", "the name of the variable on that line", "the block"
        else:
            said, named, block = f"written in plain text in {where}", f"the name {key}", f"the `{key}: !vault |` block"
        out.warn(path, "secret-in-plain-text", f"is a secret {said}: anyone who can read the inventory, or its history, has it.",
                 f"put it in Ansible Vault: run `ansible-vault encrypt_string --prompt`, give {named} and the value (hidden), and put "
                 f"{block} it prints in {where.file} in place of that line; or read it from the environment (\"{{{{ lookup('env', 'NAME') }}}}\").")
    return out.findings


def misspelled_variables(host: str, misspelled: Mapping[str, str]) -> list[Finding]:
    """A name no role reads that looks like a catalogue variable's (config.schema.misspelled): its value would be lost
    without a word, the default used instead. The catalogue's name in other case or with '-' (HICACHE_STRICT,
    hicache-strict) is surely meant as it: an error; a near miss (hicahce_port) may be a name of the user's own: a
    warning."""
    return [Finding(ERROR if name.lower().replace("-", "_") == meant else WARNING, host, name, "variable-name",
                    f"is not read by hicache-deploy (its variables are hicache_*, in lower case), so its value would be ignored "
                    f"and {meant}'s default used.", f"rename it to {meant}.")
            for name, meant in sorted(misspelled.items())]


def orphan_host_vars(orphans: Mapping[str, str]) -> list[Finding]:
    """host_vars of a name that is no host of the inventory (name -> its file): Ansible reads them for nobody (a host
    renamed or removed, a typo in the file's name), so what they set is lost without a word."""
    return [Finding(WARNING, name, "host_vars", "host-vars-orphan", f"{path} names no host of the inventory, so nothing it sets is used.",
                    "rename it after the host it is for, or remove it.")
            for name, path in orphans.items()]


def orphan_group_vars(orphans: Mapping[str, str]) -> list[Finding]:
    """group_vars of a name that is no group of the inventory (hicache_server.yml for hicache_servers): read for nobody."""
    return [Finding(WARNING, "all", "group_vars", "group-vars-orphan", f"{path} names no group of the inventory, so nothing it sets is used.",
                    "rename it after the group it is for (all, hicache_servers, hicache_routers or one of yours), or remove it.")
            for name, path in orphans.items()]
