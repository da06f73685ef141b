"""Read an Ansible inventory with Ansible's own loader and return each host's variables.

Vault works as in Ansible: ANSIBLE_VAULT_PASSWORD_FILE, ANSIBLE_VAULT_IDENTITY_LIST and the options the CLI
hands to `use_vault` (the same ones reach ansible-playbook through `vault_for_runner`). Which secret values are
written in plain text in an inventory file (not `!vault`, not a file encrypted whole, not a lookup) is recorded
as `Inventory.plain_secrets`, where each is written, never what. Ansible's own warnings
are captured while loading, never printed raw: the caller gets them as `Inventory.notes`. Every failure is an
InventoryError of one line naming the file (and line) it comes from.

Ansible is imported inside the functions: `hicachectl --help` must not pay for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import pathlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

from hicachectl.config import secrets
from hicachectl.config.deployment import PREFIX
from hicachectl.config.paths import INVENTORIES

VAULT_HOWTO = ("pass --vault-password-file FILE, --vault-id ID@FILE or --ask-vault-pass "
               "(or set ANSIBLE_VAULT_PASSWORD_FILE)")


class InventoryError(Exception):
    """The inventory cannot be read: invalid (exit 1)."""
    exit_code = 1


class InventoryNotFound(InventoryError):
    """No inventory of that name or path: a usage error (exit 2)."""
    exit_code = 2


class VaultOptionError(InventoryError):
    """A vault password source that cannot be read: a bad option value (exit 2)."""
    exit_code = 2


@dataclasses.dataclass
class Inventory:
    name: str
    path: pathlib.Path
    hosts: dict[str, dict[str, Any]]  # server host -> its hicache_* variables, templated (every host not in ROUTERS)
    notes: list[str] = dataclasses.field(default_factory=list)  # what Ansible warned about while reading it
    connections: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # host -> CONNECTION_VARS it sets
    routers: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # router host (group ROUTERS) -> its variables
    # host (server or router) -> {secret variable path, e.g. hicache_container_env.HF_TOKEN: where it is written}: the
    # secrets an inventory file holds in plain text (validate warns: hicachectl.rules.variables.plain_text_secrets).
    plain_secrets: dict[str, dict[str, Written]] = dataclasses.field(default_factory=dict)
    in_both: list[str] = dataclasses.field(default_factory=list)  # hosts in SERVERS and in ROUTERS (validate refuses them)
    # host -> {a name no role reads: the catalogue variable it was likely meant to be} (schema.misspelled; validate refuses)
    misspelled: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    orphan_host_vars: dict[str, str] = dataclasses.field(default_factory=dict)  # name -> host_vars file of no host (ignored)
    orphan_group_vars: dict[str, str] = dataclasses.field(default_factory=dict)  # name -> group_vars file of no group (ignored)


@dataclasses.dataclass(frozen=True)
class Written:
    """Where a value is written in plain text (never the value): the file and line; `referenced`: the host's variable
    is a template naming another variable (`{{ hf_token }}`), and that one is written there."""
    file: str
    line: int | None = None
    referenced: bool = False

    def __str__(self) -> str:
        return self.file + (f" line {self.line}" if self.line else "")


# The group of router hosts: they run the SGLang router (role router), never a server. Every other host is a server.
ROUTERS = "hicache_routers"
# The group `hicache init` puts servers in; a server need not be in it, but a host in it and in ROUTERS is refused.
SERVERS = "hicache_servers"


def server_hosts(groups: Mapping[str, Iterable[str]]) -> list[str]:
    """The inventory's servers from Ansible's `groups`: every host outside ROUTERS, each once, in the inventory's order.
    The order is what the router's workers file and every list built from it keep. (Ansible's `difference` filter goes
    through a set, ansible/plugins/filter/mathstuff.py, so its order changed from run to run with the hash seed.)"""
    routers = set(groups.get(ROUTERS) or ())
    return [str(h) for h in dict.fromkeys(groups.get("all") or ()) if h not in routers]


# --- where an inventory is -------------------------------------------------------------------------------

def search_places(name_or_path: str) -> list[pathlib.Path]:
    """Where `-i NAME` is looked for, in order: ./inventories/NAME, NAME as a path, the shipped profile."""
    return [pathlib.Path.cwd() / "inventories" / name_or_path, pathlib.Path(name_or_path), INVENTORIES / name_or_path]


def resolve_path(name_or_path: str) -> pathlib.Path:
    if not str(name_or_path).strip():  # "" would be the current directory, or every shipped profile at once
        raise InventoryNotFound("the inventory is named by an empty string; give its name (local, prod) or its path.")
    places = search_places(name_or_path)
    for place in places:
        if place.exists():
            return place.resolve()
    known = ", ".join(sorted(p.name for p in INVENTORIES.iterdir() if p.is_dir())) if INVENTORIES.is_dir() else ""
    looked = ", ".join(dict.fromkeys(str(p) for p in places))
    raise InventoryNotFound(f"no inventory {name_or_path!r} (looked in {looked}; shipped profiles: {known}). "
                            "Make one: hicachectl init --profile local --hosts HOST1,HOST2 --out "
                            + (name_or_path if "/" in name_or_path else f"inventories/{name_or_path}"))


def plain(value: Any) -> Any:
    """Ansible's tagged str/int/dict subclasses -> plain Python values."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    for kind in (str, int, float):
        if isinstance(value, kind):
            return kind(value)
    return value


# --- Vault -----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class VaultOptions:
    """The vault options of one command, as ansible-playbook takes them."""
    password_files: tuple[str, ...] = ()
    vault_ids: tuple[str, ...] = ()  # ID@SOURCE, SOURCE a file, a client script or `prompt`
    ask_pass: bool = False


_vault = VaultOptions()
_secrets: list | None = None  # (vault id, VaultSecret) once read: a prompt is answered once per process


def use_vault(options: VaultOptions) -> None:
    """The vault options every later load and playbook run of this process uses."""
    global _vault, _secrets
    _vault, _secrets = options, None


def _absolute(source: str) -> str:
    return source if source in ("prompt", "prompt_ask_vault_pass") else str(pathlib.Path(source).expanduser().resolve())


def _split_id(slug: str) -> tuple[str | None, str]:
    name, at, source = slug.partition("@")
    return (name, source) if at else (None, slug)


def _env_vault_ids() -> list[str]:
    return [s.strip() for s in os.environ.get("ANSIBLE_VAULT_IDENTITY_LIST", "").split(",") if s.strip()]


def _setup_vault(loader) -> None:
    """Give the loader (and Ansible's process-wide vault context) every secret the options and environment name."""
    global _secrets
    from ansible.errors import AnsibleError
    from ansible.parsing.vault import VaultSecretsContext

    if _secrets is None:
        from ansible.cli import CLI

        files = list(_vault.password_files)
        if os.environ.get("ANSIBLE_VAULT_PASSWORD_FILE"):
            files.append(os.environ["ANSIBLE_VAULT_PASSWORD_FILE"])
        for source in files + [_split_id(s)[1] for s in _env_vault_ids() + list(_vault.vault_ids)]:
            if source not in ("prompt", "prompt_ask_vault_pass") and not pathlib.Path(source).expanduser().exists():
                raise VaultOptionError(f"vault password file {source}: no such file.")
        from ansible import constants

        notes: list[str] = []
        configured = constants.DEFAULT_VAULT_PASSWORD_FILE
        try:
            # The environment's password file is passed here, as given, instead of through Ansible's config
            # (which turns an empty ANSIBLE_VAULT_PASSWORD_FILE into the current directory).
            constants.DEFAULT_VAULT_PASSWORD_FILE = None
            with _captured_warnings(notes):
                _secrets = CLI.setup_vault_secrets(loader, vault_ids=_env_vault_ids() + list(_vault.vault_ids), vault_password_files=files,
                                                   ask_vault_pass=_vault.ask_pass, auto_prompt=False, initialize_context=False)
        except AnsibleError as exc:
            raise VaultOptionError(f"cannot read the vault password: {_first_line(exc)}") from exc
        except (EOFError, KeyboardInterrupt) as exc:
            raise VaultOptionError("no vault password was entered.") from exc
        finally:
            constants.DEFAULT_VAULT_PASSWORD_FILE = configured
    if VaultSecretsContext.current(optional=True) is None:
        VaultSecretsContext.initialize(VaultSecretsContext(_secrets))
    else:
        VaultSecretsContext.current().secrets[:] = _secrets
    loader.set_vault_secrets(_secrets)


def vault_for_runner() -> tuple[list[str], dict[str, str], dict[str, str]]:
    """(ansible-playbook arguments, answers to its password prompts, environment) that give a playbook run
    the same vault secrets as the in-process loader. Paths are made absolute (the run has another cwd);
    a password typed at a prompt is answered to ansible-playbook's prompt, never written anywhere."""
    args: list[str] = []
    for source in _vault.password_files:
        args += ["--vault-password-file", _absolute(source)]
    prompted = {}
    for secret_id, secret in _secrets or []:
        if type(secret).__name__ == "PromptVaultSecret" and secret.bytes is not None:
            prompted[secret_id] = secret.bytes.decode()
    answers: dict[str, str] = {}
    for slug in _vault.vault_ids:
        name, source = _split_id(slug)
        args += ["--vault-id", f"{name}@{_absolute(source)}" if name else _absolute(source)]
        if source == "prompt":
            vid = name or "default"
            answers[rf"^Vault password \({re.escape(vid)}\):\s*$"] = prompted.get(vid, "")
    if _vault.ask_pass:
        args.append("--ask-vault-pass")
        answers[r"^Vault password:\s*$"] = prompted.get("default", "")
    env = {}
    if os.environ.get("ANSIBLE_VAULT_PASSWORD_FILE"):
        env["ANSIBLE_VAULT_PASSWORD_FILE"] = _absolute(os.environ["ANSIBLE_VAULT_PASSWORD_FILE"])
    if _env_vault_ids():
        env["ANSIBLE_VAULT_IDENTITY_LIST"] = ",".join(
            f"{n}@{_absolute(s)}" if n else _absolute(s) for n, s in map(_split_id, _env_vault_ids()))
    return args, answers, env


# --- Ansible's errors and warnings in our words -----------------------------------------------------------

def _first_line(exc: BaseException) -> str:
    text = getattr(exc, "_original_message", None) or str(exc)
    return " ".join(str(text).split("\n\n")[0].split())


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _origin(exc: BaseException) -> str | None:
    """The deepest `file line N` an exception chain knows of."""
    try:
        from ansible._internal._datatag._tags import Origin
    except ImportError:  # pragma: no cover - another ansible-core
        return None
    found = None
    for e in _chain(exc):
        obj = getattr(e, "obj", None)
        origin = obj if isinstance(obj, Origin) else (Origin.get_tag(obj) if obj is not None else None)
        if origin is not None and origin.path:
            found = origin.path + (f" line {origin.line_num}" if origin.line_num else "")
    return found


def describe(exc: BaseException, where: str, what: str | None = None) -> str:
    """One line for an Ansible error: the file (and line) it points at, what is wrong, and for Vault what to do."""
    origin = (_origin(exc) or where) + (f": {what}" if what else "")
    chain = list(_chain(exc))
    if any("vault" in type(e).__name__.lower() for e in chain) or any("vault password" in str(e).lower() for e in chain):
        if not _secrets:
            return f"{origin}{' is' if what else ':'} encrypted with Ansible Vault, and no vault password was given: {VAULT_HOWTO}."
        ids = ", ".join(dict.fromkeys(i for i, _ in _secrets))
        return f"{origin}{'' if what else ':'} cannot be decrypted with the vault password(s) given (vault id {ids}): a wrong password or vault id?"
    messages = [_first_line(e) for e in chain if str(e).strip()]
    yaml_message = next((m for m in messages if m.startswith("YAML parsing failed")), None)
    return f"{origin}: {yaml_message or messages[0] if messages else type(exc).__name__}"


@contextlib.contextmanager
def _captured_warnings(notes: list[str]):
    """Ansible's [WARNING]/[DEPRECATION WARNING] lines are kept from the terminal and returned as notes."""
    try:
        from ansible._internal._display_utils import DeferredWarningContext
    except ImportError:  # pragma: no cover - another ansible-core: its lines are printed as they are
        yield
        return
    with DeferredWarningContext(variables={}) as context:
        yield
    for warning in context.get_warnings():
        event, text = warning.event, []
        while event is not None:
            where = (event.formatted_source_context or "").split("\n")[0].removeprefix("Origin: ")
            text.append(" ".join(event.msg.split()) + (f" ({where})" if where.startswith("/") else ""))
            event = event.chain.event if event.chain else None
        notes.append(": ".join(dict.fromkeys(text)))


def _parse_failure(notes: list[str], path: pathlib.Path) -> str | None:
    """Ansible only warns when an inventory source cannot be parsed; for us that is an invalid inventory."""
    failed = [n for n in notes if n.startswith("Failed to parse inventory with")]
    if not any(n.startswith("Unable to parse") or n.startswith("No inventory was parsed") for n in notes):
        return None
    best = next((n for n in failed if "'yaml' plugin" in n or "'auto' plugin" in n), failed[0] if failed else None)
    if best is None:
        return f"{path}: Ansible could not parse it as an inventory."
    reason = best.split(": ", 1)[1] if ": " in best else best
    located = re.search(r"(?P<msg>[^:]*[^:(]) \((?P<file>/[^)]*?):(?P<line>\d+):\d+\)", reason)
    if located:
        return f"{located['file']} line {located['line']}: {located['msg'].strip()}"
    return f"{path}: {reason}"


# --- where a secret is written ---------------------------------------------------------------------------

@functools.cache
def _may_hold_secrets() -> frozenset[str]:
    """The variables whose leaves may be secret (hicachectl.config.secrets says which are)."""
    from hicachectl.config import secrets

    return frozenset(secrets.secret_variables()) | {"hicache_container_env", "hicache_extra_config"}


def _plain_text(templar, raw: Any, value: Any, path: str, written: dict[str, Written]) -> None:
    """Record in `written` each leaf of `value` (templated from `raw`) that an inventory file holds in plain text, by
    Ansible's own tags on the value (ansible-core 2.19+, ansible/_internal/_datatag/_tags.py): not a `!vault` value (an
    EncryptedString, decrypted with a VaultedValue tag: ansible/parsing/vault/__init__.py), not from a lookup (its
    Origin has no file: the environment, a password manager), not from a file encrypted whole (ansible-vault encrypt,
    DataLoader tags only the file's container: ansible/parsing/dataloader.py, so the file itself is read), and not
    made by a template from parts (its parts are not known). A reference to another variable (`{{ vault_token }}`)
    is judged by where that variable is written."""
    if isinstance(value, dict):
        for k, v in value.items():
            _plain_text(templar, raw.get(k) if isinstance(raw, dict) else None, v, f"{path}.{k}", written)
        return
    if isinstance(value, list):
        for i, v in enumerate(value):
            _plain_text(templar, raw[i] if isinstance(raw, list) and i < len(raw) else None, v, f"{path}.{i}", written)
        return
    try:
        from ansible._internal._datatag._tags import Origin, VaultedValue
        from ansible.parsing.vault import EncryptedString
    except ImportError:  # pragma: no cover - an ansible-core before 2.19 (pyproject.toml requires 2.19): not known
        return
    if value is None or isinstance(raw, EncryptedString) or VaultedValue.is_tagged_on(value):
        return
    origin = Origin.get_tag(value)
    if origin is None or not origin.path:
        return
    template = raw is not None and templar.is_template(raw)
    if template and Origin.get_tag(raw) == origin:
        return
    if _encrypted_file(origin.path):
        return
    written[path] = Written(origin.path, origin.line_num, referenced=template)


@functools.cache
def _encrypted_file(path: str) -> bool:
    """The file is encrypted whole with Ansible Vault (ansible.parsing.vault.is_encrypted_file reads its header)."""
    from ansible.parsing.vault import is_encrypted_file

    try:
        with open(path, "rb") as handle:
            return is_encrypted_file(handle)
    except OSError:
        return False


def _plain_secrets(variables: dict[str, Any], written: dict[str, Written]) -> dict[str, Written]:
    """Of the leaves written in plain text, those that hold a secret (hicachectl.config.secrets.secret_paths)."""
    from hicachectl.config import secrets

    secret = secrets.secret_paths(variables)
    return {p: where for p, where in written.items() if p in secret or any(p.startswith(s + ".") for s in secret)}


# --- loading ---------------------------------------------------------------------------------------------

def _open(path: pathlib.Path, notes: list[str]):
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    _setup_vault(loader)
    try:
        with _captured_warnings(notes):
            manager = InventoryManager(loader=loader, sources=[str(path)])
    except AnsibleError as exc:
        raise InventoryError(describe(exc, str(path))) from exc
    failure = _parse_failure(notes, path)
    if failure:
        raise InventoryError(failure)
    notes[:] = [n for n in notes if not n.startswith(("Failed to parse inventory with", "Unable to parse"))]
    return loader, manager, VariableManager(loader=loader, inventory=manager)


def _host_vars(loader, variables, host, path: pathlib.Path, names, notes: list[str], written: dict[str, Written] | None = None,
               misspelled: dict[str, str] | None = None) -> dict[str, Any]:
    """The host's variables whose names `names` accepts, templated. With `written`, where each leaf of the variables
    that may hold a secret is written in plain text (`_plain_text`): leaf path -> Written."""
    from ansible.errors import AnsibleError
    from ansible.template import Templar

    out = {}
    try:
        with _captured_warnings(notes):
            host_vars = variables.get_vars(host=host, include_hostvars=False)
            templar = Templar(loader=loader, variables=host_vars)
            if misspelled is not None:  # names no role reads that look like a catalogue variable's (validate refuses them)
                from hicachectl.config import schema

                misspelled.update((k, meant) for k in host_vars if not names(k) and (meant := schema.misspelled(k)))
            for key in [k for k in host_vars if names(k)]:
                try:
                    value = templar.template(host_vars[key])
                except AnsibleError as exc:
                    raise InventoryError(describe(exc, str(path), f"{key} (host {host.name})")) from exc
                if written is not None and key in _may_hold_secrets():
                    _plain_text(templar, host_vars[key], value, key, written)
                secrets.remember_vaulted(secrets.vaulted_texts(value))  # masked wherever this process prints
                out[key] = plain(value)
    except AnsibleError as exc:
        raise InventoryError(describe(exc, str(path))) from exc
    return out


def load(name_or_path: str, limit: str | None = None) -> Inventory:
    from ansible.errors import AnsibleError

    path = resolve_path(name_or_path)
    notes: list[str] = []
    loader, manager, variables = _open(path, notes)
    try:
        with _captured_warnings(notes):  # a pattern that matches nothing is said below, not as Ansible's raw warning
            hosts = manager.get_hosts(pattern=limit or "all")
    except AnsibleError as exc:
        raise InventoryError(f"{path}: {_first_line(exc)}") from exc
    if not hosts:
        raise InventoryError(f"{path}: no hosts{' match ' + repr(limit) if limit else ''}.")
    routers = {h.name for h in manager.groups[ROUTERS].get_hosts()} if ROUTERS in manager.groups else set()
    grouped_servers = {h.name for h in manager.groups[SERVERS].get_hosts()} if SERVERS in manager.groups else set()
    servers, router_vars, connections, plain_secrets, misspelled = {}, {}, {}, {}, {}
    for host in hosts:
        written: dict[str, Written] = {}
        typos: dict[str, str] = {}
        found = _host_vars(loader, variables, host, path, lambda k: k.startswith(PREFIX) or k in CONNECTION_VARS, notes, written, typos)
        if typos:
            misspelled[host.name] = typos
        own = {k: v for k, v in found.items() if k.startswith(PREFIX)}
        (router_vars if host.name in routers else servers)[host.name] = own
        connections[host.name] = {k: v for k, v in found.items() if k in CONNECTION_VARS}
        if shown := _plain_secrets(own, written):
            plain_secrets[host.name] = shown
    _refuse_duplicate_keys(notes)
    every = {h.name for h in manager.get_hosts(pattern="all")}
    named = _vars_files(path, "host_vars")
    # localhost: Ansible's implicit host (the playbooks' controller plays) reads host_vars/localhost.yml too
    orphans = {name: str(f) for f, name in named.items() if name not in every and name != "localhost"}
    groups = _vars_files(path, "group_vars")
    # hicache_routers: a group every playbook names, whether this inventory has router hosts yet or not
    group_orphans = {name: str(f) for f, name in groups.items() if name not in manager.groups and name != ROUTERS}
    return Inventory(name=name_or_path, path=path, hosts=servers, notes=list(dict.fromkeys(notes)), connections=connections,
                     routers=router_vars, plain_secrets=plain_secrets,
                     in_both=[h.name for h in hosts if h.name in routers and h.name in grouped_servers], misspelled=misspelled, orphan_host_vars=orphans,
                     orphan_group_vars=group_orphans)


def _vars_files(path: pathlib.Path, kind: str) -> dict[pathlib.Path, str]:
    """The files (and directories) of the inventory's host_vars/ or group_vars/, each with the host or group it names:
    as Ansible's host_group_vars plugin reads them, NAME, NAME.yml, .yaml, .json and a directory NAME/."""
    return {f: f.name if f.is_dir() or f.suffix == "" else f.stem for f in sorted(((path if path.is_dir() else path.parent) / kind).glob("*"))
            if not f.name.startswith(".") and (f.is_dir() or f.suffix in ("", ".yml", ".yaml", ".json"))}


def _refuse_duplicate_keys(notes: list[str]) -> None:
    """A key written twice in one mapping is ambiguous (Ansible silently keeps the last value): refused."""
    for note in notes:
        found = re.search(r"Found duplicate mapping key '(?P<key>[^']+)'\. \((?P<file>/[^)]*?):(?P<line>\d+):\d+\)", note)
        if found:
            raise InventoryError(f"{found['file']} line {found['line']}: {found['key']} is written twice in one mapping "
                                 "(Ansible would keep the last value silently). Fix: keep one.")


CONNECTION_VARS = ("ansible_connection", "ansible_host", "ansible_port", "ansible_user", "ansible_ssh_private_key_file",
                   # how the host's key is checked (the bench tunnel follows them: hicachectl/ops/tunnel.py)
                   "ansible_ssh_args", "ansible_ssh_common_args", "ansible_ssh_extra_args")


def connection(name_or_path: str, host: str) -> dict[str, Any]:
    """How Ansible reaches `host` (connection type, address, port, user, key), templated."""
    path = resolve_path(name_or_path)
    notes: list[str] = []
    loader, manager, variables = _open(path, notes)
    found = manager.get_host(host)
    if found is None:
        raise InventoryError(f"{path}: no host {host!r}.")
    return _host_vars(loader, variables, found, path, lambda k: k in CONNECTION_VARS, notes)
