"""Test bed only (tests/infra/vm_image.sh and base_image.sh put it in the VM and test-host images; never part of
hicache-deploy).

Ansible sends each task's module with its module_utils as a zip, which Python's zipimport compiles from source on every
task: it cannot keep bytecode as it does for a file in __pycache__. Under TCG that compilation costs the guest seconds
of CPU per task. This keeps the bytecode of a zip member by the hash of its source, as __pycache__ would; the module
runs the same code. Loaded at every start of the test host's python3 through hicache-testbed-pyc.pth (a .pth line
that imports it); hashlib is imported at the first zip member, not at every start (loading libcrypto cost a TCG guest
0.3 s of CPU per python3, measured with -X importtime)."""

import marshal
import os
import sys
import zipimport

CACHE = "/var/cache/hicache-testbed-pyc"
_compile_source = zipimport._compile_source


def _with_filename(code, filename):
    consts = tuple(_with_filename(c, filename) if isinstance(c, type(code)) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _cached_compile(pathname, source):
    import hashlib

    data = source if isinstance(source, bytes) else source.encode()
    key = hashlib.sha256(data).hexdigest()
    path = os.path.join(CACHE, f"{key}.{sys.implementation.cache_tag}.opt{sys.flags.optimize}")
    try:
        with open(path, "rb") as f:
            return _with_filename(marshal.load(f), pathname)
    except (OSError, EOFError, ValueError, TypeError):
        pass
    code = _compile_source(pathname, source)
    try:
        os.makedirs(CACHE, mode=0o755, exist_ok=True)
        part = f"{path}.{os.getpid()}"
        with open(part, "wb") as f:
            marshal.dump(code, f)
        os.replace(part, path)
    except OSError:
        pass
    return code


zipimport._compile_source = _cached_compile
