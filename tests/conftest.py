from __future__ import annotations

import pathlib
import socket
import subprocess
import sys
import time

import pytest
from support import ROOT, SHARED

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "infra"))
from fleet import Fleet, free_port  # noqa: E402

STANDIN = ROOT / "tests/standin/sglang_standin.py"


@pytest.fixture(scope="session")
def shared() -> pathlib.Path:
    assert SHARED.is_dir(), f"{SHARED} is missing: the seed documents live in ../shared beside the checkout"
    return SHARED


@pytest.fixture(scope="module")
def fleet3(tmp_path_factory):
    """Three test hosts reached over SSH (tests/infra/fleet.py)."""
    fleet = Fleet(tmp_path_factory.mktemp("fleet"), 3).up()
    yield fleet
    fleet.down()


@pytest.fixture
def standin(tmp_path):
    """Start SGLang stand-ins on this machine: standin(*flags, env=...) -> (port, process)."""
    procs = []

    def run(*args, env=None):
        port = free_port()
        proc = subprocess.Popen([sys.executable, str(STANDIN), "--model-path", "/models/m", "--port", str(port), *args],
                                env={"SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": str(tmp_path / "l3"), **(env or {})},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                return port, proc
            except OSError:
                if proc.poll() is not None:
                    return port, proc
                time.sleep(0.05)
        raise AssertionError("stand-in did not listen")

    yield run
    for proc in procs:
        proc.kill()
        proc.wait()
