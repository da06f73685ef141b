"""Every Molecule scenario, run for real: systemd containers over SSH, converge, idempotence, verify."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from support import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]  # a scenario may take its subprocess timeout (1800 s) and more
SCENARIOS = sorted(p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml"))
ANSI = re.compile(r"\x1b\[[0-9;]*m")
VAULT_TEST_TOKEN = "hf_TESTTOKEN_never_logged_4711"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_molecule_scenario(scenario):
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"], "NO_COLOR": "1"}
    # 30 minutes: a scenario that hangs still stops; the router scenario took over 15 on a machine running every stream
    proc = subprocess.run(["molecule", "test", "--scenario-name", scenario], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1800)
    out = ANSI.sub("", proc.stdout + proc.stderr)
    assert proc.returncode == 0, out[-6000:]
    for action in ("converge", "idempotence", "verify"):
        assert re.search(rf"{scenario} (?:➜|>) {action}: Executed: Successful", out), out[-3000:]
    if scenario == "model":  # the Vault-protected hub token (molecule/model/host_vars) never shows
        assert "Download the model" in out and VAULT_TEST_TOKEN not in out


def test_there_is_a_scenario_for_each_role():
    """The whole site.yml converges through hicachectl (tests/fleet/test_fleet_deploy.py) and as the built collection
    from outside the checkout (tests/test_collection.py); Molecule checks each role alone."""
    roles = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "tasks").is_dir())
    assert set(roles) <= set(SCENARIOS)
    assert (ROOT / "tests/fleet/test_fleet_deploy.py").is_file() and (ROOT / "tests/test_collection.py").is_file()
