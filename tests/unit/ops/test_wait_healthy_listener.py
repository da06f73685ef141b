"""Whose answer /health is (plugins/modules/hicache_wait_healthy.py foreign_listener), judged on /proc trees written
here in the kernel's own formats: /proc/net/tcp (proc(5): sl, local_address HEX:PORT, ..., st 0A for LISTEN, ...,
inode), /proc/PID/fd/N -> socket:[INODE], /proc/PID/cgroup (hierarchy-ID:controllers:path)."""

from __future__ import annotations

import importlib.util
import os

import pytest
from support import ROOT

spec = importlib.util.spec_from_file_location("wait_healthy", ROOT / "plugins/modules/hicache_wait_healthy.py")
wait = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wait)

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def proc_tree(tmp_path, listeners, root_cgroup="/init.scope"):
    """listeners: {pid: (port, cgroup path, comm)}; PID 1 with `root_cgroup`."""
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    rows = [HEADER]
    for i, (pid, (port, cgroup, comm)) in enumerate(sorted(listeners.items())):
        inode = 40000 + i
        rows.append(f"   {i}: 00000000:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 {inode} 1 0000\n")
        (proc / str(pid) / "fd").mkdir(parents=True)
        os.symlink(f"socket:[{inode}]", proc / str(pid) / "fd" / "3")
        # cgroup v1 as this machine kind has it: the container's own path in every other hierarchy
        (proc / str(pid) / "cgroup").write_text(f"9:name=systemd:{cgroup}\n8:pids:{root_cgroup.removesuffix('/init.scope')}\n")
        (proc / str(pid) / "comm").write_text(comm + "\n")
    (proc / "net" / "tcp").write_text("".join(rows))
    (proc / "1").mkdir(exist_ok=True)
    (proc / "1" / "cgroup").write_text(f"9:name=systemd:{root_cgroup}\n8:pids:{root_cgroup.removesuffix('/init.scope')}\n")
    return str(proc)


UNIT = "/system.slice/sglang-hicache.service"


def test_the_units_own_listener_is_its_answer(tmp_path):
    proc = proc_tree(tmp_path, {4242: (30000, UNIT, "python3")})
    assert wait.listeners(30000, proc) == {4242}
    assert wait.foreign_listener(30000, UNIT, proc) is None


def test_a_server_started_by_hand_is_named(tmp_path):
    proc = proc_tree(tmp_path, {777: (30000, "/user.slice/user-0.slice/session-3.scope", "python3")})
    assert wait.foreign_listener(30000, UNIT, proc) == (777, "python3")


def test_the_units_container_is_its_answer(tmp_path):
    proc = proc_tree(tmp_path, {900: (30000, "/system.slice/docker-0123abcd.scope", "python3")})
    assert wait.foreign_listener(30000, UNIT, proc, container_cgroup="/system.slice/docker-0123abcd.scope") is None


@pytest.mark.parametrize("container_cgroup", [None, "/system.slice/docker-ffff0000.scope"])
def test_another_container_on_the_port_is_named(tmp_path, container_cgroup):
    """Any container was taken for the unit's (#34): a container the unit did not start (another name), or one on a
    host whose unit runs none, answers /health for someone else."""
    proc = proc_tree(tmp_path, {901: (30000, "/system.slice/docker-0123abcd.scope", "python3")})
    assert wait.foreign_listener(30000, UNIT, proc, container_cgroup=container_cgroup) == (901, "python3")


def test_the_container_is_found_by_its_name_under_the_runtime_that_runs_it(tmp_path):
    """container_group asks `<runtime> inspect --format {{.State.Pid}} NAME` (docker's and podman's own flag) and reads
    that process's cgroup; a name no runtime runs, or no runtime at all, is None."""
    proc = proc_tree(tmp_path, {902: (30000, "/system.slice/docker-0123abcd.scope", "python3")})
    runtime = tmp_path / "docker"
    runtime.write_text('#!/bin/sh\n[ "$1 $2 $3 $5" = "inspect --format {{.State.Pid}} " ] || exit 2\n'
                       '[ "$4" = sglang-hicache ] && echo 902 && exit 0\necho "Error: No such object: $4" >&2; exit 1\n')
    runtime.chmod(0o755)
    assert wait.container_group(str(runtime), "sglang-hicache", proc) == "/system.slice/docker-0123abcd.scope"
    assert wait.container_group(str(runtime), "someone-else", proc) is None
    assert wait.container_group(str(tmp_path / "absent-runtime"), "sglang-hicache", proc) is None
    assert wait.container_group(None, None, proc) is None


@pytest.mark.parametrize("own, expected", [(UNIT, None), ("/user.slice/user-0.slice/session-4.scope", (55, "python3"))])
def test_inside_a_systemd_container_paths_are_judged_below_its_own(tmp_path, own, expected):
    """A test host: Podman runs systemd in a container, every path below /libpod_parent/libpod-ID (systemctl show's
    ControlGroup included, as seen there on 2026-12-06), and the other hierarchies at the container's own path."""
    root = "/libpod_parent/libpod-b69fa30c"
    proc = proc_tree(tmp_path, {55: (30000, root + own, "python3")}, root_cgroup=root + "/init.scope")
    assert wait.foreign_listener(30000, root + UNIT, proc) == expected


def test_nothing_found_is_not_judged(tmp_path):
    proc = proc_tree(tmp_path, {12: (8080, "/user.slice", "nginx")})
    assert wait.foreign_listener(30000, UNIT, proc) is None


def test_a_unit_running_no_process_answers_nothing_itself(tmp_path):
    """Between two restarts of a loop (Address already in use) systemd gives the unit no control group: whoever
    answers is someone else."""
    proc = proc_tree(tmp_path, {61: (30000, "/system.slice/ssh.service", "python3")})
    assert wait.foreign_listener(30000, "", proc) == (61, "python3")
