"""Output for people (issue 24, item 5): tables never split by a cell's line breaks, long reasons wrapped on request,
hosts with one outcome on one row, a long file's change said in one line with its digests."""

from __future__ import annotations

from hicachectl.formats import report
from hicachectl.rules import compact_hosts


def test_a_cell_with_line_breaks_stays_on_its_row():
    ssh = "Failed to connect to the host via ssh: ssh: connect to host 10.0.0.2 port 22:\nConnection refused\r\n"
    text = report.table(["host", "status", "reason"], [["gpu-01", "ok", ""], ["gpu-02", "unreachable", ssh]])
    lines = text.splitlines()
    assert len(lines) == 4 and lines[3].startswith("gpu-02") and lines[3].endswith("port 22: / Connection refused")


def test_the_reason_column_wraps_under_itself():
    reason = "; ".join(["gpus: nvidia-smi not found, so no GPU can be seen"] * 3 + ["nfs client: mount.nfs is missing " * 4])
    text = report.table(["host", "status", "reason"], [["gpu-01", "degraded", reason]], wrap=60)
    lines = text.splitlines()
    column = lines[0].index("reason")
    assert all(len(line) <= column + 60 for line in lines) and len(lines) > 4
    assert lines[2].startswith("gpu-01") and all(line[:column].strip() == "" for line in lines[3:])
    assert " ".join(line[column:].strip() for line in lines[2:]).count("gpus:") == 3


def test_hosts_with_one_outcome_are_one_row():
    rows = [["gpu-01", "degraded", 3, "x"], ["gpu-02", "degraded", 3, "x"], ["gpu-03", "failed", 1, "y"], ["gpu-04", "degraded", 3, "x"]]
    assert report.grouped(rows, compact_hosts) == [[compact_hosts(["gpu-01", "gpu-02", "gpu-04"]), "degraded", "3", "x"],
                                                   ["gpu-03", "failed", "1", "y"]]


def test_a_long_file_is_named_with_its_digests_not_diffed():
    old, new = "".join(f"line {i}\n" for i in range(300)), "".join(f"line {i}\n" for i in range(301))
    text = report.unified_diff({"before_header": "/usr/local/sbin/hicache-nic-tuning", "before": old, "after": new})
    assert text.count("\n") == 1 and text.startswith("/usr/local/sbin/hicache-nic-tuning: updated (sha256 ")
    assert "301 lines" in text
    assert report.unified_diff({"after_header": "/x", "before": "", "after": new}).startswith("/x: new (sha256 ")
    short = report.unified_diff({"before_header": "/etc/a", "after_header": "/etc/a", "before": "a\n", "after": "b\n"})
    assert "-a" in short and "+b" in short
