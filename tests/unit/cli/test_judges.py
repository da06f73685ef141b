"""The judgements behind status, doctor and verify, and the report of a playbook run, without a host: each is a pure
function of what the hosts said (hicachectl/ops/status.py, hicachectl/cli/observe.py, hicachectl/cli/common.py). The
failures, gaps and notes reach them as records (hicachectl.cli.runner), and --json keeps the keys it always had."""

from __future__ import annotations

import json

import pytest
import typer
from helpers import deployment

from hicachectl.cli import common as cli_common
from hicachectl.cli import observe as cli_observe
from hicachectl.cli.runner import HostResult, Note, Record, RunResult
from hicachectl.ops import status

HASH = "c0ffee"


def state(**changes):
    """What status.yml reports for a server that runs the inventory's config and image (the local profile's), healthy."""
    read = {"deployed": {"config_hash": HASH, "image": "lmsysorg/sglang:v0.5.20-cu130"}, "installed": {"config_hash": HASH},
            "server_info": {}, "wanted_config_hash": HASH, "unit": "active", "since": "Mon 2026-11-30 10:00:00 UTC",
            "main_pid": "42", "restarts": "0", "health": "200"}
    return {**read, **changes}


@pytest.fixture(scope="module")
def servers():
    d = deployment("local")
    return {"gpu-a": d, "gpu-b": d}


# --- status ---------------------------------------------------------------------------------------------------

def test_status_every_server_fine_is_exit_0_with_one_row_each(servers):
    verdict = status.judge_hosts(servers, {"gpu-a": state(), "gpu-b": state()}, {})
    assert verdict["exit_code"] == 0
    assert verdict["rows"] == [[host, "active", "Mon 2026-11-30 10:00:00 UTC", "lmsysorg/sglang:v0.5.20-cu130", f"{HASH} (current)", "ok", ""]
                               for host in ("gpu-a", "gpu-b")]
    assert verdict["hosts"]["gpu-a"]["ok"] and verdict["hosts"]["gpu-a"]["current"] and verdict["hosts"]["gpu-a"]["unit"] == "active"


def test_status_a_server_not_fine_is_exit_1_and_says_why(servers):
    pending = state(deployed={"config_hash": "old", "image": "i"})
    verdict = status.judge_hosts(servers, {"gpu-a": pending, "gpu-b": state(health="-1", unit="failed")}, {})
    assert verdict["exit_code"] == 1
    a, b = verdict["rows"]
    assert a[4] == "old (pending restart)" and "`hicachectl restart`" in a[6]
    assert b[5] == "down" and b[6] == f"unit {servers['gpu-b'].service_name} is failed; nothing answers /health"
    assert verdict["hosts"]["gpu-a"]["current"] is False and verdict["hosts"]["gpu-a"]["config"] == status.PENDING


def test_status_not_deployed_is_one_phrase_and_exit_1(servers):
    verdict = status.judge_hosts({"gpu-a": servers["gpu-a"]}, {"gpu-a": state(deployed={}, installed={}, unit="inactive", health="-1")}, {})
    assert verdict["exit_code"] == 1
    assert verdict["rows"] == [["gpu-a", "not deployed", "", "", "", "", verdict["hosts"]["gpu-a"]["problems"][0]]]
    assert verdict["hosts"]["gpu-a"]["problems"][0].startswith("not deployed: no config in ")


@pytest.mark.parametrize("unread_host", ["gpu-a", "gpu-b"])
def test_status_a_host_not_read_is_exit_2_whatever_the_others(servers, unread_host):
    read = "gpu-b" if unread_host == "gpu-a" else "gpu-a"
    verdict = status.judge_hosts(servers, {read: state(health="503")}, {unread_host: "unreachable: ssh refused"})
    assert verdict["exit_code"] == 2
    assert verdict["hosts"][unread_host] == {"ok": False, "error": "unreachable: ssh refused"}
    assert [unread_host, "?", "", "", "", "", "unreachable: ssh refused"] in verdict["rows"]
    assert [row[0] for row in verdict["rows"]] == ["gpu-a", "gpu-b"]  # by host name, whatever was read first


# --- doctor ---------------------------------------------------------------------------------------------------

def check(item, state_, detail="", blocking=False):
    return {"item": item, "status": state_, "detail": detail, "required": blocking, "blocking": blocking}


OK_REPORT = {"checks": [check("gpus", "ok", "1x L4"), check("nfs_client", "not needed")], "required_missing": [], "warnings": [], "strict": True}
MISSING_REPORT = {"checks": [check("gpus", "missing", "no GPU", blocking=True), check("disk", "warn", "5 GB free")],
                  "required_missing": ["gpus: no GPU"], "warnings": ["disk: 5 GB free"], "strict": True}


def test_doctor_every_host_has_what_it_needs_is_exit_0():
    verdict = cli_observe.doctor_verdict({"a": OK_REPORT, "b": OK_REPORT}, {})
    assert verdict["exit_code"] == 0 and {h: e["status"] for h, e in verdict["hosts"].items()} == {"a": "ok", "b": "ok"}
    assert verdict["lines"] == ["item        a           b\n----------  ----------  ----------\ngpus        ok: 1x L4   ok: 1x L4\n"
                                "nfs_client  not needed  not needed"]


def test_doctor_a_required_item_missing_is_exit_1_and_named():
    verdict = cli_observe.doctor_verdict({"a": OK_REPORT, "b": MISSING_REPORT}, {})
    assert verdict["exit_code"] == 1 and verdict["hosts"]["b"]["status"] == "missing"
    table, *said = verdict["lines"]
    assert "gpus        ok: 1x L4   missing (required)" in table and "nfs_client  not needed  -" in table
    assert said == ["b: gpus: no GPU [required by the inventory]", "b: disk: 5 GB free"]


def test_doctor_a_host_not_checked_is_exit_2_with_its_reason():
    verdict = cli_observe.doctor_verdict({"a": MISSING_REPORT, "b": None}, {"b": "unreachable: ssh refused"})
    assert verdict["exit_code"] == 2
    assert verdict["hosts"]["b"] == {"status": "not checked", "error": "unreachable: ssh refused"}
    assert "gpus  missing (required)  ?" in verdict["lines"][0]
    assert verdict["lines"][-1] == "b: could not be checked: unreachable: ssh refused"


# --- verify ---------------------------------------------------------------------------------------------------

def outcome(host, report=None, **fields):
    result = HostResult(host, reached=True, **fields)
    if report is not None:
        result.facts["hicache_verify_report"] = report
    return result


PASSED = {"ok": True, "checks": [{"check": "/health", "status": "pass", "detail": "200", "cause": ""}]}
FAILED = {"ok": False, "checks": [{"check": "/metrics", "status": "fail", "detail": "answered 404", "cause": "--enable-metrics is off"}]}


def test_verify_all_passed():
    verdict = cli_observe.verify_verdict({"a": outcome("a", PASSED)}, l3=False)
    assert verdict["exit_code"] == 0 and verdict["hosts"]["a"] == {"ok": True, "status": "passed", "checks": PASSED["checks"], "findings": []}
    assert verdict["lines"][-1] == "verify: passed"


def test_verify_says_where_l3_lost_to_recompute_as_a_finding_with_the_levers_once_and_still_passes():
    def slower(host):
        return {"finding": "l3-slower-than-recompute", "host": host, "message": f"L3 does not beat recompute on {host}: 2.00x",
                "seconds": {"recompute": 1.0, "l3": 2.0},
                "levers": [{"lever": "--page-size", "now": 64, "what": "tokens per page"}, {"lever": "--hicache-io-backend", "now": None, "what": "copy"}]}
    reports = {h: {**PASSED, "findings": [slower(h)]} for h in ("a", "b")}
    verdict = cli_observe.verify_verdict({"a": outcome("a", reports["a"]), "b": outcome("b", reports["b"]), "c": outcome("c", PASSED)}, l3=True)
    assert verdict["exit_code"] == 0 and verdict["hosts"]["a"]["findings"] == [slower("a")] and verdict["hosts"]["c"]["findings"] == []
    assert "finding: L3 does not beat recompute on a: 2.00x." in verdict["lines"] and "finding: L3 does not beat recompute on b: 2.00x." in verdict["lines"]
    assert [line for line in verdict["lines"] if "--page-size" in line] == ["  - --page-size [now: 64]: tokens per page"]  # once, not per host
    assert "  - --hicache-io-backend: copy" in verdict["lines"]
    assert verdict["lines"][-1] == "verify: passed (L3 slower than recompute on a, b: see the finding)"


def test_verify_a_tolerated_gap_is_a_check_not_made_and_the_host_degraded():
    gap = Record("Check the NICs", "no ConnectX port")
    verdict = cli_observe.verify_verdict({"a": outcome("a", PASSED, gaps=[gap]), "b": outcome("b", PASSED)}, l3=False)
    assert verdict["exit_code"] == 0 and verdict["hosts"]["a"]["status"] == "degraded"
    assert verdict["hosts"]["a"]["checks"][0] == {"check": "Check the NICs", "status": "not checked", "detail": "no ConnectX port",
                                                  "cause": "tolerated: hicache_strict is false"}
    assert verdict["lines"][-1] == "verify: passed, DEGRADED (1 check(s) not made; degraded: a)"


def test_verify_a_tolerated_gap_that_was_checked_is_a_tolerated_failure_and_the_host_degraded():
    """A ToS set but not in effect was read and does not meet the inventory: a failed check the role tolerates, with
    why, not a check not made, nor "hicache_strict is false" on a strict host."""
    gap = Record("Report a ToS set but not yet in effect on the L3 mount", "eth0 roce tos: set, not yet in effect on /mnt/l3",
                 checked=True, why_tolerated="its fix interrupts the server on it")
    verdict = cli_observe.verify_verdict({"a": outcome("a", PASSED, gaps=[gap])}, l3=False)
    assert verdict["exit_code"] == 0 and verdict["hosts"]["a"]["status"] == "degraded"
    assert verdict["hosts"]["a"]["checks"][0] == {"check": gap.task, "status": "fail", "detail": gap.reason,
                                                  "cause": "tolerated: its fix interrupts the server on it"}
    assert verdict["lines"][-1] == "verify: passed, DEGRADED (1 failure(s) tolerated; degraded: a)"
    assert f"a: {gap.task}: tolerated: its fix interrupts the server on it" in verdict["lines"]


def test_verify_says_what_a_roles_checks_could_not_see_as_not_checked_without_degrading_the_host():
    notes = [Note("Say what the NFS client does not show (not checked)", "not checked on /mnt/kvcache: which layout the pNFS client uses"),
             Note("Restart the server", "restarted: the config changed")]  # a note that is not about a check stays out
    verdict = cli_observe.verify_verdict({"a": outcome("a", PASSED, notes=notes)}, l3=False)
    assert verdict["exit_code"] == 0 and verdict["hosts"]["a"]["status"] == "passed"
    assert verdict["hosts"]["a"]["checks"][0] == {"check": notes[0].task, "status": "not checked",
                                                  "detail": "/mnt/kvcache: which layout the pNFS client uses", "cause": ""}
    assert len(verdict["hosts"]["a"]["checks"]) == 2
    assert verdict["lines"][-1] == "verify: passed (1 check(s) not made)"


def test_verify_a_failed_check_is_exit_1_with_its_cause():
    verdict = cli_observe.verify_verdict({"a": outcome("a", FAILED), "b": outcome("b", PASSED)}, l3=False)
    assert verdict["exit_code"] == 1 and verdict["hosts"]["a"]["status"] == "failed"
    assert "a: /metrics: --enable-metrics is off" in verdict["lines"] and verdict["lines"][-1] == "verify: FAILED"


def test_verify_a_report_from_a_run_cut_short_is_not_a_pass():
    verdict = cli_observe.verify_verdict({"a": outcome("a", PASSED, interrupted=True)}, l3=False)
    assert verdict["exit_code"] == 1 and verdict["hosts"]["a"]["status"] == "failed"


@pytest.mark.parametrize("first", ["failed", "unchecked"])
def test_verify_a_host_not_checked_is_exit_2_whatever_the_others(first):
    hosts = {"failed": outcome("failed", FAILED), "unchecked": outcome("unchecked", failures=[Record("Ask /health", "timed out", "gpu")])}
    ordered = dict(sorted(hosts.items(), key=lambda kv: kv[0] != first))
    verdict = cli_observe.verify_verdict(ordered, l3=False)
    assert verdict["exit_code"] == 2
    assert verdict["hosts"]["unchecked"] == {"ok": False, "status": "failed", "error": "Ask /health (gpu): timed out", "checks": [], "findings": []}
    assert any(line.startswith("unchecked  -") and "error" in line and "Ask /health (gpu): timed out" in line
               for line in verdict["lines"][0].splitlines())


def test_verify_l3_says_why_a_host_the_proof_never_reached_was_not_verified():
    never = HostResult("b")  # not reached: "not run"
    verdict = cli_observe.verify_verdict({"a": outcome("a", FAILED), "b": never}, l3=True)
    assert verdict["hosts"]["b"]["status"] == "not run"
    assert verdict["hosts"]["b"]["error"] == "not verified: the proof stops restarting servers after a failed batch"
    assert cli_observe.verify_verdict({"b": HostResult("b")}, l3=False)["hosts"]["b"]["error"] == "not run"


# --- records and the report of a run -------------------------------------------------------------------------------

def test_a_hosts_json_keeps_its_text_keys_and_adds_the_records():
    host = HostResult("gpu-a", reached=True, failed=1,
                      failures=[Record("Remove it from each router", "timed out", "router-2"), Record("unreachable", "ssh refused")],
                      gaps=[Record("Tune the NICs", "no ConnectX port")], skips=[Record("Mount L3", "local tier")],
                      notes=[Note("Start the server", "NIXL fell back to posix_aio")])
    out = host.as_dict()
    assert out["reasons"] == ["Remove it from each router (router-2): timed out", "unreachable: ssh refused"] == host.reasons
    assert out["notes"] == ["NIXL fell back to posix_aio"]
    assert out["gaps"] == [{"task": "Tune the NICs", "reason": "no ConnectX port"}]  # no "item": the shape gaps always had
    assert out["skips"] == [{"task": "Mount L3", "reason": "local tier"}]
    assert out["failures"] == [{"task": "Remove it from each router", "reason": "timed out", "item": "router-2"},
                               {"task": "unreachable", "reason": "ssh refused"}]
    assert out["note_records"] == [{"task": "Start the server", "text": "NIXL fell back to posix_aio"}]
    assert out["status"] == "failed"
    assert list(out)[:14] == ["host", "ok", "changed", "failed", "skipped", "unreachable", "interrupted", "reached", "reasons",
                              "changes", "gaps", "skips", "facts", "notes"]  # where they always were
    json.dumps(out)


def test_the_reason_column_is_the_records_then_what_cut_the_host_short():
    host = HostResult("gpu-a", interrupted=True, failures=[Record("Pull", "denied")], gaps=[Record("Tune", "no NIC")])
    assert cli_common.host_reason(host) == ("Pull: denied; the run was cut short before this host finished: its state is unknown; "
                                            "run the command again; Tune: no NIC")
    assert cli_common.host_reason(HostResult("gpu-b")) == "the run never reached this host (an earlier batch failed, or the play stopped)"
    assert cli_common.why_failed(HostResult("gpu-b")) == "not run"


def run_report(capsys, result, **options):
    class Inventory:
        name = "prod"

    with pytest.raises(typer.Exit) as ended:
        cli_common.report_run(Inventory, result, **{"json": False, "check": False, "verb": "changed", "show_diff": False,
                                                    "hidden": ["s3cr3t"], **options})
    return ended.value.exit_code, capsys.readouterr().out


def test_a_runs_report_renders_notes_gaps_and_failures_from_their_records(capsys):
    degraded = HostResult("gpu-a", reached=True, ok=5, gaps=[Record("Tune the NICs", "no port for token s3cr3t")],
                          notes=[Note("Start the server", "restarted with s3cr3t")])
    failed = HostResult("gpu-b", reached=True, failed=1, failures=[Record("Pull the image", "denied")])
    code, out = run_report(capsys, RunResult(2, {"gpu-b": failed, "gpu-a": degraded}))
    assert code == 1
    assert out.splitlines()[:4] == ["gpu-a: note: restarted with ********", "gpu-a: degraded: Tune the NICs: no port for token ********",
                                    "gpu-b: failed: Pull the image: denied", ""]
    assert "gpu-b  failed    0   0        1       Pull the image: denied" in out
    assert "s3cr3t" not in out


def test_a_runs_json_is_masked_and_exit_0_only_when_every_host_is_good(capsys):
    good = HostResult("gpu-a", reached=True, changed=1, notes=[Note("Write start.sh", "token s3cr3t")])
    code, out = run_report(capsys, RunResult(0, {"gpu-a": good}), json=True, check=True)
    report = json.loads(out)
    assert code == 0 and report["ok"] and report["check"] is True and report["hosts"]["gpu-a"]["reason"] == ""
    assert report["hosts"]["gpu-a"]["notes"] == ["token ********"]
    assert report["hosts"]["gpu-a"]["note_records"] == [{"task": "Write start.sh", "text": "token ********"}]


def test_status_a_server_on_another_image_than_the_inventorys_is_not_current(servers):
    """With runtime none the image is in no launch file, so the config hash alone would call it current (issue 24:
    after an upgrade outside the inventory, status said "(current)" and the next deploy rolled every host back)."""
    d = servers["gpu-a"]
    other = {"config_hash": HASH, "image": "lmsysorg/sglang:v0.5.99-other"}
    verdict = status.judge(d, state(deployed=other))
    assert verdict["config"] == status.OTHER and not verdict["ok"]
    assert verdict["problems"][0] == f"runs image lmsysorg/sglang:v0.5.99-other, not the inventory's {d.image} (`hicachectl upgrade`, or `deploy`)"
    same = status.judge(d, state(deployed={"config_hash": HASH, "image": d.image}))
    assert same["config"] == status.CURRENT, same
