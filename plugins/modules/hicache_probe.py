#!/usr/bin/python
# Copyright: hicache-deploy developers
# SPDX-License-Identifier: Apache-2.0
"""Read a server's host and ask its endpoints in one round trip (hicachectl status and verify).

Each question was a task of its own (a stat, two slurps, a systemctl read, an ansible.builtin.uri per endpoint): each a
module run on the host and a task on the controller, for every host of every status and verify. Here they are one, and
every answer keeps the shape the judges read (hicachectl/ops/verify.py, playbooks/status.yml): an HTTP answer as
ansible.builtin.uri gives it (status, -1 when nothing answered or the answer was not HTTP; json when the answer is JSON;
content when asked for, and, unlike uri, whenever the status is not 2xx), a file's text (none when absent), a path's kind, the unit's properties. Read-only: it
runs in check mode too and never reports a change.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: hicache_probe
short_description: Read a server's host and ask its endpoints in one round trip
description:
  - Reads the systemd O(unit)'s properties, the text of O(files), what each of O(paths) is, then asks each of O(requests) in order.
  - Each answer has the shape M(ansible.builtin.uri) gives (RV(answers)); a request that is not asked (its O(requests[].after)
    did not answer 200) is C(skipped).
  - Read-only; it runs in check mode as it does otherwise and reports no change.
options:
  unit:
    description: The systemd unit whose O(unit_properties) to read (C(systemctl show)).
    type: str
  unit_properties:
    description: The properties of O(unit) to read.
    type: list
    elements: str
    default: [ActiveState, SubState, NRestarts, MainPID, ActiveEnterTimestamp, LoadState]
  files:
    description: Files whose text to return in RV(files) (null for a file that does not exist or cannot be read).
    type: list
    elements: str
    default: []
  paths:
    description: Paths to look at (RV(paths)).
    type: list
    elements: str
    default: []
  requests:
    description: The HTTP requests, asked one after the other.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: The key of its answer in RV(answers).
        type: str
        required: true
      url:
        description: The URL.
        type: str
        required: true
      method:
        description: The HTTP method.
        type: str
        default: GET
      body:
        description: A body, sent as JSON.
        type: raw
      headers:
        description: Request headers, never shown (they may carry a key).
        type: dict
        default: {}
      timeout:
        description: Seconds to wait for the answer.
        type: int
        default: 30
      return_content:
        description: Return the body in its answer (C(content)) whatever the status.
        type: bool
        default: false
      after:
        description: The name of an earlier request that must have answered 200 for this one to be asked.
        type: str
notes:
  - Supports check mode (it only reads).
author: hicache-deploy developers (@hicache-deploy)
"""

EXAMPLES = r"""
- name: Read the server's state and ask it
  hicache.deploy.hicache_probe:
    unit: sglang-hicache.service
    files: [/opt/sglang-hicache/cfg/deployed.json]
    requests:
      - {name: health, url: "http://127.0.0.1:30000/health"}
      - {name: info, url: "http://127.0.0.1:30000/server_info", after: health}
  register: probe
  no_log: true  # /server_info carries the server's keys
"""

RETURN = r"""
unit:
  description: The unit as C(systemctl show) gave it (rc, stdout) and its properties; absent without O(unit).
  returned: when O(unit) is given
  type: dict
  sample: {rc: 0, stdout: "ActiveState=active\nSubState=running\n", properties: {ActiveState: active, SubState: running}}
files:
  description: Each of O(files) with its text, null when absent or unreadable.
  returned: always
  type: dict
  sample: {/opt/sglang-hicache/cfg/deployed.json: '{"config_hash": "ab12"}'}
paths:
  description: Each of O(paths) with C(exists), C(isdir) and C(writeable) (by this process).
  returned: always
  type: dict
  sample: {/mnt/kvcache/ns: {exists: true, isdir: true, writeable: true}}
answers:
  description: Each request's answer by its name, as M(ansible.builtin.uri) gives it (C(status), -1 when nothing answered or the
    answer was not HTTP; C(json) when the answer is JSON; C(content) when asked for or when the status is not 2xx; C(msg)), with
    C(seconds) from sending the request to reading the whole answer (where one came), or C(skipped).
  returned: always
  type: dict
  sample: {health: {status: 200, msg: OK (2 bytes), seconds: 0.0021}, info: {skipped: true}}
"""

import json
import os
import subprocess
import time
import urllib.error

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_text
from ansible.module_utils.urls import open_url


def read_unit(unit, properties):
    try:
        proc = subprocess.run(["systemctl", "show", "--property=" + ",".join(properties), unit], capture_output=True, text=True, check=False)
    except OSError as exc:  # no systemctl on this host
        return {"rc": -1, "stdout": "", "stderr": str(exc), "properties": {}}
    props = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    return {"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr, "properties": props}


def read_file(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def look_at(path):
    return {"exists": os.path.exists(path), "isdir": os.path.isdir(path), "writeable": os.access(path, os.W_OK)}


def is_json(content_type):
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind.endswith("/json") or kind.endswith("+json")


def answer(request):
    """The answer to one request, in ansible.builtin.uri's shape."""
    headers = dict(request.get("headers") or {})
    data = None
    if request.get("body") is not None:
        data = json.dumps(request["body"]).encode()
        headers.setdefault("Content-Type", "application/json")
    start = time.monotonic()
    try:
        response = open_url(request["url"], data=data, headers=headers, method=request.get("method") or "GET",
                            timeout=request.get("timeout") or 30, follow_redirects="safe")
        status, content_type = response.status, response.headers.get("Content-Type", "")
        body = response.read()
    except urllib.error.HTTPError as exc:  # every status but 2xx
        status, content_type = exc.code, exc.headers.get("Content-Type", "") if exc.headers else ""
        try:
            body = exc.read()
        except Exception:  # noqa: BLE001 - a body cut short: the status stands, as uri keeps it
            body = b""
    except Exception as exc:  # noqa: BLE001 - nothing answered, or not HTTP (refused, timed out, TLS, a bad status line,
        # a body cut short): -1, as ansible.builtin.uri's fetch_url gives it, never a failed task that hides every other answer
        return {"status": -1, "url": request["url"], "msg": f"Request failed: {exc!r}"}
    seconds = round(time.monotonic() - start, 6)  # sent to the whole body read
    text = to_text(body, errors="surrogate_or_strict")
    out = {"status": status, "url": request["url"], "msg": f"OK ({len(body)} bytes)" if 200 <= status < 300 else f"HTTP Error {status}",
           "seconds": seconds}
    if is_json(content_type) and text:
        try:
            out["json"] = json.loads(text)
        except ValueError:
            pass
    if request.get("return_content") or not 200 <= status < 300:
        out["content"] = text
    return out


def ask_all(requests):
    """Each request's answer by its name, in order; one whose `after` did not answer 200 is not asked."""
    answers = {}
    for request in requests:
        after = request.get("after")
        if after and (answers.get(after) or {}).get("status") != 200:
            answers[request["name"]] = {"skipped": True, "msg": f"not asked: {after} did not answer 200"}
            continue
        answers[request["name"]] = answer(request)
    return answers


def main():
    request_spec = {"name": {"type": "str", "required": True}, "url": {"type": "str", "required": True},
                    "method": {"type": "str", "default": "GET"}, "body": {"type": "raw"}, "headers": {"type": "dict", "default": {}, "no_log": True},
                    "timeout": {"type": "int", "default": 30}, "return_content": {"type": "bool", "default": False},
                    "after": {"type": "str"}}
    module = AnsibleModule(argument_spec={
        "unit": {"type": "str"},
        "unit_properties": {"type": "list", "elements": "str",
                            "default": ["ActiveState", "SubState", "NRestarts", "MainPID", "ActiveEnterTimestamp", "LoadState"]},
        "files": {"type": "list", "elements": "str", "default": []},
        "paths": {"type": "list", "elements": "str", "default": []},
        "requests": {"type": "list", "elements": "dict", "default": [], "options": request_spec},
    }, supports_check_mode=True)
    params = module.params
    result = {"changed": False, "files": {path: read_file(path) for path in params["files"]},
              "paths": {path: look_at(path) for path in params["paths"]}}
    if params["unit"]:
        result["unit"] = read_unit(params["unit"], params["unit_properties"])
    result["answers"] = ask_all(params["requests"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
