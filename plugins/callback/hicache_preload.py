# Copyright: hicache-deploy developers
# SPDX-License-Identifier: Apache-2.0
"""Load hicachectl's core once, in the controller process, before any task runs.

Ansible runs each task of each host in a worker forked from the controller process. A hicache filter imports the
core (hicachectl) when first used; in a fork that import is lost with the fork, so every task planning with the
core paid it again (about half of each plan's cost). Imported here, in the parent, every fork inherits it.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: hicache_preload
type: aggregate
short_description: Load hicache-deploy's core once in the controller process
description:
  - Imports the Python package hicache-deploy (hicachectl), which the collection's filters use, in the controller process
    when the callback loads, so the workers Ansible forks for each task inherit it instead of importing it per task.
  - Compiles the templates of the server's files (start.sh, its unit, ...) there too, which every plan of a server renders.
  - Also loads Ansible's own filter and test plugins and this collection's filters, for the same reason. A worker
    otherwise builds the table of every builtin Jinja plugin again on its first filter or test (about a tenth of a
    worker's CPU in a no-op deploy).
  - Remembers, for the run, what each short name of a filter or test resolves to, and resolves Jinja's own names
    (C(length), C(list), C(none), ...) in the controller process before any fork. Ansible looks for such a name in every file of its
    builtin plugins before Jinja's own table answers, again in each worker and each task (about 0.4 ms a name). What is
    remembered is forgotten when a loader's directories change (a role with its own plugins), as Ansible's own caches.
  - Keeps, for the run, which module_utils each module_utils file imports, in the run's private directory beside
    Ansible's own cache of module payloads, so that the payload of each module after the first is built without
    compiling and walking the same files again (about 60 ms of the controller's CPU per module).
  - Keeps the Python code Jinja compiles from each template and conditional, keyed by the template's text and every
    setting that shapes the code, in memory and, for text from this collection's own files, in a private directory
    (C($XDG_CACHE_HOME/hicache-deploy/jinja-code), mode 0700, ignored unless the user's alone), so that a worker
    compiles a task's conditions and arguments once per text instead of once per task and host. Text from an
    inventory or a vault is never written there. Templates are still rendered, with each host's variables, every time.
  - Set E(HICACHE_JINJA_CODE_CACHE=off) to compile as Ansible does.
  - Before each task's workers are forked, moves every object the controller process holds out of reach of Python's
    cyclic garbage collector (C(gc.freeze), which Python's documentation gives for processes that fork without exec),
    so that neither the controller nor a worker walks them all in a collection and copies every page they sit on; each
    time the controller's peak memory has grown by a quarter since the last full collection, they are handed back and
    collected first.
  - Does nothing else, and nothing at all when the package is not installed (the filters then name it).
requirements:
  - Enabled in C(callbacks_enabled) (ansible.cfg or E(ANSIBLE_CALLBACKS_ENABLED)).
author: hicache-deploy developers (@hicache-deploy)
"""

import gc  # noqa: E402 (imports below the documentation, as ansible-test's validate-modules wants)
import hashlib  # noqa: E402
import importlib  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import marshal  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import stat  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import types  # noqa: E402

from ansible.plugins.callback import CallbackBase  # noqa: E402

# The modules the collection's filter plugins import (plugins/filter/*.py).
CORE_MODULES = ("config.deployment", "config.inventory", "config.namespace", "config.schema", "config.secrets", "ops.l3", "ops.metrics",
                "ops.rolling", "ops.verify", "plans.container_runtime", "plans.host_files", "plans.host_limits", "plans.launch", "plans.model",
                "plans.nic_tuning", "plans.plan", "plans.preflight", "plans.router", "plans.sglang_image", "plans.sglang_server",
                "plans.storage", "plans.storage_live", "rules")

# One filter of each of the collection's filter files (plugins/filter/*.py), and the builtin plugins they sit beside.
JINJA_PLUGINS = (("filter", "ansible.builtin.bool"), ("test", "ansible.builtin.truthy"), ("filter", "hicache.deploy.hicache_findings"),
                 ("filter", "hicache.deploy.hicache_l3_dir"), ("filter", "hicache.deploy.hicache_rolling"),
                 ("filter", "hicache.deploy.hicache_router_plan"))

for name in CORE_MODULES:
    try:
        importlib.import_module("hicachectl." + name)
    except ImportError:
        break
else:
    # The server's file templates (start.sh, the unit, ...), which every plan of a server renders: compiled once here.
    # A template that does not compile is left to the plan that renders it, which names it.
    try:
        importlib.import_module("hicachectl.plans.sglang_server").compile_templates()
    except Exception:  # noqa: BLE001, S110
        pass


def _remember_plugin_lookups() -> None:
    """Keep, per Jinja plugin loader, what each short name resolved to (a plugin, or None: not one of Ansible's, so
    Jinja's own filter or test of that name answers), then resolve Jinja's own names here, in the controller process,
    so that every worker forked after inherits the answers. ansible-core 2.19 resolves a name that is not one of its
    legacy plugins (Jinja's length, list, none, ...) by loading and listing every file of ansible.builtin's filter or
    test plugins, at each lookup (plugins/loader.py, Jinja2Loader.get_with_context: "FUTURE ... cache the collection
    results"), in each worker: a third of the names a task of this collection templates. Only a short name is kept:
    it resolves among the legacy plugins and ansible-core's own files, which a run does not change; a collection's name
    (with dots) is looked up as Ansible does, each time, since a file of the collection that failed to load is skipped
    (None) and may load later. A loader forgets when its directories change (PluginLoader._clear_caches, called by
    add_directory: a role with its own plugins); a name that raises is never kept."""
    import jinja2.defaults
    from ansible.plugins.loader import Jinja2Loader, filter_loader, test_loader

    if getattr(Jinja2Loader, "_hicache_remembers", False) or not hasattr(Jinja2Loader, "_clear_caches"):
        return
    original_get, original_clear = Jinja2Loader.get, Jinja2Loader._clear_caches

    def get(self, name, *args, **kwargs):
        if args or kwargs or not isinstance(name, str) or "." in name:
            return original_get(self, name, *args, **kwargs)
        resolved = self.__dict__.setdefault("_hicache_resolved", {})
        try:
            return resolved[name]
        except KeyError:
            pass
        plugin = original_get(self, name)
        resolved[name] = plugin
        return plugin

    def _clear_caches(self, *args, **kwargs):
        self.__dict__.pop("_hicache_resolved", None)
        return original_clear(self, *args, **kwargs)

    Jinja2Loader.get, Jinja2Loader._clear_caches, Jinja2Loader._hicache_remembers = get, _clear_caches, True
    for loader, names in ((filter_loader, jinja2.defaults.DEFAULT_FILTERS), (test_loader, jinja2.defaults.DEFAULT_TESTS)):
        for name in names:
            try:
                loader.get(name)
            except Exception:  # noqa: BLE001 (an operator alias such as "==" is no plugin name: resolved, and failing, where used)
                pass


def _load_jinja_plugins() -> None:
    """Ansible's Jinja plugin loaders fill their tables on first use, in whichever process uses them first: here, the
    controller process, so that every worker forked after inherits them (ansible-core 2.19 plugins/loader.py,
    Jinja2Loader._ensure_non_collection_wrappers, a table of every builtin filter or test built by loading each file)."""
    from ansible.plugins.loader import filter_loader, test_loader

    loaders = {"filter": filter_loader, "test": test_loader}
    for kind, name in JINJA_PLUGINS:
        try:
            loaders[kind].get(name)
        except Exception:  # noqa: BLE001 (a speed-up only: a plugin that does not load here fails where it is used)
            pass


class _JinjaCodeCache:
    """The code Jinja generates for a template or an expression, by its text and what shapes the code.

    Ansible runs each task of each host in a worker forked for it, and the worker compiles every condition, argument
    and variable it templates (Jinja's parser, its code generator and Python's compile: about 0.5 ms for a short
    expression) with no cache outliving it (ansible-core 2.19 _internal/_templating/_engine.py, _compile_expression
    and _compile_template). The same text on the next host, or in the next run, compiles to the same code. This keeps
    that code: in the controller's memory, which later forks inherit, and for the collection's own files (its roles'
    tasks, defaults, vars and templates) in a private directory every fork reads, the way Jinja's FileSystemBytecodeCache
    keeps file templates' code (marshal, a directory of the user's own). Text from anywhere else (an inventory, a
    vault) stays in memory: compiled code holds the text's constants.

    What shapes the code: the text, the environment's settings (the lexer's, Ansible's backslash escaping, embedded
    templates, the code generator) and which filters and tests the names resolve to (Jinja passes a context to those
    marked pass_context, and a name that resolves to nothing fails the compile): the key holds the first two, an entry
    the third, checked again before the entry is used. A template from the cache is built for the environment that asks
    (Template.from_code, as Jinja's from_string), so rendering is unchanged. With Ansible's template debugging on, or
    anything not as expected, Ansible compiles as usual.
    """

    FORMAT = 1
    # past this many entries the directory starts again empty (about 1,500 for this collection's roles)
    MAX_ENTRIES = 6000
    # a larger code object (a whole template file of someone's) is kept in memory only
    MAX_ENTRY_BYTES = 256 * 1024

    def __init__(self, directory_fd: int | None, collection_root: str, jinja_bits, jinja_common, tags) -> None:
        self.directory_fd = directory_fd
        self.collection_root = collection_root.rstrip(os.sep) + os.sep
        self.memory: dict[str, tuple] = {}
        self.capture = threading.local()
        self._jinja_bits = jinja_bits
        self._jinja_common = jinja_common
        self._tags = tags
        self._encrypted_files: dict[str, bool] = {}

    def key(self, env, kind: str, source: str) -> str | None:
        if env._debuggable_template_source:
            return None
        compile_context = self._jinja_bits._TemplateCompileContext.current(optional=True)
        settings = (self.FORMAT, kind, type(env).__module__, type(env).__qualname__, env.code_generator_class.__qualname__,
                    tuple(getattr(env, name) for name in self._jinja_bits._TEMPLATE_OVERRIDE_FIELD_NAMES),
                    bool(compile_context and compile_context.escape_backslashes),
                    bool(self._jinja_common._TemplateConfig.allow_embedded_templates), env.optimized, env.is_async,
                    repr(env.autoescape), tuple(sorted(env.extensions)), getattr(env.finalize, "__qualname__", repr(env.finalize)))
        digest = hashlib.sha256(repr(settings).encode())
        digest.update(b"\0")
        digest.update(str(source).encode("utf-8", "surrogatepass"))
        return digest.hexdigest()

    def persistent(self, source: str) -> bool:
        """Whether the text comes from one of the collection's own files, not encrypted (else: memory only). Origin
        decides nothing else here; a text without one stays in memory."""
        if self.directory_fd is None or self._tags.SourceWasEncrypted.is_tagged_on(source):
            return False
        origin = self._tags.Origin.get_tag(source)
        path = origin.path if origin else None
        if not path or not os.path.realpath(path).startswith(self.collection_root):
            return False
        if path not in self._encrypted_files:
            try:
                with open(path, "rb") as text:
                    self._encrypted_files[path] = text.read(14) == b"$ANSIBLE_VAULT"
            except OSError:
                self._encrypted_files[path] = True
        return not self._encrypted_files[path]

    def get(self, key: str, env):
        """The code kept for key, if every filter and test it was compiled against resolves the same way in env."""
        entry = self.memory.get(key)
        if entry is None and self.directory_fd is not None:
            entry = self._read(key)
            if entry is not None:
                self.memory[key] = entry
        if entry is None:
            return None
        code, plugins = entry
        for kind, name, marker in plugins:
            mapping = env.filters if kind == "filter" else env.tests if kind == "test" else None
            try:
                if mapping is None or _plugin_marker(mapping, name) != marker:
                    return None
            except Exception:  # noqa: BLE001 (a plugin that fails to load: Ansible's own compile reports it)
                return None
        return code

    def _read(self, key: str):
        try:
            with os.fdopen(os.open(key, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=self.directory_fd), "rb") as entry:
                info = os.fstat(entry.fileno())
                if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
                    return None
                data = marshal.loads(entry.read())
        except (OSError, ValueError, EOFError, TypeError):
            return None
        if not (isinstance(data, tuple) and len(data) == 3 and data[0] == self.FORMAT and isinstance(data[1], types.CodeType)
                and isinstance(data[2], tuple)):
            return None
        return data[1], data[2]

    def put(self, key: str, code, plugins: tuple, persistent: bool) -> None:
        self.memory[key] = (code, plugins)
        if not persistent:
            return
        data = marshal.dumps((self.FORMAT, code, plugins))
        if len(data) > self.MAX_ENTRY_BYTES:
            return
        temporary = f".new-{os.getpid()}-{threading.get_ident()}-{key}"
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=self.directory_fd)
        except OSError:
            return
        try:
            with os.fdopen(fd, "wb") as entry:
                entry.write(data)
            os.replace(temporary, key, src_dir_fd=self.directory_fd, dst_dir_fd=self.directory_fd)
        except OSError:
            try:
                os.unlink(temporary, dir_fd=self.directory_fd)
            except OSError:
                pass

    def drop(self, key: str) -> None:
        self.memory.pop(key, None)
        if self.directory_fd is not None:
            try:
                os.unlink(key, dir_fd=self.directory_fd)
            except OSError:
                pass

    def compiled(self, call):
        """Run call (Ansible's compile of one text) and return its result, the one code object it compiled (None where
        it compiled none or several: then nothing is kept) and the filters and tests the compile looked up."""
        outer = getattr(self.capture, "codes", None), getattr(self.capture, "plugins", None)
        self.capture.codes, self.capture.plugins = codes, plugins = [], []
        try:
            result = call()
        finally:
            self.capture.codes, self.capture.plugins = outer
        return result, (codes[0] if len(codes) == 1 else None), tuple(dict.fromkeys(plugins))

    def trim(self) -> None:
        """Start the directory again empty once it holds more than MAX_ENTRIES; once, in the controller."""
        try:
            names = os.listdir(self.directory_fd)
            if len(names) > self.MAX_ENTRIES:
                for name in names:
                    os.unlink(name, dir_fd=self.directory_fd)
        except OSError:
            pass


def _plugin_marker(plugins, name: str) -> str:
    """What Jinja's code generator sees of a filter or test: absent, or which context it is passed (jinja2
    compiler.py, CodeGenerator._filter_test_common; utils.py, _PassArg.from_obj)."""
    try:
        function = plugins[name]
    except KeyError:
        return "absent"
    return _pass_arg(function)


def _pass_arg(function) -> str:
    """Which context Jinja passes the filter or test function first: plain (none), context, eval_context or
    environment (jinja2 utils.py, _PassArg.from_obj)."""
    return getattr(getattr(function, "jinja_pass_arg", None), "name", "plain")


def _code_cache_directory() -> int | None:
    """The user's own directory for the cache, one per Python, Jinja and ansible-core, opened once here (forks
    inherit the descriptor, so every read and write is relative to the directory checked); None (memory only) where
    it cannot be made or is not the user's alone."""
    import jinja2
    import jinja2.compiler
    from ansible._internal._templating import _jinja_bits
    from ansible.release import __version__ as ansible_version

    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    # a patched Jinja or ansible-core of the same version generates other code: their files' times are in the name
    sources = hashlib.sha256(repr([(os.stat(module.__file__).st_mtime_ns, os.stat(module.__file__).st_size)
                                   for module in (jinja2.compiler, _jinja_bits)]).encode()).hexdigest()[:12]
    version = f"{sys.implementation.cache_tag}-jinja{jinja2.__version__}-ansible{ansible_version}-{sources}"
    directory = os.path.join(base, "hicache-deploy", "jinja-code", version)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    info = os.fstat(fd)  # the entries are code this process runs: the directory must be the user's alone
    if info.st_uid != os.geteuid() or info.st_mode & 0o077:
        os.close(fd)
        return None
    return fd


def _install_jinja_code_cache() -> _JinjaCodeCache | None:
    """Wrap AnsibleEnvironment's compile steps with the cache (once per process); None where it is turned off or
    ansible-core is not the one this was written against (then Ansible compiles as usual)."""
    if os.environ.get("HICACHE_JINJA_CODE_CACHE", "").lower() in ("off", "0", "false", "no"):
        return None
    try:
        from ansible._internal._datatag import _tags
        from ansible._internal._templating import _jinja_bits, _jinja_common, _jinja_plugins
        from jinja2.environment import TemplateExpression
    except ImportError:
        return None
    environment, intercept = _jinja_bits.AnsibleEnvironment, _jinja_plugins.JinjaPluginIntercept
    # what the key and the wrappers use, as ansible-core 2.19 to 2.21 have it
    needed = [(_jinja_bits, "_TemplateCompileContext"), (_jinja_bits, "_TEMPLATE_OVERRIDE_FIELD_NAMES"),
              (_jinja_common._TemplateConfig, "allow_embedded_templates"), (_tags, "Origin"), (_tags, "SourceWasEncrypted"),
              (intercept, "__getitem__")]
    needed += [(environment, name) for name in ("_compile", "_debuggable_template_source", "from_string", "compile_expression", "lexer")]
    if not all(hasattr(owner, name) for owner, name in needed):
        return None
    if getattr(environment, "_hicache_code_cache", None) is not None:
        return environment._hicache_code_cache
    collection_root = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
    cache = _JinjaCodeCache(_code_cache_directory(), collection_root, _jinja_bits, _jinja_common, _tags)
    original_compile = environment._compile
    original_from_string = environment.from_string
    original_compile_expression = environment.compile_expression
    original_getitem = intercept.__getitem__

    def _compile(self, source, filename):
        code = original_compile(self, source, filename)
        codes = getattr(cache.capture, "codes", None)
        if codes is not None:
            codes.append(code)
        return code

    def __getitem__(self, name):
        plugins = getattr(cache.capture, "plugins", None)
        if plugins is None:
            return original_getitem(self, name)
        kind = getattr(getattr(self, "_plugin_loader", None), "type", None)  # "filter" or "test"
        try:
            function = original_getitem(self, name)
        except KeyError:
            plugins.append((kind, name, "absent"))
            raise
        plugins.append((kind, name, _pass_arg(function)))
        return function

    def cached(self, kind, source, build, call):
        """build(code) from the entry for source, else call() (Ansible's compile) and keep what it compiled."""
        key = cache.key(self, kind, source)
        if key is None:
            return call()
        code = cache.get(key, self)
        if code is not None:
            try:
                return build(code)
            except Exception:  # noqa: BLE001 (an entry that does not build: compile as Ansible does, and forget it)
                cache.drop(key)
        result, code, plugins = cache.compiled(call)
        if code is not None:
            cache.put(key, code, plugins, cache.persistent(source))
        return result

    def from_string(self, source, globals=None, template_class=None):  # noqa: A002 (Jinja's own parameter name)
        if not isinstance(source, str):
            return original_from_string(self, source, globals, template_class)
        return cached(self, "template", source,
                      lambda code: (template_class or self.template_class).from_code(self, code, self.make_globals(globals), None),
                      lambda: original_from_string(self, source, globals, template_class))

    def compile_expression(self, source, undefined_to_none=True):
        if not isinstance(source, str):
            return original_compile_expression(self, source, undefined_to_none)
        return cached(self, "expression", source,
                      lambda code: TemplateExpression(self.template_class.from_code(self, code, self.make_globals(None), None),
                                                      undefined_to_none),
                      lambda: original_compile_expression(self, source, undefined_to_none))

    environment._compile = _compile
    environment.from_string = from_string
    environment.compile_expression = compile_expression
    intercept.__getitem__ = __getitem__
    environment._hicache_code_cache = cache
    if cache.directory_fd is not None:
        cache.trim()
    # The lexer too (its regular expressions), which each worker would otherwise build on its first template
    # (ansible-core's own note on AnsibleEnvironment.lexer: "pre-generate the default cached lexer before forking").
    _lexer = environment().lexer
    return cache


class _ModuleUtilsText:
    """Stands in for a module_utils file's syntax tree until its imports are needed and not known for the run."""

    __slots__ = ("name", "source", "digest")

    def __init__(self, name: str, source, digest: str) -> None:
        self.name, self.source, self.digest = name, source, digest


def _remember_module_utils_imports() -> None:
    """Ansible builds a module's payload (AnsiballZ) in the worker that first runs the module, and finds the
    module_utils to put in it by compiling each one (about fifty behind ansible.module_utils.basic) and walking its
    imports (ansible-core 2.19 executor/module_common.py, recursive_finder): about 75 ms per module. The payload is kept
    for the run (ansiballz_cache, in the run's private directory C.DEFAULT_LOCAL_TMP), the imports found are not, so the
    next module compiles the same files again. This keeps them in that directory, by the file's name, whether it is a
    package and the SHA-256 of its text, as JSON: a later build reads a file's text as before and compiles only a
    file whose text it has not seen. Anything not as expected: Ansible builds as usual."""
    try:
        from ansible import constants
        from ansible.executor import module_common
        from ansible.module_utils.common.text.converters import to_bytes
    except ImportError:
        return
    if getattr(module_common, "_hicache_remembers_imports", False) or not all(
            callable(getattr(module_common, name, None)) for name in ("_compile_module_ast", "ModuleDepFinder", "recursive_finder")) or \
            set(inspect.signature(module_common.ModuleDepFinder.__init__).parameters) != {"self", "module_fqn", "tree", "is_pkg_init", "args", "kwargs"}:
        return
    finder_class = module_common.ModuleDepFinder
    original_compile, original_init, original_recursive = module_common._compile_module_ast, finder_class.__init__, module_common.recursive_finder
    known: dict[str, list] = {}
    state = {"dirty": False}

    def path() -> str:
        return os.path.join(constants.DEFAULT_LOCAL_TMP, "hicache-module-utils-imports.json")

    def load() -> None:
        try:
            with open(path(), encoding="utf-8") as text:
                data = json.load(text)
        except (OSError, ValueError):
            return
        if isinstance(data, dict):
            for key, value in data.items():
                if (isinstance(value, list) and len(value) == 2
                        and all(isinstance(names, list) and all(isinstance(part, str) for part in names) for group in value for names in group)):
                    known.setdefault(key, value)

    def save() -> None:
        temporary = f"{path()}.{os.getpid()}"
        try:
            with open(temporary, "w", encoding="utf-8") as text:
                json.dump(known, text)
            os.replace(temporary, path())
            state["dirty"] = False
        except OSError:
            pass

    def _compile_module_ast(module_name, source_code):
        if not (module_name.startswith("ansible.module_utils") or ".plugins.module_utils" in module_name):
            return original_compile(module_name, source_code)  # the module itself: its metadata is read from the tree
        return _ModuleUtilsText(module_name, source_code, hashlib.sha256(to_bytes(source_code)).hexdigest())

    def __init__(self, module_fqn, tree, is_pkg_init=False, *args, **kwargs):
        if not isinstance(tree, _ModuleUtilsText):
            return original_init(self, module_fqn, tree, is_pkg_init, *args, **kwargs)
        key = f"{module_fqn}\0{bool(is_pkg_init)}\0{tree.digest}"
        if key in known and module_fqn == tree.name and not args and not kwargs:
            submodules, optional = known[key]
            self.submodules, self.optional_imports = {tuple(names) for names in submodules}, {tuple(names) for names in optional}
            self.module_fqn, self.is_pkg_init, self._tree = module_fqn, is_pkg_init, None
            return None
        original_init(self, module_fqn, original_compile(tree.name, tree.source), is_pkg_init, *args, **kwargs)
        known[key] = [sorted(map(list, self.submodules)), sorted(map(list, self.optional_imports))]
        state["dirty"] = True
        return None

    def recursive_finder(*args, **kwargs):
        load()
        try:
            return original_recursive(*args, **kwargs)
        finally:
            if state["dirty"]:
                save()

    module_common._compile_module_ast = _compile_module_ast
    finder_class.__init__ = __init__
    module_common.recursive_finder = recursive_finder
    module_common._hicache_remembers_imports = True


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "hicache_preload"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _load_jinja_plugins()
        _remember_plugin_lookups()
        _remember_module_utils_imports()
        _install_jinja_code_cache()
        self._peak_after_collection = None  # the controller's peak memory (KiB) just after the last full collection

    # Each task's workers are forked from this process after its start is announced here (the strategies send
    # v2_playbook_on_task_start, then queue the task for each host). A fork shares the controller's memory until either
    # side writes a page; a collection of the older generations writes to every object it walks, in the worker (its own
    # copy of each page) and in the controller (a copy of each page a live worker still shares). Frozen objects are
    # never walked (Python's gc.freeze).
    def v2_playbook_on_task_start(self, task, is_conditional):
        self._freeze_before_forks()

    def v2_playbook_on_handler_task_start(self, task):
        self._freeze_before_forks()

    def _freeze_before_forks(self) -> None:
        """Freeze every object the controller holds (O(1): Python moves its lists, not the objects). Garbage with cycles
        that is frozen is never freed, so each time the controller's peak memory has grown by a quarter since the last
        full collection, the objects are thawed and collected first: a bound in proportion to the memory the run holds,
        as Python's own collector keeps one in proportion to its objects (counting the frozen objects,
        gc.get_freeze_count, walks them all: it cost more than the freeze saves). A no-op deploy of 8 hosts never grows
        by a quarter (about 900 objects of garbage stay frozen until the run ends); a full collection costs ~35 ms."""
        gc.freeze()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        if self._peak_after_collection is None:
            self._peak_after_collection = peak
        elif peak > self._peak_after_collection * 1.25:
            gc.unfreeze()
            gc.collect()
            gc.freeze()
            self._peak_after_collection = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
