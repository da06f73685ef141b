#!/usr/bin/python
# Copyright: hicache-deploy developers
# SPDX-License-Identifier: Apache-2.0
"""The raw read bandwidth of an L3 tier, with the I/O SGLang's storage backend does: `hicachectl bench --tier`.

It writes a set of files in a directory of its own under the tier's directory, drops them from the page cache, reads
them back and returns bytes, seconds and GB/s, then removes its files (on failure too). The reads are the backend's
(read in SGLang 0.5.23):
- file (HiCacheFile.get, mem_cache/hicache_storage.py:846-868): one whole `.bin` file per page and rank, opened and
  read with plain reads (open(..., buffering=0), readinto) through the page cache, one page after the other per rank
  (batch_get loops over the keys); the ranks read at once: queue depth = TP ranks, O_DIRECT off;
- nixl (mem_cache/storage/nixl/hicache_nixl.py batch_get_v1 -> _batch_xfer): a batch of pages (up to 128,
  STORAGE_BATCH_SIZE) is one NIXL transfer, a file per page and rank for K and one for V (_get_key_list_from_meta), so
  half a page per read; the POSIX plugin opens them with O_DIRECT unless use_direct_io is false (nixl_utils.py
  get_use_direct_io, default SGLANG_HICACHE_NIXL_USE_DIRECT_IO on) and keeps up to its kernel_queue_size reads in
  flight (NIXL's DEF_KERNEL_QUEUE_SIZE, 256). The controller passes read_bytes, queue_depth and direct accordingly.

With `fio` on the host's PATH (and use_fio) it reads with fio: one job of libaio at iodepth=queue_depth with direct=1,
or queue_depth jobs of psync reading their own files in turn with direct=0 (files named by fio's filename_format, so
no list of them, which fio's option length would cut); otherwise a small Python reader does the
same with queue_depth threads, each opening a file (O_DIRECT when asked), reading it whole with preadv into a
page-aligned buffer and closing it. Before reading, every file is fsync'ed and dropped from the page cache
(posix_fadvise POSIX_FADV_DONTNEED, which the NFS client honours for clean pages); O_DIRECT reads bypass it anyway.
Where the filesystem refuses O_DIRECT (EINVAL at open), the reads fall back to buffered ones and the result says so,
as the NIXL backend does (NixlFileManager: "falls back to buffered I/O with a warning").

Its files stay out of the tier's namespaces: the directory is `.hicache-tier-bench-<pid>-<hex>` (a leading dot: not
a namespace name, hicache_l3_namespaces NAMESPACE_FORM; not a NIXL bucket, which the NIXL cleaner alone scans; not a
file at the tier's top, which HiCacheFile lists), its files `page.<reader>.<n>.bin` and `job.fio`. Directories of that form
left by a run that was killed (older than stale_after seconds) are removed first, their own files only.
The decisions are plain functions below (tests/test_tier_bench.py calls them on a tmp dir). This file is shipped
to the host on its own: standard library and ansible.module_utils only.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: hicache_tier_bench
short_description: Measure the read bandwidth of an L3 tier with the I/O of SGLang's storage backend
description:
  - Writes O(total_bytes) in files of O(read_bytes) in a new directory C(.hicache-tier-bench-<pid>-<hex>) under O(path), drops them
    from the page cache, reads each file whole with O(queue_depth) reads in flight (O_DIRECT with O(direct)), and removes the
    directory, whether the reads succeeded or not.
  - Reads with fio when it is on the PATH and O(use_fio) is true, else with a Python reader of the same shape.
  - Before it starts it removes directories of the same form older than O(stale_after) seconds (a run that was killed), only the
    files it names; anything else keeps such a directory.
  - Changes nothing that outlives the task. In check mode it measures nothing.
options:
  path:
    description: The tier's directory (C(hicache_cache_dir)); it must exist.
    type: path
    required: true
  read_bytes:
    description: Bytes of one read, one file (the backend's page file of one rank; for nixl half of it, K or V). Rounded up to 4096 with O(direct).
    type: int
    required: true
  total_bytes:
    description: Bytes written and read (at least one file, at least O(queue_depth) files).
    type: int
    default: 1073741824
  queue_depth:
    description: Reads in flight (file backend, the TP ranks; nixl, the kernel queue of NIXL's POSIX plugin).
    type: int
    default: 1
  direct:
    description: Read with O_DIRECT, as NIXL's POSIX plugin does by default.
    type: bool
    default: false
  use_fio:
    description: Use fio when it is on the PATH.
    type: bool
    default: true
  stale_after:
    description: Seconds after which a directory of this module's form is a leftover and removed.
    type: float
    default: 3600.0
notes:
  - Needs free space for O(total_bytes) (refused below twice that).
author: hicache-deploy developers (@hicache-deploy)
"""

EXAMPLES = r"""
- name: Read bandwidth of the tier as NIXL's POSIX plugin reads it (O_DIRECT, half pages, 256 in flight)
  hicache.deploy.hicache_tier_bench:
    path: /mnt/hicache
    read_bytes: 4194304
    queue_depth: 256
    direct: true
  register: tier
"""

RETURN = r"""
bytes:
  description: Bytes read.
  returned: unless in check mode
  type: int
seconds:
  description: Wall time of the reads.
  returned: unless in check mode
  type: float
gbps:
  description: Bytes read per second, in GB/s (1e9).
  returned: unless in check mode
  type: float
method:
  description: How it read, e.g. C(fio libaio iodepth=256 direct=1) or C(python preadv threads=2 buffered).
  returned: always
  type: str
read_bytes:
  description: Bytes of one read as done (rounded up to 4096 with O_DIRECT).
  returned: always
  type: int
files:
  description: Files written and read.
  returned: always
  type: int
queue_depth:
  description: Reads in flight.
  returned: always
  type: int
direct:
  description: Whether the reads used O_DIRECT (false after a fallback).
  returned: always
  type: bool
cache_dropped:
  description: Whether every file was dropped from the page cache before the reads.
  returned: unless in check mode
  type: bool
notes:
  description: What the measurement could not do as asked (an O_DIRECT fallback, fio missing).
  returned: always
  type: list
  elements: str
stale_removed:
  description: Leftover directories of earlier runs removed.
  returned: always
  type: list
  elements: str
fio:
  description: The fio that read, or null for the Python reader.
  returned: unless in check mode
  type: str
"""

import concurrent.futures
import errno
import json
import mmap
import os
import re
import secrets
import shutil
import subprocess
import threading
import time

from ansible.module_utils.basic import AnsibleModule

PREFIX = ".hicache-tier-bench-"
DIR_FORM = re.compile(r"\.hicache-tier-bench-[0-9]+-[0-9a-f]{8}")
# page.<reader>.<n>.bin: the names fio's filename_format=page.$jobnum.$filenum.bin gives reader <reader>'s n-th file
FILE_FORM = re.compile(r"page\.[0-9]+\.[0-9]+\.bin|job\.fio")
ALIGN = 4096  # O_DIRECT: offsets, sizes and buffers aligned to the logical block (4096 covers every common one)
MAX_THREADS = 64  # the Python reader's threads at most (NIXL's queue of TP ranks x 256 would be thousands); fio takes any depth


class DirectUnsupported(OSError):
    """The filesystem refuses O_DIRECT (EINVAL at open: tmpfs, some FUSE)."""


def read_size(read_bytes, direct):
    """The bytes of one read as done: read_bytes, rounded up to ALIGN for O_DIRECT."""
    return -(-read_bytes // ALIGN) * ALIGN if direct else read_bytes


def readers(direct, queue_depth):
    """fio's jobs: one libaio job keeping queue_depth reads in flight (O_DIRECT), or queue_depth psync jobs."""
    return 1 if direct else queue_depth


def file_count(total_bytes, size, jobs):
    """Files to write: total_bytes in files of `size`, a whole number of files per reader."""
    return -(-max(1, -(-total_bytes // size)) // jobs) * jobs


def new_dir(path, pid=None):
    """Create this run's directory under the tier (mode 0700); its name never collides with a namespace."""
    name = f"{PREFIX}{os.getpid() if pid is None else pid}-{secrets.token_hex(4)}"
    target = os.path.join(path, name)
    os.mkdir(target, 0o700)
    return target


def remove_dir(directory):
    """Remove this module's files from a directory of its form, then the directory; anything else keeps it (and is
    left alone). True when the directory is gone."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return True
    for name in names:
        if FILE_FORM.fullmatch(name):
            try:
                os.unlink(os.path.join(directory, name))
            except FileNotFoundError:
                pass
    try:
        os.rmdir(directory)
    except OSError:
        return False
    return True


def remove_stale(path, stale_after, now=None):
    """Remove the leftovers of killed runs: directories of this module's form, not symlinks, older than stale_after."""
    now = time.time() if now is None else now
    removed = []
    with os.scandir(path) as entries:
        for entry in entries:
            if not DIR_FORM.fullmatch(entry.name) or not entry.is_dir(follow_symlinks=False):
                continue
            try:
                if now - entry.stat(follow_symlinks=False).st_mtime < stale_after:
                    continue
            except OSError:
                continue
            if remove_dir(entry.path):
                removed.append(entry.name)
    return removed


def write_files(directory, count, size, jobs=1):
    """Write `count` files of `size` bytes (not zeros: a tier that compresses or dedups would read less), fsync each;
    file i is reader i % jobs's (i // jobs)-th (fio's filename_format below)."""
    block = os.urandom(min(size, 1 << 20))
    paths = []
    for i in range(count):
        target = os.path.join(directory, f"page.{i % jobs}.{i // jobs}.bin")
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            left = size
            while left:
                left -= os.write(fd, block[:min(left, len(block))])
            os.fsync(fd)
        finally:
            os.close(fd)
        paths.append(target)
    return paths


def drop_cache(paths):
    """posix_fadvise(DONTNEED) on each file: True when every call succeeded."""
    if not hasattr(os, "posix_fadvise"):
        return False
    dropped = True
    for target in paths:
        fd = os.open(target, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            dropped = False
        finally:
            os.close(fd)
    return dropped


def _read_one(target, size, direct, buf=None):
    """Bytes read from one file, opened (O_DIRECT when asked), read whole with preadv into `buf` (a page-aligned
    buffer of `size`, as O_DIRECT needs; the backends read into their host pool, allocated once) and closed."""
    flags = os.O_RDONLY | (getattr(os, "O_DIRECT", 0) if direct else 0)
    try:
        fd = os.open(target, flags)
    except OSError as exc:
        if direct and exc.errno == errno.EINVAL:
            raise DirectUnsupported(exc.errno, "O_DIRECT refused", target) from exc
        raise
    own = buf is None
    buf = mmap.mmap(-1, size) if own else buf
    try:
        view, done = memoryview(buf), 0
        try:
            while done < size:
                got = os.preadv(fd, [view[done:]], done)
                if got == 0:
                    break
                done += got
        finally:
            view.release()
        return done
    finally:
        if own:
            buf.close()
        os.close(fd)


def python_read(paths, size, direct, queue_depth):
    """(bytes, seconds): every file read whole, queue_depth at a time, each opened, read and closed as the backends
    do, each reader thread with its own buffer."""
    local = threading.local()

    def read(target):
        if not hasattr(local, "buf"):
            local.buf = mmap.mmap(-1, size)
        return _read_one(target, size, direct, local.buf)

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=queue_depth) as pool:
        total = sum(pool.map(read, paths))
    return total, time.perf_counter() - started


def fio_job(directory, files, size, direct, queue_depth):
    """A fio job file over the files write_files wrote for readers(direct, queue_depth) jobs (named by fio's
    filename_format, so no file list, which fio's option length would cut): with O_DIRECT one libaio job at
    iodepth=queue_depth over every file (NIXL's POSIX plugin); without, queue_depth psync jobs each reading its own
    files in turn (HiCacheFile, one rank each)."""
    jobs = readers(direct, queue_depth)
    per_job = files // jobs
    escaped = directory.replace("\\", "\\\\").replace(":", "\\:")  # fio's separator in directory=
    lines = ["[global]", "rw=read", f"bs={size}", f"directory={escaped}",
             "filename_format=page.$jobnum.$filenum.bin", f"nrfiles={per_job}", f"size={size * per_job}",
             "file_service_type=sequential", "invalidate=1", "group_reporting=1"]
    if direct:
        lines += ["ioengine=libaio", f"iodepth={queue_depth}", "direct=1"]
    else:
        lines += ["ioengine=psync", "iodepth=1", "direct=0", f"numjobs={jobs}"]
    return "\n".join(lines + ["", "[reader]", ""])


def parse_fio(text):
    """(bytes, seconds) from fio's --output-format=json: the reads of every job (one with group_reporting), the
    longest runtime (ms)."""
    data = json.loads(text[text.index("{"):])
    jobs = data.get("jobs") or []
    if not jobs:
        raise ValueError("fio reported no job")
    total = sum(int(job["read"]["io_bytes"]) for job in jobs)
    seconds = max(float(job["read"]["runtime"]) for job in jobs) / 1000.0
    return total, seconds


def fio_read(fio, directory, files, size, direct, queue_depth, timeout=3600):
    job = os.path.join(directory, "job.fio")
    with open(job, "w", encoding="utf-8") as handle:
        handle.write(fio_job(directory, files, size, direct, queue_depth))
    run = subprocess.run([fio, "--output-format=json", job], capture_output=True, text=True, timeout=timeout, check=False)
    if run.returncode != 0:
        raise OSError(f"fio failed ({run.returncode}): {(run.stderr or run.stdout).strip()[-500:]}")
    return parse_fio(run.stdout)


def measure(path, read_bytes, total_bytes=1 << 30, queue_depth=1, direct=False, use_fio=True, stale_after=3600.0, fio=None):
    """What the module returns (without `changed`): the reads measured in a directory of its own, removed after."""
    if read_bytes < 1 or queue_depth < 1 or total_bytes < 1:
        raise ValueError("read_bytes, queue_depth and total_bytes must be at least 1")
    if not os.path.isdir(path):
        raise ValueError(f"{path} is not a directory (the tier is not mounted?)")
    notes, stale = [], remove_stale(path, stale_after)
    size = read_size(read_bytes, direct)
    count = file_count(total_bytes, size, readers(direct, queue_depth))
    vfs = os.statvfs(path)
    if vfs.f_bavail * vfs.f_frsize < 2 * size * count:
        raise ValueError(f"{path} has {vfs.f_bavail * vfs.f_frsize} bytes free; the measurement needs twice its {size * count}")
    fio = fio if fio is not None else (shutil.which("fio") if use_fio else None)
    if use_fio and not fio:
        notes.append("fio is not on the PATH: read with the Python reader")
    directory = new_dir(path)
    try:
        paths = write_files(directory, count, size, readers(direct, queue_depth))
        dropped = drop_cache(paths)
        if direct:
            try:
                _read_one(paths[0], size, True)  # O_DIRECT refused for one file is refused for all
            except DirectUnsupported:
                notes.append(f"{path} refuses O_DIRECT: read buffered instead, as NIXL falls back")
                direct = False
                fio = None  # its files are laid out for one O_DIRECT reader
        if fio:
            total, seconds = fio_read(fio, directory, count, size, direct, queue_depth)
            method = (f"fio libaio iodepth={queue_depth} direct=1" if direct else f"fio psync jobs={queue_depth} direct=0")
        else:
            threads = min(queue_depth, MAX_THREADS)
            if threads < queue_depth:
                notes.append(f"the Python reader keeps {threads} reads in flight, not {queue_depth} (install fio for the full depth)")
            total, seconds = python_read(paths, size, direct, threads)
            method = f"python preadv threads={threads} {'O_DIRECT' if direct else 'buffered'}"
    finally:
        gone = remove_dir(directory)
    if not gone:
        notes.append(f"{directory} could not be removed entirely")
    return {"bytes": total, "seconds": round(seconds, 6), "gbps": float(f"{total / seconds / 1e9:.4g}") if seconds > 0 else None,
            "method": method, "read_bytes": size, "files": count, "queue_depth": queue_depth, "direct": direct,
            "cache_dropped": dropped, "notes": notes, "stale_removed": stale, "fio": fio}


def main():
    module = AnsibleModule(argument_spec={
        "path": {"type": "path", "required": True},
        "read_bytes": {"type": "int", "required": True},
        "total_bytes": {"type": "int", "default": 1 << 30},
        "queue_depth": {"type": "int", "default": 1},
        "direct": {"type": "bool", "default": False},
        "use_fio": {"type": "bool", "default": True},
        "stale_after": {"type": "float", "default": 3600.0},
    }, supports_check_mode=True)
    p = module.params
    if module.check_mode:
        module.exit_json(changed=False, method="not measured (check mode)", read_bytes=p["read_bytes"], files=0,
                         queue_depth=p["queue_depth"], direct=p["direct"], notes=["check mode: nothing read"], stale_removed=[])
    try:
        result = measure(p["path"], p["read_bytes"], p["total_bytes"], p["queue_depth"], p["direct"], p["use_fio"], p["stale_after"])
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        module.fail_json(msg=f"cannot measure the tier at {p['path']}: {exc}")
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
