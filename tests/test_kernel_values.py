"""hicache_kernel_values' decision on a sample /proc/sys tree (the module file imported, its plain functions called).

A value the inventory asks for that cannot be set is a failure under strict and a gap otherwise: never
skipped, never an ok with the problem in `msg`.
"""

from __future__ import annotations

import errno
import importlib.util
import pathlib

import pytest
from support import ROOT


def load():
    spec = importlib.util.spec_from_file_location("hicache_kernel_values", ROOT / "plugins/modules/hicache_kernel_values.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


kv = load()


@pytest.fixture
def proc(tmp_path):
    """/proc/sys/net/ipv4/conf/all/rp_filter = 1 and /proc/sys/sunrpc/tcp_slot_table_entries = 128."""
    for rel, text in (("proc/sys/net/ipv4/conf/all/rp_filter", "1\n"), ("proc/sys/sunrpc/tcp_slot_table_entries", "128\n")):
        target = tmp_path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return tmp_path


def read(root: pathlib.Path, rel: str) -> str:
    return (root / rel).read_text()


def test_all_matching_is_ok_and_unchanged(proc):
    decided = kv.decide({"sunrpc.tcp_slot_table_entries": 128, "net.ipv4.conf.all.rp_filter": "1"}, False, str(proc))
    result = kv.outcome(decided, strict=True)
    assert result["changed"] is False and not result.get("failed") and "hicache_gaps" not in result
    assert sorted(result["matching"]) == ["net.ipv4.conf.all.rp_filter", "sunrpc.tcp_slot_table_entries"]


def test_some_changed_are_written_with_a_diff(proc):
    decided = kv.decide({"sunrpc.tcp_slot_table_entries": 128, "net.ipv4.conf.all.rp_filter": 0}, False, str(proc))
    result = kv.outcome(decided, strict=True, diff=True)
    assert result["changed"] is True and result["set"] == {"net.ipv4.conf.all.rp_filter": {"before": "1", "after": "0"}}
    assert read(proc, "proc/sys/net/ipv4/conf/all/rp_filter") == "0"
    assert result["diff"] == {"before": "net.ipv4.conf.all.rp_filter = 1\n", "after": "net.ipv4.conf.all.rp_filter = 0\n"}


def test_check_mode_reports_the_change_and_writes_nothing(proc):
    result = kv.outcome(kv.decide({"net.ipv4.conf.all.rp_filter": 0}, True, str(proc)), strict=True)
    assert result["changed"] is True and result["set"]["net.ipv4.conf.all.rp_filter"] == {"before": "1", "after": "0"}
    assert read(proc, "proc/sys/net/ipv4/conf/all/rp_filter") == "1\n"


def test_a_misspelt_sysctl_fails_under_strict_naming_the_key(proc):
    decided = kv.decide({"net.ipv4.conf.all.rp_filtr": 0, "sunrpc.tcp_slot_table_entries": 128}, False, str(proc))
    assert decided["unavailable"] == {"net.ipv4.conf.all.rp_filtr": "/proc/sys/net/ipv4/conf/all/rp_filtr does not exist on this host (no such sysctl, or its module is not loaded)"}
    result = kv.outcome(decided, strict=True)
    assert result["failed"] is True and result.get("skipped") is None
    assert result["msg"] == "cannot set net.ipv4.conf.all.rp_filtr: /proc/sys/net/ipv4/conf/all/rp_filtr does not exist on this host (no such sysctl, or its module is not loaded)"


def test_a_missing_key_is_a_gap_when_not_strict(proc):
    result = kv.outcome(kv.decide({"sunrpc.tcp_max_slot_table_entries": 128}, False, str(proc)), strict=False)
    assert not result.get("failed") and result.get("skipped") is None and result["changed"] is False
    assert result["hicache_gaps"] == ["sunrpc.tcp_max_slot_table_entries: /proc/sys/sunrpc/tcp_max_slot_table_entries does not exist on this host (no such sysctl, or its module is not loaded)"]
    assert result["warnings"] == ["degraded (hicache_strict is false): " + result["hicache_gaps"][0]]


def test_a_read_only_value_is_a_failure_or_a_gap(proc, monkeypatch):
    # access(2) answers EROFS for a read-only /proc/sys (a container) even to root; root passes a 0444 file's
    # check, so the host's answer is stood in for here.
    monkeypatch.setattr(kv, "writable", lambda path: False)
    decided = kv.decide({"net.ipv4.conf.all.rp_filter": 0, "sunrpc.tcp_slot_table_entries": 128}, False, str(proc))
    reason = "/proc/sys/net/ipv4/conf/all/rp_filter is read-only here (current 1, wanted 0)"
    assert decided["unavailable"] == {"net.ipv4.conf.all.rp_filter": reason} and decided["matching"] == ["sunrpc.tcp_slot_table_entries"]
    assert kv.outcome(decided, strict=True)["msg"] == f"cannot set net.ipv4.conf.all.rp_filter: {reason}"
    lax = kv.outcome(decided, strict=False)
    assert not lax.get("failed") and lax["hicache_gaps"] == [f"net.ipv4.conf.all.rp_filter: {reason}"]
    assert read(proc, "proc/sys/net/ipv4/conf/all/rp_filter") == "1\n"


def test_a_refused_write_fails_with_the_kernels_reason_and_the_rest_is_still_set(proc, monkeypatch):
    real_write = kv.write_value

    def write(path, value):
        if path.endswith("tcp_slot_table_entries"):
            raise OSError(errno.EINVAL, "Invalid argument")
        real_write(path, value)

    monkeypatch.setattr(kv, "write_value", write)
    decided = kv.decide({"sunrpc.tcp_slot_table_entries": 99999, "net.ipv4.conf.all.rp_filter": 0}, False, str(proc))
    assert decided["unavailable"] == {"sunrpc.tcp_slot_table_entries":
                                      "writing 99999 to /proc/sys/sunrpc/tcp_slot_table_entries failed: Invalid argument (current 128)"}
    assert decided["set"] == {"net.ipv4.conf.all.rp_filter": {"before": "1", "after": "0"}}
    result = kv.outcome(decided, strict=True)
    assert result["failed"] is True and result["changed"] is True  # what was written is reported as written
    assert "sunrpc.tcp_slot_table_entries: writing 99999" in result["msg"]


def test_a_value_that_cannot_be_read_is_unavailable(proc):
    (proc / "proc/sys/vm").mkdir(parents=True)
    (proc / "proc/sys/vm/drop_caches").mkdir()  # a directory: reading it fails as a write-only file's read would
    decided = kv.decide({"vm.drop_caches": 3}, False, str(proc))
    assert decided["unavailable"]["vm.drop_caches"].startswith("reading /proc/sys/vm/drop_caches failed: ")
    assert kv.outcome(decided, strict=True)["failed"] is True


def test_sysctl_names_are_read_as_sysctl_d_reads_them():
    """sysctl.d(5): a name whose first separator is a slash keeps its dots (a VLAN interface such as ens1f0.100);
    one whose first separator is a dot has dots and slashes swapped."""
    assert kv.path_of("net/ipv4/conf/ens1f0.100/rp_filter") == "/proc/sys/net/ipv4/conf/ens1f0.100/rp_filter"
    assert kv.path_of("net.ipv4.conf.ens1f0/100.rp_filter") == "/proc/sys/net/ipv4/conf/ens1f0.100/rp_filter"
    assert kv.path_of("net.ipv4.conf.all.rp_filter") == "/proc/sys/net/ipv4/conf/all/rp_filter"
    assert kv.path_of("/sys/class/bdi/0:43/read_ahead_kb", "/root") == "/root/sys/class/bdi/0:43/read_ahead_kb"


def test_a_dry_run_shows_a_value_its_role_loads_the_module_for_as_a_change_not_a_failure(proc):
    """sunrpc.rdma_* appear only once rpcrdma is loaded (net/sunrpc/xprtrdma/transport.c registers them), and the
    storage role loads it just before, with a command that check mode skips: `hicachectl plan` on a host that never
    mounted NFS over RDMA failed here ("does not exist") before the role named them in after_load."""
    values = {"sunrpc.rdma_slot_table_entries": 64, "net.ipv4.conf.all.rp_filter": 0}
    dry = kv.outcome(kv.decide(values, True, str(proc), after_load=["sunrpc.rdma_slot_table_entries"]), strict=True)
    assert not dry.get("failed") and dry["changed"] is True
    assert dry["set"]["sunrpc.rdma_slot_table_entries"] == {"before": "(absent until its module is loaded)", "after": "64"}
    assert not (proc / "proc/sys/sunrpc/rdma_slot_table_entries").exists()
    # a real run whose module did not bring the file is judged as any key: failed under strict
    real = kv.outcome(kv.decide(values, False, str(proc), after_load=["sunrpc.rdma_slot_table_entries"]), strict=True)
    assert real["failed"] is True and "rdma_slot_table_entries does not exist" in real["msg"]
    # and a dry run without the role's word still says it cannot be set
    assert kv.outcome(kv.decide(values, True, str(proc)), strict=True)["failed"] is True
