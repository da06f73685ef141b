"""`hicachectl l3` on SSH test hosts: two configs on one shared tier, listed once, and `--prune` removing only the
old namespace. Two test hosts get one directory of this machine bind-mounted at /mnt/kvcache (one export, as a
VAST or NFS tier); each runs SGLang's stand-in as a systemd service, whose SGLang HiCacheFile writes a file per page
of a prompt into its L3 directory: <hicache_cache_dir>/<namespace> (launch.py passes it). What is never pruned: a literal
directory (`models`), nixl's bucket directories, the namespace the servers run after the inventory was edited and
not deployed (their deployed.json), anything on the tier while one of its servers cannot be reached. Then the same two hosts move to SGLang's HiCacheNixl
(NIXL's POSIX plugin) on a directory of the same export: its bucket directories and `_k`/`_v` files inside each namespace,
`l3` counting them as pages, `--prune` and `verify --l3` on that layout.

The tests run in order on one fleet."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import re

import pytest
from fleet import HEALTH_TIMEOUT, STANDIN, Fleet
from support import cli, cli_json

from hicachectl.config import namespace
from hicachectl.config.inventory import load
from hicachectl.rules import check_host

pytestmark = pytest.mark.slow

# SGLang's HiCacheFile writes one `<key>_gpt-oss-20b_0_1.bin` per page (TP 1) of the stand-in's model: k and v x 4 layers x
# 1 head x dim 128 x bf16 x 16 tokens (tests/standin/sglang_pages.py MODEL).
PAGE_BYTES = 2 * 4 * 1 * 128 * 2 * 16
VARS = {
    "hicache_container_runtime": "none",
    "hicache_launcher": ["python3", STANDIN],
    "hicache_served_model_name": "gpt-oss-20b",
    "hicache_storage_backend": "file",
    "hicache_cache_dir": "/mnt/kvcache",
    "hicache_storage_type": "local",
    "hicache_strict": False,  # as the local profile: no GPU here, the host is degraded, never ok
    "hicache_l3_share": "l3-test",
    "hicache_page_size": 16,
    "hicache_write_policy": "write_through",
    "hicache_health_timeout": HEALTH_TIMEOUT,
}
PROMPT = " ".join(f"word{i}" for i in range(16 * 6))  # six pages


@pytest.fixture(scope="module")
def tier(tmp_path_factory):
    export = tmp_path_factory.mktemp("export")
    fleet = Fleet(tmp_path_factory.mktemp("fleet"), 2, prefix="hicache-l3ns", volumes=(f"{export}:/mnt/kvcache",)).up()
    try:
        fleet.install_standin()
        fleet.export = export
        fleet.sorted = sorted(fleet.hosts)
        fleet.configs = {}
        yield fleet
    finally:
        fleet.down()


def config(fleet, name, **group):
    """An inventory of the fleet with VARS and `group`, and the namespace its servers use."""
    path = fleet.inventory(extra_vars={**VARS, **group}, name=name)
    host = fleet.sorted[0]
    d, _ = check_host(host, load(str(path)).hosts[host])
    return path, namespace.of(d)


def ask(fleet, host, prompt):
    code = ("import json,urllib.request as u;"
            f"r=u.Request('http://127.0.0.1:30000/v1/chat/completions',data=json.dumps({{'model':'gpt-oss-20b','messages':[{{'role':'user','content':{prompt!r}}}]}}).encode(),headers={{'Content-Type':'application/json'}});"
            "print(json.load(u.urlopen(r))['usage']['prompt_tokens'])")
    proc = fleet.ssh(host, f"python3 -c {json.dumps(code)}")
    assert proc.returncode == 0, proc.stderr


def deploy_and_ask(fleet, path, host):
    """Deploy `path` on every host of the fleet (judged per host: every host ran without a failure), then ask `host`
    the six-page prompt, whose pages its server writes to the tier."""
    report = json.loads(cli("deploy", "--inventory", str(path), "--json").stdout)
    assert all(r["failed"] == 0 and not r["unreachable"] and not r["interrupted"] for r in report["hosts"].values()), report
    assert set(report["hosts"]) == set(fleet.hosts)
    ask(fleet, host, PROMPT)


def files(fleet, name):
    return sorted(p.name for p in (fleet.export / name).iterdir())


def test_two_configs_write_two_namespaces_on_the_tier(tier):
    old_path, old = config(tier, "kv-auto")
    new_path, new = config(tier, "kv-fp8", hicache_kv_cache_dtype="fp8_e4m3")
    assert old != new
    for path, host in ((old_path, tier.sorted[0]), (new_path, tier.sorted[1])):
        deploy_and_ask(tier, path, host)  # both servers on the config; one writes its pages
    tier.configs.update(old=(old_path, old), new=(new_path, new))
    assert len(files(tier, old)) == 6 and len(files(tier, new)) == 6
    assert all(f.endswith("_gpt-oss-20b_0_1.bin") and len(f.split("_")[0]) == 64 for f in files(tier, old) + files(tier, new))
    assert sorted(p.name for p in tier.export.iterdir()) == sorted([old, new])
    # Beside them, what is not a namespace of auto's: a literal directory and a bucket of nixl's pages (namespace off).
    for name, count in (("models", 2), ("a7", 3)):
        (tier.export / name).mkdir()
        for i in range(count):
            (tier.export / name / f"f{i}").write_text("x")
            os.utime(tier.export / name / f"f{i}", (1_700_000_000, 1_700_000_000))


def test_l3_lists_the_shared_tier_once_with_both_namespaces(tier):
    path, new = tier.configs["new"]
    old = tier.configs["old"][1]
    report = cli_json("l3", "--inventory", str(path))
    assert [t["name"] for t in report["tiers"]] == ["l3-test"]  # two hosts, one export: read once
    shared = report["tiers"][0]
    assert shared["read_on"] == tier.sorted[0] and shared["hosts"] == tier.sorted and shared["path"] == "/mnt/kvcache"
    rows = {r["namespace"]: r for r in shared["namespaces"]}
    assert set(rows) == {old, new, "models", "(no namespace)"}
    assert rows["(no namespace)"]["pages"] == 3 and not rows["models"]["prune"] and "not a name auto derives" in rows["models"]["why_kept"]
    assert rows[new]["state"] == "in use" and rows[new]["used_by"] == tier.sorted and rows[new]["pages"] == 6
    assert rows[old]["state"] == "unused" and rows[old]["pages"] == 6 and rows[old]["bytes"] == 6 * PAGE_BYTES
    assert rows[old]["last_use"] and rows[old]["prune"] is False and rows[new]["prune"] is False
    assert "a server may still use it" in rows[old]["why_kept"]  # written minutes ago: --min-age 24 h keeps it
    text = cli("l3", "--inventory", str(path), check_rc=0).stdout
    assert "tier l3-test (shared by " in text and old in text and new in text


def test_an_edited_inventory_not_yet_deployed_keeps_the_namespace_the_servers_run(tier):
    path, new = tier.configs["new"]
    old = tier.configs["old"][1]
    edited, third = config(tier, "kv-fp8-p32", hicache_kv_cache_dtype="fp8_e4m3", hicache_page_size=32)
    assert third not in (old, new)
    report = cli_json("l3", "--inventory", str(edited), "--prune", "--min-age", "0")
    shared = report["tiers"][0]
    rows = {r["namespace"]: r for r in shared["namespaces"]}
    assert report["running"] == {new: tier.sorted} and report["not_checked"] == {}
    assert rows[new]["state"] == "running" and rows[new]["prune"] is False
    assert shared["would_remove"] == [old]


def test_prune_without_yes_names_the_old_namespace_and_removes_nothing(tier):
    path, new = tier.configs["new"]
    old = tier.configs["old"][1]
    dry = cli("l3", "--inventory", str(path), "--prune", "--min-age", "0", check_rc=0)
    assert f"would remove {old}" in dry.stdout and f"would remove {new}" not in dry.stdout
    assert "dry run: 1 unused namespace(s) would be removed; nothing was removed" in dry.stdout
    assert len(files(tier, old)) == 6 and len(files(tier, new)) == 6


def test_prune_yes_removes_only_the_old_namespace(tier):
    path, new = tier.configs["new"]
    old = tier.configs["old"][1]
    before = files(tier, new)
    report = cli_json("l3", "--inventory", str(path), "--prune", "--yes", "--min-age", "0")
    shared = report["tiers"][0]
    assert shared["removed"] == [old] and shared["refused"] == [] and shared["removal_errors"] == []
    assert [r["namespace"] for r in shared["namespaces"]] == [*sorted(["models", new]), "(no namespace)"]
    assert not (tier.export / old).exists()
    assert files(tier, new) == before  # the namespace in use is untouched
    assert files(tier, "models") == ["f0", "f1"] and files(tier, "a7") == ["f0", "f1", "f2"]
    again = cli_json("l3", "--inventory", str(path), "--prune", "--min-age", "0")
    assert again["tiers"][0]["would_remove"] == []


def test_a_tier_is_read_on_its_next_host_when_the_first_cannot_be_reached(tier):
    path, new = tier.configs["new"]
    tier.stop(tier.sorted[0])
    report = cli_json("l3", "--inventory", str(path))
    assert report["tiers"][0]["read_on"] == tier.sorted[1]
    assert [r["namespace"] for r in report["tiers"][0]["namespaces"]] == [*sorted(["models", new]), "(no namespace)"]
    alone = cli_json("l3", "--inventory", str(path), "--limit", tier.sorted[0], check_rc=1)  # the only host allowed is down
    assert alone["tiers"][0]["error"].startswith(f"{tier.sorted[0]}: ")


def test_a_server_that_cannot_be_reached_holds_the_prune_of_its_tier(tier):
    path, new = tier.configs["new"]
    stale = "stale-0123456789ab"  # unused, of auto's form, old: pruned when every server is checked
    (tier.export / stale).mkdir()
    (tier.export / stale / "p").write_text("x")
    os.utime(tier.export / stale / "p", (1_700_000_000, 1_700_000_000))
    down = tier.sorted[0]  # stopped by the test before
    report = cli_json("l3", "--inventory", str(path), "--prune", "--yes", check_rc=1)
    shared = report["tiers"][0]
    assert shared["read_on"] == tier.sorted[1] and list(shared["not_checked"]) == [down]
    assert shared.get("removed", []) == [] and (tier.export / stale / "p").exists()
    rows = {r["namespace"]: r for r in shared["namespaces"]}
    assert f"not checked what {down} runs" in rows[stale]["why_kept"]
    text = cli("l3", "--inventory", str(path), "--prune", check_rc=1).stdout
    assert f"nothing is pruned on this tier: not checked what {down} runs" in text and "would remove" not in text


# The same tier with SGLang's HiCacheNixl (nixl-cu12 1.5.1's POSIX plugin, DRAM buffers, CPU): the two hosts' servers move to
# the nixl backend, their tier a directory of the same export (/mnt/kvcache/nixl). NIXL's layout (sglang 0.5.23,
# mem_cache/storage/nixl/): the base directory (the namespace) holds the 256 bucket directories `00`..`ff`, all created at
# start (nixl_utils.py NixlFileManager.ensure_all_bucket_dirs); page_first is zero copy (hicache_nixl.py
# register_mem_pool_host), so each page is a `_k` and a `_v` file per TP rank, `<key>_<served name>_<tp_rank>_<tp_size>_<k|v>`
# (_get_key_list_from_meta, tp_config_suffix), in the bucket its whole name routes to (nixl_routing.py route_key).
NIXL_VARS = {
    "hicache_storage_backend": "nixl",
    "hicache_cache_dir": "/mnt/kvcache/nixl",
    "hicache_l3_share": "l3-nixl",
    "hicache_nixl_plugin": "POSIX",
    # One io queue (rules/nixl.py nixl-io-queue: NIXL refuses two); POSIX AIO also works where io_uring is blocked. The
    # cleaner off, as validate's nixl-cleaner-shared asks on a shared tier (it would evict the live namespace only).
    "hicache_extra_config": {"use_direct_io": True, "use_posix_aio": True, "l3_cleaner_enabled": False},
}
NIXL_NAME = re.compile(r"(?P<bucket>[0-9a-f]{2})/(?P<key>[0-9a-f]{64})_gpt-oss-20b_0_1_(?P<part>[kv])")
BUCKETS = [f"{i:02x}" for i in range(256)]


def nixl_bucket(name):
    """nixl_routing.route_key's bucket for one base directory: the low 8 bits of the 64-bit blake2b of the file's key."""
    return f"{int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), 'big') & 0xff:02x}"


def nixl_files(root):
    """The files under a NIXL base directory, as `<bucket>/<name>`."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def nixl_pages(root):
    """{page key: its parts} of the files under a NIXL base directory, each file checked against NIXL's name and layout."""
    pages = collections.defaultdict(set)
    for path in nixl_files(root):
        found = NIXL_NAME.fullmatch(path)
        assert found, f"{path} is not a NIXL page file of rank 0 of 1"
        assert found["bucket"] == nixl_bucket(path.split("/")[1]), f"{path} is not in the bucket NIXL routes its name to"
        assert (root / path).stat().st_size == PAGE_BYTES // 2, path  # a part: k or v of 4 layers
        pages[found["key"]].add(found["part"])
    assert all(parts == {"k", "v"} for parts in pages.values()), pages
    return dict(pages)


def table_row(text, name):
    """The cells of the l3 table's row of a namespace (cells are 2 or more spaces apart)."""
    return next(re.split(r"\s{2,}", line.strip()) for line in text.splitlines() if f"  {name}  " in line)


@pytest.fixture(scope="module")
def nixl_tier(tier):
    tier.start(tier.sorted[0])  # stopped by the file backend's last tests (a no-op when it runs)
    tier.nixl_root = tier.export / "nixl"
    tier.nixl = {}
    return tier


def test_nixl_writes_its_buckets_and_k_v_parts_inside_each_namespace(nixl_tier):
    t = nixl_tier
    old_path, old = config(t, "nixl-auto", **NIXL_VARS)
    new_path, new = config(t, "nixl-fp8", **NIXL_VARS, hicache_kv_cache_dtype="fp8_e4m3")
    assert old != new and namespace.looks_like_bucket(old) is False
    for path in (old_path, new_path):
        _, findings = check_host(t.sorted[0], load(str(path)).hosts[t.sorted[0]])
        assert [f for f in findings if f.level == "error" or f.rule.startswith(("nixl", "uring"))] == [], findings
    for path, host in ((old_path, t.sorted[0]), (new_path, t.sorted[1])):
        deploy_and_ask(t, path, host)
    t.nixl.update(old=(old_path, old), new=(new_path, new))
    assert sorted(p.name for p in t.nixl_root.iterdir()) == sorted([old, new])
    for name in (old, new):
        assert sorted(p.name for p in (t.nixl_root / name).iterdir()) == BUCKETS  # every bucket, nothing beside them
        assert len(nixl_pages(t.nixl_root / name)) == 6 and len(nixl_files(t.nixl_root / name)) == 12  # a k and a v file per page
    # Beside them, pages of a nixl server with the namespace off: a bucket directly in the tier, one page (k and v), old.
    key = hashlib.sha256(b"off").hexdigest()
    (t.nixl_root / "3c").mkdir()
    for part in "kv":
        file = t.nixl_root / "3c" / f"{key}_gpt-oss-20b_0_1_{part}"
        file.write_bytes(b"\0" * (PAGE_BYTES // 2))
        os.utime(file, (1_700_000_000, 1_700_000_000))


def test_l3_lists_the_nixl_namespaces_in_pages_with_their_servers(nixl_tier):
    t = nixl_tier
    path, new = t.nixl["new"]
    old = t.nixl["old"][1]
    report = cli_json("l3", "--inventory", str(path))
    assert [x["name"] for x in report["tiers"]] == ["l3-nixl"] and report["left_out"] == {}
    shared = report["tiers"][0]
    assert shared["hosts"] == t.sorted and shared["read_on"] == t.sorted[0] and shared["path"] == "/mnt/kvcache/nixl"
    rows = {r["namespace"]: r for r in shared["namespaces"]}
    assert set(rows) == {old, new, "(no namespace)"}  # the 256 buckets inside a namespace are its pages, not namespaces
    assert rows[new]["state"] == "in use" and rows[new]["used_by"] == t.sorted
    for name in (old, new):  # pages, not files: 12 files, 6 pages
        assert rows[name]["pages"] == 6 and rows[name]["bytes"] == 6 * PAGE_BYTES and rows[name]["last_use"], rows[name]
    assert rows[old]["state"] == "unused" and rows[old]["prune"] is False and "a server may still use it" in rows[old]["why_kept"]
    top = rows["(no namespace)"]
    assert top["state"] == "top level" and top["pages"] == 1 and top["bytes"] == PAGE_BYTES and top["prune"] is False
    text = cli("l3", "--inventory", str(path), check_rc=0).stdout
    assert "tier l3-nixl (shared by " in text
    assert table_row(text, new)[3] == "6" and table_row(text, old)[3] == "6"


def test_prune_of_a_nixl_tier_keeps_what_the_servers_use_and_removes_only_the_old_namespace(nixl_tier):
    t = nixl_tier
    path, new = t.nixl["new"]
    old = t.nixl["old"][1]
    edited, third = config(t, "nixl-fp8-p32", **NIXL_VARS, hicache_kv_cache_dtype="fp8_e4m3", hicache_page_size=32)
    assert third not in (old, new)
    report = cli_json("l3", "--inventory", str(edited), "--prune", "--min-age", "0")  # not deployed: the servers run `new`
    assert report["running"] == {new: t.sorted} and report["not_checked"] == {}
    rows = {r["namespace"]: r for r in report["tiers"][0]["namespaces"]}
    assert rows[new]["state"] == "running" and rows[new]["prune"] is False and report["tiers"][0]["would_remove"] == [old]
    dry = cli("l3", "--inventory", str(path), "--prune", "--min-age", "0", check_rc=0)
    assert f"would remove {old}" in dry.stdout and f"would remove {new}" not in dry.stdout and "would remove 3c" not in dry.stdout
    assert len(nixl_files(t.nixl_root / old)) == 12
    before = nixl_files(t.nixl_root / new)
    report = cli_json("l3", "--inventory", str(path), "--prune", "--yes", "--min-age", "0")
    shared = report["tiers"][0]
    assert shared["removed"] == [old] and shared["refused"] == [] and shared["removal_errors"] == []
    assert sorted(p.name for p in t.nixl_root.iterdir()) == sorted(["3c", new])
    assert sorted(p.name for p in (t.nixl_root / new).iterdir()) == BUCKETS and nixl_files(t.nixl_root / new) == before
    assert len(nixl_files(t.nixl_root)) == 12 + 2  # the namespace in use and the bucket without one: untouched
    assert cli_json("l3", "--inventory", str(path), "--prune", "--min-age", "0")["tiers"][0]["would_remove"] == []


def test_verify_l3_proves_nixl_pages_come_back_from_the_shared_tier_after_a_restart(nixl_tier):
    t = nixl_tier
    path, new = t.nixl["new"]
    before = nixl_pages(t.nixl_root / new)
    report = cli_json("verify", "--inventory", str(path), "--l3")
    assert report["l3"] is True
    ring = {h: t.sorted[i - 1] for i, h in enumerate(t.sorted)}
    for host, writer in ring.items():
        checks = {c["check"]: c for c in report["hosts"][host]["checks"]}
        assert report["hosts"][host]["ok"], report["hosts"][host]
        assert checks["restart"]["status"] == "pass" and checks["L3 write"]["detail"].endswith(f"written to L3 by {writer}")
        hit = checks["L3 hit across servers"]
        assert hit["status"] == "pass" and hit["detail"].endswith(f"written by {writer}"), hit
        assert int(hit["detail"].split()[0]) >= 4 * 16  # at least the proof's 4 pages, read by HiCacheNixl from the tier
    after = nixl_pages(t.nixl_root / new)  # the proofs' pages: NIXL's names and layout too
    assert set(before) < set(after) and len(after) >= len(before) + 2 * 4
    row = next(r for r in cli_json("l3", "--inventory", str(path))["tiers"][0]["namespaces"] if r["namespace"] == new)
    assert row["pages"] == len(after) and row["bytes"] == len(after) * PAGE_BYTES


def test_the_tier_collector_evicts_whole_nixl_pages_across_their_buckets(nixl_tier, tmp_path):
    """#35: the L3 tier's collector (roles/sglang_server/files/hicache-l3-collect) on what HiCacheNixl wrote: a budget
    of half the namespace's pages leaves at most half, each kept page with both its _k and _v parts (nixl_pages checks
    every file's name, bucket and part), never the bucket directories, nor the page without a namespace ("3c")."""
    import subprocess
    import sys
    import time

    from hicachectl.plans import l3_collector

    t = nixl_tier
    _, new = t.nixl["new"]
    pages = nixl_pages(t.nixl_root / new)
    outside = nixl_files(t.nixl_root / "3c")
    past = time.time() - 3600  # past the collector's grace for pages just written
    for p in t.nixl_root.rglob("*"):
        os.utime(p, (past, past))
    keep = len(pages) // 2
    config = {"tier": "l3-nixl", "root": str(t.nixl_root), "budget_bytes": keep * PAGE_BYTES + PAGE_BYTES, "free_floor_pct": 0,
              "grace_seconds": 120, "namespaces": {new: {"share_pct": None, "servers": t.sorted}}, "state_file": str(tmp_path / "state.json")}
    (tmp_path / "c.json").write_text(json.dumps(config))
    run = subprocess.run([sys.executable, str(l3_collector.PROGRAM_SOURCE), "--config", str(tmp_path / "c.json"), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout.splitlines()[-1])
    left = nixl_pages(t.nixl_root / new)  # every page left whole: both parts, NIXL's names and buckets
    assert set(left) < set(pages) and len(left) <= keep and report["removed"][new]["pages"] == len(pages) - len(left)
    # and no page more than the budget needs: what is left (the namespace's files on disk, with everything else on the
    # tier) is within it, and one page more would not be
    held = sum(p.stat().st_size for p in (t.nixl_root / new).rglob("*") if p.is_file())
    assert report["bytes"][new] == held == len(left) * PAGE_BYTES and report["total_bytes"] == held + report["other_bytes"], report
    assert report["total_bytes"] <= config["budget_bytes"] < report["total_bytes"] + PAGE_BYTES, report
    assert sorted(p.name for p in (t.nixl_root / new).iterdir()) == BUCKETS and nixl_files(t.nixl_root / "3c") == outside
