"""Run the real CLI the way a user does."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
# The documents the shipped profiles reproduce flag for flag, in SHARED/seeds (tests/seeds.py names each).
SEED_FILES_HOME = "../shared/seeds"


def missing_source_documents(shared: pathlib.Path) -> str | None:
    """What to say when the source documents are not where the tests read them: the path each must have."""
    import seeds

    missing = [shared / "seeds" / name for name in seeds.SEED_FILES.values() if not (shared / "seeds" / name).is_file()]
    if not missing:
        return None
    return (f"the profiles' source documents are missing: {', '.join(str(p) for p in missing)}. They live in {SEED_FILES_HOME} "
            f"beside the checkout ({shared.resolve() / 'seeds'}); put the four documents there to run these tests.")


def source_documents() -> pathlib.Path:
    """SHARED, holding the source documents. Without them the tests that compare with them skip, saying in one line
    where they belong (a fresh clone on its own); with HICACHE_SOURCE_DOCUMENTS=required (the full tier, as CI runs
    it) they fail instead, so that CI never passes without comparing."""
    import pytest

    problem = missing_source_documents(SHARED)
    if problem is not None:
        if os.environ.get("HICACHE_SOURCE_DOCUMENTS") == "required":
            pytest.fail(problem)
        pytest.skip(problem)
    return SHARED


def cli(*args: str, check_rc: int | None = None, env: dict | None = None, cwd: str | None = None) -> subprocess.CompletedProcess:
    """Run the real `hicachectl` in a fresh process, as a user would."""
    # stdin from /dev/null, never pytest's own: a non-blocking stdin left by another process makes Ansible refuse to run
    proc = subprocess.run([sys.executable, "-m", "hicachectl", *args], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          # 25 minutes: a deploy of four hosts with a router took over 10 on a CI machine running
                          # every stream at once; a command that hangs still stops.
                          env={**os.environ, **(env or {})}, cwd=cwd or ROOT, timeout=1500)
    if check_rc is not None:
        assert proc.returncode == check_rc, f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def cli_json(*args: str, check_rc: int | None = 0) -> dict:
    return json.loads(cli(*args, "--json", check_rc=check_rc).stdout)
