"""The hicache_preload callback (plugins/callback/hicache_preload.py) loads, in the controller process, what every forked
worker would otherwise load again: hicachectl's core, Ansible's table of builtin Jinja plugins, the collection's filters."""

from __future__ import annotations

import json
import marshal
import os
import subprocess
import sys

from support import ROOT

# What each probe below starts with: a new process (as each forked worker is, for what it loads on its own), Ansible's
# loaders on this checkout's collection, and the callback's directory.
SETUP = f"""
from ansible.plugins.loader import callback_loader, init_plugin_loader
init_plugin_loader([{str(ROOT / ".ansible/collections")!r}])
callback_loader.add_directory({str(ROOT / "plugins/callback")!r})
"""


def _probe(source: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SETUP + source, *args], cwd=ROOT, env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=120)

PROBE = """
import sys
from ansible.plugins.loader import filter_loader, test_loader
assert not filter_loader._cached_non_collection_wrappers and not test_loader._cached_non_collection_wrappers
callback = callback_loader.get("hicache_preload")
callback.__class__()
module = sys.modules[callback.__class__.__module__]
loaders = {"filter": filter_loader, "test": test_loader}
missing = [name for kind, name in module.JINJA_PLUGINS if loaders[kind].get(name) is None]
assert not missing, missing
# the tables a worker would otherwise build on its first filter or test
assert "bool" in filter_loader._cached_non_collection_wrappers and "truthy" in test_loader._cached_non_collection_wrappers
assert "hicachectl.plans.storage" in sys.modules
# the server's file templates, compiled here: a worker planning a server renders them without compiling
from hicachectl.plans import sglang_server
environment = sglang_server._environment()
compiled = {template.name for template in environment.cache.values()}
assert compiled == set(environment.list_templates()) and "start.sh.j2" in compiled, compiled
print("ok")
"""


def test_the_controller_process_loads_the_jinja_plugins_before_any_worker_forks():
    proc = _probe(PROBE)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


LOOKUPS = """
import pathlib, sys, tempfile
from ansible.plugins.loader import Jinja2Loader, filter_loader, test_loader
searched = []
original = Jinja2Loader.get_with_context
def counting(self, name, *args, **kwargs):
    searched.append((self.type, name))
    return original(self, name, *args, **kwargs)
Jinja2Loader.get_with_context = counting
callback_loader.get("hicache_preload").__class__()
# Jinja's own names, resolved in this (the controller) process: not Ansible's plugins, so None (Jinja's table answers)
assert ("filter", "length") in searched and ("test", "none") in searched, searched
searched.clear()
assert filter_loader.get("length") is None and test_loader.get("none") is None and filter_loader.get("list") is None
assert not searched, searched  # Jinja's own names: never searched again
# a collection's name is looked up each time, as Ansible does (a file of it that failed to load may load later)
assert filter_loader.get("hicache.deploy.hicache_storage") is not None and filter_loader.get("hicache.deploy.hicache_storage") is not None
assert searched == [("filter", "hicache.deploy.hicache_storage")] * 2, searched
try:
    filter_loader.get("not a name")
except KeyError:
    pass
else:
    raise AssertionError("an invalid name resolves")
# a directory of plugins added later (a role's own filter_plugins) is seen: what was remembered is forgotten
extra = pathlib.Path(tempfile.mkdtemp())
(extra / "mine.py").write_text("class FilterModule:\\n    def filters(self):\\n        return {'length': lambda value: 42}\\n")
filter_loader.add_directory(str(extra))
assert filter_loader.get("length") is not None
assert test_loader.get("none") is None
print("ok")
"""


def test_the_controller_process_resolves_jinjas_own_names_once_and_forgets_when_plugins_change():
    proc = _probe(LOOKUPS)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


BUILD = f"""
import base64, glob, hashlib, io, json, os, sys, zipfile
from ansible import constants as C
if sys.argv[1] != "ansible":
    callback_loader.get("hicache_preload").__class__()
from ansible.executor import module_common
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar
memo = os.path.join(C.DEFAULT_LOCAL_TMP, "hicache-module-utils-imports.json")
payloads = {{}}
for name in ("hicache_lock", "hicache_host_facts", "hicache_files"):
    # each module built in a worker forked for it, as Ansible builds them: what one kept reaches the next only on disk
    found = os.path.join(C.DEFAULT_LOCAL_TMP, name + ".json")
    if os.fork() == 0:
        module_common.modify_module(module_name="hicache.deploy." + name, module_path={str(ROOT / "plugins/modules")!r} + "/" + name + ".py",
                                    module_args={{}}, templar=Templar(loader=DataLoader()), task_vars={{"ansible_python_interpreter": "/usr/bin/python3"}},
                                    module_compression="ZIP_DEFLATED")
        cached = [path for path in glob.glob(os.path.join(C.DEFAULT_LOCAL_TMP, "ansiballz_cache", "*" + name + "*")) if not path.endswith(".lock")]
        archive = zipfile.ZipFile(io.BytesIO(base64.b64decode(module_common._CachedModule.load(cached[0]).zip_data)))
        json.dump({{info.filename: hashlib.sha256(archive.read(info)).hexdigest() for info in archive.infolist()}}, open(found, "w"))
        os._exit(0)
    os.wait()
    payloads[name] = json.load(open(found))
    if name == "hicache_lock" and sys.argv[1] == "corrupt":
        open(memo, "w").write("{{not json")
    if name == "hicache_lock" and sys.argv[1] == "tamper":  # every file kept as importing nothing: a later build must show it
        kept = json.load(open(memo))
        json.dump({{key: [[], []] for key in kept}}, open(memo, "w"))
print(json.dumps({{"payloads": payloads, "kept": sorted(key.split(chr(0))[0] for key in json.load(open(memo))) if os.path.exists(memo) else None}}))
"""


def _build(mode: str) -> dict:
    proc = _probe(BUILD, mode)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def test_module_payloads_built_with_the_imports_kept_for_the_run_are_ansibles_own():
    ansible, kept, corrupt, tamper = (_build(mode) for mode in ("ansible", "remember", "corrupt", "tamper"))
    assert ansible["kept"] is None and "ansible.module_utils.basic" in kept["kept"]
    assert len(ansible["payloads"]["hicache_files"]) > 20
    # the same files, byte for byte, whether the imports were found again or read from what the first build kept,
    # and whatever the kept file holds when it is not what this writes
    assert kept["payloads"] == ansible["payloads"] == corrupt["payloads"]
    # the later builds did read them: kept as importing nothing, their payloads lose basic's own module_utils
    assert tamper["payloads"]["hicache_lock"] == ansible["payloads"]["hicache_lock"]
    assert len(tamper["payloads"]["hicache_files"]) < len(ansible["payloads"]["hicache_files"])


# Jinja's code cache (hicache_preload._JinjaCodeCache): each case templated in a new process, as each forked worker
# does, once as Ansible compiles it and twice through the cache (an empty directory, then the one the first filled).
# A case's text comes from one of the roles' files, from an inventory, or from a vault.
RENDER = f"""
import json, os, sys
import jinja2.environment
generated = []
original_generate = jinja2.environment.Environment._generate
def counting_generate(self, *args, **kwargs):
    generated.append(1)
    return original_generate(self, *args, **kwargs)
jinja2.environment.Environment._generate = counting_generate
callback_loader.get("hicache_preload").__class__()
from ansible._internal._datatag._tags import Origin, SourceWasEncrypted
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
ORIGINS = {{"role": {str(ROOT / "roles/sglang_server/tasks/apply.yml")!r}, "inventory": "/somewhere/else/group_vars/all.yml"}}
def text(case):
    value = Origin(path=ORIGINS["role" if case[2] == "vault" else case[2]], line_num=1).tag(case[1])
    return trust_as_template(SourceWasEncrypted().tag(value) if case[2] == "vault" else value)
variables = {{"a": 1, "b": [1, 2, 3], "x": {{"y": "z"}}, "tiers": ["vast", "netapp"],
             "nested": trust_as_template("{{{{ a + 1 }}}}")}}
results = []
def outcome(call):
    try:
        return ["ok", repr(call())]
    except Exception as error:
        return ["error", type(error).__name__, str(error)]
for case in json.loads(sys.argv[1]):
    generated.clear()
    templar = Templar(loader=DataLoader(), variables=variables)
    if case[0] == "when":
        got = outcome(lambda: templar.evaluate_conditional(text(case)))
    else:
        got = outcome(lambda: templar.template(text(case), escape_backslashes=case[0] == "template"))
    results.append([got, len(generated)])
print(json.dumps(results))
"""

CASES = [
    ["when", "a == 1 and 'vast' in tiers", "role"],
    ["when", "x.y | default('q') == 'z'", "role"],
    ["when", "b | length > 2", "role"],
    ["when", "missing is defined", "role"],
    ["when", "nested == 2", "role"],
    ["template", "pre {{ x.y }} {{ b | join(',') }} post", "role"],
    ["template", "{% for i in b %}{{ i }};{% endfor %}", "role"],
    ["template", "{{ nested }}", "role"],
    # the same text with and without Ansible's backslash escaping compiles to different code
    ["template", '{{ "c:\\tfile" }}', "role"],
    ["template-raw", '{{ "c:\\tfile" }}', "role"],
    ["template", "{{ 'a1b' | regex_replace('(\\\\d)', '<\\\\1>') }}", "role"],
    # a template header changes the delimiters: the same body means something else
    ["template", "#jinja2:variable_start_string:'[[', variable_end_string:']]'\n[[ a ]] {{ a }}", "role"],
    ["template", "[[ a ]] {{ a }}", "role"],
    ["template", "{{ a + }}", "role"],
    ["template", "{{ not_a_variable }}", "role"],
    # compiled code holds a text's constants: an inventory's or a vault's text is never written to disk
    ["template", "{{ 'inventory-constant-4711' ~ a }}", "inventory"],
    ["template", "{{ 'vault-constant-4712' ~ a }}", "vault"],
]
PERSISTENT = [case for case in CASES if case[2] == "role" and case[1] != "{{ a + }}"]


def _render(tmp_path, mode: str, cases=CASES, **env):
    proc = _probe(RENDER, json.dumps(cases), XDG_CACHE_HOME=str(tmp_path / "cache"), HICACHE_JINJA_CODE_CACHE=mode, **env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def _entries(tmp_path):
    return sorted(tmp_path.glob("cache/hicache-deploy/jinja-code/*/*"))


def test_templates_from_the_code_cache_render_as_ansible_compiles_them(tmp_path):
    ansible = _render(tmp_path, "off")
    assert not _entries(tmp_path)  # turned off: nothing kept
    # each case compiled but the syntax error, which fails before Jinja generates code
    assert [bool(generated) for _, generated in ansible] == [case[1] != "{{ a + }}" for case in CASES], ansible
    first = _render(tmp_path, "on")
    assert [got for got, _ in first] == [got for got, _ in ansible]
    kept = _entries(tmp_path)
    assert len(kept) == len(PERSISTENT) - 1  # the header's case: the text Ansible strips of it has no origin
    assert all(path.stat().st_mode & 0o077 == 0 for path in [kept[0].parent, *kept])
    assert not [path for path in kept if b"constant-471" in path.read_bytes()]
    second = _render(tmp_path, "on")
    assert [got for got, _ in second] == [got for got, _ in ansible]
    for case, (got, generated) in zip(CASES, second, strict=True):
        # from the directory the first process filled, no role's text is compiled again (the syntax error never was);
        # an inventory's, a vault's and the variable's without an origin are, once in each process (the variable's
        # by the first case using it)
        in_memory_only = case[2] != "role" or case[1] == "nested == 2" or case[1].startswith("#jinja2:")
        assert generated == (1 if in_memory_only else 0), (case, got, generated)
    escaped, raw = (got for case, (got, _) in zip(CASES, second, strict=True) if case[1] == '{{ "c:\\tfile" }}')
    assert escaped != raw


FILTERS = {
    "plain": "def myf(value, extra=0):\n    return f'plain:{value} extra={extra}'\n",
    "context": "from jinja2 import pass_context\n\n@pass_context\ndef myf(context, value):\n    return f'context:{value}'\n",
}


def test_a_kept_template_is_compiled_again_where_its_filter_resolves_otherwise(tmp_path):
    """Jinja passes a context to a filter marked pass_context, and fails the compile of a filter it cannot find: code
    compiled where a name meant one filter must not run where it means another, or none."""
    cases = [["template", "{{ 1 | myf }}", "role"]]
    results = {}
    for kind, source in FILTERS.items():
        plugins = tmp_path / kind
        plugins.mkdir()
        (plugins / "myf.py").write_text(source + "\n\nclass FilterModule:\n    def filters(self):\n        return {'myf': myf}\n")
    for mode in ("off", "on"):
        for kind in ("plain", "context", "plain", "none"):
            plugins = tmp_path / kind
            plugins.mkdir(exist_ok=True)  # "none": no filter of that name
            results.setdefault(mode, []).append(_render(tmp_path, mode, cases, ANSIBLE_FILTER_PLUGINS=str(plugins))[0][0])
    assert results["on"] == results["off"], results
    assert results["off"][0][1].startswith("'plain:1 extra=0") and results["off"][1][1] == "'context:1'"
    assert results["off"][3][0] == "error"


def test_a_code_cache_directory_others_can_write_is_not_used(tmp_path):
    shared = tmp_path / "cache/hicache-deploy/jinja-code"
    shared.mkdir(parents=True)
    _render(tmp_path, "on")  # makes its directory inside, 0700: used
    directory = next(shared.iterdir())
    assert list(directory.iterdir())
    for path in directory.iterdir():
        path.unlink()
    directory.chmod(0o777)
    results = _render(tmp_path, "on")
    assert not list(directory.iterdir())  # memory only
    assert all(generated for got, generated in results if got[0] == "ok")


def test_an_entry_that_is_not_code_is_compiled_again(tmp_path):
    _render(tmp_path, "on", PERSISTENT[:1])
    (entry,) = _entries(tmp_path)
    entry.write_bytes(marshal.dumps((1, "not code", ())))
    ((got, generated),) = _render(tmp_path, "on", PERSISTENT[:1])
    assert got == ["ok", "True"] and generated == 1


# The controller's objects frozen before each task's workers fork (gc.freeze): a worker's collections never walk them
# (nor copy the pages they sit on). Frozen garbage is never freed: once the controller's peak memory has grown by a
# quarter since the last full collection, they are thawed and collected first.
FREEZE = """
import gc, json, os, sys, weakref
callback = callback_loader.get("hicache_preload").__class__()
class Node:
    pass
def garbage():
    node = Node()
    node.self = node  # a cycle: only a collection frees it
    return weakref.ref(node)
seen = {"start": gc.get_freeze_count()}
callback.v2_playbook_on_task_start(None, False)
seen["task"] = gc.get_freeze_count()
read, write = os.pipe()
pid = os.fork()
if pid == 0:  # a worker
    os.write(write, str(gc.get_freeze_count()).encode())
    os._exit(0)
os.waitpid(pid, 0)
seen["worker"] = int(os.read(read, 64))
left = garbage()
callback.v2_playbook_on_handler_task_start(None)
seen["handler"] = gc.get_freeze_count()
seen["small_growth_keeps_garbage"] = left() is not None
import resource
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
kept = []
while resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 1.3 * peak:  # the controller's peak memory up by more than a quarter
    kept.extend([i] for i in range(100000))
callback.v2_playbook_on_task_start(None, False)
seen["large_growth_frees_garbage"] = left() is None
seen["after_collection"] = gc.get_freeze_count()
print(json.dumps(seen))
"""


def test_the_controller_freezes_its_objects_before_each_tasks_workers_fork_and_collects_once_its_memory_grows_a_quarter():
    proc = _probe(FREEZE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["start"] == 0 and seen["task"] > 10000 and seen["worker"] > 0.99 * seen["task"] and seen["handler"] >= seen["task"]
    assert seen["small_growth_keeps_garbage"] and seen["large_growth_frees_garbage"], seen
    assert seen["after_collection"] > seen["task"] + 100000, seen  # everything alive frozen again
