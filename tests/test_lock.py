"""The per-host deploy lock (plugins/modules/hicache_lock.py): every state of the file, and races between real processes."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import subprocess
import sys
import time

import pytest
from support import ROOT

MODULE_PATH = ROOT / "plugins/modules/hicache_lock.py"
_spec = importlib.util.spec_from_file_location("hicache_lock", MODULE_PATH)
lock_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lock_module)
acquire, release = lock_module.acquire, lock_module.release

NOW = 1_800_000_000.0
DAY = 86400
ANSIBLE = os.path.join(os.path.dirname(sys.executable), "ansible")
# fork: the workers inherit the module loaded above from its file, as the playbook's processes each load it.
FORK = multiprocessing.get_context("fork")


def write_lock(path, run_id="other-run", holder="alice@ctl2", epoch=NOW):
    path.write_text(json.dumps({"run_id": run_id, "holder": holder, "since": "then", "epoch": epoch}))


def on_disk(path):
    return json.loads(path.read_text())


def leftovers(path):
    """Files beside the lock other than the lock and its guard: temp files must never stay behind."""
    return sorted(name for name in os.listdir(path.parent) if name not in (path.name, path.name + ".guard"))


@pytest.fixture
def path(tmp_path):
    return tmp_path / "hicache-deploy.lock"


def test_absent_is_taken_with_its_content(path):
    result = acquire(str(path), "run-1", "bob@ctl1", 3600, now=NOW)
    assert not result["failed"] and result["action"] == "took" and result["found"] is None
    assert on_disk(path) == result["lock"] == {"run_id": "run-1", "holder": "bob@ctl1", "since": "2027-01-15T08:00:00Z", "epoch": NOW}
    assert str(path) in result["msg"] and not result["warnings"]
    assert leftovers(path) == []


def test_our_own_lock_is_kept(path):
    acquire(str(path), "run-1", "bob@ctl1", 3600, now=NOW)
    again = acquire(str(path), "run-1", "bob@ctl1", 3600, now=NOW + 10)
    assert not again["failed"] and again["action"] == "kept"
    assert on_disk(path)["epoch"] == NOW  # untouched, not rewritten
    assert "run-1" in again["msg"] and str(path) in again["msg"]


def test_a_live_lock_of_another_run_is_refused_naming_it(path):
    write_lock(path, epoch=NOW - 60)
    before = path.read_bytes()
    result = acquire(str(path), "run-2", "bob@ctl1", 3600, now=NOW)
    assert result["failed"] and result["action"] == "refused"
    msg = result["msg"]
    # The fleet test and users look for these words; the message must say who, since when, which run and how to clear it.
    assert "another deploy holds this host" in msg and " since " in msg
    assert "alice@ctl2" in msg and "other-run" in msg and "then" in msg
    assert f"remove {path} if that run is gone" in msg
    assert result["lock"]["run_id"] == "other-run"
    assert path.read_bytes() == before


def test_clock_skew_within_the_allowance_is_still_a_live_lock(path):
    write_lock(path, epoch=NOW + 200)
    result = acquire(str(path), "run-2", "bob@ctl1", 3600, now=NOW)
    assert result["failed"] and result["action"] == "refused"


@pytest.mark.parametrize("content, found", [
    ("", "an empty file"),
    ("   \n", "an empty file"),
    ('{"run_id": "other-run", "holder": "ali', "not JSON"),
    ("\x00\xff garbage", "not JSON"),
    ("[1, 2]", "not an object"),
    ("null", "not an object"),
    ('{"holder": "alice@ctl2", "epoch": 1}', "without a run id"),
    ('{"run_id": "other-run", "holder": "alice@ctl2"}', "without a valid epoch (None)"),
    ('{"run_id": "other-run", "epoch": "yesterday"}', "without a valid epoch ('yesterday')"),
    ('{"run_id": "other-run", "epoch": NaN}', "without a valid epoch (nan)"),
    ('{"run_id": "other-run", "epoch": true}', "without a valid epoch (True)"),
])
def test_an_unreadable_lock_is_taken_over_with_a_warning(path, content, found):
    path.write_text(content)
    result = acquire(str(path), "run-2", "bob@ctl1", 3600, now=NOW)
    assert not result["failed"] and result["action"] == "took_over"
    [warning] = result["warnings"]
    assert found in warning and str(path) in warning and "crashed" in warning
    assert found in result["found"]["invalid"]
    assert on_disk(path)["run_id"] == "run-2"
    assert leftovers(path) == []


def test_a_stale_lock_is_taken_over_with_a_warning(path):
    write_lock(path, epoch=NOW - 3601)
    result = acquire(str(path), "run-2", "bob@ctl1", 3600, now=NOW)
    assert not result["failed"] and result["action"] == "took_over"
    [warning] = result["warnings"]
    assert "stale" in warning and "alice@ctl2" in warning and "other-run" in warning and "3601 s old" in warning and str(path) in warning
    assert result["found"]["run_id"] == "other-run"
    assert on_disk(path)["run_id"] == "run-2"


def test_a_lock_just_under_stale_after_is_live(path):
    write_lock(path, epoch=NOW - 3599)
    assert acquire(str(path), "run-2", "bob@ctl1", 3600, now=NOW)["action"] == "refused"


def test_a_future_dated_lock_is_taken_over_not_kept_for_ever(path):
    write_lock(path, epoch=NOW + 30 * DAY)
    result = acquire(str(path), "run-2", "bob@ctl1", 3600, now=NOW)
    assert not result["failed"] and result["action"] == "took_over"
    [warning] = result["warnings"]
    assert "in the future" in warning and "clock or the file is wrong" in warning and "alice@ctl2" in warning
    assert on_disk(path)["run_id"] == "run-2"


def test_check_mode_writes_nothing_and_still_refuses_a_live_lock(path):
    result = acquire(str(path), "run-1", "bob@ctl1", 3600, now=NOW, check_mode=True)
    assert not result["failed"] and result["action"] == "took" and "would take" in result["msg"]
    assert not path.parent.joinpath(path.name).exists() and os.listdir(path.parent) == []  # not even the guard

    path.write_text("")
    result = acquire(str(path), "run-1", "bob@ctl1", 3600, now=NOW, check_mode=True)
    assert result["action"] == "took_over" and "would take it over" in result["warnings"][0]
    assert path.read_text() == ""

    write_lock(path, epoch=NOW - 60)
    result = acquire(str(path), "run-1", "bob@ctl1", 3600, now=NOW, check_mode=True)
    assert result["failed"] and "another deploy holds this host" in result["msg"]
    assert sorted(os.listdir(path.parent)) == [path.name]


def test_release_of_our_lock_removes_it(path):
    acquire(str(path), "run-1", "bob@ctl1", 3600, now=NOW)
    result = release(str(path), "run-1")
    assert not result["failed"] and result["action"] == "released" and result["found"]["run_id"] == "run-1"
    assert not path.exists()
    assert acquire(str(path), "run-2", "carol@ctl3", 3600)["action"] == "took"


def test_release_of_another_runs_lock_leaves_it(path):
    write_lock(path)
    before = path.read_bytes()
    result = release(str(path), "run-1")
    assert not result["failed"] and result["action"] == "left"
    assert result["found"]["run_id"] == "other-run" and "other-run" in result["msg"]
    assert path.read_bytes() == before


def test_release_of_an_unreadable_lock_leaves_it(path):
    path.write_text("{")
    result = release(str(path), "run-1")
    assert not result["failed"] and result["action"] == "left" and "not JSON" in result["msg"]
    assert path.read_text() == "{"


def test_release_when_not_held_is_not_an_error(path):
    result = release(str(path), "run-1")
    assert not result["failed"] and result["action"] == "not_held" and result["found"] is None


def test_release_in_check_mode_keeps_the_lock(path):
    acquire(str(path), "run-1", "bob@ctl1", 3600, now=NOW)
    result = release(str(path), "run-1", check_mode=True)
    assert result["action"] == "released" and "would release" in result["msg"]
    assert on_disk(path)["run_id"] == "run-1"


def test_a_missing_directory_is_a_clear_error(tmp_path):
    path = tmp_path / "no-such-dir" / "hicache-deploy.lock"
    with pytest.raises(lock_module.LockError, match="no-such-dir"):
        acquire(str(path), "run-1", "bob@ctl1", 3600)


def _race_worker(path, run_id, barrier, results):
    barrier.wait()
    try:
        result = acquire(path, run_id, f"{run_id}@ctl", 3600)
        results.put((run_id, result["action"], result["failed"]))
    except BaseException as exc:  # report anything, so the parent does not wait for a result that never comes
        results.put((run_id, f"error: {exc!r}", True))


def _race(path, takers):
    barrier, results = FORK.Barrier(takers), FORK.Queue()
    procs = [FORK.Process(target=_race_worker, args=(str(path), f"run-{i}", barrier, results)) for i in range(takers)]
    for proc in procs:
        proc.start()
    outcomes = [results.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    return outcomes


@pytest.mark.parametrize("initial", ["absent", "stale", "empty", "partial", "future"])
def test_concurrent_takers_exactly_one_wins(tmp_path, initial):
    for round_ in range(5):
        path = tmp_path / f"round-{round_}" / "hicache-deploy.lock"
        path.parent.mkdir()
        if initial == "stale":
            write_lock(path, epoch=time.time() - 2 * DAY)
        elif initial == "empty":
            path.write_text("")
        elif initial == "partial":
            path.write_text('{"run_id": "crashed", "hol')
        elif initial == "future":
            write_lock(path, epoch=time.time() + 2 * DAY)
        outcomes = _race(path, 8)
        winners = [run_id for run_id, action, failed in outcomes if not failed]
        assert len(winners) == 1, outcomes
        assert sorted(action for _, action, _ in outcomes) == sorted(["took" if initial == "absent" else "took_over"] + ["refused"] * 7), outcomes
        assert on_disk(path)["run_id"] == winners[0]
        assert leftovers(path) == []


def _churn_worker(path, run_id, critical, rounds, results):
    overlaps = taken = 0
    for _ in range(rounds):
        if acquire(path, run_id, "churn", 3600)["action"] != "took":
            continue
        taken += 1
        # Holding the lock must mean nobody else holds it: a second holder would find the marker there.
        try:
            os.close(os.open(critical, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            overlaps += 1
        else:
            os.unlink(critical)
        assert release(path, run_id)["action"] == "released"
    results.put((taken, overlaps))


def _reader(path, stop, results):
    seen = {"absent": 0, "valid": 0, "invalid": 0}
    while not stop.is_set():
        seen[lock_module.read(path)[0]] += 1
    results.put(seen)


def test_holders_never_overlap_and_readers_never_see_a_partial_file(tmp_path):
    path, critical = str(tmp_path / "hicache-deploy.lock"), str(tmp_path / "critical")
    results, reads, stop = FORK.Queue(), FORK.Queue(), FORK.Event()
    reader = FORK.Process(target=_reader, args=(path, stop, reads))
    reader.start()
    workers = [FORK.Process(target=_churn_worker, args=(path, f"run-{i}", critical, 150, results)) for i in range(4)]
    for proc in workers:
        proc.start()
    totals = [results.get(timeout=120) for _ in workers]
    for proc in workers:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    stop.set()
    seen = reads.get(timeout=60)
    reader.join(timeout=60)
    assert sum(taken for taken, _ in totals) > 0
    assert [overlaps for _, overlaps in totals] == [0, 0, 0, 0]
    assert seen["invalid"] == 0 and seen["valid"] > 0, seen


def ansible(path, *args, check=False):
    """Run the module as a playbook does: shipped by Ansible to a host (here localhost) and run there."""
    proc = subprocess.run([ANSIBLE, "localhost", "-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}",
                           *(["--check"] if check else []), "-m", "hicache.deploy.hicache_lock", "-a", " ".join([f"path={path}", *args])],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ANSIBLE_CALLBACK_RESULT_FORMAT": "json", "ANSIBLE_DEPRECATION_WARNINGS": "False", "ANSIBLE_NOCOLOR": "1"})
    head, _, body = proc.stdout.partition(" => ")
    assert body, f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.returncode, head, json.loads(body), proc.stderr


def test_the_module_through_ansible(tmp_path):
    path = tmp_path / "hicache-deploy.lock"

    rc, head, result, _ = ansible(path, "state=acquired", "run_id=run-1", "holder=bob@ctl1", check=True)
    assert rc == 0 and "SUCCESS" in head and result["action"] == "took" and result["changed"] is False
    assert os.listdir(tmp_path) == []  # check mode wrote nothing

    rc, head, result, _ = ansible(path, "state=acquired", "run_id=run-1", "holder=bob@ctl1")
    assert rc == 0 and result["action"] == "took" and result["changed"] is False
    assert on_disk(path)["holder"] == "bob@ctl1"

    for check in (True, False):
        rc, head, result, _ = ansible(path, "state=acquired", "run_id=run-2", "holder=carol@ctl3", check=check)
        assert rc != 0 and "FAILED" in head and result["action"] == "refused"
        assert "bob@ctl1" in result["msg"] and "run-1" in result["msg"] and f"remove {path}" in result["msg"]

    path.write_text("")
    rc, head, result, stderr = ansible(path, "state=acquired", "run_id=run-2", "holder=carol@ctl3")
    assert rc == 0 and result["action"] == "took_over" and "an empty file" in stderr  # the warning reaches the user
    assert on_disk(path)["run_id"] == "run-2"

    rc, head, result, _ = ansible(path, "state=released", "run_id=run-1")
    assert rc == 0 and result["action"] == "left" and path.exists()
    rc, head, result, _ = ansible(path, "state=released", "run_id=run-2")
    assert rc == 0 and result["action"] == "released" and result["changed"] is False and not path.exists()
