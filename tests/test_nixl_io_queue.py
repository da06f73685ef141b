"""NIXL itself against the `nixl-io-queue` rule: the POSIX plugin of nixl-cu12 1.5.1 creates its backend with the
io-queue keys exactly when validate lets them through (and refuses two at once, "mutually exclusive").

NIXL runs in a subprocess, from the interpreter in HICACHE_NIXL_PYTHON or this one, whichever has `nixl_cu12`
(install: `pip install --no-deps nixl-cu12==1.5.1 numpy`; its torch dependency is not needed to create a backend).
Without NIXL the test is skipped, and says so."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from helpers import _host_vars

from hicachectl import rules

_PROBE = r'''
import json, os, pathlib, sys
import nixl_cu12
from nixl_cu12 import _bindings as b
if not os.environ.get("NIXL_PLUGIN_DIR"):
    site = pathlib.Path(nixl_cu12.__file__).parent.parent
    os.environ["NIXL_PLUGIN_DIR"] = str(next(p for p in (site / ".nixl_cu12.mesonpy.libs" / "plugins", site / "nixl_cu12.libs" / "nixl")
                                              if (p / "libplugin_POSIX.so").exists()))
for i, params in enumerate(json.loads(sys.argv[1])):
    agent = b.nixlAgent(f"hicache-probe-{i}", b.nixlAgentConfig())  # one POSIX backend per agent
    try:
        agent.createBackend("POSIX", params)
        print(json.dumps(["ok", ""]), flush=True)
    except Exception as exc:
        print(json.dumps(["refused", str(exc)]), flush=True)
'''


def _nixl_python() -> str | None:
    for python in (os.environ.get("HICACHE_NIXL_PYTHON"), sys.executable):
        if python and subprocess.run([python, "-c", "import nixl_cu12"], capture_output=True).returncode == 0:
            return python
    return None


# What SGLang hands NIXL for each config: str(value) of every plugin key (nixl_utils.py get_backend_initparams).
CONFIGS = [
    {"use_uring": True, "use_posix_aio": "true"},
    {"use_aio": "yes", "use_posix_aio": "on"},
    {"use_aio": "true", "use_uring": True},
    {"use_uring": True, "use_posix_aio": "false"},
    {"use_uring": True},
    {"use_posix_aio": "true"},
    {},
]


@pytest.fixture(scope="module")
def nixl_answers():
    python = _nixl_python()
    if python is None:
        pytest.skip("NIXL (nixl_cu12) is not installed here; set HICACHE_NIXL_PYTHON to a python that has it")
    params = [{k: str(v) for k, v in config.items()} for config in CONFIGS]
    run = subprocess.run([python, "-c", _PROBE, json.dumps(params)], capture_output=True, text=True, timeout=120)
    answers = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("[")]
    assert len(answers) == len(CONFIGS), run.stderr[-2000:]
    return dict(zip(map(json.dumps, CONFIGS), answers, strict=True)), run.stderr


@pytest.mark.parametrize("config", CONFIGS, ids=json.dumps)
def test_validate_refuses_exactly_the_io_queues_nixl_refuses(config, nixl_answers):
    answers, log = nixl_answers
    verdict, _ = answers[json.dumps(config)]
    host, variables = _host_vars("vast")
    _, found = rules.check_host(host, {**variables, "hicache_nixl_plugin": "POSIX", "hicache_extra_config": {"use_direct_io": True, **config}})
    refused = any(f.rule == "nixl-io-queue" for f in found)
    assert refused is (verdict == "refused"), (config, verdict)
    if refused:
        assert "mutually exclusive" in log


def test_nixl_refuses_two_io_queues_with_a_message_that_names_use_uring(nixl_answers):
    """The message the role's fallback must not take for an io_uring failure (roles/sglang_server/tasks/service.yml)."""
    _, log = nixl_answers
    line = next(line for line in log.splitlines() if "mutually exclusive" in line)
    assert "use_uring" in line
    from helpers import fallback_pattern
    assert re.search(fallback_pattern(), line, re.IGNORECASE) is None, line
