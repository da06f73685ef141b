#!/usr/bin/python
# Copyright: hicache-deploy developers
# SPDX-License-Identifier: Apache-2.0
"""The record of a finished hub download in hicache_model_dir, so "downloaded" means what the inventory asks for.

The stamp (`<dir>/.hicache-downloaded`, JSON) names the repository, the revision (None: the hub's default
branch) and every file with its size, and is written only after `hf download` succeeded. A download in
progress is marked by `<dir>/.hicache-downloading` (repository and revision) and has no stamp, so a partial
or failed download never counts as finished. The model role calls this module three times around the
download: `inspect` (read-only: is the finished download the one wanted, with every file there at its
size?), `begin` (drop the stamp; empty the directory when what it holds is another repository or revision)
and `finish` (list the files, write the stamp). The decisions are plain functions below (tests/test_model_stamp.py).
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: hicache_model_stamp
short_description: Check, prepare and record a hub model download in hicache_model_dir
description:
  - C(inspect) reads the stamp and stats the files it lists; it changes nothing. RV(current) is true only when
    the stamp names O(repo) at O(revision) and every listed file exists with its recorded size.
  - C(begin) removes the stamp, marks the download as in progress and, when the stamp or an unfinished
    download in the directory is of another repository or revision (or the stamp is unreadable), empties the
    directory (the directory itself is kept, it may be a mount point). Files of the same repository and
    revision are kept, so C(hf download) resumes and fetches only what is missing or changed. A directory with
    neither stamp nor marker is not emptied (nothing says this module put its files there); hf downloads into it.
  - C(finish) lists every file under the directory with its size (but the stamp, the marker and C(hf)'s
    own C(.cache) directory) and writes the stamp atomically.
options:
  dir:
    description: The model directory (C(hicache_model_dir)).
    type: path
    required: true
  repo:
    description: The hub repository the inventory wants.
    type: str
    required: true
  revision:
    description: The revision it wants; none means the hub's default branch.
    type: str
  state:
    description: What to do, see the description.
    type: str
    choices: [inspect, begin, finish]
    default: inspect
notes:
  - Supports check mode (begin and finish report what they would change and write nothing).
author: hicache-deploy developers (@hicache-deploy)
"""

EXAMPLES = r"""
- name: Check the finished download
  hicache.deploy.hicache_model_stamp:
    dir: /models/qwen
    repo: Qwen/Qwen2.5-0.5B-Instruct
    state: inspect
  register: stamp

- name: Make a clean place for the download
  hicache.deploy.hicache_model_stamp:
    dir: /models/qwen
    repo: Qwen/Qwen2.5-0.5B-Instruct
    state: begin
  when: not stamp.current

# ... hf download Qwen/Qwen2.5-0.5B-Instruct --local-dir /models/qwen ...

- name: Record the finished download
  hicache.deploy.hicache_model_stamp:
    dir: /models/qwen
    repo: Qwen/Qwen2.5-0.5B-Instruct
    state: finish
  when: not stamp.current
"""

RETURN = r"""
current:
  description: The finished download is the one wanted and complete (always true after C(finish)).
  returned: always
  type: bool
action:
  description: What a download must do, C(none), C(resume) (keep the files) or C(clean) (empty the directory first).
  returned: always
  type: str
  sample: resume
reason:
  description: Why the download is not current (empty when it is).
  returned: always
  type: str
stamp:
  description: The stamp as read (inspect, begin; C({}) when there is none) or as written (finish).
  returned: always
  type: dict
  sample: {repo: Qwen/Qwen2.5-0.5B-Instruct, revision: null, finished: "2026-11-30T10:45:00Z", files: {config.json: 659}}
files:
  description: The number of files the stamp records.
  returned: when O(state=finish) and not in check mode
  type: int
bytes:
  description: Their total size in bytes.
  returned: when O(state=finish) and not in check mode
  type: int
"""

import json
import os
import re
import shutil
import time

from ansible.module_utils.basic import AnsibleModule

STAMP = ".hicache-downloaded"
MARKER = ".hicache-downloading"
# The lock of a directory several hosts share (roles/model/tasks/weights.yml takes it with hicache_lock, which keeps a
# guard file beside it): held while this module empties the directory, so never removed, and no file of the model.
DOWNLOAD_LOCK = ".hicache-download.lock"
LOCK_FILES = {DOWNLOAD_LOCK, f"{DOWNLOAD_LOCK}.guard"}
NOT_LISTED = {STAMP, MARKER, f"{STAMP}.tmp", f"{MARKER}.tmp", ".cache", *LOCK_FILES}  # .cache/huggingface: hf's own bookkeeping of a --local-dir download


def describe(repo, revision):
    return f"{repo}@{revision}" if revision else f"{repo} (default branch)"


def read_json(path):
    """A stamp or marker: None when absent; {'invalid': True} when unreadable. The first version of the role
    wrote the repository as plain text; that reads as {'repo': ..., 'legacy': True} (no file list)."""
    try:
        with open(path) as handle:
            text = handle.read()
    except FileNotFoundError:
        return None
    except OSError:
        return {"invalid": True}
    try:
        data = json.loads(text)
    except ValueError:
        legacy = text.strip()
        return {"repo": legacy, "legacy": True} if re.fullmatch(r"[\w.-]+(/[\w.-]+)?", legacy) else {"invalid": True}
    return data if isinstance(data, dict) else {"invalid": True}


def same_download(record, repo, revision):
    return record.get("repo") == repo and (record.get("revision") or None) == (revision or None)


def missing_files(files, directory, stat=os.stat):
    """The listed files that are gone or have another size: ['a.safetensors: missing', ...]."""
    problems = []
    for name, size in sorted(files.items()):
        try:
            actual = stat(os.path.join(directory, name)).st_size
        except OSError:
            problems.append(f"{name}: missing")
            continue
        if actual != size:
            problems.append(f"{name}: {actual} bytes, the download had {size}")
    return problems


def judge(stamp, marker, repo, revision, directory, stat=os.stat):
    """(current, action, reason) from the stamp and the in-progress marker; action is none, resume or clean."""
    wanted = describe(repo, revision)
    if stamp is not None:
        if stamp.get("invalid") or not isinstance(stamp.get("files", {}), dict):
            return False, "clean", f"the stamp {STAMP} in {directory} cannot be read; downloading {wanted} again into an emptied directory"
        if not same_download(stamp, repo, revision):
            return False, "clean", (f"{directory} holds {describe(stamp.get('repo'), stamp.get('revision'))}, the inventory wants {wanted}; "
                                    "downloading it into an emptied directory")
        if stamp.get("legacy"):
            return False, "resume", f"the stamp in {directory} has no file list (an older hicache-deploy); hf checks the files and records them"
        problems = missing_files(stamp.get("files", {}), directory, stat)
        if problems:
            shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
            return False, "resume", f"files of {wanted} in {directory} changed since the download ({shown}); downloading them again"
        return True, "none", ""
    if marker is not None:
        if marker.get("invalid") or not same_download(marker, repo, revision):
            what = "of something unreadable" if marker.get("invalid") else f"of {describe(marker.get('repo'), marker.get('revision'))}"
            return False, "clean", f"{directory} holds an unfinished download {what}, the inventory wants {wanted}; downloading it into an emptied directory"
        return False, "resume", f"the download of {wanted} into {directory} did not finish; resuming it"
    return False, "resume", f"{wanted} has not been downloaded into {directory}"


def list_files(directory):
    """Every file under the directory (relative path: size), but the stamp, the marker and hf's .cache."""
    files = {}
    for root, dirs, names in os.walk(directory):
        if root == directory:
            dirs[:] = [d for d in dirs if d not in NOT_LISTED]
            names = [n for n in names if n not in NOT_LISTED]
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            files[os.path.relpath(path, directory)] = os.stat(path).st_size
    return files


def empty_directory(directory):
    if os.path.realpath(directory) == "/":
        raise ValueError("refusing to empty /")
    for entry in os.scandir(directory):
        if entry.name in LOCK_FILES:  # the lock of the host emptying it (a shared directory)
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)


def write_json(path, data, mode=0o600):
    """Atomically: a reader sees the old file or the whole new one, never a part."""
    temporary = f"{path}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def remove(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def main():
    module = AnsibleModule(argument_spec={
        "dir": {"type": "path", "required": True},
        "repo": {"type": "str", "required": True},
        "revision": {"type": "str"},
        "state": {"type": "str", "choices": ["inspect", "begin", "finish"], "default": "inspect"},
    }, supports_check_mode=True)
    p = module.params
    directory, repo, revision = p["dir"].rstrip("/") or "/", p["repo"], p["revision"] or None
    stamp_path, marker_path = os.path.join(directory, STAMP), os.path.join(directory, MARKER)
    stamp, marker = read_json(stamp_path), read_json(marker_path)
    current, action, reason = judge(stamp, marker, repo, revision, directory)
    result = {"current": current, "action": action, "reason": reason, "stamp": stamp or {}}

    if p["state"] == "inspect":
        module.exit_json(changed=False, **result)
    if p["state"] == "begin":
        if current:
            module.exit_json(changed=False, **result)
        if not module.check_mode:
            if not os.path.isdir(directory):
                os.makedirs(directory, mode=0o750)
            remove(stamp_path)  # from here on, a failure leaves no stamp
            if action == "clean":
                empty_directory(directory)
            write_json(marker_path, {"repo": repo, "revision": revision, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        module.exit_json(changed=True, msg=reason, **result)
    # finish: called only after hf download succeeded
    if module.check_mode:
        module.exit_json(changed=True, **result)
    if not os.path.isdir(directory):
        module.fail_json(msg=f"{directory} does not exist: nothing was downloaded", **result)
    files = list_files(directory)
    written = {"repo": repo, "revision": revision, "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "files": files}
    write_json(stamp_path, written)
    remove(marker_path)
    module.exit_json(changed=True, current=True, action="none", reason="", stamp=written, files=len(files), bytes=sum(files.values()))


if __name__ == "__main__":
    main()
