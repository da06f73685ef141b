"""The io_uring fallback of roles/sglang_server/tasks/service.yml: which startup errors switch a host to posix_aio
for good (/etc/hicache/nixl-uring-unavailable). Only a real io_uring initialisation failure does; NIXL 1.5.1's
refusal of two io-queue keys names use_uring but is a config error (validate's nixl-io-queue)."""

from __future__ import annotations

import re

import pytest
import yaml
from helpers import SERVICE, _find, fallback_pattern


def _task(name):
    return _find(yaml.safe_load(SERVICE.read_text()), "rescue") and next(
        t for t in _find(yaml.safe_load(SERVICE.read_text()), "rescue") if t.get("name", "").startswith(name))


def test_the_fallback_task_tests_the_journal_with_that_pattern():
    task = _task("Fall back from io_uring")
    assert "search(__hicache_server_uring_failure" in task["when"]
    assert "__hicache_server_uring_failure" in task["vars"]["__hicache_server_uring_error"]


# NIXL's own texts: ai-dynamo/nixl src/plugins/posix/io_uring_io_queue.cpp ("Failed to initialize io_uring instance:
# %s" with std::generic_category's message), backend_plugin.h ("Failed to create engine: "); the 1.5.1 wheel's
# libplugin_POSIX.so holds the "mutually exclusive" text (seen refusing, tests/test_nixl_io_queue.py).
REAL_FAILURES = [
    "E1201 10:02:46.834285 16886 backend_plugin.h:102] Failed to create engine: Failed to initialize io_uring instance: Operation not permitted",
    "Failed to create engine: Failed to initialize io_uring instance: Bad file descriptor",
    "nixl: failed to create backend POSIX: io_uring_queue_init failed: EBADF (Bad file descriptor)",  # tests/standin
]
NOT_URING_FAILURES = [
    "E1201 10:02:46.834285 16886 backend_plugin.h:102] Failed to create engine: POSIX I/O queue parameters use_aio, use_uring, "
    "and use_posix_aio are mutually exclusive",
    "Failed to create engine: Conversion to bool failed for string 'maybe' known are y, yes, on, 1, true, enable as positive "
    "and n, no, off, 0, false, disable as negative (case insensitive) converting backend parameter use_uring",
    "RuntimeError: Failed to create NIXL backend",
]


@pytest.mark.parametrize("line", REAL_FAILURES)
def test_a_real_io_uring_failure_falls_back(line):
    assert re.search(fallback_pattern(), f"journal start\n{line}\nmore", re.IGNORECASE)


@pytest.mark.parametrize("line", NOT_URING_FAILURES)
def test_a_config_error_naming_use_uring_does_not_mark_the_host(line):
    assert re.search(fallback_pattern(), f"journal start\n{line}\nmore", re.IGNORECASE) is None


def test_the_marker_the_role_writes_is_the_one_the_host_facts_read_and_render_names():
    """One path in three places that cannot share an import: the plan (which the role's copy task takes it from and
    render lists), and the host facts module that reads it back on the next run."""
    import importlib.util

    from support import ROOT

    from hicachectl.plans import sglang_server

    spec = importlib.util.spec_from_file_location("hicache_host_facts", ROOT / "plugins/modules/hicache_host_facts.py")
    facts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(facts)
    assert facts.URING_MARKER == sglang_server.URING_MARKER
    def tasks(node):
        if isinstance(node, dict):
            yield node
            node = list(node.values())
        for child in node if isinstance(node, list) else ():
            yield from tasks(child)

    copy = next(t for t in tasks(yaml.safe_load(SERVICE.read_text())) if t.get("name") == "Remember that io_uring fails on this host")
    assert copy["ansible.builtin.copy"]["dest"] == "{{ __hicache_server_rendered.uring_marker }}"
