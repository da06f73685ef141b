#!/usr/bin/python
# Copyright: hicache-deploy developers
# SPDX-License-Identifier: Apache-2.0
"""Add a worker to an SGLang router, or take it out, through the router's worker API.

sglang-router 0.3.2: `GET /workers` lists {"workers": [{"id", "url", "model_id", "is_healthy", ...}]};
`POST /workers` {"url": URL} answers 202 and adds the worker in the background; `DELETE /workers/{id}`
answers 202 and removes it in the background; `GET /workers/{id}` carries the background job's status.
The router keeps URLs verbatim (`http://h:1` and `http://h:1/` are two workers), so the URL is normalised
(no trailing slash) before it is compared or sent.

The decision logic lives in plain functions (normalize, find, decide, wait, probe) that tests call directly;
main() only wraps them for Ansible. This file is shipped to the host on its own: standard library and
ansible.module_utils only.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: hicache_router_worker
short_description: Add a worker to an SGLang router or take it out
description:
  - Makes sure the SGLang router at O(router_url) lists O(worker_url) among its workers (O(state=present)) or not (O(state=absent)),
    through the router's worker API (C(GET/POST /workers), C(DELETE /workers/{id})) as sglang-router 0.3.2 serves it.
  - The worker URL is normalised (no trailing slash) before it is compared or sent; the router keeps URLs verbatim.
  - With O(state=present) a worker the router does not list is added (changed), then the module waits up to O(timeout) seconds until the
    router lists it healthy; a listed worker is left as it is (not changed) and also waited for. It fails when the router reports the
    addition failed or the worker is not healthy in time.
  - With O(state=absent) a listed worker is removed (changed), then the module waits up to O(timeout) seconds until the router no longer
    lists it; a worker the router does not list is not an error (not changed).
  - sglang-router 0.3.2 does not list a worker it cannot reach when it is added (the addition is retried until the worker answers), so
    O(state=present) waits until the worker is listed healthy; a listed worker that dies stays listed healthy until the periodic health
    check (C(--health-check-interval-secs), 60 s by default, 3 failures) says otherwise, so check the worker's own C(/health) too.
    A C(model_id) of C(unknown) in RV(worker) means the router could not read the worker's model.
  - With O(state=query) nothing is changed, and RV(running) says whether the router runs. A router whose port refuses the connection does not
    run (not deployed yet, or stopped). One that answers neither a worker list nor a refusal (no answer within the request's 10 s, an error
    status, not a worker list) may run and still send requests to the worker, so it is asked again until O(timeout) seconds have passed,
    and then the module fails naming the router and its last answer.
  - In check mode only C(GET /workers) is sent; the result says what would change.
options:
  router_url:
    description: The router's base URL (its C(--host)/C(--port)), e.g. C(http://127.0.0.1:30080).
    type: str
    required: true
  worker_url:
    description: The worker's base URL, C(http(s)://host[:port]), as the router reaches it.
    type: str
    required: true
  state:
    description:
      - C(present) adds the worker and waits until it is healthy; C(absent) removes it and waits until it is gone.
      - C(query) changes nothing and says whether the router runs (RV(running)) and what it lists.
    type: str
    choices: [present, absent, query]
    default: present
  timeout:
    description:
      - Seconds to wait for the router to list the worker healthy (present) or no longer list it (absent); C(0) does not wait.
      - With O(state=query), seconds to keep asking a router that answers neither a worker list nor a refused connection.
    type: int
    default: 120
  interval:
    description: Seconds between polls of C(GET /workers).
    type: float
    default: 1.0
notes:
  - Supports check mode.
  - Runs wherever the router's API is reachable; delegate it to the router host when the API listens on 127.0.0.1.
author: hicache-deploy developers (@hicache-deploy)
"""

EXAMPLES = r"""
- name: Take the server out of the router before restarting it
  hicache.deploy.hicache_router_worker:
    router_url: http://10.0.0.5:30080
    worker_url: http://10.0.0.11:30000
    state: absent
    timeout: 60
  delegate_to: router-01

- name: See whether the router runs (a refused connection) or cannot be asked (the task fails after 30 s)
  hicache.deploy.hicache_router_worker:
    router_url: http://127.0.0.1:30080
    worker_url: http://10.0.0.11:30000
    state: query
    timeout: 30
  delegate_to: router-01
  register: router_probe

- name: Put it back once it is healthy
  hicache.deploy.hicache_router_worker:
    router_url: http://10.0.0.5:30080
    worker_url: http://10.0.0.11:30000
    state: present
    timeout: 120
  delegate_to: router-01
"""

RETURN = r"""
workers:
  description: The worker URLs the router lists after the task (before it, in check mode).
  returned: always
  type: list
  elements: str
  sample: [http://10.0.0.11:30000, http://10.0.0.12:30000]
worker:
  description: The router's record of the worker (C(id), C(url), C(model_id), C(is_healthy), ...); C({}) when it is not listed.
  returned: always
  type: dict
  sample: {id: fbd305d8-32dc-481f-8650-51a61a5fba82, url: "http://10.0.0.11:30000", model_id: Qwen/Qwen3-8B, is_healthy: true}
running:
  description: Whether the router answered its worker list; C(false) only when its port refused the connection (nothing listens).
  returned: success
  type: bool
  sample: true
action:
  description: What was done, one of C(added), C(removed), C(none); in check mode what would be done.
  returned: always
  type: str
  sample: added
seconds:
  description: Seconds spent waiting for the router.
  returned: always
  type: float
  sample: 2.1
"""

import http.client
import json
import time
import urllib.error
import urllib.parse

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import ConnectionError as UrlsConnectionError
from ansible.module_utils.urls import open_url


class RouterError(Exception):
    """The router could not be asked, or said no; the message names the URL and the answer. `refused`: the connection
    was refused, so nothing listens on the router's port."""

    def __init__(self, message, refused=False):
        super().__init__(message)
        self.refused = refused


def normalize(url):
    """The URL as the router should hold it: no surrounding spaces, no trailing slash, scheme and host in lower case."""
    url = (url or "").strip()
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.netloc or parts.query or parts.fragment or parts.path.strip("/"):
        raise ValueError(f"{url!r} is not http(s)://host[:port] without a path")
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}"


def find(workers, url):
    """The router's records of the worker at url (normalised on both sides)."""
    want = normalize(url)
    found = []
    for worker in workers:
        try:
            if normalize(worker.get("url", "")) == want:
                found.append(worker)
        except ValueError:  # a record added by hand without a scheme: never ours
            continue
    return found


def decide(workers, url, state):
    """What to do: "add", "remove" or "none"."""
    listed = bool(find(workers, url))
    if state == "present":
        return "none" if listed else "add"
    return "remove" if listed else "none"


def settled(workers, url, state):
    """Whether the router's list is where the task wants it: listed and healthy (present), or gone (absent)."""
    found = find(workers, url)
    if state == "present":
        return bool(found) and all(w.get("is_healthy") is True for w in found)
    return not found


def urls(workers):
    return [w.get("url") for w in workers]


class Router:
    """The router's worker API over open_url."""

    def __init__(self, base, timeout=10):
        self.base = base.rstrip("/")
        self.timeout = timeout

    def _call(self, method, path, body=None):
        url = self.base + path
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if body is not None else {}
        try:
            # No proxy: the router is asked on its own host, and a proxy's refusal would pass for the router's.
            with open_url(url, method=method, data=data, headers=headers, timeout=self.timeout, use_proxy=False) as response:
                text = response.read().decode("utf-8", "replace")
                status = response.status
        except urllib.error.HTTPError as exc:
            text = exc.read().decode("utf-8", "replace") if exc.fp is not None else ""
            raise RouterError(f"{method} {url} answered {exc.code}: {text[:300]}") from exc
        except (urllib.error.URLError, OSError, UrlsConnectionError) as exc:
            # urllib wraps a failed connect in URLError(reason); a read that times out is raised as it is.
            refused = isinstance(getattr(exc, "reason", exc), ConnectionRefusedError)
            raise RouterError(f"{method} {url}: no answer ({getattr(exc, 'reason', exc)})", refused=refused) from exc
        except http.client.HTTPException as exc:  # an answer cut short or malformed (IncompleteRead, BadStatusLine)
            raise RouterError(f"{method} {url}: a broken answer ({exc!r})") from exc
        try:
            return status, json.loads(text) if text else {}
        except ValueError as exc:
            raise RouterError(f"{method} {url} answered {status} with something that is not JSON: {text[:300]}") from exc

    def workers(self):
        body = self._call("GET", "/workers")[1]
        if not isinstance(body, dict) or not isinstance(body.get("workers"), list):
            raise RouterError(f"GET {self.base}/workers did not answer a worker list: {str(body)[:300]}")
        return body["workers"]

    def add(self, url):
        return self._call("POST", "/workers", {"url": url})[1]

    def remove(self, worker_id):
        return self._call("DELETE", "/workers/" + urllib.parse.quote(str(worker_id), safe=""))[1]

    def job(self, worker_id):
        """The background job's status of a listed worker ({} when the router says nothing)."""
        try:
            body = self._call("GET", "/workers/" + urllib.parse.quote(str(worker_id), safe=""))[1]
        except RouterError:
            return {}
        return body.get("job_status") or {} if isinstance(body, dict) else {}


def wait(list_workers, url, state, timeout, interval, clock=time.monotonic, sleep=time.sleep, job_failed=None):
    """Poll until settled(); returns (settled?, workers last seen, seconds, why). job_failed(workers) may name a
    reason to stop early (the router reports the addition failed)."""
    start = clock()
    while True:
        workers = list_workers()
        if settled(workers, url, state):
            return True, workers, round(clock() - start, 1), ""
        if job_failed is not None:
            why = job_failed(workers)
            if why:
                return False, workers, round(clock() - start, 1), why
        if clock() - start >= timeout:
            found = find(workers, url)
            if state == "present":
                why = "the router does not list it" if not found else f"the router lists it unhealthy ({found[0].get('model_id', '?')})"
            else:
                why = "the router still lists it"
            return False, workers, round(clock() - start, 1), why
        sleep(interval)


def probe(router, timeout, interval, clock=time.monotonic, sleep=time.sleep):
    """(runs?, workers, seconds). A refused connection is a router that does not run; a worker list is one that runs.
    Anything else (a timeout, an error status, not a worker list) is not "not running": such a router may still send
    requests to the worker. It is asked again until `timeout` seconds have passed, then RouterError names the last answer."""
    start = clock()
    while True:
        try:
            return True, router.workers(), round(clock() - start, 1)
        except RouterError as exc:
            if exc.refused:
                return False, [], round(clock() - start, 1)
            if clock() - start >= timeout:
                raise RouterError(f"{exc}; no worker list after {round(clock() - start)} s of asking") from exc
        sleep(interval)


def run(router, worker_url, state, timeout, interval, check_mode=False, clock=time.monotonic, sleep=time.sleep):
    """The whole task; returns the module's result (with failed and msg)."""
    url = normalize(worker_url)
    if state == "query":
        running, workers, seconds = probe(router, max(timeout, 0), interval, clock, sleep)
        found = find(workers, url)
        return {"changed": False, "action": "none", "running": running, "workers": urls(workers), "worker": found[0] if found else {},
                "seconds": seconds, "failed": False,
                "msg": (f"{router.base} lists {url}" if found else f"{router.base} does not list {url}") if running
                else f"{router.base} refused the connection: no router runs there"}
    before = router.workers()
    action = {"add": "added", "remove": "removed", "none": "none"}[decide(before, url, state)]
    result = {"changed": action != "none", "action": action, "running": True, "workers": urls(before), "seconds": 0.0, "failed": False}
    if check_mode:
        found = find(before, url)
        result["worker"] = found[0] if found else {}
        result["msg"] = {"added": f"would add {url}", "removed": f"would remove {url}", "none": f"{url} is already {state}"}[action]
        return result
    if action == "added":
        router.add(url)
    elif action == "removed":
        for worker in find(before, url):
            router.remove(worker["id"])

    def job_failed(workers):
        for worker in find(workers, url):
            job = router.job(worker.get("id")) if state == "present" and not worker.get("is_healthy") else {}
            if job.get("status") == "failed":
                return f"the router says: {job.get('message', 'failed')}"
        return ""

    if timeout > 0 or action != "none":
        ok, after, seconds, why = wait(router.workers, url, state, max(timeout, 0), interval, clock, sleep, job_failed)
    else:
        ok, after, seconds, why = settled(before, url, state), before, 0.0, "not waited for (timeout 0)"
    found = find(after, url)
    result.update(workers=urls(after), worker=found[0] if found else {}, seconds=seconds)
    if not ok and timeout > 0:
        result.update(failed=True, msg=f"{url} on {router.base}: {why} after {seconds} s")
    else:
        result["msg"] = {"added": f"added {url}", "removed": f"removed {url}", "none": f"{url} is already {state}"}[action]
    return result


def main():
    module = AnsibleModule(argument_spec={
        "router_url": {"type": "str", "required": True},
        "worker_url": {"type": "str", "required": True},
        "state": {"type": "str", "choices": ["present", "absent", "query"], "default": "present"},
        "timeout": {"type": "int", "default": 120},
        "interval": {"type": "float", "default": 1.0},
    }, supports_check_mode=True)
    p = module.params
    try:
        normalize(p["router_url"])
        result = run(Router(p["router_url"]), p["worker_url"], p["state"], p["timeout"], max(p["interval"], 0.1), check_mode=module.check_mode)
    except (ValueError, RouterError) as exc:
        module.fail_json(msg=str(exc), changed=False)
    if result.pop("failed"):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
