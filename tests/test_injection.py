"""Nothing injects into a line-oriented file (issue 11).

For every variable of the catalogue that carries text (strings, list items, mapping keys and values), values
with newlines, carriage returns, `%`, quotes, `$()`, `;`, backslashes and control characters either are refused
by validate, with an error naming that variable, or come out inert in every file the host receives, each read
back by its format's parser:

- the systemd unit: `systemd-analyze verify` (systemd's own parser: unknown keys, lines without '=', bad
  specifiers) and a strict INI reading (no key or section beyond the template's, every '%' escaped, the
  served name and the Exec words read back exactly);
- start.sh and run.sh: run by real bash with recorders (the argv that arrives is the one the catalogue
  built); serve.sh: `bash -n`;
- the backend config (json/toml/yaml), installed.json, the NIC tuning config: their parsers, equal to the data;
- the env file (secrets.env): one KEY=VALUE line per variable;
- fstab, modprobe.d, nfs.conf (configparser, strict), sysctl.d, limits.conf, the runtime drop-in: one line per
  entry, with the fields the format has.
"""

from __future__ import annotations

import configparser
import functools
import json
import re
import shutil
import subprocess
import tempfile
import tomllib

import pytest
import seeds
import yaml
from helpers import _host_vars
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import LINE_BREAKING, NASTY

from hicachectl import rules
from hicachectl.config import schema, secrets
from hicachectl.plans import host_limits, launch, nic_tuning, sglang_server, storage

ATTACKS = [
    "x\nExecStartPre=/bin/touch /tmp/pwned", "x\r\nEnvironment=LD_PRELOAD=/tmp/x.so", "x\\\nExecStart=/bin/sh", "%n", "100%", "%%",
    "a%i%h", '"quoted"', "it's", "$(touch /tmp/pwned)", "`id`", "a;b", "${HOME}", "$HOME", "back\\", "\\", "#c", ";c", "[Service]",
    "nul\x00", "tab\tx", "ls\u2028x", "esc\x1b[0m", "a=b", " lead", "trail ", "-flag", "x y", "", "ünïcode", "a:b", "../../etc/passwd",
]

# Which shipped inventory makes each variable reach its files, and what else it needs to be rendered at all.
SEED = {"hicache_storage_device": "local", "hicache_storage_fstype": "local", "hicache_extra_config_file": "netapp"}
EXTRA = {"hicache_storage_fstype": {"hicache_storage_device": "/dev/nvme1n1"}, "hicache_storage_device": {"hicache_storage_device": "/dev/nvme1n1"},
         "hicache_model_repo": {"hicache_model_source": "hub"}, "hicache_model_revision": {"hicache_model_source": "hub", "hicache_model_repo": "org/model"},
         "hicache_model_files": {"hicache_model_source": "path"}}
DICT_KEY = {"hicache_container_env": "INJECTED", "hicache_host_sysctls": "net.core.rmem_max", "hicache_container_ulimits": "memlock",
            "hicache_model_files": "config.json", "hicache_extra_config": "label"}
TEXT_VARIABLES = [v.name for v in schema.VARIABLES if v.type in ("str", "list", "dict")]


def placements(name: str, text: str, base: dict) -> list:
    """Where `text` can go in the variable: the value, a list item, a mapping value, a mapping key."""
    var = schema.BY_NAME[name]
    if var.type == "str":
        return [text]
    if var.type == "list":
        return [["python3", text]] if name == "hicache_launcher" else [[text]]  # the launcher's first word is a program
    kept = dict(base.get(name) or {}) if name == "hicache_extra_config" else {}
    return [{**kept, DICT_KEY[name]: text}, {**kept, text: "1"}]


# A well-formed image reference without a version tag is refused on the variable that version would come from; a
# valid choice that contradicts the seed's other variables (runtime none with a container directory, 1 GPU for TP 8)
# is refused on the variable it contradicts, whose fix says what to change.
RELATED = {"hicache_image": ("hicache_sglang_version",),
           "hicache_container_runtime": ("hicache_cache_container_dir", "hicache_model_dir", "hicache_image_digest", "hicache_image_mirror"),
           "hicache_container_gpus": ("hicache_tp_size",)}


def _names(name: str, finding: rules.Finding) -> bool:
    return finding.variable in (name, *RELATED.get(name, ())) or finding.variable.startswith((name + ".", name + "["))


def outcome(name: str, value):
    """The deployment when validate accepts the value; None when it refuses it with an error naming the variable."""
    host, variables = _host_vars(SEED.get(name, "vast"))
    raw = {**variables, **EXTRA.get(name, {}), name: value}
    deployment, findings = rules.check_host(host, raw)
    errors = [f for f in findings if f.level == rules.ERROR]
    if errors:
        assert any(_names(name, f) for f in errors), (name, value, [f.format() for f in errors])
        assert all(f.fix for f in errors)
        return None
    for _, text in rules._strings(value, name):
        assert not schema.refused_characters(text), f"{name}: {text!r} accepted with a control character"
    return deployment


# --- the systemd unit ------------------------------------------------------------------------------------

def parse_unit(text: str) -> list[tuple[str, str, str]]:
    """(section, key, raw value) of every setting, read strictly: a line is a comment, a [Section] or Key=value."""
    settings_, section = [], None
    for line in text.split("\n"):
        if not line.strip() or line.startswith(("#", ";")):
            continue
        assert not line.endswith("\\"), f"continued line: {line!r}"
        if line.startswith("["):
            assert re.fullmatch(r"\[[A-Za-z]+\]", line), line
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Za-z]+", key), f"not a setting: {line!r}"
        settings_.append((section, key, value))
    return settings_


def unit_words(value: str) -> list[str]:
    """How systemd splits an Exec*= / RequiresMountsFor= value into words: quotes, C escapes, %% and $$."""
    words, i = [], 0
    while i < len(value):
        if value[i] == " ":
            i += 1
            continue
        word = ""
        quote = value[i] == '"'
        i += quote
        while i < len(value) and (quote or value[i] != " "):
            c = value[i]
            if quote and c == '"':
                i += 1
                break
            if c == "\\":
                word, i = word + value[i + 1], i + 2
                continue
            if c in "%$":
                assert value[i + 1] == c, f"unescaped {c} in {value!r}"
                word, i = word + c, i + 2
                continue
            word, i = word + c, i + 1
        words.append(word)
    return words


@functools.cache
def _baseline_keys(seed: str, extra: tuple) -> list[tuple[str, str]]:
    host, variables = _host_vars(seed)
    d, _ = rules.check_host(host, {**variables, **dict(extra)})
    return [(s, k) for s, k, _ in parse_unit(sglang_server.unit(d).content)]


_ANALYZE = shutil.which("systemd-analyze")


@functools.cache
def systemd_analyze(name: str, text: str) -> list[str]:
    """What systemd's own parser says of the unit (missing executables aside: serve.sh is not on this machine)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/{name}"
        with open(path, "w") as fh:
            fh.write(text)
        proc = subprocess.run([_ANALYZE, "verify", "--man=no", path], capture_output=True, text=True, timeout=60)
    return [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip() and "is not executable" not in line]


def check_unit(d, name: str, text: str) -> None:
    settings_ = parse_unit(text)
    host, variables = _host_vars(SEED.get(name, "vast"))
    assert [(s, k) for s, k, _ in settings_] == _baseline_keys(SEED.get(name, "vast"), tuple(EXTRA.get(name, {}).items()))
    value = {k: v for _, k, v in settings_}
    assert re.sub("%%", "", value["Description"]).count("%") == 0
    assert value["Description"].replace("%%", "%") == f"SGLang HiCache server ({d.served_name})"
    assert unit_words(value["ExecStart"]) == [f"{d.cfg_dir}/serve.sh"]
    if "ExecStop" in value:
        assert unit_words(value["ExecStop"]) == [d.container_runtime, "stop", "-t", "60", d.container_name]
    if "RequiresMountsFor" in value:
        assert unit_words(value["RequiresMountsFor"]) == [d.cache_dir]
    if "ExecStartPre" in value:  # the last one: no server without the L3 mount (test_l3_mount_unit.py)
        assert unit_words(value["ExecStartPre"]) == ["/bin/mountpoint", "-q", d.cache_dir]
    assert re.fullmatch(r"[A-Za-z0-9_.-]+\.service", sglang_server.unit_name(d)), sglang_server.unit_name(d)
    if _ANALYZE:
        assert systemd_analyze(sglang_server.unit_name(d), text) == []


# --- scripts -------------------------------------------------------------------------------------------

@functools.cache
def bash_syntax(text: str) -> str:
    return subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True, timeout=60).stderr


@functools.cache
def recorded(text: str) -> str:
    return json.dumps(seeds.run_recorded(text))


def check_scripts(d, files: dict[str, str]) -> None:
    for name in ("start.sh", "run.sh", "serve.sh"):
        assert bash_syntax(files[name]) == "", (name, bash_syntax(files[name]))
    launches = [r for r in json.loads(recorded(files["start.sh"])) if r["prog"] == d.launcher[0]]
    assert [[d.launcher[0], *r["argv"]] for r in launches] == [launch.sglang_argv(d)]  # every word arrives as it is, none more
    if launch.in_container(d):
        docker = [r["argv"] for r in json.loads(recorded(files["run.sh"])) if r["prog"] == d.container_runtime]
        assert docker[-1] == launch.container_argv(d)[1:]


# --- every other format ---------------------------------------------------------------------------------

def check_other_files(d, files: dict[str, str]) -> None:
    config = launch.extra_config(d)
    for fname, text in files.items():
        if fname == secrets.SERVER_SECRETS_FILE:  # SGLang reads it as YAML: every value arrives as it is
            assert yaml.safe_load(text) == secrets.server_secret_flags(d) != {}
        elif fname.endswith(".json") and fname != sglang_server.INSTALLED:
            assert json.loads(text) == config
        elif fname.endswith(".toml"):
            assert tomllib.loads(text) == config
        elif fname.endswith((".yaml", ".yml")):
            assert yaml.safe_load(text) == config
        elif fname == sglang_server.INSTALLED:
            json.loads(text)
        elif fname.endswith(".env"):
            lines = [line for line in text.splitlines() if line and not line.startswith("#")]
            assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", line) for line in lines), text
    assert json.loads(nic_tuning.config_text(d)) == json.loads(json.dumps(nic_tuning.desired(d)))
    mount = storage.mount(d)
    if mount is not None:
        assert "\n" not in mount.fstab_line and len(mount.fstab_line.split()) == 6, mount.fstab_line
        assert mount.fstab_line.split()[:3] == [mount.source, mount.point, mount.fstype]
    sysctls = {**storage.sunrpc_sysctls(d), **storage.rp_filter_sysctls(d)}
    storage_sysctl = storage.sysctl_conf(sysctls)
    if storage_sysctl:  # one `key = value` line per value, each key one sysctl name (interface names from localports)
        lines = storage_sysctl.splitlines()[1:]
        assert [line.split(" = ", 1)[0] for line in lines] == list(sysctls)
        assert all(re.fullmatch(r"[A-Za-z0-9_./:@+-]+ = [0-9]+", line) for line in lines), storage_sysctl
    nfs = configparser.ConfigParser(strict=True, interpolation=None)
    nfs.read_string(storage.nfsrahead_conf(d))
    assert dict(nfs["nfsrahead"]) == {"nfs": str(d.storage_read_ahead_kb), "nfs4": str(d.storage_read_ahead_kb)}
    memlock = [line.split() for line in host_limits.limits_conf(d).splitlines()[1:]]
    assert len(memlock) == 4 and all(len(fields) == 4 and fields[3] == d.limits_memlock for fields in memlock)
    dropin = configparser.ConfigParser(strict=True, interpolation=None)
    dropin.optionxform = str
    dropin.read_string(host_limits.runtime_dropin(d))
    assert dict(dropin["Service"]) == {"LimitMEMLOCK": host_limits.systemd_memlock(d)}
    sysctl = host_limits.sysctl_conf(d)
    if sysctl:
        lines = sysctl.splitlines()[1:]
        assert [line.split(" = ", 1)[0] for line in lines] == list(d.host_sysctls)
        assert [line.split(" = ", 1)[1] for line in lines] == [str(v) for v in d.host_sysctls.values()]


def assert_inert(d, name: str) -> None:
    rendered = sglang_server.files(d)
    files = {f.name: f.content for f in rendered}
    check_unit(d, name, files[sglang_server.unit_name(d)])
    check_scripts(d, files)
    check_other_files(d, files)


def check(name: str, text: str) -> None:
    host, variables = _host_vars(SEED.get(name, "vast"))
    for value in placements(name, text, variables):
        d = outcome(name, value)
        if d is not None:
            assert_inert(d, name)


@pytest.mark.parametrize("name", TEXT_VARIABLES)
def test_attacks_are_refused_or_inert(name):
    for text in ATTACKS:
        check(name, text)


@pytest.mark.parametrize("name", TEXT_VARIABLES)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(text=NASTY | LINE_BREAKING | st.text(min_size=1, max_size=12))
def test_any_text_is_refused_or_inert(name, text):
    check(name, text)


@pytest.mark.parametrize("text", ["x\nExecStartPre=/bin/touch /tmp/pwned", "c\r\nExecStart=/bin/sh", "nul\x00"])
@pytest.mark.parametrize("name", ["hicache_served_model_name", "hicache_container_name", "hicache_model_path", "hicache_service_name"])
def test_the_measured_injections_are_refused(name, text):
    """The issue's measurements: each of these reached the unit (or its file name) before."""
    host, variables = _host_vars("local")
    _, findings = rules.check_host(host, {**variables, name: text})
    assert any(f.level == rules.ERROR and f.variable == name and f.rule == "control-character" for f in findings)


def test_percent_in_the_served_name_reaches_the_unit_escaped():
    host, variables = _host_vars("vast")
    d, findings = rules.check_host(host, {**variables, "hicache_served_model_name": "llama 100% %n"})
    assert not rules.has_errors(findings)
    unit = sglang_server.unit(d).content
    assert "Description=SGLang HiCache server (llama 100%% %%n)" in unit
    if _ANALYZE:
        assert systemd_analyze(sglang_server.unit_name(d), unit) == []


def test_systemd_analyze_is_here():
    """The unit checks above must use systemd's own parser: without it they would prove less than they claim."""
    assert _ANALYZE, "systemd-analyze is not installed (Debian package systemd): the unit checks need systemd's own parser"
    bad = "[Unit]\nDescription=x\nFoo\nExecStartPre=/bin/id\n[Service]\nExecStart=/bin/true %k\n"
    said = "\n".join(systemd_analyze("bad.service", bad))
    assert "Unknown key 'ExecStartPre'" in said and "Missing '='" in said and "specifiers" in said, said
