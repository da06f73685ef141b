"""Secret values: which they are, where they may go, and masking them in everything shown.

Secrets are the catalogue's `secret` variables (the hub token) and the values of the keys named in
`hicache_secret_keys`, looked up in `hicache_container_env` and, at any depth, in `hicache_extra_config`.
They reach a host only in files of mode 0600 (`secrets.env`, read by `docker/podman run --env-file` or by
serve.sh/run.sh with runtime none; an extra config holding a secret), never in start.sh or argv, and every
output shows them as MASK. Works on a Deployment or on raw inventory variables; imports nothing heavy.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from hicachectl.config import schema
from hicachectl.config.deployment import Deployment

MASK = "********"
SECRETS_ENV = "secrets.env"  # in cfg/, mode 0600: NAME=value lines, the format of `docker run --env-file`
SECRET_MODE = "0600"
DEFAULT_SECRET_EXTRA_CONFIG_FILE = "extra_config.json"  # when hicache_extra_config holds a secret and no file is named
# In cfg/, mode 0600: the secret SGLang flags (a secret catalogue variable with a flag, e.g. --admin-api-key) as SGLang's
# --config file (utils/server_args_config_parser.py, 0.5.20-0.5.23: a .yaml/.yml file of flag names without "--",
# merged into argv inside the process, so the value is in no process's command line). Written as JSON, which YAML reads.
SERVER_SECRETS_FILE = "server_secrets.yaml"
CONFIG_FLAG = "--config"  # SGLang reads one --config only ("Multiple config files specified! Only one allowed.")
# ServerArgs fields SGLang's /server_info returns as they are (0.5.23's http_server.py server_info: build_server_info
# redacts only the watermark's secrets), and the flags whose next word its launch_command shows.
SERVER_INFO_SECRET_FIELDS = ("api_key", "admin_api_key", "ssl_keyfile_password")
SECRET_SERVER_FLAGS = ("--api-key", "--admin-api-key", "--ssl-keyfile-password")
# Shorter values are masked only where they are known to sit (a variable, an env entry, a config key): found as
# text anywhere, they would mask unrelated output ("1", "true") and hide nothing worth hiding.
MIN_TEXT_MASK = 4

_LOOKS_SECRET = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|PRIVATE|(^|[^A-Z])KEY($|[^A-Z]))", re.IGNORECASE)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _vars(source: Any) -> Mapping[str, Any]:
    """Inventory variables (hicache_*) of a Deployment or of a mapping."""
    return source.as_vars() if hasattr(source, "as_vars") else source


def secret_keys(source: Any) -> frozenset[str]:
    keys = _vars(source).get("hicache_secret_keys") or []
    return frozenset(str(k) for k in keys) if isinstance(keys, list) else frozenset()


def secret_variables() -> tuple[str, ...]:
    return tuple(v.name for v in schema.VARIABLES if v.secret)


def server_secret_flags(source: Any) -> dict[str, str]:
    """The secret SGLang flags the host sets, as SERVER_SECRETS_FILE's keys (the flag without "--") and values."""
    variables = _vars(source)
    return {v.flag[2:]: str(variables[v.name]) for v in schema.VARIABLES
            if v.secret and v.flag and variables.get(v.name) is not None}


def server_secrets_text(flags: Mapping[str, str]) -> str:
    return json.dumps(dict(flags), indent=2) + "\n"


def redact_server_info(info: Any) -> Any:
    """SGLang's /server_info without the keys it returns: SERVER_INFO_SECRET_FIELDS at any depth (its internal_states
    repeat the server's settings per DP rank), and the word after a secret flag in a launch_command (0.5.23 records
    the argv after merging --config, so a key given in a config file shows there too)."""
    if isinstance(info, list):
        return [redact_server_info(item) for item in info]
    if not isinstance(info, Mapping):
        return info
    out = {k: (MASK if k in SERVER_INFO_SECRET_FIELDS and v is not None else redact_server_info(v)) for k, v in info.items()}
    command = out.get("launch_command")
    if isinstance(command, list):
        words = [str(w) for w in command]
        out["launch_command"] = [MASK if i and words[i - 1] in SECRET_SERVER_FLAGS else
                                 (w.split("=", 1)[0] + "=" + MASK if w.split("=", 1)[0] in SECRET_SERVER_FLAGS and "=" in w else w)
                                 for i, w in enumerate(words)]
    elif isinstance(command, str):
        flags = "|".join(map(re.escape, SECRET_SERVER_FLAGS))
        out["launch_command"] = re.sub(rf"({flags})([= ]+)(\S+)", lambda m: m.group(1) + m.group(2) + MASK, command)
    return out


def _walk(value: Any, path: tuple[str, ...] = ()) -> Iterable[tuple[tuple[str, ...], Any]]:
    """(path of keys, value) for every leaf of a nested mapping/list."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _walk(v, path + (str(k),))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk(v, path + (str(i),))
    else:
        yield path, value


def _secret_in_config(config: Any, keys: frozenset[str]) -> Iterable[Any]:
    """Values under a secret key, at any depth (a secret key's whole subtree is secret)."""
    for path, value in _walk(config):
        if any(p in keys for p in path) and value is not None:
            yield value


def _env_text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def container_secret_env(source: Any) -> dict[str, str]:
    """The container env entries that are secret (they go to secrets.env)."""
    variables, keys = _vars(source), secret_keys(source)
    env = variables.get("hicache_container_env") or {}
    return {str(k): _env_text(v) for k, v in env.items() if str(k) in keys} if isinstance(env, Mapping) else {}


def extra_config_has_secrets(source: Any) -> bool:
    config = _vars(source).get("hicache_extra_config") or {}
    return any(True for _ in _secret_in_config(config, secret_keys(source)))


# The texts of the values this process's inventory gave as `!vault` (config/inventory.py records them as it loads):
# a value the user encrypted is a secret by their word, whichever variable holds it, and is masked like one.
_VAULTED: set[str] = set()


def vaulted_texts(value: Any) -> list[str]:
    """The plain text of every leaf of `value` (keys too) that came from an Ansible Vault: decrypted, such a value
    keeps Ansible's vault tag (ansible.parsing.vault.VaultHelper)."""
    try:
        from ansible.parsing.vault import VaultHelper
    except ImportError:  # no Ansible, no vault
        return []
    found: list[str] = []

    def walk(item: Any) -> None:
        if isinstance(item, Mapping):
            for key, inner in item.items():
                walk(key)
                walk(inner)
        elif isinstance(item, (list, tuple)):
            for inner in item:
                walk(inner)
        elif item is not None and not isinstance(item, bool) and VaultHelper.get_ciphertext(item, with_tags=False) is not None:
            found.append(str(item))

    walk(value)
    return found


def remember_vaulted(texts: Iterable[str]) -> None:
    """Each text, and as names derived from it write it: lower case, and a namespace's model part (its slug)."""
    from hicachectl.config.namespace import slug_of

    for text in texts:
        if text:
            _VAULTED.update((text, text.lower()))
            if (slug := slug_of(text)) != "model":
                _VAULTED.add(slug)


def values(source: Any) -> list[str]:
    """Every secret value of one host as text, longest first (so a secret containing another is masked whole): the
    catalogue's secrets, the secret keys', and every value given as `!vault`."""
    variables, keys = _vars(source), secret_keys(source)
    found: list[Any] = [variables.get(name) for name in secret_variables()]
    found += [*_VAULTED, *(vaulted_texts({k: v for k, v in variables.items() if str(k).startswith("hicache_")})
                           if isinstance(variables, Mapping) else [])]
    env = variables.get("hicache_container_env") or {}
    if isinstance(env, Mapping):
        found += [v for k, v in env.items() if str(k) in keys]
    found += list(_secret_in_config(variables.get("hicache_extra_config") or {}, keys))
    texts = {_env_text(v) for v in found if v is not None and not isinstance(v, (Mapping, list))}
    texts |= {str(v) for value in found if isinstance(value, (Mapping, list)) for _, v in _walk(value) if v is not None}
    return sorted((t for t in texts if t), key=len, reverse=True)


def secret_paths(source: Any) -> set[str]:
    """Where one host's secrets sit, as dotted paths: the catalogue's secret variables, hicache_container_env.NAME of
    each secret key, and every leaf under a secret key of hicache_extra_config (hicache_extra_config.a.0.secret_key)."""
    variables, keys = _vars(source), secret_keys(source)
    paths = set(secret_variables())
    env = variables.get("hicache_container_env")
    if isinstance(env, Mapping):
        paths |= {f"hicache_container_env.{k}" for k in env if str(k) in keys}
    config = variables.get("hicache_extra_config")
    if isinstance(config, (Mapping, list)):
        paths |= {"hicache_extra_config." + ".".join(path) for path, _ in _walk(config) if any(p in keys for p in path)}
    return paths


def all_values(sources: Iterable[Any]) -> list[str]:
    """The secret values of several hosts (one host's secret is masked in another's output too)."""
    texts = {t for source in sources if source is not None for t in values(source)}
    return sorted(texts, key=len, reverse=True)


def _forms(value: str) -> list[str]:
    """The ways a value appears in text we print: as is, JSON-escaped, inside a single-quoted shell word, and as
    Python's repr writes it (SGLang logs its ServerArgs' repr at start: a value with both quotes gets \\')."""
    forms = {value, json.dumps(value)[1:-1], value.replace("'", "'\"'\"'"), repr(value)[1:-1]}
    return sorted((f for f in forms if len(f) >= MIN_TEXT_MASK), key=len, reverse=True)


def bearer(key: str | None) -> dict[str, str]:
    """The header SGLang's admin endpoints want once the server has an admin key (0.5.23 utils/auth.py,
    AuthLevel.ADMIN_OPTIONAL: `Authorization: Bearer <admin key>`, 401 otherwise); none without a key."""
    return {"Authorization": f"Bearer {key}"} if key else {}


def text_forms(secret_values: Iterable[str]) -> list[str]:
    """Every form of every value (_forms), longest first: what a plain text replacement must replace (a module that
    masks what it prints gets these, so the forms are known here only)."""
    return sorted({form for value in secret_values if value for form in _forms(value)}, key=len, reverse=True)


def mask_text(text: str, secret_values: Iterable[str]) -> str:
    for form in text_forms(secret_values):
        text = text.replace(form, MASK)
    return text


def mask(obj: Any, secret_values: Iterable[str]) -> Any:
    """A copy of any structure (dicts, lists, strings, dataclass-free JSON-like data) with every secret value
    replaced by MASK wherever it appears in a string, keys included."""
    secret_values = list(secret_values)
    if not secret_values:
        return obj
    if isinstance(obj, str):
        return mask_text(obj, secret_values)
    if isinstance(obj, Mapping):
        return {mask(k, secret_values): mask(v, secret_values) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [mask(v, secret_values) for v in obj]
    if obj is not None and not isinstance(obj, (bool, int, float)) and str(obj) in secret_values:
        return MASK
    if isinstance(obj, (int, float)) and not isinstance(obj, bool) and str(obj) in secret_values:
        return MASK
    return obj


def mask_config(config: Any, keys: frozenset[str]) -> Any:
    """An extra config (or any mapping) with the values under secret keys replaced by MASK."""
    if isinstance(config, Mapping):
        return {k: (MASK if str(k) in keys and v is not None else mask_config(v, keys)) for k, v in config.items()}
    if isinstance(config, list):
        return [mask_config(v, keys) for v in config]
    return config


def mask_vars(source: Any) -> dict[str, Any]:
    """A host's hicache_* variables with every secret replaced by MASK where it sits (and as text elsewhere)."""
    variables, keys = dict(_vars(source)), secret_keys(source)
    for name in secret_variables():
        if variables.get(name) is not None:
            variables[name] = MASK
    for name in ("hicache_container_env", "hicache_extra_config"):
        if isinstance(variables.get(name), Mapping):
            variables[name] = mask_config(variables[name], keys)
    return mask(variables, values(source))


def env_file_text(env: Mapping[str, str]) -> str:
    """`NAME=value` lines: what `docker/podman run --env-file` reads (the value verbatim to the end of the line)
    and what serve.sh/run.sh export one line at a time with runtime none. `env_file_problems` keeps it parseable."""
    header = "# Rendered by hicache-deploy: the container's secret environment (hicache_secret_keys). Mode 0600.\n"
    return header + "".join(f"{name}={value}\n" for name, value in env.items())


def env_file_problems(name: str, value: str) -> str | None:
    """Why NAME=value cannot be one line of an env file read the same way by Docker, Podman and bash, or None."""
    if not _ENV_NAME.match(name):
        return f"{name!r} is not an environment variable name (letters, digits, _; not starting with a digit)"
    if any(c in value for c in "\n\r\x00"):
        return "contains a line break or NUL, which ends the env file's line"
    if value[:1] in ("'", '"') or value[:1].isspace():
        return "starts with a quote or a space, which Podman's --env-file strips or parses and Docker keeps"
    return None


# docker run's and podman run's short flags that take no value, which may come before -e in one word (-ie, -tie).
_BOOL_SHORT_FLAGS = frozenset("itdP")


def _extra_arg_env_names(args: list) -> list[str]:
    """The names `docker run`/`podman run` arguments set in the environment, as their flag parser (pflag) reads them:
    -e NAME=V, -eNAME=V, -e=NAME=V, --env NAME=V, --env=NAME=V, and -e at the end of a run of flags that take no
    value (-ie NAME=V, -tieNAME=V)."""
    words = [str(a) for a in args]
    names = []
    for i, word in enumerate(words):
        value = None
        if word == "--env":
            value = words[i + 1] if i + 1 < len(words) else None
        elif word.startswith("--env="):
            value = word[len("--env="):]
        elif word.startswith("-") and not word.startswith("--") and len(word) > 1:
            for j, char in enumerate(word[1:], start=1):
                if char in _BOOL_SHORT_FLAGS:
                    continue
                if char == "e":
                    rest = word[j + 1:].removeprefix("=")
                    value = rest or (words[i + 1] if i + 1 < len(words) else None)
                break  # another flag, which takes the rest of the word as its value
        if value:
            names.append(value.split("=", 1)[0])
    return names


def looks_secret(key: str) -> bool:
    return bool(_LOOKS_SECRET.search(key))


def check(d: Deployment, out) -> None:
    """The validate rule for secrets (registered by hicachectl/rules/__init__.py): env-file values that cannot be written, secret keys
    that match nothing (a typo leaves the value in clear), and keys that look secret but are not marked."""
    keys = secret_keys(d)
    for name, value in container_secret_env(d).items():
        problem = env_file_problems(name, value)
        if problem:
            out.error(f"hicache_container_env.{name}", "secret-env-file", f"is secret, so it goes to secrets.env, but it {problem}.",
                      "remove the line break, leading quote or space from the value (or rename the variable).")
    config_keys = {p for path, _ in _walk(d.extra_config or {}) for p in path}
    known = set(map(str, (d.container_env or {}).keys())) | config_keys
    for key in sorted(keys - known):
        out.warn("hicache_secret_keys", "secret-key-unused", f"names {key!r}, which is neither a key of hicache_container_env nor of "
                 "hicache_extra_config; a misspelt name leaves the value it meant in clear.", f"correct {key!r} or remove it.")
    for name in map(str, (d.container_env or {}).keys()):
        if name not in keys and looks_secret(name):
            out.warn(f"hicache_container_env.{name}", "secret-not-marked", "looks like a secret but is not in hicache_secret_keys: it is "
                     "written to run.sh/serve.sh, shown in `docker run`'s argv (ps) and printed by render and plan.",
                     f"add {name} to hicache_secret_keys.")
    for name in _extra_arg_env_names(d.container_extra_args or []):
        if looks_secret(name):
            out.warn("hicache_container_extra_args", "secret-not-marked", f"sets {name} with -e/--env, which looks like a secret: it is "
                     "written to run.sh/serve.sh, shown in `docker run`'s argv (ps) and printed by render and plan.",
                     f"move {name} to hicache_container_env and add it to hicache_secret_keys (it then goes to secrets.env, 0600).")
    for path, value in _walk(d.extra_config or {}):
        if path and value is not None and not any(p in keys for p in path) and looks_secret(path[-1]) and isinstance(value, str):
            out.warn("hicache_extra_config." + ".".join(path), "secret-not-marked", "looks like a secret but is not in hicache_secret_keys: "
                     "it reaches SGLang's argv or a readable config file and is printed by render and plan.",
                     f"add {path[-1]} to hicache_secret_keys.")
