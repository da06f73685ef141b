#!/usr/bin/python
# Copyright: hicache-deploy developers
# SPDX-License-Identifier: Apache-2.0
"""A per-host lock so two deploys never interleave on one host.

The lock is a small JSON file under /run (a reboot clears it) naming the run, who started it and when.
Two rules make it trustworthy:

* The file is never visible empty or half-written: its content is written to a temp file in the same
  directory first, which is then hard-linked into place (fails if a lock appeared meanwhile) or renamed
  over a lock being taken over. Both are atomic in one directory.
* Every read-decide-write happens while holding flock(LOCK_EX) on a guard file beside the lock
  (`<path>.guard`). Of several runs taking over one stale lock, the first one through the guard replaces
  it; each later one then reads that fresh lock and is refused, so exactly one wins. The guard file is
  never removed: unlinking a flock file lets a second process lock a new inode while the first still
  holds the old one.

Taking and releasing the lock are bookkeeping of the run, not changes to the host: they report
changed=false. In check mode nothing is written, not even the guard, but a lock of another live run still
fails the task, so a plan tells the truth.

The decision logic lives in acquire() and release(), plain functions that tests call directly; main()
only wraps them for Ansible. This file is shipped to the host on its own, so it imports only the standard
library and ansible.module_utils.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: hicache_lock
short_description: Take or release the hicache-deploy lock on a host
description:
  - Takes or releases a per-host lock file so that two hicache-deploy runs never work on one host at the same time.
  - The lock file holds JSON with the run's id, who started it (C(holder)), when (C(since)) and the same time in seconds (C(epoch)).
  - The file is created with its content atomically (temp file, then hard link or rename) and every decision is taken while holding
    C(flock) on C(<path>.guard), so of several runs taking over one stale lock exactly one wins.
  - A lock of this run (same C(run_id)) is kept. A lock of another run is refused with its holder, start time and run id, unless it is
    empty or unreadable (left by a crashed run), older than I(stale_after), or dated more than I(max_clock_skew) seconds in the future;
    those are taken over with a warning.
  - Releasing removes the lock only if it belongs to this run; releasing a lock that is absent or another run's is not an error.
  - Both states report C(changed=false), since the lock is bookkeeping of the run, not a change to the host.
  - In check mode nothing is written; a lock held by another live run still fails the task.
options:
  state:
    description: C(acquired) takes the lock for I(run_id); C(released) gives it back if I(run_id) holds it.
    type: str
    choices: [acquired, released]
    required: true
  run_id:
    description: The id of this run; the same id acquiring again keeps the lock.
    type: str
    required: true
  holder:
    description: Who runs the deploy (user@controller), shown to a run that is refused.
    type: str
    default: unknown
  path:
    description: The lock file. Its directory must exist; C(<path>.guard) is created beside it and left in place.
    type: str
    default: /run/hicache-deploy.lock
  stale_after:
    description: Seconds after which another run's lock is taken over, so a crashed run cannot block a host for ever.
    type: int
    default: 21600
  max_clock_skew:
    description: Seconds a lock may be dated in the future (clocks of controllers differ) before it is taken over as wrong.
    type: int
    default: 300
notes:
  - Supports check mode.
  - hicache-deploy has no unlock command; if the run holding a lock is gone, remove the lock file by hand.
author: hicache-deploy developers (@hicache-deploy)
"""

EXAMPLES = r"""
- name: Take the deploy lock of this host
  hicache.deploy.hicache_lock:
    state: acquired
    run_id: "{{ __hicache_run.id }}"
    holder: "{{ __hicache_run.holder }}"

- name: Release the deploy lock of this host
  hicache.deploy.hicache_lock:
    state: released
    run_id: "{{ __hicache_run.id }}"

- name: A lock in another place, taken over after one hour
  hicache.deploy.hicache_lock:
    state: acquired
    run_id: "{{ __hicache_run.id }}"
    path: /var/lock/hicache-deploy.lock
    stale_after: 3600
"""

RETURN = r"""
lock:
  description: The lock as it is after the task; this run's lock once acquired, the other run's lock when refused or left in place, C({}) once released.
  returned: always
  type: dict
  sample: {run_id: 20261130T104500-ab12, holder: ops@ctl1, since: "2026-11-30T10:45:00Z", epoch: 1796035500.0}
found:
  description: The lock file as found before the task; null if there was none, or a description of its content if it was not a valid lock.
  returned: always
  type: raw
  sample: {run_id: 20261130T090000-cd34, holder: ops@ctl2, since: "2026-11-30T09:00:00Z", epoch: 1796029200.0}
action:
  description:
    - What was done, one of C(took), C(kept), C(took_over), C(refused) (acquired); C(released), C(not_held), C(left) (released).
    - In check mode C(took) and C(took_over) mean it would be done; nothing is written.
  returned: always
  type: str
  sample: took
"""

import errno
import fcntl
import json
import math
import os
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule

DEFAULT_STALE_AFTER = 21600
DEFAULT_MAX_CLOCK_SKEW = 300
# A lock is a few hundred bytes; anything far larger is not ours and need not be read whole.
MAX_READ = 65536
# The guard is held for microseconds; waiting this long means something is badly wrong with the filesystem.
GUARD_TIMEOUT = 30.0


class LockError(Exception):
    """A lock operation that could not be done; the message says what and what to do."""


def read(path):
    """Return (state, content, what): state is absent, valid or invalid; what describes an invalid file."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_READ)
    except FileNotFoundError:
        return "absent", None, None
    except OSError as exc:
        return "invalid", None, f"an unreadable file ({exc.strerror or exc})"
    if not raw.strip():
        return "invalid", None, "an empty file"
    try:
        content = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return "invalid", None, f"text that is not JSON: {_excerpt(raw)}"
    if not isinstance(content, dict):
        return "invalid", None, f"JSON that is not an object: {_excerpt(raw)}"
    if not isinstance(content.get("run_id"), str) or not content["run_id"]:
        return "invalid", content, f"a lock without a run id: {_excerpt(raw)}"
    epoch = content.get("epoch")
    # bool is an int to Python but never a time; NaN and infinities would make every comparison lie.
    if isinstance(epoch, bool) or not isinstance(epoch, (int, float)) or not math.isfinite(epoch):
        return "invalid", content, f"a lock of run {content['run_id']} without a valid epoch ({epoch!r})"
    return "valid", content, None


def _excerpt(raw):
    text = raw[:120].decode("utf-8", "replace")
    return repr(text + ("..." if len(raw) > 120 else ""))


def _describe(lock):
    return f"{lock.get('holder', 'unknown')} since {lock.get('since', 'an unknown time')} (run {lock.get('run_id')})"


def new_lock(run_id, holder, now):
    return {"run_id": run_id, "holder": holder, "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)), "epoch": now}


def _decide(path, state, current, what, run_id, stale_after, max_clock_skew, now, check_mode=False):
    """Return (action, message, warning) for the lock as found; action is took, kept, took_over or refused."""
    take, take_over, take_it_over = ("would take", "would take over", "would take it over") if check_mode else ("took", "took over", "took it over")
    # In check mode a plan must not read as if the host had been changed.
    note = " (check mode: nothing written)" if check_mode else ""
    if state == "absent":
        return "took", f"{take} the deploy lock {path} for run {run_id}{note}", None
    if state == "invalid":
        return ("took_over", f"{take_over} the deploy lock {path} for run {run_id}{note}",
                f"the deploy lock {path} held {what}, probably left by a crashed run; {take_it_over} for run {run_id}{note}")
    if current["run_id"] == run_id:
        return "kept", f"run {run_id} already holds the deploy lock {path}; kept it", None
    age = now - current["epoch"]
    if age > stale_after:
        return ("took_over", f"{take_over} the stale deploy lock {path} for run {run_id}{note}",
                f"{take_over} the stale deploy lock {path} of {_describe(current)}: {int(age)} s old, more than stale_after={stale_after} s{note}")
    if age < -max_clock_skew:
        return ("took_over", f"{take_over} the future-dated deploy lock {path} for run {run_id}{note}",
                f"the deploy lock {path} of {_describe(current)} is dated {int(-age)} s in the future (more than the {max_clock_skew} s allowed "
                f"for clock skew): the holder's clock or the file is wrong; {take_it_over} for run {run_id} rather than wait for ever{note}")
    return ("refused", f"another deploy holds this host: {_describe(current)}, lock {path}. "
                       f"Wait for it to finish, or remove {path} if that run is gone.", None)


class _Guard:
    """flock(LOCK_EX) on <path>.guard for the time of one read-decide-write."""

    def __init__(self, path, timeout=GUARD_TIMEOUT):
        self.path = path + ".guard"
        self.timeout = timeout
        self.fd = None

    def __enter__(self):
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            except OSError as exc:
                raise LockError(f"cannot open the lock guard {self.path}: {exc.strerror or exc}") from exc
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                        os.close(fd)
                        raise LockError(f"cannot lock the lock guard {self.path}: {exc.strerror or exc}") from exc
                    if time.monotonic() > deadline:
                        os.close(fd)
                        raise LockError(f"the lock guard {self.path} stayed locked for {self.timeout:.0f} s; "
                                        f"a process holding it is stuck (see `fuser {self.path}`)") from exc
                    time.sleep(0.01)
            # Someone may have removed the guard while we waited; a lock on a removed inode excludes nobody.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                self.fd = fd
                return self
            os.close(fd)

    def __exit__(self, *exc):
        os.close(self.fd)  # closing drops the flock
        self.fd = None
        return False


def _fsync_dir(directory):
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the rename is still atomic
    finally:
        os.close(fd)


def _install(path, content, replace):
    """Put content at path atomically: never visible empty or partial. Without replace, fail if path exists."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise LockError(f"cannot write the deploy lock {path}: {exc.strerror or exc} (in {directory})") from exc
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(content, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; others may need to read who holds the host
        if replace:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise
            except OSError as exc:
                # No hard links on this filesystem: we hold the guard, so a rename after a last look is as safe
                # against runs of this version; only a writer ignoring the guard could slip in between.
                if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK) or os.path.lexists(path):
                    raise
                os.replace(tmp, path)
        _fsync_dir(directory)
    except FileExistsError:
        raise
    except OSError as exc:
        raise LockError(f"cannot write the deploy lock {path}: {exc.strerror or exc}") from exc
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


def _result(failed, action, msg, lock, found, warnings, path):
    return {"failed": failed, "action": action, "msg": msg, "lock": lock or {}, "found": found, "warnings": warnings, "path": path}


def _found(state, current, what):
    if state == "valid":
        return current
    if state == "invalid":
        return {"invalid": what, "content": current}
    return None


def acquire(path, run_id, holder="unknown", stale_after=DEFAULT_STALE_AFTER, now=None, check_mode=False, max_clock_skew=DEFAULT_MAX_CLOCK_SKEW):
    """Take the lock at path for run_id. Returns a dict: failed, action, msg, lock, found, warnings, path.

    `now` (epoch seconds) is for tests; `check_mode` decides without writing anything.
    Raises LockError only when the filesystem does not let the lock be read or written.
    """
    if not run_id:
        raise LockError("run_id must not be empty: it is how a run recognises its own lock")
    if stale_after < 0 or max_clock_skew < 0:
        raise LockError(f"stale_after ({stale_after}) and max_clock_skew ({max_clock_skew}) must not be negative")
    if check_mode:
        # Without the guard: the file is only ever replaced whole, so a lone read sees a complete lock or none.
        state, current, what = read(path)
        clock = time.time() if now is None else now
        action, msg, warning = _decide(path, state, current, what, run_id, stale_after, max_clock_skew, clock, check_mode=True)
        lock = new_lock(run_id, holder, clock) if action in ("took", "took_over") else current
        return _result(action == "refused", action, msg, lock, _found(state, current, what), [warning] if warning else [], path)
    with _Guard(path):
        # A writer of an older version ignores the guard and may create the file between our look and our link;
        # then we simply look again.
        for _attempt in range(3):
            state, current, what = read(path)
            clock = time.time() if now is None else now
            action, msg, warning = _decide(path, state, current, what, run_id, stale_after, max_clock_skew, clock)
            found = _found(state, current, what)
            if action in ("kept", "refused"):
                return _result(action == "refused", action, msg, current, found, [], path)
            mine = new_lock(run_id, holder, clock)
            try:
                _install(path, mine, replace=(action == "took_over"))
            except FileExistsError:
                continue
            return _result(False, action, msg, mine, found, [warning] if warning else [], path)
    raise LockError(f"the deploy lock {path} kept appearing while it was being taken; another program writes it without the guard {path}.guard")


def release(path, run_id, check_mode=False):
    """Give back the lock at path if run_id holds it. Returns a dict: failed (always False), action, msg, lock, found, warnings, path.

    Not holding it is not an error: the release runs in an `always:` after a run that may have failed before taking it.
    """
    state, current, what = read(path)
    found = _found(state, current, what)
    if state == "absent":
        return _result(False, "not_held", f"the deploy lock {path} was not there; nothing to release", None, None, [], path)
    if state != "valid" or current["run_id"] != run_id:
        holder = f"it is held by {_describe(current)}" if state == "valid" else f"it holds {what}"
        return _result(False, "left", f"the deploy lock {path} is not held by run {run_id}: {holder}; left it in place", current, found, [], path)
    if check_mode:
        return _result(False, "released", f"would release the deploy lock {path} of run {run_id} (check mode: nothing written)", None, found, [], path)
    with _Guard(path):
        # Look again under the guard: if our lock was taken over as stale meanwhile, the file is someone else's now.
        state, current, what = read(path)
        if state == "absent":
            return _result(False, "not_held", f"the deploy lock {path} was removed by someone else before run {run_id} released it", None, found, [], path)
        if state != "valid" or current["run_id"] != run_id:
            holder = _describe(current) if state == "valid" else f"something that wrote {what}"
            return _result(False, "left", f"the deploy lock {path} was taken over by {holder} before run {run_id} released it; left it in place",
                           current, _found(state, current, what), [], path)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise LockError(f"cannot remove the deploy lock {path}: {exc.strerror or exc}") from exc
    return _result(False, "released", f"released the deploy lock {path} of run {run_id}", None, found, [], path)


def main():
    module = AnsibleModule(argument_spec={
        "state": {"type": "str", "choices": ["acquired", "released"], "required": True},
        "run_id": {"type": "str", "required": True},
        "holder": {"type": "str", "default": "unknown"},
        "path": {"type": "str", "default": "/run/hicache-deploy.lock"},
        "stale_after": {"type": "int", "default": DEFAULT_STALE_AFTER},
        "max_clock_skew": {"type": "int", "default": DEFAULT_MAX_CLOCK_SKEW},
    }, supports_check_mode=True)
    p = module.params
    try:
        if p["state"] == "acquired":
            result = acquire(p["path"], p["run_id"], p["holder"], p["stale_after"], check_mode=module.check_mode, max_clock_skew=p["max_clock_skew"])
        else:
            result = release(p["path"], p["run_id"], check_mode=module.check_mode)
    except LockError as exc:
        module.fail_json(msg=str(exc), changed=False)
    for warning in result["warnings"]:
        module.warn(warning)
    out = {"changed": False, "msg": result["msg"], "lock": result["lock"], "found": result["found"], "action": result["action"]}
    if result["failed"]:
        module.fail_json(**out)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
