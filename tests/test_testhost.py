"""tests/infra/testhost.sh clean removes only the test hosts of its own run (TESTHOST_RUN), or those whose run
ended: never the hosts of a run still going beside it (another helper's, another checkout's)."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest
from support import ROOT

pytestmark = pytest.mark.slow

TESTHOST = str(ROOT / "tests/infra/testhost.sh")


def _names() -> set[str]:
    out = subprocess.run(["podman", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def _up(name: str, key, env: dict) -> None:
    subprocess.run([TESTHOST, "up", name, "0", str(key)], check=True, stdout=subprocess.DEVNULL, env={**os.environ, **env}, timeout=300)


def test_clean_removes_only_its_own_run(tmp_path):
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    tag = uuid.uuid4().hex[:8]
    mine, theirs, ended = f"hicache-clean-{tag}-mine", f"hicache-clean-{tag}-theirs", f"hicache-clean-{tag}-ended"
    try:
        _up(mine, key, {"TESTHOST_RUN": f"run-{tag}-a"})
        _up(theirs, key, {"TESTHOST_RUN": f"run-{tag}-b"})
        # a host whose owner process is gone (as after an interrupted run): owned by a process that has exited
        gone = subprocess.Popen(["sleep", "5"])
        no_run = {k: v for k, v in os.environ.items() if k != "TESTHOST_RUN"}
        subprocess.run([TESTHOST, "up", ended, "0", str(key)], check=True, stdout=subprocess.DEVNULL, timeout=300,
                       env={**no_run, "TESTHOST_OWNER": str(gone.pid)})
        gone.wait()
        subprocess.run([TESTHOST, "clean"], check=True, env={**os.environ, "TESTHOST_RUN": f"run-{tag}-a"})
        assert mine not in _names() and {theirs, ended} <= _names()
        # without a run: only the hosts whose owner is gone; this test (pytest, alive) still owns theirs
        subprocess.run([TESTHOST, "clean"], check=True, env=no_run)
        names = _names()
        assert ended not in names and theirs in names
    finally:
        subprocess.run([TESTHOST, "down", mine, theirs, ended], check=False, stderr=subprocess.DEVNULL)
