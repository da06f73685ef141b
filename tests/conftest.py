from __future__ import annotations

import pathlib
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from support import ROOT, source_documents

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "infra"))
from fleet import Fleet, free_port, sglang_path, sglang_storage_env  # noqa: E402

STANDIN = ROOT / "tests/standin/sglang_standin.py"


@pytest.fixture(scope="session")
def shared() -> pathlib.Path:
    """The source documents' directory (support.source_documents: skip, or fail in the full tier, when missing)."""
    return source_documents()


@pytest.fixture(scope="module")
def fleet3(tmp_path_factory):
    """Three test hosts reached over SSH (tests/infra/fleet.py)."""
    fleet = Fleet(tmp_path_factory.mktemp("fleet"), 3).up()
    yield fleet
    fleet.down()


@pytest.fixture
def standin(tmp_path):
    """Start SGLang stand-ins on this machine: standin(*flags, env=...) -> (port, process). With an L3 backend
    (--hicache-storage-backend) its pages go through SGLang's own storage classes (tests/standin/sglang_pages.py), from
    the CPU environment tests/infra/sglang_env.sh --storage builds once; then this waits for /health (the store opened).
    `launcher` goes before the stand-in's python on its command line (e.g. unshare), as a container's runtime would."""
    procs = []

    def run(*args, env=None, launcher=()):
        port = free_port()
        storage = "--hicache-storage-backend" in args
        extra = {"STANDIN_SGLANG_PATH": sglang_path(*sglang_storage_env())} if storage else {}
        proc = subprocess.Popen([*launcher, sys.executable, str(STANDIN), "--model-path", "/models/m", "--port", str(port), *args],
                                env={"SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": str(tmp_path / "l3"), **extra, **(env or {})},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        deadline = time.monotonic() + (180 if storage else 5)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return port, proc
            try:
                if not storage:
                    socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                    return port, proc
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return port, proc
            except OSError:
                pass
            time.sleep(0.05 if not storage else 0.5)
        raise AssertionError("stand-in did not listen" if not storage else "stand-in's L3 store did not open in 180 s")

    yield run
    for proc in procs:
        proc.kill()
        proc.wait()
