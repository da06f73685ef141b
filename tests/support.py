"""Run the real CLI the way a user does."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"


def cli(*args: str, check_rc: int | None = None, env: dict | None = None, cwd: str | None = None) -> subprocess.CompletedProcess:
    """Run the real `hicachectl` in a fresh process, as a user would."""
    proc = subprocess.run([sys.executable, "-m", "hicachectl", *args], capture_output=True, text=True,
                          # 25 minutes: a deploy of four hosts with a router took over 10 on a CI machine running
                          # every stream at once; a command that hangs still stops.
                          env={**os.environ, **(env or {})}, cwd=cwd or ROOT, timeout=1500)
    if check_rc is not None:
        assert proc.returncode == check_rc, f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def cli_json(*args: str, check_rc: int | None = 0) -> dict:
    return json.loads(cli(*args, "--json", check_rc=check_rc).stdout)
