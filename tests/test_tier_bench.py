"""The L3 tier's raw read bandwidth (plugins/modules/hicache_tier_bench.py, `hicachectl bench --tier`): its functions
on a tmp dir, and the module as Ansible runs it. The reads are the backend's (page-sized files read whole; O_DIRECT
and a queue for NIXL's POSIX plugin, plain reads one after the other per rank for HiCacheFile); its files live in a
dot-directory of their own that no namespace, NIXL bucket or HiCacheFile listing sees, and are gone afterwards,
failure included."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from support import ROOT

sys.path.insert(0, str(ROOT / "tests/standin"))
import sglang_pages  # noqa: E402  the stand-in's model (its config.json), no torch at import

MODULE_PATH = ROOT / "plugins/modules/hicache_tier_bench.py"
_spec = importlib.util.spec_from_file_location("hicache_tier_bench_under_test", MODULE_PATH)
mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mod)

_l3_spec = importlib.util.spec_from_file_location("hicache_l3_namespaces_for_tier_bench", ROOT / "plugins/modules/hicache_l3_namespaces.py")
namespaces = importlib.util.module_from_spec(_l3_spec)
_l3_spec.loader.exec_module(namespaces)

KIB = 1024
FIO = shutil.which("fio")

# fio 3.33's --output-format=json (Debian's fio 3.33-3), run here on 2026-12-04 with fio_job(directory, 16, 65536, True, 4)
# over 16 files of 64 KiB on ext4, trimmed to the keys parse_fio reads and their neighbours (values as fio wrote them).
FIO_SAMPLE = """{
  "fio version": "fio-3.33",
  "global options": {
    "rw": "read",
    "bs": "65536",
    "directory": "/tmp/hb/fio/.hicache-tier-bench-27243-7a613f62",
    "nrfiles": "16",
    "size": "1048576",
    "file_service_type": "sequential",
    "invalidate": "1",
    "group_reporting": "1",
    "ioengine": "libaio",
    "iodepth": "4",
    "direct": "1",
    "filename_format": "page.$jobnum.$filenum.bin"
  },
  "jobs": [
    {
      "jobname": "reader",
      "groupid": 0,
      "error": 0,
      "read": {
        "io_bytes": 1048576,
        "io_kbytes": 1024,
        "bw_bytes": 349525333,
        "bw": 341333,
        "iops": 5333.333333,
        "runtime": 3,
        "total_ios": 16
      }
    }
  ]
}
"""


def test_reads_every_byte_of_page_sized_files_and_removes_them(tmp_path):
    result = mod.measure(str(tmp_path), read_bytes=64 * KIB, total_bytes=2048 * KIB, queue_depth=2, direct=False, use_fio=False)
    assert result["bytes"] == 32 * 64 * KIB and result["files"] == 32 and result["read_bytes"] == 64 * KIB
    assert result["seconds"] > 0 and result["gbps"] == pytest.approx(result["bytes"] / result["seconds"] / 1e9, rel=0.01)
    assert result["method"] == "python preadv threads=2 buffered" and result["direct"] is False and result["cache_dropped"] is True
    assert list(tmp_path.iterdir()) == []  # nothing left in the tier


def test_o_direct_reads_are_aligned_and_say_so_or_fall_back_where_refused(tmp_path):
    result = mod.measure(str(tmp_path), read_bytes=100_000, total_bytes=1_000_000, queue_depth=4, direct=True, use_fio=False)
    assert result["read_bytes"] == 102_400 and result["files"] == 10  # rounded up to 4096: O_DIRECT's alignment
    if result["direct"]:
        assert result["method"] == "python preadv threads=4 O_DIRECT" and result["bytes"] == 10 * 102_400
    else:  # a filesystem without O_DIRECT (tmpfs): buffered, and said
        assert any("refuses O_DIRECT" in n for n in result["notes"]) and "buffered" in result["method"]
    assert list(tmp_path.iterdir()) == []


def test_its_directory_is_no_namespace_no_nixl_bucket_and_no_page_of_the_tier(tmp_path):
    directory = mod.new_dir(str(tmp_path), pid=4242)
    name = os.path.basename(directory)
    assert name.startswith(".hicache-tier-bench-4242-") and mod.DIR_FORM.fullmatch(name)
    assert not namespaces.is_namespace_name(name) and not namespaces.is_derived(name)  # never listed as one, never pruned
    assert namespaces.refusal(str(tmp_path), name, keep=[]) is not None
    mod.write_files(directory, 4, 4096, jobs=2)  # file i is reader i % 2's (i // 2)-th, as fio's filename_format names them
    assert sorted(os.listdir(directory)) == ["page.0.0.bin", "page.0.1.bin", "page.1.0.bin", "page.1.1.bin"]
    assert namespaces.page_of("page.0.0.bin", directory) == f"file:{directory}"  # no SGLang key in its names
    assert mod.remove_dir(directory) and not os.path.exists(directory)


def test_files_are_removed_when_the_reads_fail(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError("the tier went away")
    monkeypatch.setattr(mod, "python_read", broken)
    with pytest.raises(OSError, match="went away"):
        mod.measure(str(tmp_path), read_bytes=4096, total_bytes=8192, use_fio=False)
    assert list(tmp_path.iterdir()) == []


def test_leftovers_of_a_killed_run_go_only_when_old_and_only_their_own_files(tmp_path):
    old = tmp_path / ".hicache-tier-bench-1-0123abcd"
    fresh = tmp_path / ".hicache-tier-bench-2-89abcdef"
    kept = tmp_path / ".hicache-tier-bench-3-00000000"
    for d in (old, fresh, kept):
        d.mkdir()
        (d / "page.0.0.bin").write_bytes(b"x")
    (kept / "someone-elses").write_text("x")  # not a file of ours: the directory stays
    ancient = time.time() - 7200
    for d in (old, kept):
        os.utime(d, (ancient, ancient))
    namespace = tmp_path / "qwen3-8b-0123456789ab"
    namespace.mkdir()
    os.utime(namespace, (ancient, ancient))
    assert mod.remove_stale(str(tmp_path), 3600) == [old.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([fresh.name, kept.name, namespace.name])
    assert (kept / "someone-elses").exists() and not (kept / "page.0.0.bin").exists()


def test_fio_jobs_are_the_backends_io():
    direct = mod.fio_job("/mnt/l3/.hicache-tier-bench-1-0123abcd", 512, 8192, True, 256).splitlines()
    assert {"ioengine=libaio", "iodepth=256", "direct=1", "bs=8192", "nrfiles=512", f"size={512 * 8192}",
            "filename_format=page.$jobnum.$filenum.bin"} <= set(direct) and not any(line.startswith("numjobs") for line in direct)
    buffered = mod.fio_job("/mnt/a:b", 6, 4096, False, 2).splitlines()
    assert {"directory=/mnt/a\\:b", "ioengine=psync", "direct=0", "numjobs=2", "nrfiles=3", f"size={3 * 4096}"} <= set(buffered)
    assert mod.file_count(10 * 4096, 4096, 4) == 12 and mod.file_count(1, 4096, 1) == 1  # whole files per reader
    assert mod.parse_fio(FIO_SAMPLE) == (1048576, 0.003)


@pytest.mark.skipif(FIO is None, reason="fio is not installed here (apt-get install fio): the Python reader is tested above")
def test_fio_reads_the_files_where_the_host_has_it(tmp_path):
    result = mod.measure(str(tmp_path), read_bytes=64 * KIB, total_bytes=1024 * KIB, queue_depth=4, direct=True, use_fio=True)
    assert result["fio"] == FIO and result["bytes"] == 16 * 64 * KIB
    assert result["method"] in ("fio libaio iodepth=4 direct=1", "fio psync jobs=4 direct=0")
    assert list(tmp_path.iterdir()) == []


def test_the_module_as_ansible_runs_it(tmp_path):
    tier = tmp_path / "tier"
    tier.mkdir()

    def run(**args):
        args_file = tmp_path / "args.json"
        args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"path": str(tier), **args}}))
        proc = subprocess.run([sys.executable, str(MODULE_PATH), str(args_file)], capture_output=True, text=True, timeout=120)
        return json.loads(proc.stdout)
    out = run(read_bytes=8192, total_bytes=81920, queue_depth=2, use_fio=False)
    assert out["changed"] is False and out["bytes"] == 81920 and out["files"] == 10 and out["gbps"] > 0, out
    assert list(tier.iterdir()) == []
    checked = run(read_bytes=8192, _ansible_check_mode=True)
    assert checked["files"] == 0 and "check mode" in checked["method"]
    failed = run(read_bytes=8192, path=str(tmp_path / "not-mounted"))
    assert failed["failed"] is True and "not a directory" in failed["msg"]


def _inventory(tmp_path, **extra):
    """This machine as an inventory's only server (connection local), its tier a tmp dir and its model the stand-in's."""
    import yaml
    inv = tmp_path / "inventory"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text((ROOT / "inventories/local/hosts.yml").read_text())
    variables = yaml.safe_load((ROOT / "inventories/local/group_vars/all.yml").read_text())
    config = tmp_path / "config.json"
    config.write_text(json.dumps(sglang_pages.CONFIG_JSON))
    variables.update(hicache_base_dir=str(tmp_path / "base"), hicache_cache_dir=str(tmp_path / "tier"), hicache_page_size=64,
                     hicache_model_config=str(config), **extra)
    (inv / "group_vars/all.yml").write_text(yaml.safe_dump(variables))
    (tmp_path / "tier").mkdir()
    return inv


@pytest.mark.slow  # a whole playbook (validate, then the module) through ansible-runner
@pytest.mark.parametrize("backend", ["file", "nixl"])
def test_bench_tier_reads_the_servers_tier_through_the_playbook_as_its_backend_reads(tmp_path, backend):
    from hicachectl.cli import bench as cli_bench

    inv = _inventory(tmp_path, hicache_storage_backend=backend)
    out = cli_bench._tier_bench(str(inv), None, False, None, 4 << 20)
    [(host, result)] = out.items()
    assert host == "localhost" and result.get("gbps", 0) > 0, result
    page = 64 * 2048  # 64 tokens of the stand-in's model: 4 layers x K and V of 128 bf16
    if backend == "file":
        assert (result["read_bytes"], result["queue_depth"], result["direct"]) == (page, 1, False)
        assert "buffered" in result["method"] or "direct=0" in result["method"]
    else:  # K or V of a page per read, O_DIRECT, NIXL's queue (one rank: min(256, 2 x 128))
        assert (result["read_bytes"], result["queue_depth"]) == (page // 2, 256)
        assert result["direct"] is True or any("refuses O_DIRECT" in n for n in result["notes"])
    assert result["bytes"] == result["read_bytes"] * result["files"] >= 4 << 20
    assert list((tmp_path / "tier").iterdir()) == []  # the tier as it was


def test_tier_only_reads_each_tier_once_by_its_first_server_and_skips_what_has_no_file_tier(tmp_path):
    """--tier-only's plan: servers of one hicache_l3_share are one tier, read by the first by name (two readers would
    each report their share of its bandwidth); a server alone is its own tier; a server whose pages are not files on a
    tier is skipped; one that cannot be read (no model config) says why. --tier's plan (not once per tier) reads each."""
    from helpers import deployment

    from hicachectl.ops import bench as benching

    config = tmp_path / "config.json"
    config.write_text(json.dumps(sglang_pages.CONFIG_JSON))
    model = {"model_config": str(config), "page_size": 64}
    servers = {"gpu-2": deployment("local", l3_share="rack-a", storage_backend="nixl", **model),
               "gpu-1": deployment("local", l3_share="rack-a", **model),
               "gpu-3": deployment("local", **model),
               "gpu-4": deployment("local", storage_backend=None, **model),
               "gpu-5": deployment("local")}
    plan, out = benching.tier_plan(servers, None, 1 << 20, once_per_tier=True)
    assert sorted(plan) == ["gpu-1", "gpu-3"] and plan["gpu-1"] == {"read_bytes": 64 * 2048, "queue_depth": 1, "direct": False, "total_bytes": 1 << 20}
    assert out["gpu-2"] == {"skipped": "its tier rack-a is read through gpu-1"}
    assert out["gpu-4"]["skipped"].startswith("hicache_storage_backend None: its pages are not files")
    assert out["gpu-5"]["why"].startswith("a read is one page's bytes")
    every, _ = benching.tier_plan(servers, None, 1 << 20)
    assert sorted(every) == ["gpu-1", "gpu-2", "gpu-3"]  # --tier with --router: every server, as they read in the L3 phase


@pytest.mark.slow  # the CLI, whole playbooks (validate, then the module) through ansible-runner
def test_bench_tier_only_reads_the_tier_with_no_server_and_says_the_share_is_not_measured(tmp_path):
    """`bench -i NAME --tier-only`: the tier read with no server running (no server answers here), as its backend reads
    it; SGLang's share is said to be not measured, never a number. Usage errors are refused before any host is
    contacted; a tier that cannot be read is a failure that says why."""
    import yaml
    from support import cli

    inv = _inventory(tmp_path, hicache_storage_backend="nixl")
    run = cli("bench", "--inventory", str(inv), "--tier-only", check_rc=0)
    assert run.stdout.count("L3 tier of localhost: ") == 1 and " GB/s raw (" in run.stdout, run.stdout
    assert "SGLang's share of it: not measured (--tier-only benched no server" in run.stdout
    report = json.loads(cli("bench", "--inventory", str(inv), "--tier-only", "--json", check_rc=0).stdout)
    assert report["tier_share"] is None and report["tier"]["localhost"]["gbps"] > 0 and report["tier"]["localhost"]["read_bytes"] == 64 * 2048 // 2
    assert list((tmp_path / "tier").iterdir()) == []  # the tier as it was
    for args, said in ((("--tier-only", "--url", "http://127.0.0.1:9"), "--tier-only needs --inventory"),
                       (("--inventory", str(inv), "--tier-only", "--router"), "--tier-only benches no server"),
                       (("--inventory", str(inv), "--tier-only", "--tier"), "not --tier")):
        refused = cli("bench", *args, check_rc=2)
        assert said in refused.stderr + refused.stdout, refused
    (tmp_path / "bare").mkdir()
    no_config = _inventory(tmp_path / "bare", hicache_storage_backend="nixl")
    variables = yaml.safe_load((no_config / "group_vars/all.yml").read_text())
    del variables["hicache_model_config"]
    (no_config / "group_vars/all.yml").write_text(yaml.safe_dump(variables))
    missing = cli("bench", "--inventory", str(no_config), "--tier-only", check_rc=1)  # not measured: a failure, said why
    assert "L3 tier of localhost: not measured: a read is one page's bytes" in missing.stdout, missing.stdout
