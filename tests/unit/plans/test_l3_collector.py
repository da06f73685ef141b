"""The L3 tier's collector: who runs it (hicachectl/plans/l3_collector.py), and what the program
(roles/sglang_server/files/hicache-l3-collect) evicts from a real directory laid out as SGLang writes it.

The layouts follow sglang 0.5.23's own naming: HiCacheFile writes `<key>[.<pool>]_<model>_<tp_rank>_<tp_size>.bin`
directly in its directory, through a hidden `.<uuid>.tmp` renamed into place (mem_cache/hicache_storage.py,
HiCacheFile.__init__, _get_suffixed_key, _log_key, set); HiCacheNixl writes `<key>_<model>_<rank>_<size>_k|_v` into
the bucket directories `00`..`ff` of storage/nixl/nixl_routing.py (route_key), one page's files in several buckets
(storage/nixl/nixl_cleaner.py, _GroupInfo: "Physical files in one logical group can hash to different base dirs").
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re
import subprocess
import sys
import time

import pytest
from helpers import deployment

from hicachectl import rules
from hicachectl.config import namespace
from hicachectl.plans import l3_collector

collect = l3_collector.program()
PAGE = 1000  # bytes per file in these layouts


def key(n: int) -> str:
    return hashlib.sha256(str(n).encode()).hexdigest()


def file_page(directory, n, *, tp_size=2, model="Qwen-Qwen3-8B", age=0.0, now=None):
    """One HiCacheFile page: a file per TP rank."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for rank in range(tp_size):
        path = os.path.join(directory, f"{key(n)}_{model}_{rank}_{tp_size}.bin")
        with open(path, "wb") as f:
            f.write(b"\0" * PAGE)
        paths.append(path)
    _age(paths, age, now)
    return paths


def nixl_page(directory, n, *, age=0.0, now=None):
    """One HiCacheNixl page of a non-MLA model at TP 1: its _k and _v objects, each in the bucket directory its name
    routes to (nixl_routing.route_key: the low byte of the name's 8-byte blake2b)."""
    paths = []
    for part in ("k", "v"):
        name = f"{key(n)}_Qwen-Qwen3-8B_0_1_{part}"
        bucket = f"{hashlib.blake2b(name.encode(), digest_size=8).digest()[-1]:02x}"
        os.makedirs(os.path.join(directory, bucket), exist_ok=True)
        path = os.path.join(directory, bucket, name)
        with open(path, "wb") as f:
            f.write(b"\0" * PAGE)
        paths.append(path)
    _age(paths, age, now)
    return paths


def _age(paths, age, now):
    stamp = (now or time.time()) - age
    for path in paths:
        os.utime(path, (stamp, stamp))


def config(root, namespaces, *, budget, floor=0, grace=60):
    return {"tier": "t", "root": str(root), "budget_bytes": budget, "free_floor_pct": floor, "grace_seconds": grace,
            "namespaces": namespaces, "state_file": str(root.parent / "state.json"), "textfile_dir": str(root.parent)}


def pages_left(root):
    found = set()
    for dirpath, _, files in os.walk(root):
        for name in files:
            match = re.match(r"([0-9a-f]{64})", name)
            if match:
                found.add((os.path.relpath(dirpath, root).split(os.sep)[0], match.group(1)))
    return found


def test_each_namespace_is_kept_within_its_share_oldest_pages_first(tmp_path):
    root = tmp_path / "tier"
    now = time.time()
    for n in range(10):  # 10 pages of 2 files: 20000 bytes, the oldest first
        file_page(root / "a", n, age=1000 - n, now=now)
    for n in range(100, 104):
        nixl_page(root / "b", n, age=500, now=now)
    # budget 30000: a has 60% (18000, holds 9 pages), b an equal part of the rest (12000, holds all its 4 pages)
    report = collect.collect(config(root, {"a": {"share_pct": 60}, "b": {"share_pct": None}}, budget=30000), out=lambda _: None)
    left = pages_left(root)
    assert {k for ns, k in left if ns == "a"} == {key(n) for n in range(1, 10)}  # page 0, the oldest, went
    assert len([1 for ns, _ in left if ns == "b"]) == 4
    assert report["removed"]["a"]["pages"] == 1 and report["removed"]["a"]["reason"] == "over its share"
    # whole pages: no page is left with only some of its files
    for ns in ("a", "b"):
        for _dirpath, _, files in os.walk(root / ns):
            for name in files:
                assert sum(1 for _, _, fs in os.walk(root / ns) for f in fs if f.startswith(name[:64])) == 2


def test_the_tier_over_its_budget_evicts_across_namespaces_by_last_use(tmp_path):
    root = tmp_path / "tier"
    now = time.time()
    for n in range(5):
        file_page(root / "a", n, age=100 + 10 * n, now=now)  # a's pages: ages 100..140
    for n in range(10, 15):
        nixl_page(root / "b", n, age=200 + 10 * n, now=now)  # b's: older, 300..340
    # Shares add up to the whole budget, but "other" bytes (a namespace the config does not name) push the tier over
    (root / "foreign").mkdir()
    (root / "foreign" / "x.bin").write_bytes(b"\0" * 4000)
    report = collect.collect(config(root, {"a": {"share_pct": 50}, "b": {"share_pct": 50}}, budget=20000), out=lambda _: None)
    assert report["total_bytes"] <= 20000
    removed = report["removed"]
    assert set(removed) == {"b"} and removed["b"]["pages"] == 2  # the two least recently used pages, both b's
    assert (root / "foreign" / "x.bin").exists()  # never a namespace the config does not name


def test_never_a_page_being_written_nor_one_used_within_the_grace(tmp_path):
    root = tmp_path / "tier"
    now = time.time()
    file_page(root / "a", 1, age=10_000, now=now)
    file_page(root / "a", 2, age=5, now=now)  # written 5 s ago: inside the 60 s grace
    (root / "a" / ".5f1c2a9e0d14aa.tmp").write_bytes(b"\0" * 50_000)  # HiCacheFile's write in progress
    collect.collect(config(root, {"a": {"share_pct": None}}, budget=1), out=lambda _: None)
    assert (root / "a" / ".5f1c2a9e0d14aa.tmp").exists()
    assert {k for _, k in pages_left(root)} == {key(2)}


def test_pages_written_without_a_namespace_and_the_buckets(tmp_path):
    root = tmp_path / "tier"
    now = time.time()
    file_page(root, 1, age=1000, now=now)
    nixl_page(root, 2, age=900, now=now)
    file_page(root / "kept-literal", 3, age=5000, now=now)
    collect.collect(config(root, {"": {"share_pct": None}}, budget=4500), out=lambda _: None)
    assert {k for _, k in pages_left(root)} == {key(2), key(3)}


def test_a_page_rewritten_after_the_listing_is_kept_whole(tmp_path, monkeypatch):
    root = tmp_path / "tier"
    now = time.time()
    paths = file_page(root / "a", 1, age=1000, now=now)
    real_remove = collect.remove

    def touched_then_removed(page):
        os.utime(paths[1], (now, now))  # a server rewrites rank 1's file between the listing and the removal
        return real_remove(page)

    monkeypatch.setattr(collect, "remove", touched_then_removed)
    report = collect.collect(config(root, {"a": {"share_pct": None}}, budget=1), out=lambda _: None)
    assert all(os.path.exists(p) for p in paths) and report["kept_rewritten"] == 1


def test_counters_accumulate_and_are_written_for_prometheus(tmp_path):
    root = tmp_path / "tier"
    now = time.time()
    for n in range(4):
        file_page(root / "a", n, age=1000 + n, now=now)
    conf = config(root, {"a": {"share_pct": None}}, budget=4000)
    collect.collect(conf, out=lambda _: None)
    file_page(root / "a", 9, age=999, now=now)
    collect.collect(conf, out=lambda _: None)
    text = (tmp_path / "hicache_l3_collector.prom").read_text()
    assert 'hicache_l3_collector_evicted_pages_total{tier="t",namespace="a"} 3' in text
    assert 'hicache_l3_collector_evicted_bytes_total{tier="t",namespace="a"} 6000' in text
    assert re.search(r'hicache_l3_tier_fill_ratio\{tier="t"\} 1\.0+\n', text)
    promtool = "/usr/bin/promtool"
    if os.path.exists(promtool):
        checked = subprocess.run([promtool, "check", "metrics"], input=text, text=True, capture_output=True)
        assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_dry_run_removes_nothing(tmp_path):
    root = tmp_path / "tier"
    file_page(root / "a", 1, age=1000)
    report = collect.collect(config(root, {"a": {"share_pct": None}}, budget=1), dry_run=True, out=lambda _: None)
    assert report["removed"]["a"]["pages"] == 1 and len(pages_left(root)) == 1


def _hold_lock(root, ready, release):
    import fcntl

    fd = os.open(os.path.join(root, collect.LOCK_NAME), os.O_RDWR | os.O_CREAT)
    fcntl.lockf(fd, fcntl.LOCK_EX)
    os.pwrite(fd, b"first-collector pid 1\n", 0)
    ready.set()
    release.wait(30)
    os.close(fd)


def test_a_second_collector_waits_on_the_tiers_lock(tmp_path):
    root = tmp_path / "tier"
    file_page(root / "a", 1, age=1000)
    (tmp_path / "c.json").write_text(json.dumps(config(root, {"a": {"share_pct": None}}, budget=1)))
    ready, release = multiprocessing.Event(), multiprocessing.Event()
    holder = multiprocessing.Process(target=_hold_lock, args=(str(root), ready, release))
    holder.start()
    try:
        assert ready.wait(10)
        second = subprocess.Popen([sys.executable, str(l3_collector.PROGRAM_SOURCE), "--config", str(tmp_path / "c.json")],
                                  stdout=subprocess.PIPE, text=True)
        time.sleep(1.5)
        assert second.poll() is None and len(pages_left(root)) == 1  # waiting: nothing removed yet
        release.set()
        out, _ = second.communicate(timeout=30)
        assert second.returncode == 0
        assert "waiting for the lock of tier t" in out and "first-collector" in out
        assert not pages_left(root)
        refused = subprocess.run([sys.executable, str(l3_collector.PROGRAM_SOURCE), "--config", str(tmp_path / "c.json"), "--no-wait"],
                                 capture_output=True, text=True)
        assert refused.returncode == 0  # the lock is free again
    finally:
        release.set()
        holder.join(10)


def test_a_run_whose_lock_file_is_removed_while_held_stops_before_the_next_page(tmp_path, monkeypatch):
    """#35's limit of a POSIX lock: a lock file unlinked while held lets a second collector lock a new one. The run
    checks before each page that its lock file is still the one at the path, and stops (said, counted) otherwise."""
    root = tmp_path / "tier"
    for n in range(3):
        file_page(root / "a", n, age=1000 + n)
    real_remove, said = collect.remove, []

    def remove_then_lose_the_lock(page):
        done = real_remove(page)
        os.unlink(root / collect.LOCK_NAME)  # what SGLang's clear of a namespace-less tier, or an operator, does
        return done
    monkeypatch.setattr(collect, "remove", remove_then_lose_the_lock)
    report = collect.collect(config(root, {"a": {"share_pct": None}}, budget=1), out=said.append)
    assert report["lost_lock"] is True and report["removed"]["a"]["pages"] == 1, report
    assert len(pages_left(root)) == 2 and len(list((root / "a").iterdir())) == 4  # left whole, for the next run
    assert any("was removed or replaced while this run held it" in line and "2 chosen page(s) left" in line for line in said), said
    # a lock file replaced by another (a second collector's new one) is the same loss
    (root / collect.LOCK_NAME).unlink(missing_ok=True)
    monkeypatch.setattr(collect, "remove", real_remove)
    fd = os.open(root / collect.LOCK_NAME, os.O_RDWR | os.O_CREAT)
    try:
        held = (os.fstat(fd).st_dev, os.fstat(fd).st_ino)
        assert collect._still_held(held, str(root / collect.LOCK_NAME))
        os.rename(root / collect.LOCK_NAME, root / "old")
        (root / collect.LOCK_NAME).write_text("another collector\n")
        assert not collect._still_held(held, str(root / collect.LOCK_NAME))
    finally:
        os.close(fd)
    # said where an operator looks: the state's counter for Prometheus, and the program's exit status (a failed unit)
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["lost_lock_runs"] == 1, state
    assert 'hicache_l3_collector_lost_lock_runs_total{tier="t"} 1' in collect.metrics_text("t", state, 0.5)
    # and an undisturbed run removes every chosen page
    whole = collect.collect(config(root, {"a": {"share_pct": None}}, budget=1), out=lambda _: None)
    assert whole["lost_lock"] is False and whole["removed"]["a"]["pages"] == 2 and not pages_left(root)
    assert json.loads((tmp_path / "state.json").read_text())["lost_lock_runs"] == 1  # counted once, not reset
    (tmp_path / "c.json").write_text(json.dumps(config(root, {"a": {"share_pct": None}}, budget=1)))
    monkeypatch.setattr(collect, "collect", lambda *a, **k: {"lost_lock": True})
    assert collect.main(["--config", str(tmp_path / "c.json")]) == 2


# --- who collects, and the inventory's rules ---------------------------------------------------------------------


def servers(**by_host):
    """Deployments of the local profile on a shared tier, each host's overrides given."""
    base = {"storage_backend": "file", "l3_share": "pool", "l3_budget_gb": 100}
    import dataclasses

    return {host: dataclasses.replace(deployment("local", **{**base, **overrides}), inventory_host=host) for host, overrides in by_host.items()}


def test_the_tiers_first_server_collects_and_the_others_remove_it():
    fleet = servers(h1={}, h2={"model_path": "/models/other"}, h3={"l3_namespace_share_pct": 30})
    plans = {h: l3_collector.plan(h, fleet) for h in fleet}
    assert [h for h, p in plans.items() if p.here] == ["h1"]
    assert all(p.collector == "h1" for p in plans.values())
    assert plans["h2"].absent == (l3_collector.PROGRAM, l3_collector.CONFIG_FILE, *(f"/etc/systemd/system/{u}" for u in (l3_collector.SERVICE, l3_collector.TIMER)))
    conf = json.loads(next(f["content"] for f in plans["h1"].files if f["path"] == l3_collector.CONFIG_FILE))
    assert conf["budget_bytes"] == 100 * 10**9 and conf["root"] == fleet["h1"].cache_dir
    assert set(conf["namespaces"]) == {namespace.of(d) for d in fleet.values()}
    assert conf["namespaces"][namespace.of(fleet["h3"])]["share_pct"] == 30


def test_without_a_budget_there_is_no_collector_and_an_old_one_goes():
    d = deployment("local", storage_backend="file")
    p = l3_collector.plan("h1", {"h1": d})
    assert not p.here and p.files == () and l3_collector.CONFIG_FILE in p.absent


def _findings(fleet):
    from hicachectl.rules.fleet import check_shared_tiers

    return check_shared_tiers(fleet)


def test_a_tier_has_one_budget_and_shares_add_up_to_at_most_all_of_it():
    split = _findings(servers(h1={}, h2={"model_path": "/models/other", "l3_budget_gb": 50}))
    assert [(f.host, f.variable, f.rule) for f in split if f.rule == "l3-budget-split"] == [("h2", "hicache_l3_budget_gb", "l3-budget-split")]
    over = _findings(servers(h1={"l3_namespace_share_pct": 70}, h2={"model_path": "/models/other", "l3_namespace_share_pct": 40}))
    assert any(f.rule == "l3-budget-share" and "110%" in f.message for f in over)
    fine = _findings(servers(h1={"l3_namespace_share_pct": 70}, h2={"model_path": "/models/other", "l3_namespace_share_pct": 30}))
    assert not [f for f in fine if f.rule.startswith("l3-budget")]


def test_a_budget_needs_pages_in_files_and_turns_nixls_cleaner_off():
    from hicachectl.plans import launch

    _, findings = rules.check_host("h", {**_local(), "hicache_storage_backend": "dynamic", "hicache_l3_budget_gb": 10,
                                         "hicache_extra_config": {"backend_name": "xkv", "module_path": "m", "class_name": "C"}})
    assert any(f.rule == "l3-budget" and f.level == rules.ERROR for f in findings)
    d = deployment("local", storage_backend="nixl", l3_budget_gb=10)
    assert launch.extra_config(d)["l3_cleaner_enabled"] is False
    _, findings = rules.check_host("h", {**_local(), "hicache_storage_backend": "nixl", "hicache_l3_budget_gb": 10,
                                         "hicache_extra_config": {"l3_cleaner_enabled": True}})
    assert any(f.rule == "nixl-cleaner-budget" and f.level == rules.ERROR for f in findings)
    # the file backend: no "unbounded" warning with a budget, but one about SGLang's own LRU beside it
    _, findings = rules.check_host("h", {**_local(), "hicache_storage_backend": "file", "hicache_l3_budget_gb": 10})
    assert not any(f.rule == "file-backend-unbounded" for f in findings)
    _, findings = rules.check_host("h", {**_local(), "hicache_storage_backend": "file", "hicache_l3_budget_gb": 10,
                                         "hicache_extra_config": {"max_size": "800G"}})
    assert any(f.rule == "file-lru-with-budget" for f in findings)


def _local():
    from helpers import _host_vars

    return dict(_host_vars("local")[1])


def test_the_module_and_the_collector_group_pages_alike():
    import importlib.util

    spec = importlib.util.spec_from_file_location("m", str(l3_collector.ROLES.parent / "plugins" / "modules" / "hicache_l3_namespaces.py"))
    source = spec.loader.get_source("m")
    assert f're.compile(r"{collect.PAGE_KEY.pattern}")' in source
    assert f'COLLECTOR_LOCK = "{l3_collector.LOCK_NAME}"' in source


@pytest.mark.parametrize("name, page", [
    (f"{key(1)}_Qwen-Qwen3-8B_0_2.bin", key(1)),
    (f"{key(1)}.mamba_Qwen-Qwen3-8B_0_2.bin", key(1)),
    (f"{key(1)}_Qwen-Qwen3-8B_0_1_k", key(1)),
    (".3b1f0c.tmp", None),
    ("README", None),
])
def test_page_keys(name, page):
    assert collect.page_key(name) == page


def test_the_programs_lock_name_is_the_plans():
    assert collect.LOCK_NAME == l3_collector.LOCK_NAME


def test_render_names_the_collectors_files_on_its_host_only():
    from hicachectl.plans import host_files

    fleet = servers(h1={}, h2={"model_path": "/models/other"})
    on_collector = host_files.server_host_files(fleet["h1"], fleet)
    elsewhere = host_files.server_host_files(fleet["h2"], fleet)
    assert {l3_collector.PROGRAM, l3_collector.CONFIG_FILE} <= {f.path for f in on_collector.files}
    assert l3_collector.STATE_FILE in {k.path for k in on_collector.kept}
    assert not {l3_collector.PROGRAM, l3_collector.CONFIG_FILE} & {f.path for f in elsewhere.files}
    assert ("sglang_server", l3_collector.CONFIG_FILE) in elsewhere.removed


# --- what an operator or a hostile writer of the tier meets (audit 2026-12-06) -------------------------------------


def test_files_named_like_a_key_that_sglang_would_not_write_there_are_never_removed(tmp_path):
    root = tmp_path / "tier"
    now = time.time()
    file_page(root / "a", 1, age=1000, now=now)
    strays = [root / "a" / f"{key(2)}.txt", root / "a" / f"{key(3)}_backup.tar", root / "a" / "00" / f"{key(4)}_m_0_1_k"]
    for stray in strays:  # not .bin beside the pages; a nixl name in a bucket its name does not route to
        stray.parent.mkdir(parents=True, exist_ok=True)
        stray.write_bytes(b"\0" * 11)
        os.utime(stray, (now - 5000, now - 5000))
    assert collect.nixl_bucket(strays[2].name) != "00"
    report = collect.collect(config(root, {"a": {"share_pct": None}}, budget=0), out=lambda _: None)
    assert all(stray.exists() for stray in strays) and not any(root.joinpath("a").glob("*.bin"))
    assert report["removed"]["a"]["pages"] == 1 and report["other_bytes"] == 33


def test_a_file_it_may_not_remove_is_said_and_the_run_goes_on(tmp_path, monkeypatch):
    root = tmp_path / "tier"
    now = time.time()
    stuck = file_page(root / "a", 1, age=3000, now=now)
    file_page(root / "a", 2, age=2000, now=now)
    real_unlink = os.unlink

    def refused(name, *, dir_fd=None):
        if name == os.path.basename(stuck[1]):
            raise PermissionError(1, "Operation not permitted")
        return real_unlink(name, dir_fd=dir_fd)

    monkeypatch.setattr(collect.os, "unlink", refused)
    said = []
    report = collect.collect(config(root, {"a": {"share_pct": None}}, budget=0), out=said.append)
    assert report["removed"]["a"]["pages"] == 1 and len(report["not_removed"]) == 1  # page 2 went all the same
    assert any("could not remove" in line and "Operation not permitted" in line for line in said), said
    assert json.loads((tmp_path / "state.json").read_text())["evicted"]["a"]["pages"] == 1  # and is counted


def test_an_unreadable_directory_is_said_and_left(tmp_path, monkeypatch):
    root = tmp_path / "tier"
    now = time.time()
    file_page(root / "a", 1, age=1000, now=now)
    nixl_page(root / "b", 2, age=1000, now=now)
    real_scandir = os.scandir
    locked = {str(p.parent) for p in (root / "b").rglob("*_k")}

    def scandir(path):
        if str(path) in locked:
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)

    monkeypatch.setattr(collect.os, "scandir", scandir)
    said = []
    report = collect.collect(config(root, {"a": {"share_pct": None}, "b": {"share_pct": None}}, budget=0), out=said.append)
    assert report["removed"]["a"]["pages"] == 1 and any("cannot read" in w for w in report["warnings"]), report


def test_a_directory_swapped_for_a_symlink_after_the_listing_leads_nowhere(tmp_path, monkeypatch):
    root = tmp_path / "tier"
    victim = tmp_path / "victim"
    now = time.time()
    paths = nixl_page(root / "a", 1, age=1000, now=now)
    bucket = os.path.dirname(paths[0])
    victim.mkdir()
    (victim / os.path.basename(paths[0])).write_bytes(b"keep")
    os.utime(victim / os.path.basename(paths[0]), (now - 1000, now - 1000))
    real_remove = collect.remove

    def swapped_then_removed(page):  # a writer of the tier swaps a bucket for a symlink out of it meanwhile
        os.rename(bucket, bucket + ".moved")
        os.symlink(victim, bucket)
        return real_remove(page)

    monkeypatch.setattr(collect, "remove", swapped_then_removed)
    report = collect.collect(config(root, {"a": {"share_pct": None}}, budget=0), out=lambda _: None)
    assert (victim / os.path.basename(paths[0])).read_bytes() == b"keep"
    assert report["not_removed"] and not report["removed"], report


@pytest.mark.parametrize("change, named", [
    ({"budget_bytes": float("nan")}, "budget_bytes"), ({"budget_bytes": -5}, "budget_bytes"),
    ({"budget_bytes": "10"}, "budget_bytes"), ({"budget_bytes": None}, "budget_bytes"),
    ({"free_floor_pct": 150}, "free_floor_pct"), ({"namespaces": {"../victim": {}}}, "../victim"),
    ({"namespaces": {"/etc": {}}}, "/etc"), ({"namespaces": {"a": None}}, "'a'"),
    ({"namespaces": {"a": {"share_pct": "30"}}}, "share_pct"), ({"root": "tier"}, "root"),
    # the files it writes and its tier's name, checked before anything is removed (a list crashed after the removal)
    ({"state_file": ["x"]}, "state_file"), ({"textfile_dir": "relative"}, "textfile_dir"), ({"tier": "two\nlines"}, "tier"),
])
def test_a_config_out_of_shape_is_refused_in_one_line_and_nothing_is_removed(tmp_path, change, named):
    root = tmp_path / "tier"
    file_page(root / "a", 1, age=1000)
    (tmp_path / "c.json").write_text(json.dumps({**config(root, {"a": {"share_pct": None}}, budget=1), **change}))
    run = subprocess.run([sys.executable, str(l3_collector.PROGRAM_SOURCE), "--config", str(tmp_path / "c.json")],
                         capture_output=True, text=True)
    assert run.returncode == 1 and len(run.stderr.strip().splitlines()) == 1 and named in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and len(pages_left(root)) == 1


def test_pages_dated_in_the_future_are_taken_as_least_recently_used(tmp_path):
    root = tmp_path / "tier"
    now = time.time()
    file_page(root / "a", 1, age=-10 * 365 * 86400, now=now)  # ten years ahead
    file_page(root / "a", 2, age=1000, now=now)
    said = []
    report = collect.collect(config(root, {"a": {"share_pct": None}}, budget=2 * PAGE), out=said.append)
    assert {k for _, k in pages_left(root)} == {key(2)} and report["removed"]["a"]["pages"] == 1
    assert any("dated in the future" in line for line in said), said


def test_a_floor_no_eviction_can_reach_evicts_nothing_for_it():
    now = 10_000.0
    pages = {}
    for n in range(3):
        page = collect.Page("/tier", "a", key(n))
        page.bytes, page.used = PAGE, now - 1000
        pages[("a", key(n))] = page
    # 100 bytes free of 1 MB and a 50 % floor: all three pages (3000 bytes) cannot bring it there
    chosen, _, _ = collect.plan_eviction(pages, {"a": 3 * PAGE}, 0, budget=10**9, shares={"a": None}, fs_size=10**6,
                                         fs_free=100, floor_pct=50, now=now, grace=60)
    assert chosen == []
    reachable, _, _ = collect.plan_eviction(pages, {"a": 3 * PAGE}, 0, budget=10**9, shares={"a": None}, fs_size=10**4,
                                            fs_free=100, floor_pct=20, now=now, grace=60)
    assert [reason for _, reason in reachable] == ["free space under the floor"] * 2



def test_a_tier_whose_clock_runs_ahead_keeps_its_newest_pages(tmp_path):
    """An NFS server dates the pages by its own clock: five minutes ahead of this host, the page just written is not
    'in the future' (the lock file the run writes gives the tier's now), and the least recently used page goes."""
    root = tmp_path / "tier"
    now = time.time()
    file_page(root / "a", 1, age=-300, now=now)  # written just now by a server whose clock is 300 s ahead
    file_page(root / "a", 2, age=3600, now=now)  # an hour old
    conf = collect.check_config(config(root, {"a": {"share_pct": None}}, budget=2 * PAGE))
    report = collect._collect_locked(conf, dry_run=False, out=lambda _: None, tier_now=now + 300)
    assert {k for _, k in pages_left(root)} == {key(1)} and report["removed"]["a"]["pages"] == 1


def test_a_file_name_no_utf8_name_has_is_counted_not_a_crash(tmp_path):
    root = tmp_path / "tier"
    file_page(root / "a", 1, age=1000)
    bucket = root / "a" / "7f"
    bucket.mkdir()
    (bucket / os.fsdecode(key(5).encode() + b"_m_0_1_\xff")).write_bytes(b"\0" * 10)
    (root / "a" / os.fsdecode(key(6).encode() + b"_m_\xff_1.bin")).write_bytes(b"\0" * 10)
    os.utime(root / "a" / os.fsdecode(key(6).encode() + b"_m_\xff_1.bin"), (time.time() - 1000, time.time() - 1000))
    said = []
    report = collect.collect(config(root, {"a": {"share_pct": None}}, budget=0), out=said.append)
    assert report["removed"]["a"]["pages"] == 2 and report["other_bytes"] == 10, report
    (tmp_path / "c.json").write_text(json.dumps(config(root, {"a": {"share_pct": None}}, budget=0)))
    run = subprocess.run([sys.executable, str(l3_collector.PROGRAM_SOURCE), "--config", str(tmp_path / "c.json")],
                         capture_output=True, text=True, env={**os.environ, "PYTHONIOENCODING": "utf-8"})
    assert run.returncode == 0, run.stderr


def test_data_of_no_namespace_filling_the_whole_budget_does_not_empty_the_live_ones(tmp_path):
    """An old namespace the inventory no longer names (after a KV dtype change, say) holds more than the budget: no
    eviction of live pages can reach it, so the live namespaces keep what their shares allow, and the run says why."""
    root = tmp_path / "tier"
    now = time.time()
    for n in range(3):
        file_page(root / "live", n, age=1000 + n, now=now)  # 6000 bytes
    (root / "old-namespace").mkdir()
    (root / "old-namespace" / "pages").write_bytes(b"\0" * 30_000)
    said = []
    report = collect.collect(config(root, {"live": {"share_pct": None}}, budget=20_000), out=said.append)
    assert len(pages_left(root)) == 3 and not report["removed"], report  # its 6000 bytes are within its share
    assert any("more than the whole budget" in line and "--prune" in line for line in said), said


@pytest.mark.parametrize("plugin,refused", [("OBJ", True), ("POSIX", False), ("GDS_MT", False), (None, False)])
def test_a_budget_on_nixls_object_plugin_is_refused_the_file_plugins_are_not(plugin, refused):
    """SGLang 0.5.23 opens no file for NIXL's OBJ plugin (storage/nixl/hicache_nixl.py: no NixlFileManager for
    OBJ_PLUGINS): its pages are objects in a bucket, which the collector cannot see or evict."""
    variables = {**_local(), "hicache_storage_backend": "nixl", "hicache_l3_budget_gb": 10}
    if plugin:
        variables["hicache_nixl_plugin"] = plugin
    _, findings = rules.check_host("h", variables)
    budget = [f for f in findings if f.rule == "l3-budget" and f.level == rules.ERROR]
    assert bool(budget) is refused, [f.format() for f in findings]
    if refused:
        assert "object store" in budget[0].message and budget[0].variable == "hicache_l3_budget_gb"


@pytest.mark.parametrize("sections,refused", [
    ({"obj": {"active": True, "bucket": "b"}}, True),  # the first active section is the plugin (nixl_utils.py get_specified_plugin)
    ({"posix": {"active": False}, "obj": {"active": "true", "bucket": "b"}}, True),
    ({"posix": {"active": True}, "obj": {"active": True, "bucket": "b"}}, False),  # POSIX comes first: files
    ({"obj": {"bucket": "b"}, "posix": {"active": True}}, False),
])
def test_a_budget_is_refused_where_the_extra_configs_plugin_section_picks_nixls_object_plugin(sections, refused):
    from hicachectl.rules import nixl

    variables = {**_local(), "hicache_storage_backend": "nixl", "hicache_l3_budget_gb": 10, "hicache_extra_config": {"plugin": sections}}
    d, findings = rules.check_host("h", variables)
    budget = [f for f in findings if f.rule == "l3-budget" and f.level == rules.ERROR]
    assert bool(budget) is refused, [f.format() for f in findings]
    if d is not None:
        assert (nixl.plugin_in_effect(d) == "OBJ") is refused
