#!/usr/bin/python
# Copyright: hicache-deploy developers
# SPDX-License-Identifier: Apache-2.0
"""Wait until an SGLang server answers /health, without killing one that is still loading.

Model loading can take 10+ minutes: while the unit is active (or activating) and /health says 503,
keep waiting until the timeout. Stop early when the unit has failed or systemd had to restart it
twice during the wait (a crash loop), with the end of its journal in the result.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: hicache_wait_healthy
short_description: Wait for an SGLang server's /health
description:
  - Polls O(url) until it answers 200, at most O(timeout) seconds. Loading a model can take 10 minutes and more; while the
    systemd O(unit) is active (or activating) and /health answers 503 or nothing, the module keeps waiting.
  - Fails early when the unit has failed, is inactive after the first poll interval, or was restarted by systemd twice during
    the wait (a crash loop); the end of the unit's journal is in RV(journal).
  - An answer counts only when it is the unit's own. The process listening on the URL's port must run in the unit's
    control group, or in the control group of the container O(container_name) that the unit's C(docker run) or
    C(podman run) started. A server started by hand, another container, or another process holding the port while the
    unit fails to bind it, fails the module, naming that process.
  - With O(start), a unit that is not active is started first (the result is then changed), so a stopped server is started
    and waited for in one step.
  - In check mode nothing was (re)started, so there is nothing to wait for; the module returns at once, skipped, or, with
    O(start), changed when the unit would be started.
options:
  url:
    description: The server's /health URL.
    type: str
    required: true
  unit:
    description: The systemd unit running the server.
    type: str
    required: true
  timeout:
    description: Seconds to wait at most.
    type: int
    default: 1800
  container_runtime:
    description: The container runtime (C(docker), C(podman)) that runs the container O(container_name); when not given,
      whichever of them runs a container of that name.
    type: str
  container_name:
    description: The name the server's container has (C(docker run --name)); its processes answer for the unit.
    type: str
  start:
    description: Start O(unit) first when it is not active (C(systemctl start)); the result is changed when it was started.
    type: bool
    default: false
  interval:
    description: Seconds between polls.
    type: int
    default: 5
  hide:
    description:
      - Texts never returned. SGLang logs its settings at start, its keys among them; each text given is replaced by
        C(********) in RV(journal). The filter C(hicache.deploy.hicache_secret_forms) gives every form the host's secrets
        take (as written, JSON-escaped, shell-quoted, as Python's repr writes them).
    type: list
    elements: str
    default: []
notes:
  - Supports check mode (returns at once, skipped, or changed when O(start) would start the unit).
  - Needs systemd on the host (C(systemctl show), C(journalctl)).
author: hicache-deploy developers (@hicache-deploy)
"""

EXAMPLES = r"""
- name: Wait for the server to load its model
  hicache.deploy.hicache_wait_healthy:
    url: http://127.0.0.1:30000/health
    unit: sglang-hicache.service
    timeout: 1800
"""

RETURN = r"""
started:
  description: Whether the module started O(unit) (O(start)).
  returned: always
  type: bool
  sample: false
seconds:
  description: Seconds until /health answered 200.
  returned: success
  type: float
  sample: 312.4
url:
  description: The URL that answered.
  returned: success
  type: str
  sample: http://127.0.0.1:30000/health
journal:
  description: The unit's last 40 journal lines.
  returned: failure
  type: str
"""

import glob
import os
import subprocess
import time
import urllib.error
import urllib.parse

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import ConnectionError as UrlsConnectionError
from ansible.module_utils.urls import open_url


def status(url):
    """The HTTP status /health answered, None when nothing answered (refused, timed out, TLS failed)."""
    try:
        with open_url(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:  # open_url raises it for every status but 2xx, as urlopen does
        return exc.code
    except (urllib.error.URLError, OSError, UrlsConnectionError):  # open_url's own errors (e.g. certificate validation) are not OSErrors
        return None


def unit_show(unit):
    """The unit's ActiveState, SubState, NRestarts and ControlGroup, from one `systemctl show`."""
    out = subprocess.run(["systemctl", "show", "--property=ActiveState,SubState,NRestarts,ControlGroup", unit],
                         capture_output=True, text=True, check=False).stdout
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return {"active": props.get("ActiveState", "unknown"), "sub": props.get("SubState", ""),
            "restarts": int(props.get("NRestarts", "0") or 0), "control_group": props.get("ControlGroup", "").strip()}


def listeners(port, proc="/proc"):
    """The pids with a TCP socket listening on `port` (IPv4 or IPv6), from /proc/net/tcp{,6} and each process's fds."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(os.path.join(proc, "net", table)) as handle:
                rows = handle.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    pids = set()
    if not inodes:
        return pids
    for fd in glob.glob(os.path.join(proc, "[0-9]*", "fd", "*")):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            pids.add(int(fd.split(os.sep)[-3]))
    return pids


def cgroup(pid, proc="/proc"):
    """The process's path in systemd's hierarchy (cgroup v1's name=systemd, else v2's unified one), or None."""
    try:
        with open(os.path.join(proc, str(pid), "cgroup")) as handle:
            lines = [line.rstrip("\n").split(":", 2) for line in handle if line.count(":") >= 2]
    except OSError:
        return None
    for wanted in ("name=systemd", ""):
        for fields in lines:
            if fields[1] == wanted:  # hierarchy-ID:controllers:path
                return fields[2]
    return None


def foreign_listener(port, control_group, proc="/proc", container_cgroup=None):
    """(pid, command) of a process listening on `port` that is neither in the unit's control group (empty: the unit
    runs no process, between two restarts of a loop) nor in `container_cgroup`, the control group of the container the
    unit runs (None: it runs none, or it could not be found); None when every listener is the unit's (or none was
    found: not judged)."""
    # Inside a container that runs systemd (without a cgroup namespace), every path starts with the container's own:
    # PID 1's, less its init.scope. Judged below that, the container's processes look as the host's do.
    root = (cgroup(1, proc) or "").removesuffix("/init.scope").rstrip("/")

    def below_root(path):
        return path[len(root):] if root and (path == root or path.startswith(root + "/")) else path

    unit_path = "/" + below_root(control_group).strip("/") + "/" if control_group else None
    for pid in sorted(listeners(port, proc)):
        found = cgroup(pid, proc)
        if found is None:
            continue  # not judged
        path = "/" + below_root(found).strip("/") + "/"
        if unit_path and path.startswith(unit_path):
            continue
        if container_cgroup and (found == container_cgroup or found.startswith(container_cgroup.rstrip("/") + "/")):
            continue  # the container the unit's docker run or podman run started (its own scope)
        try:
            with open(os.path.join(proc, str(pid), "comm")) as handle:
                command = handle.read().strip()
        except OSError:
            command = "?"
        return pid, command
    return None


def container_group(runtime, name, proc="/proc"):
    """The control group of the running container `name` (its main process's) under `runtime`, or where that is not
    given (a rollback to a config that ran a container) under docker or podman, whichever runs it; None when no such
    container runs."""
    if not name:
        return None
    for tool in [runtime] if runtime else ["docker", "podman"]:
        try:
            out = subprocess.run([tool, "inspect", "--format", "{{.State.Pid}}", name], capture_output=True, text=True, check=False, timeout=60)
        except (OSError, subprocess.TimeoutExpired):  # not installed here
            continue
        pid = out.stdout.strip()
        if out.returncode == 0 and pid.isdigit() and int(pid) > 0:
            return cgroup(int(pid), proc)
    return None


def journal(unit, hide=()):
    text = subprocess.run(["journalctl", "-u", unit, "-n", "40", "--no-pager", "-o", "cat"], capture_output=True, text=True, check=False).stdout
    for form in sorted({form for form in hide if form}, key=len, reverse=True):
        text = text.replace(form, "********")
    return text


def main():
    module = AnsibleModule(argument_spec={"url": {"type": "str", "required": True}, "unit": {"type": "str", "required": True},
                                          "timeout": {"type": "int", "default": 1800}, "interval": {"type": "int", "default": 5},
                                          "start": {"type": "bool", "default": False},
                                          "container_runtime": {"type": "str"}, "container_name": {"type": "str"},
                                          "hide": {"type": "list", "elements": "str", "default": [], "no_log": True}},
                           supports_check_mode=True)
    params, unit = module.params, module.params["unit"]
    state = unit_show(unit)
    # As ansible.builtin.systemd_service's state=started (is_running_service): active and activating units are left as they are.
    started = params["start"] and state["active"] not in ("active", "activating")
    if module.check_mode:
        module.exit_json(changed=started, started=started, skipped=not started,
                         msg=f"check mode: {unit} would be started" if started else
                             "check mode: the server was not (re)started, so there is nothing to wait for")
    if started:
        done = subprocess.run(["systemctl", "start", unit], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            module.fail_json(msg=f"systemctl start {unit} failed: {done.stderr.strip()}", started=False,
                             journal=journal(unit, params["hide"]))
        state = unit_show(unit)
    start = time.monotonic()
    restarts_at_start = state["restarts"]
    last = None
    while time.monotonic() - start < params["timeout"]:
        last = status(params["url"])
        if last == 200:
            state = unit_show(unit)
            port = urllib.parse.urlsplit(params["url"]).port or 80
            other = foreign_listener(port, state["control_group"],
                                     container_cgroup=container_group(params["container_runtime"], params["container_name"]))
            if other:
                module.fail_json(msg=f"{params['url']} is answered by pid {other[0]} ({other[1]}), not by {unit} "
                                     f"({state['active']}, {state['sub']}): stop what holds port {port}, then deploy again",
                                 started=started, journal=journal(unit, params["hide"]))
            module.exit_json(changed=started, started=started, seconds=round(time.monotonic() - start, 1), url=params["url"])
        state = unit_show(unit)
        if state["active"] == "failed" or (state["active"] == "inactive" and time.monotonic() - start > params["interval"]):
            module.fail_json(msg=f"{unit} is {state['active']} ({state['sub']}) and never answered {params['url']}", started=started,
                             journal=journal(unit, params["hide"]))
        if state["restarts"] - restarts_at_start >= 2:
            module.fail_json(msg=f"{unit} crashed and was restarted {state['restarts'] - restarts_at_start} times while loading",
                             started=started, journal=journal(unit, params["hide"]))
        time.sleep(params["interval"])
    module.fail_json(msg=f"{params['url']} did not answer 200 within {params['timeout']} s (last answer: {last})", started=started,
                     journal=journal(unit, params["hide"]))


if __name__ == "__main__":
    main()
