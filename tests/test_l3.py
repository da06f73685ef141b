"""hicachectl l3's decisions (hicachectl/ops/l3.py) and the module that lists and prunes a tier's namespaces
(plugins/modules/hicache_l3_namespaces.py, its functions on a tmp dir and as Ansible runs it)."""

from __future__ import annotations

import base64
import errno
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest
from support import ROOT, cli

from hicachectl import rules
from hicachectl.config import namespace, schema
from hicachectl.config.deployment import PREFIX
from hicachectl.ops import l3
from hicachectl.plans import sglang_server

MODULE_PATH = ROOT / "plugins/modules/hicache_l3_namespaces.py"
_spec = importlib.util.spec_from_file_location("hicache_l3_namespaces_under_test", MODULE_PATH)
mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mod)

BASE = {"hicache_model_path": "/models/m", "hicache_served_model_name": "qwen3-8b", "hicache_storage_backend": "file",
        "hicache_cache_dir": "/mnt/l3", "hicache_page_size": 64, "hicache_image": "lmsysorg/sglang:v0.5.21-cu129"}


def deployment(host="h1", **overrides):
    d, findings = rules.check_host(host, {**BASE, **overrides})
    assert d is not None and not rules.has_errors(findings), [f.format() for f in findings]
    return d


def module_run(path, state="listed", names=(), keep=(), check_mode=False) -> dict:
    """The module as Ansible runs it: a fresh Python process given its arguments."""
    args = {"path": str(path), "state": state, "names": list(names), "keep": list(keep), "_ansible_check_mode": check_mode}
    args_file = path.parent / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    proc = subprocess.run([sys.executable, str(MODULE_PATH), str(args_file)], capture_output=True, text=True, timeout=60)
    return json.loads(proc.stdout)


def pages(directory, count, size=3, mtime=None):
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        page = directory / f"page-{i}"
        page.write_text("k" * size)
        if mtime is not None:
            os.utime(page, (mtime, mtime))


# --- the module ------------------------------------------------------------------------------------------

def test_the_module_carries_the_catalogues_namespace_form_and_the_derived_form():
    assert mod.NAMESPACE_FORM.pattern == schema.BY_NAME["hicache_l3_namespace"].domain.pattern == l3.NAME_FORM.pattern
    assert mod.DERIVED_FORM.pattern == namespace._DERIVED.pattern == r"[a-z0-9][a-z0-9._-]{0,40}-[0-9a-f]{12}"
    name = namespace.of(deployment())
    assert mod.is_derived(name) and namespace.is_derived(name)
    for literal in ("models", "backup", "cfg", "team-a", "00", "ff", "lost+found", "qwen3-8b-ABCDEF012345"):
        assert not mod.is_derived(literal) and not namespace.is_derived(literal)


def test_listing_sums_each_subdirectory_without_following_symlinks_and_the_top_level_apart(tmp_path):
    root = tmp_path / "l3"
    pages(root / "qwen3-8b-aaaaaaaaaaaa", 3, size=5, mtime=1_700_000_000)
    pages(root / "qwen3-8b-aaaaaaaaaaaa" / "deeper", 2, size=7, mtime=1_700_000_100)
    outside = tmp_path / "outside"
    pages(outside, 50, size=1000)
    os.symlink(outside, root / "qwen3-8b-aaaaaaaaaaaa" / "link")  # inside a namespace: not followed
    os.symlink(outside, root / "linked-namespace")  # at the top: not a namespace, not followed
    pages(root, 2, size=11, mtime=1_700_000_200)  # pages of a server with namespace off
    os.utime(root / "qwen3-8b-aaaaaaaaaaaa" / "page-1", (1_700_000_900, 1_700_000_000))  # read after the last write
    (root / "lost+found").mkdir()
    listed = mod.listing(str(root))
    assert listed["exists"] is True
    by_name = {e["name"]: e for e in listed["entries"]}
    assert set(by_name) == {"qwen3-8b-aaaaaaaaaaaa", "lost+found"}
    assert by_name["qwen3-8b-aaaaaaaaaaaa"] | {} == {"name": "qwen3-8b-aaaaaaaaaaaa", "bytes": 3 * 5 + 2 * 7, "files": 5,
                                                    "pages": 5, "newest": 1_700_000_100, "newest_read": 1_700_000_900,
                                                    "namespace_form": True, "derived": True, "errors": 0, "mounts": 0}
    assert by_name["lost+found"]["namespace_form"] is False
    # pages written and never read since (atime at creation, mtime later or equal): no read
    assert listed["top"] == {"bytes": 22, "files": 2, "pages": 2, "newest": 1_700_000_200, "newest_read": None, "other": 1}


def test_pages_are_counted_not_files_on_sglangs_layouts_of_both_backends(tmp_path):
    """SGLang 0.5.23's names (mem_cache/hicache_storage.py, storage/nixl/hicache_nixl.py): a page of a TP 2 server is two
    `.bin` files for HiCacheFile and four `_k`/`_v` files in bucket directories for HiCacheNixl (page_first); a
    `.<uuid>.tmp` being written is no page. `l3` shows 3 pages for each, not 6 or 12 files."""
    keys = [f"{i:064x}" for i in (1, 2, 3)]
    file_ns = tmp_path / "l3" / "qwen3-8b-aaaaaaaaaaaa"
    file_ns.mkdir(parents=True)
    for key in keys:
        for rank in (0, 1):
            (file_ns / f"{key}_qwen3-8b_{rank}_2.bin").write_bytes(b"x" * 8)
    (file_ns / ".0123abcd.tmp").write_bytes(b"x")
    nixl_ns = tmp_path / "l3" / "qwen3-8b-bbbbbbbbbbbb"
    for n, key in enumerate(keys):
        for rank in (0, 1):
            for part in "kv":
                bucket = nixl_ns / f"{(n * 4 + rank * 2 + (part == 'v')):02x}"
                bucket.mkdir(parents=True, exist_ok=True)
                (bucket / f"{key}_qwen3-8b_{rank}_2_{part}").write_bytes(b"x" * 4)
    listed = mod.listing(str(tmp_path / "l3"))
    by_name = {e["name"]: e for e in listed["entries"]}
    assert (by_name[file_ns.name]["files"], by_name[file_ns.name]["pages"]) == (7, 3)
    assert (by_name[nixl_ns.name]["files"], by_name[nixl_ns.name]["pages"]) == (12, 3)
    tier = l3.Tier(name="t", shared=False, hosts=("a",), root=str(tmp_path / "l3"))
    rows = {r.namespace: r for r in l3.rows(tier, listed, {})}
    assert rows[file_ns.name].pages == 3 and rows[nixl_ns.name].pages == 3


def test_listing_a_directory_that_does_not_exist(tmp_path):
    listed = mod.listing(str(tmp_path / "absent"))
    assert listed.pop("now") > 0
    assert listed == {"exists": False, "path": str(tmp_path / "absent"), "entries": [], "top": {"bytes": 0, "files": 0, "pages": 0, "newest": None, "newest_read": None, "other": 0}}


def test_prune_removes_only_what_it_may_and_says_why_for_the_rest(tmp_path):
    root = tmp_path / "l3"
    literals = ("lost+found", "models", "backup", "team-a", "00", "ff")
    for name in ("old-aaaaaaaaaaaa", "inuse-bbbbbbbbbbbb", *literals):
        pages(root / name, 2)
    (root / "afile-aaaaaaaaaaaa").write_text("x")
    os.symlink(root / "inuse-bbbbbbbbbbbb", root / "alias-aaaaaaaaaaaa")
    removed, refused, errors = mod.prune(str(root), ["old-aaaaaaaaaaaa", "inuse-bbbbbbbbbbbb", *literals, "afile-aaaaaaaaaaaa",
                                                     "alias-aaaaaaaaaaaa", "absent-aaaaaaaaaaaa", "..", "../l3", ""],
                                         keep=["inuse-bbbbbbbbbbbb"])
    assert removed == ["old-aaaaaaaaaaaa"] and errors == []
    literal = "not a name auto derives (a literal namespace or another directory): never removed"
    assert {r["name"]: r["reason"] for r in refused} == {
        "inuse-bbbbbbbbbbbb": "in use by a server of the inventory", **dict.fromkeys(literals, literal),
        "afile-aaaaaaaaaaaa": "not a directory", "alias-aaaaaaaaaaaa": "a symlink (not followed)", "absent-aaaaaaaaaaaa": "not there",
        "..": literal, "../l3": literal, "": literal}
    assert sorted(p.name for p in root.iterdir()) == sorted(["afile-aaaaaaaaaaaa", "alias-aaaaaaaaaaaa", "inuse-bbbbbbbbbbbb", *literals])
    assert all(len(list((root / name).iterdir())) == 2 for name in ("inuse-bbbbbbbbbbbb", *literals))


def test_the_module_in_check_mode_removes_nothing_and_then_removes_as_asked(tmp_path):
    root = tmp_path / "l3"
    pages(root / "old-aaaaaaaaaaaa", 2)
    pages(root / "new-bbbbbbbbbbbb", 1)
    dry = module_run(root, "pruned", names=["old-aaaaaaaaaaaa", "new-bbbbbbbbbbbb"], keep=["new-bbbbbbbbbbbb"], check_mode=True)
    assert dry["removed"] == ["old-aaaaaaaaaaaa"] and dry["changed"] is True
    assert (root / "old-aaaaaaaaaaaa").is_dir()
    done = module_run(root, "pruned", names=["old-aaaaaaaaaaaa", "new-bbbbbbbbbbbb"], keep=["new-bbbbbbbbbbbb"])
    assert done["removed"] == ["old-aaaaaaaaaaaa"] and not done.get("failed")
    assert [e["name"] for e in done["entries"]] == ["new-bbbbbbbbbbbb"]  # the listing after the removal
    assert not (root / "old-aaaaaaaaaaaa").exists() and (root / "new-bbbbbbbbbbbb" / "page-0").exists()
    again = module_run(root, "pruned", names=["old-aaaaaaaaaaaa"])
    assert again["changed"] is False and again["refused"] == [{"name": "old-aaaaaaaaaaaa", "reason": "not there"}]
    listed = module_run(root)
    assert listed["changed"] is False and listed["removed"] == [] and listed["entries"][0]["files"] == 1


def test_a_removal_that_fails_is_reported_and_the_others_go_on(tmp_path, monkeypatch):
    root = tmp_path / "l3"
    pages(root / "busy-aaaaaaaaaaaa", 1)
    pages(root / "old-bbbbbbbbbbbb", 1)
    real = mod.os.unlink

    def unlink(path, *args, **kwargs):  # a page busy on NFS: the removal fails part-way
        if kwargs.get("dir_fd") is not None and os.readlink(f"/proc/self/fd/{kwargs['dir_fd']}").endswith("busy-aaaaaaaaaaaa"):
            raise OSError(16, "Device or resource busy", path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(mod.os, "unlink", unlink)
    removed, refused, errors = mod.prune(str(root), ["busy-aaaaaaaaaaaa", "old-bbbbbbbbbbbb"], keep=[])
    assert removed == ["old-bbbbbbbbbbbb"] and refused == []
    assert errors[0]["name"] == "busy-aaaaaaaaaaaa" and "Device or resource busy" in errors[0]["reason"]
    assert (root / "busy-aaaaaaaaaaaa").is_dir() and not (root / "old-bbbbbbbbbbbb").exists()


# --- the core's decisions ----------------------------------------------------------------------------------

def test_tiers_group_hosts_by_share_and_leave_out_what_has_no_files():
    deployments = {"a": deployment("a", hicache_l3_share="vast"), "b": deployment("b", hicache_l3_share="vast"),
                   "c": deployment("c"), "d": deployment("d", hicache_storage_backend=None),
                   "e": deployment("e", hicache_storage_backend="dynamic",
                                   hicache_extra_config={"backend_name": "x", "module_path": "m.x", "class_name": "X"}),
                   "f": deployment("f", hicache_l3_share="vast", hicache_l3_namespace="off")}
    tiers, left_out = l3.tiers(deployments)
    assert [(t.name, t.shared, t.hosts, t.root, t.off_hosts) for t in tiers] == [
        ("vast", True, ("a", "b", "f"), "/mnt/l3", ("f",)), ("c", False, ("c",), "/mnt/l3", ())]
    assert set(left_out) == {"d", "e"} and "not in files" in left_out["e"]
    assert l3.reader_order(tiers[0], ["b", "f", "c"]) == ["b", "f"]


def test_rows_prune_only_unused_namespaces_never_top_level_pages_or_other_names():
    auto, fp8 = deployment("a"), deployment("b", hicache_kv_cache_dtype="fp8_e4m3")
    assert namespace.of(auto) != namespace.of(fp8)
    used = l3.in_use({"a": auto, "b": fp8})
    tier = l3.Tier("a", False, ("a",), "/mnt/l3")
    old = namespace.of(deployment("a", hicache_page_size=32))
    listing = {"entries": [{"name": namespace.of(auto), "bytes": 10, "files": 2, "newest": 1.0},
                           {"name": namespace.of(fp8), "bytes": 10, "files": 2, "newest": 1.0},
                           {"name": old, "bytes": 30, "files": 3, "newest": 2.0, "newest_read": 7.0},
                           {"name": "my-literal", "bytes": 1, "files": 1, "newest": 3.0},
                           {"name": "half-read-aaaaaaaaaaaa", "bytes": 1, "files": 1, "newest": 3.0, "errors": 2},
                           {"name": "lost+found", "bytes": 0, "files": 0, "newest": None}],
               "top": {"bytes": 5, "files": 1, "newest": 4.0}}
    rows = {r.namespace: r for r in l3.rows(tier, listing, used)}
    assert rows[namespace.of(auto)].state == l3.IN_USE and rows[namespace.of(auto)].used_by == ("a",)
    assert rows[namespace.of(fp8)].state == l3.IN_USE_ELSEWHERE and rows[namespace.of(fp8)].used_by == ("b",)
    assert rows["lost+found"].state == l3.NOT_A_NAMESPACE and rows[l3.NO_NAMESPACE].state == l3.TOP_LEVEL
    assert rows["half-read-aaaaaaaaaaaa"].state == l3.UNUSED and not rows["half-read-aaaaaaaaaaaa"].prune
    assert rows["my-literal"].state == l3.UNUSED and not rows["my-literal"].prune and "never pruned" in rows["my-literal"].why_kept
    assert [r.namespace for r in l3.prunable(rows.values())] == [old]
    assert rows[old].cells() == ["a", old, "30 B", "3", "1970-01-01 00:00:02Z", "1970-01-01 00:00:07Z", "unused"]
    assert rows[old].as_dict()["last_read"] == "1970-01-01 00:00:07Z" and rows["my-literal"].as_dict()["last_read"] is None
    assert rows["my-literal"].cells()[5] == "-"  # an older module's listing without atimes


def test_on_a_tier_with_a_namespace_off_server_only_derived_names_are_pruned():
    off = deployment("a", hicache_l3_namespace="off", hicache_l3_share="t")
    tier = l3.tiers({"a": off, "b": deployment("b", hicache_l3_share="t")})[0][0]
    derived = namespace.of(deployment("x", hicache_page_size=16))
    listing = {"entries": [{"name": derived, "bytes": 1, "files": 1, "newest": 1.0},
                           {"name": "backups", "bytes": 1, "files": 1, "newest": 1.0}], "top": {"files": 4, "bytes": 8, "newest": 2.0}}
    rows = {r.namespace: r for r in l3.rows(tier, listing, l3.in_use({"a": off, "b": deployment("b", hicache_l3_share="t")}))}
    assert rows[derived].prune and not rows["backups"].prune and "not a name auto derives" in rows["backups"].why_kept
    assert rows[l3.NO_NAMESPACE].used_by == ("a",) and not rows[l3.NO_NAMESPACE].prune


def test_describe_names_the_namespace_and_what_it_comes_from_or_warns_when_off():
    line = l3.describe(deployment(hicache_kv_cache_dtype="fp8_e4m3"))
    assert line.startswith(f"L3 namespace: {namespace.of(deployment(hicache_kv_cache_dtype='fp8_e4m3'))} (")
    assert "KV dtype fp8_e4m3" in line and "page size 64" in line and "model qwen3-8b" in line
    assert "would be read as valid" in l3.describe(deployment(hicache_l3_namespace="off"))
    assert l3.describe(deployment(hicache_l3_namespace="mine")).startswith("L3 namespace: mine (set by hicache_l3_namespace")
    assert l3.describe(deployment(hicache_storage_backend=None)).startswith("L3 namespace: none")


def test_the_report_fact_is_public_and_not_a_variable():
    assert "hicache_l3_report" in schema.FACTS and "hicache_l3_report" not in schema.BY_NAME
    assert PREFIX == "hicache_"


# --- what is never pruned --------------------------------------------------------------------------------

def test_unused_literal_namespaces_and_other_directories_are_listed_and_kept_with_the_reason():
    tier = l3.Tier("a", False, ("a",), "/mnt/l3")
    derived = namespace.of(deployment("a", hicache_page_size=32))
    names = ["models", "backup", "cfg", "team-a", derived, "lost+found"]
    listing = {"entries": [{"name": n, "bytes": 1, "files": 1, "newest": 1.0} for n in names], "top": {}}
    rows = {r.namespace: r for r in l3.rows(tier, listing, l3.in_use({"a": deployment("a")}))}
    assert [r.namespace for r in l3.prunable(rows.values())] == [derived]
    for name in ("models", "backup", "cfg", "team-a"):
        assert rows[name].state == l3.UNUSED and not rows[name].prune
        assert rows[name].cells()[-1].startswith("unused - kept: not a name auto derives")
    assert rows["lost+found"].state == l3.NOT_A_NAMESPACE and not rows["lost+found"].prune


def test_a_servers_model_base_or_cfg_directory_is_never_pruned_nor_what_holds_or_lies_in_one():
    weights, holder, base = "weights-0123456789ab", "holder-0123456789ab", "base-0123456789ab"
    deployments = {"a": deployment("a", hicache_model_dir=f"/mnt/l3/{weights}", hicache_cfg_dir=f"/mnt/l3/{holder}/cfg"),
                   "b": deployment("b", hicache_cache_dir="/srv/l3", hicache_base_dir=f"/srv/x/../l3/{base}"),
                   "c": deployment("c", hicache_cache_dir="/opt/sglang-hicache/l3")}  # inside the default hicache_base_dir
    paths = l3.protected(deployments)
    assert (f"/srv/l3/{base}", "hicache_base_dir", "b") in paths  # normalised
    tiers = {t.name: t for t in l3.tiers(deployments)[0]}
    free = namespace.of(deployment("a", hicache_page_size=32))
    listing = {"entries": [{"name": n, "bytes": 1, "files": 1, "newest": 1.0} for n in (weights, holder, base, free)], "top": {}}
    rows = {r.namespace: r for r in l3.rows(tiers["a"], listing, {}, paths=paths)}
    assert rows[weights].why_kept == "it is hicache_model_dir of a: never pruned"
    assert rows[holder].why_kept == f"it holds hicache_cfg_dir of a (/mnt/l3/{holder}/cfg): never pruned"
    assert [r.namespace for r in l3.prunable(rows.values())] == [base, free]  # b's base dir is on another tier's root
    assert [r.namespace for r in l3.prunable(l3.rows(tiers["b"], listing, {}, paths=paths))] == [weights, holder, free]
    inside = l3.rows(tiers["c"], listing, {}, paths=paths)
    assert not l3.prunable(inside) and all("lies inside hicache_base_dir of a (/opt/sglang-hicache)" in r.why_kept for r in inside)


def test_the_module_refuses_a_protected_directory_resolved_on_the_host(tmp_path):
    root = tmp_path / "l3"
    for name in ("is-0123456789ab", "holds-0123456789ab", "linked-0123456789ab", "free-0123456789ab"):
        pages(root / name, 1)
    os.symlink(root / "linked-0123456789ab", tmp_path / "model-link")  # the model dir as the inventory names it: a symlink
    protect = [str(root / "is-0123456789ab"), str(root / "holds-0123456789ab" / "cfg"), str(tmp_path / "model-link")]
    names = ["is-0123456789ab", "holds-0123456789ab", "linked-0123456789ab", "free-0123456789ab"]
    removed, refused, _ = mod.prune(str(root), names, keep=[], protect=protect)
    assert removed == ["free-0123456789ab"]
    reasons = {r["name"]: r["reason"] for r in refused}
    assert reasons["is-0123456789ab"].startswith("it is ") and reasons["holds-0123456789ab"].startswith("it holds ")
    assert reasons["linked-0123456789ab"] == f"it is {tmp_path / 'model-link'} (a server's model, base or cfg directory)"
    removed, refused, _ = mod.prune(str(root), names[:3], keep=[], protect=[str(tmp_path)])  # the tier inside a base dir
    assert removed == [] and [r["reason"] for r in refused] == [f"it lies inside {tmp_path} (a server's model, base or cfg directory)"] * 3


def test_nixl_bucket_directories_are_pages_without_a_namespace_never_namespaces():
    tier = l3.Tier("a", False, ("a",), "/mnt/l3", off_hosts=("a",))
    buckets = [f"{i:02x}" for i in range(256)]
    listing = {"entries": [{"name": b, "bytes": 10, "files": 2, "newest": float(i)} for i, b in enumerate(buckets)]
               + [{"name": "0A", "bytes": 1, "files": 1, "newest": 1.0}, {"name": "000", "bytes": 1, "files": 1, "newest": 1.0}],
               "top": {"bytes": 5, "files": 1, "newest": 7.0}}
    rows = {r.namespace: r for r in l3.rows(tier, listing, {})}
    assert set(rows) == {l3.NO_NAMESPACE, "0A", "000"}  # not 256 namespace rows
    top = rows[l3.NO_NAMESPACE]
    assert (top.pages, top.bytes, top.last_use, top.state, top.used_by) == (513, 2565, 255.0, l3.TOP_LEVEL, ("a",))
    assert not l3.prunable(rows.values())
    only_buckets = l3.rows(tier, {"entries": listing["entries"][:3], "top": {}}, {})  # nixl writes no top-level file
    assert [(r.namespace, r.pages) for r in only_buckets] == [(l3.NO_NAMESPACE, 6)]


def deployed_report(record=None, exists=True, error=""):
    """What the l3 playbook records of a server's deployed.json (hicache_l3_report.running)."""
    content = base64.b64encode(json.dumps(record).encode()).decode() if record is not None else ""
    return {"exists": exists, "content": content, "error": error}


def test_what_each_server_runs_is_read_from_its_deployed_json_and_a_server_not_read_is_unknown():
    d = deployment("a", hicache_kv_cache_dtype="fp8_e4m3")
    record = sglang_server.deployed(d, [])
    assert record["l3_namespace"] == namespace.of(d) and record["l3_dir"] == namespace.host_dir(d)
    runs, unknown = l3.running({"a": deployed_report(record), "b": deployed_report({"l3_namespace": namespace.of(d)}),
                                "c": deployed_report({"l3_namespace": None}),  # namespace off
                                "d": deployed_report(exists=False),  # ran nothing
                                "e": "not read: unreachable: ssh: connect to host e port 22: Connection refused",
                                "f": None, "g": deployed_report({"config_hash": "abc"}),
                                "h": {"exists": True, "content": "!!", "error": ""},
                                "i": deployed_report(exists=True, error="file is not readable")})
    assert runs == {namespace.of(d): ["a", "b"]}
    assert set(unknown) == {"e", "f", "g", "h", "i"}
    assert "Connection refused" in unknown["e"] and "older" in unknown["g"] and "not readable" in unknown["i"]


def test_prune_keeps_what_a_server_runs_holds_a_tier_not_checked_and_keeps_recent_pages():
    edited = deployment("a", hicache_kv_cache_dtype="fp8_e4m3")  # the inventory after an edit, not yet deployed
    runs_now = namespace.of(deployment("a"))  # what the server writes into until the next deploy
    old, fresh = namespace.of(deployment("a", hicache_page_size=32)), namespace.of(deployment("a", hicache_page_size=16))
    tier = l3.tiers({"a": edited})[0][0]
    now = 1_800_000_000.0
    listing = {"entries": [{"name": runs_now, "bytes": 1, "files": 1, "newest": now - 90_000},
                           {"name": old, "bytes": 1, "files": 1, "newest": now - 90_000},
                           {"name": fresh, "bytes": 1, "files": 1, "newest": now - 600}], "top": {}}
    used = l3.in_use({"a": edited})
    rows = {r.namespace: r for r in l3.rows(tier, listing, used, runs={runs_now: ["a"]}, min_age=24 * 3600, now=now)}
    assert rows[runs_now].state == l3.RUNNING and rows[runs_now].used_by == ("a",) and not rows[runs_now].prune
    assert "running it" in rows[runs_now].cells()[-1]
    assert rows[fresh].why_kept == "written 10 min ago: a server may still use it"
    assert [r.namespace for r in l3.prunable(rows.values())] == [old]
    assert [r.namespace for r in l3.prunable(l3.rows(tier, listing, used, runs={runs_now: ["a"]}, now=now))] == [old, fresh]
    held = l3.rows(tier, listing, used, unchecked={"a": "not read: unreachable"}, now=now)
    assert not l3.prunable(held)
    assert all("not checked what a runs (not read: unreachable)" in r.why_kept for r in held)


def test_the_playbooks_guard_keeps_what_runs_and_holds_the_tier_of_a_server_not_read():
    spec = importlib.util.spec_from_file_location("hicache_l3_filter_under_test", ROOT / "plugins/filter/l3.py")
    filters = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(filters)
    old = namespace.of(deployment("a"))
    server = {**BASE, "group_names": ["hicache_servers"]}
    hostvars = {"a": {**server, "hicache_l3_share": "t", "hicache_kv_cache_dtype": "fp8_e4m3",
                      "hicache_l3_report": {"running": deployed_report({"l3_namespace": old})}},
                "b": {**server, "hicache_l3_share": "t", "hicache_kv_cache_dtype": "fp8_e4m3"},  # unreachable: nothing read
                "c": {**server, "hicache_l3_report": {"running": deployed_report(exists=False)}},
                "r": {"group_names": ["hicache_routers"]}}
    guard = filters.hicache_l3_guard(hostvars, ["a", "b", "c", "r"])
    assert set(guard["keep"]) == {old, namespace.of(deployment("a", hicache_kv_cache_dtype="fp8_e4m3"))}
    assert set(guard["hold"]) == {"a", "b"} and "not checked what b runs" in guard["hold"]["a"]
    assert guard["protect"] == ["/opt/sglang-hicache", "/opt/sglang-hicache/cfg"]
    # what runs is read where the server role writes it (sglang_server.record_paths), a trailing slash or not
    for cfg in ("/opt/sglang-hicache/cfg", "/srv/cfg/"):
        variables = {**BASE, "hicache_cfg_dir": cfg}
        assert filters.hicache_l3_running_record(variables, "a") == cfg.rstrip("/") + "/deployed.json"


def test_the_module_holds_keeps_recent_pages_and_checks_the_form_first(tmp_path):
    root = tmp_path / "l3"
    pages(root / "old-0123456789ab", 1, mtime=1_700_000_000)
    pages(root / "fresh-0123456789ab", 1)
    removed, refused, _ = mod.prune(str(root), ["old-0123456789ab", "models"], keep=[], hold="not checked what b runs")
    assert removed == [] and {r["name"]: r["reason"] for r in refused} == {
        "old-0123456789ab": "not checked what b runs",
        "models": "not a name auto derives (a literal namespace or another directory): never removed"}
    removed, refused, _ = mod.prune(str(root), ["old-0123456789ab", "fresh-0123456789ab"], keep=[], min_age=3600)
    assert removed == ["old-0123456789ab"] and refused[0]["name"] == "fresh-0123456789ab"
    assert refused[0]["reason"].startswith("written 0 min ago")


UNSHARE = shutil.which("unshare")
MOUNTED = r"""
import importlib.util, json, os, subprocess, sys
spec = importlib.util.spec_from_file_location("m", sys.argv[1]); mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
root = sys.argv[2]
def run(*a): subprocess.run(a, check=True)
run("mount", "-t", "tmpfs", "none", f"{root}/holds-0123456789ab/mnt")  # another filesystem inside a namespace
open(f"{root}/holds-0123456789ab/mnt/theirs", "w").write("x")
run("mount", "-t", "tmpfs", "none", f"{root}/is-0123456789ab")  # a namespace that is a mount point
open(f"{root}/is-0123456789ab/theirs", "w").write("x")
run("mount", "--bind", f"{root}/../elsewhere", f"{root}/bind-0123456789ab/data")  # same filesystem: st_dev cannot tell
listed = {e["name"]: e["mounts"] for e in mod.listing(root)["entries"]}
removed, refused, errors = mod.prune(root, ["holds-0123456789ab", "is-0123456789ab", "bind-0123456789ab", "free-0123456789ab"], keep=[])
try:
    mod.remove_tree(f"{root}/holds-0123456789ab")  # the removal itself, asked directly: stops at the mount
    crossed = None
except OSError as exc:
    crossed = exc.errno
print(json.dumps({"listed": listed, "removed": removed, "refused": refused, "errors": errors, "crossed": crossed,
                  "theirs": os.path.exists(f"{root}/holds-0123456789ab/mnt/theirs"),
                  "walk": mod.walk(f"{root}/holds-0123456789ab")[4]}))
"""


def test_a_namespace_that_is_or_holds_a_mount_point_is_never_removed_nor_entered(tmp_path):
    """Real mounts in a private mount namespace (unshare): a tmpfs inside a namespace, a tmpfs as a namespace, a bind mount."""
    root = tmp_path / "l3"
    for name in ("holds-0123456789ab/mnt", "is-0123456789ab", "bind-0123456789ab/data", "free-0123456789ab"):
        (root / name).mkdir(parents=True)
    pages(root / "holds-0123456789ab", 2)
    pages(root / "free-0123456789ab", 1)
    pages(tmp_path / "elsewhere", 3)
    # No skip: the mount-point refusal is a data-loss guard; a machine that cannot show it fails this test.
    assert UNSHARE is not None, "unshare (util-linux) is needed to check the mount-point refusal"
    args = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    proc = subprocess.run([UNSHARE, *args, "--mount", "--propagation", "private", sys.executable, "-c", MOUNTED, str(MODULE_PATH), str(root)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["removed"] == ["free-0123456789ab"] and got["errors"] == []
    assert {r["name"]: r["reason"] for r in got["refused"]} == dict.fromkeys(
        ["holds-0123456789ab", "is-0123456789ab", "bind-0123456789ab"], "a mount point or holds one")
    assert got["listed"]["holds-0123456789ab"] >= 1 and got["listed"]["is-0123456789ab"] >= 1 and got["listed"]["bind-0123456789ab"] >= 1
    assert got["walk"] == 1  # st_dev while walking: the tmpfs is seen, not entered
    assert got["crossed"] == errno.EXDEV and got["theirs"] is True
    assert sorted(p.name for p in (tmp_path / "elsewhere").iterdir()) == ["page-0", "page-1", "page-2"]


# --- the CLI, without hosts ----------------------------------------------------------------------------------

def test_validate_explains_each_servers_namespace_and_off(tmp_path):
    proc = cli("validate", "-i", "local", check_rc=0)
    assert "localhost: L3 namespace: " in proc.stdout and "KV dtype auto" in proc.stdout
    report = json.loads(cli("validate", "-i", "vast", "--json", check_rc=1).stdout)  # refused: the profile's placeholders
    assert all(e["off"] and e["namespace"] is None and "would be read as valid" in e["line"] for e in report["l3_namespaces"].values())


def test_yes_without_prune_is_a_usage_error():
    proc = cli("l3", "-i", "local", "--yes")
    assert proc.returncode == 2 and "--yes goes with --prune" in proc.stderr


def test_a_limit_matching_no_server_is_a_usage_error_not_an_empty_success(tmp_path):
    import yaml

    inventory = local_inventory(tmp_path, tmp_path / "l3")
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    hosts["all"]["children"]["hicache_routers"] = {"hosts": {"router-1": {"ansible_connection": "local"}}}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    router = cli("l3", "-i", str(inventory), "--limit", "router-1")
    assert router.returncode == 2 and "--limit 'router-1' matches no server" in router.stderr and "router" in router.stderr
    nothing = cli("l3", "-i", str(inventory), "--limit", "nothere", "--prune")
    assert nothing.returncode == 2 and "--limit 'nothere' matches no server" in nothing.stderr
    assert router.stdout == nothing.stdout == ""


def test_a_negative_min_age_is_a_usage_error():
    proc = cli("l3", "-i", "local", "--prune", "--min-age", "-1")
    assert proc.returncode == 2 and "--min-age -1: hours, 0 or more" in proc.stderr


def local_inventory(tmp_path, cache_dir, **overrides):
    """The shipped `local` inventory (this machine, connection local) with its L3 tier in `cache_dir`."""
    import shutil

    import yaml

    path = tmp_path / "inv"
    if path.exists():
        shutil.rmtree(path)
    shutil.copytree(ROOT / "inventories/local", path)
    variables = yaml.safe_load((path / "group_vars/all.yml").read_text())
    variables.update({"hicache_cache_dir": str(cache_dir), "hicache_served_model_name": "qwen3-8b", **overrides})
    (path / "group_vars/all.yml").write_text(yaml.safe_dump(variables))
    return path


@pytest.mark.slow  # ten CLI runs and one of the l3 playbook (about a minute)
def test_l3_on_this_machine_lists_both_configs_and_prunes_only_the_old_one(tmp_path):
    """Two configs on one tier (KV dtype auto, then fp8_e4m3), through the real playbook on this machine; what the
    server runs (deployed.json in its cfg dir), a recent namespace, a literal one and nixl's buckets are kept."""
    cache, base = tmp_path / "l3", tmp_path / "base"
    old_inventory = local_inventory(tmp_path, cache, hicache_base_dir=str(base))
    old = json.loads(cli("validate", "-i", str(old_inventory), "--json", check_rc=0).stdout)["l3_namespaces"]["localhost"]["namespace"]
    new_inventory = local_inventory(tmp_path, cache, hicache_base_dir=str(base), hicache_kv_cache_dtype="fp8_e4m3")
    new = json.loads(cli("validate", "-i", str(new_inventory), "--json", check_rc=0).stdout)["l3_namespaces"]["localhost"]["namespace"]
    fresh = namespace.of(deployment("localhost", hicache_page_size=16))  # unused, a page written just now
    assert old and new and old != new and namespace.is_derived(fresh)
    pages(cache / old, 3, mtime=1_700_000_000)
    pages(cache / new, 2)
    pages(cache / fresh, 1)
    pages(cache / "models", 2, mtime=1_700_000_000)  # a literal name: never pruned
    pages(cache / "3f", 4, mtime=1_700_000_000)  # a bucket of the nixl backend with the namespace off
    pages(cache, 1)  # a page written without a namespace
    listed = json.loads(cli("l3", "-i", str(new_inventory), "--json", check_rc=0).stdout)
    rows = {r["namespace"]: r for r in listed["tiers"][0]["namespaces"]}
    assert rows[old]["state"] == l3.UNUSED and rows[old]["pages"] == 3 and rows[old]["last_use"] == "2023-11-14 22:13:20Z"
    assert rows[new]["state"] == l3.IN_USE and rows[new]["used_by"] == ["localhost"] and rows[new]["pages"] == 2
    assert rows[l3.NO_NAMESPACE]["pages"] == 5 and "3f" not in rows
    assert not rows["models"]["prune"] and "not a name auto derives" in rows["models"]["why_kept"]

    # The server still runs the old config (the inventory was edited, not deployed): its namespace is kept.
    (base / "cfg").mkdir(parents=True)
    (base / "cfg" / "deployed.json").write_text(json.dumps({"config_hash": "x", "l3_namespace": old, "l3_dir": str(cache / old)}))
    running = json.loads(cli("l3", "-i", str(new_inventory), "--prune", "--json", check_rc=0).stdout)
    rows = {r["namespace"]: r for r in running["tiers"][0]["namespaces"]}
    assert running["running"] == {old: ["localhost"]} and rows[old]["state"] == l3.RUNNING and not rows[old]["prune"]
    assert running["tiers"][0]["would_remove"] == [] and "written " in rows[fresh]["why_kept"]
    # A deployed.json that cannot be read: what the server runs is unknown, nothing on its tier is pruned.
    (base / "cfg" / "deployed.json").unlink()
    (base / "cfg" / "deployed.json").mkdir()
    held = cli("l3", "-i", str(new_inventory), "--prune", check_rc=1)
    assert "nothing is pruned on this tier: not checked what localhost runs" in held.stdout and "would remove" not in held.stdout
    (base / "cfg" / "deployed.json").rmdir()  # ran nothing: fine

    dry = cli("l3", "-i", str(new_inventory), "--prune", check_rc=0)
    assert f"would remove {old}" in dry.stdout and f"would remove {new}" not in dry.stdout and "nothing was removed" in dry.stdout
    assert f"would remove {fresh}" not in dry.stdout and "a server may still use it" in dry.stdout
    assert (cache / old / "page-0").exists()
    done = json.loads(cli("l3", "-i", str(new_inventory), "--prune", "--yes", "--json", check_rc=0).stdout)
    assert done["tiers"][0]["removed"] == [old] and done["tiers"][0]["removal_errors"] == []
    assert [r["namespace"] for r in done["tiers"][0]["namespaces"]] == sorted(["models", new, fresh]) + [l3.NO_NAMESPACE]
    assert not (cache / old).exists()
    recent = json.loads(cli("l3", "-i", str(new_inventory), "--prune", "--yes", "--min-age", "0", "--json", check_rc=0).stdout)
    assert recent["tiers"][0]["removed"] == [fresh] and not (cache / fresh).exists()
    assert sorted(p.name for p in (cache / new).iterdir()) == ["page-0", "page-1"] and (cache / "page-0").exists()
    assert len(list((cache / "models").iterdir())) == 2 and len(list((cache / "3f").iterdir())) == 4
    # Defence in depth: the playbook asked to remove the namespace in use, a literal one and a bucket keeps them (it
    # computes the namespaces in use itself and checks the form).
    forced = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(new_inventory), "playbooks/l3.yml", "-v",
                             "-e", json.dumps({"__hicache_l3_prune": {"localhost": [new, "models", "3f"]}, "__hicache_l3_min_age": 0})],
                            cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")})
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert "in use by a server of the inventory" in forced.stdout, forced.stdout  # the removal ran, and refused
    assert forced.stdout.count("not a name auto derives") >= 2, forced.stdout
    assert sorted(p.name for p in (cache / new).iterdir()) == ["page-0", "page-1"]
    assert len(list((cache / "models").iterdir())) == 2 and len(list((cache / "3f").iterdir())) == 4
