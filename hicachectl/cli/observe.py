"""The commands that look at hosts and change nothing (verify --l3 restarts the servers it proves): plan, doctor,
status, verify. Each guards the inventory, runs its playbook, and hands what the hosts said to a pure judge
(`doctor_verdict` and `verify_verdict` here, hicachectl.ops.status.judge_hosts) that gives every host's verdict, the
lines to print and the exit code, tested without a host (tests/unit/cli/test_judges.py).

Exit codes, as DeepOps: 0 every check passed; 1 a check failed; 2 a host could not be checked (every judge's
`exit_code`, hicachectl.cli.main.CHECK_EXIT_CODES).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import typer

from hicachectl.cli import change as cli_change
from hicachectl.cli import common
from hicachectl.config import secrets
from hicachectl.plans.plan import INFO, MISSING, OK, WARN


@common.with_vault
def plan(inventory: str = common.InventoryOpt, limit: str | None = common.LimitOpt, json: bool = common.JsonOpt,
         diff: bool = typer.Option(False, "--diff/--no-diff", help="Show the content of each planned change (without it, one line "
                                                                 "per change with the lines it adds and removes)."),
         detailed_exitcode: bool = typer.Option(False, "--detailed-exitcode", help="Exit 0 when nothing would change, 2 when changes "
                                                "are pending, 1 on an error or a change deploy would refuse (for CI to gate on).")) -> None:
    """Dry run: what a deploy would change on each host (Ansible check mode), hosts with the same changes said once;
    --diff shows each change's content (--json always holds it). Changes nothing."""
    try:
        cli_change.run_and_report("site.yml", inventory, limit, json, check=True, show_diff=diff, verb="would change",
                                  detailed_exitcode=detailed_exitcode)
    except common.Finished:
        raise
    except typer.Exit as stop:
        # With --detailed-exitcode, 2 means changes pending: an error before the plan (an inventory or a vault password
        # file that cannot be read) exits 1, as Terraform's plan -detailed-exitcode does.
        if detailed_exitcode and stop.exit_code == common.EXIT_USAGE:
            raise typer.Exit(common.EXIT_INVALID) from stop
        raise


@common.with_vault
def doctor(inventory: str = common.InventoryOpt, limit: str | None = common.LimitOpt, json: bool = common.JsonOpt) -> None:
    """What each host has (OS, GPUs, NICs, RDMA, NFS client, runtime, RAM, disk) against what its inventory needs;
    each router host too (OS, Python and its venv support, systemd, disk). A value where one was found.

    Exit 0: nothing required is missing; 1: a required item is missing; 2: a host could not be checked.
    """
    from hicachectl.cli import runner

    inv, deployments = common.guard(inventory, limit)
    routers = sorted(getattr(inv, "routers", {}))  # the routers --limit matched: doctor.yml's router play judges them
    result = runner.run_playbook("doctor.yml", inv.path, limit=limit, hosts=[*deployments, *routers], routers=routers)
    reports = {h: result.hosts[h].facts.get("hicache_preflight_report") if h in result.hosts else None for h in [*sorted(deployments), *routers]}
    unchecked = {h: common.said(result.hosts[h].failures) if h in result.hosts else "not run" for h, r in reports.items() if r is None}
    verdict = doctor_verdict(reports, unchecked)
    common.finish(verdict["exit_code"], json, {"inventory": inv.name, "exit_code": verdict["exit_code"], "hosts": verdict["hosts"]},
                  verdict["lines"])


def doctor_verdict(reports: Mapping[str, Mapping[str, Any] | None], unchecked: Mapping[str, str]) -> dict[str, Any]:
    """doctor's judgement, pure: `reports` are each host's hicache_preflight_report (None: it could not be checked,
    `unchecked` says why). {"exit_code", "hosts": each host's --json entry, "lines": the item x host table, then
    what is missing or warned about, then the hosts not checked}."""
    from hicachectl.formats import report
    from hicachectl.plans import preflight

    hosts = list(reports)
    entries = {h: dict(r, status=preflight.host_status(r)) if r else {"status": preflight.host_status(r), "error": unchecked[h]}
               for h, r in reports.items()}
    items = list(dict.fromkeys(c["item"] for r in reports.values() if r for c in r["checks"]))
    cells = {h: {c["item"]: _doctor_cell(c) for c in r["checks"]} for h, r in reports.items() if r}
    lines = [report.table(["item"] + hosts, [[item] + [cells.get(h, {}).get(item, "-" if h in cells else "?") for h in hosts] for item in items])]
    lines += [f"{host}: {c['item']}: {c['detail']}" + (" [required by the inventory]" if c["blocking"] else "")
              for host, r in reports.items() for c in (r or {}).get("checks", []) if c["status"] in (MISSING, WARN)]
    lines += [f"{host}: could not be checked: {reason}" for host, reason in unchecked.items()]
    return {"exit_code": preflight.doctor_exit_code(dict(reports)), "hosts": entries, "lines": lines}


DOCTOR_CELL = 40  # characters of a value shown in doctor's table; the whole detail is in --json


def _doctor_cell(check: Mapping[str, Any]) -> str:
    """What doctor's table shows of one check: for an item that is only reported (`info`: the kernel, the RAM) the
    value itself; for one that passed, `ok` and the value found (`ok: 1x L4`); else the outcome (what is missing or
    warned about is said in full below the table)."""
    detail = " ".join(str(check.get("detail") or "").split())
    if check["status"] == INFO and detail:
        cell = detail
    elif check["status"] == OK and detail:
        cell = f"ok: {detail}"
    else:
        return check["status"] + (" (required)" if check["blocking"] else "")
    return cell if len(cell) <= DOCTOR_CELL else cell[:DOCTOR_CELL - 3] + "..."


@common.with_vault
def status(inventory: str = common.InventoryOpt, limit: str | None = common.LimitOpt, json: bool = common.JsonOpt) -> None:
    """Per host: unit state, since when, image, the config it runs (the inventory's, pending restart, or
    another), /health, the L3 backend attached (GET /hicache/storage-backend), and whether the running server
    (/server_info) agrees with the inventory; per router: its unit, version, and the workers it lists.

    Exit 0: every server is active, healthy and runs the inventory's config; 1 otherwise (not deployed
    included); 2: a host could not be read.
    """
    from hicachectl.cli import runner
    from hicachectl.ops import status as judging

    inv, deployments = common.guard(inventory, limit)
    routers = sorted(getattr(inv, "routers", {}))  # the routers --limit matched (inventory.load): status.yml's router play
    result = runner.run_playbook("status.yml", inv.path, limit=limit, hosts=[*deployments, *routers], routers=routers)
    states = {h: result.hosts[h].facts.get("hicache_status_report") for h in [*deployments, *routers]}
    verdict = judging.judge_hosts(deployments, {h: s for h, s in states.items() if s is not None},
                                  {h: common.why_failed(result.hosts[h]) for h, s in states.items() if s is None}, routers=routers)
    hidden = secrets.all_values(deployments.values())  # the inventory's secrets, wherever a server's answer echoes one
    common.finish(verdict["exit_code"], json, secrets.mask({"inventory": inv.name, "exit_code": verdict["exit_code"], "hosts": verdict["hosts"]}, hidden),
                  [secrets.mask_text(line, hidden) for line in verdict["lines"]])


@common.with_vault
def verify(inventory: str = common.InventoryOpt, limit: str | None = common.LimitOpt, json: bool = common.JsonOpt,
           l3: bool = typer.Option(False, "--l3", help="Also prove L3 persistence: write a long prompt, restart the server "
                                                        "(hicache_serial hosts at a time), and require hits from storage.")) -> None:
    """Check each host (mount, read-ahead, memlock, NICs) and its server (/health, served name, a chat
    completion, cache report, metrics). Changes nothing, except that --l3 restarts the servers.

    Exit 0: every check passed, or could not be made only where the inventory tolerates it (hicache_strict:
    false; the host is shown degraded); 1: a check failed; 2: a host could not be checked.
    """
    from hicachectl.cli import runner

    inv, deployments = common.guard(inventory, limit)
    routers = sorted(getattr(inv, "routers", {}))  # router hosts: verify_routers.yml asks their SGLang router
    common.say(f"verifying {common.counted(deployments, routers)} of {inv.name}"
               + (" with the L3 persistence proof (restarts each server)" if l3 else ""))
    run_id = cli_change.new_run_id()
    result = runner.run_playbook("verify.yml", inv.path, limit=limit, hosts=[*deployments, *routers], routers=routers,
                                 extravars=cli_change.play_vars(deployments, l3, {"__hicache_verify_l3_requested": l3, "__hicache_run_id": run_id}),
                                 progress=common.progress)
    cli_change.release_locks_after(result, inv, run_id)
    verdict = verify_verdict({h: result.hosts[h] for h in [*sorted(deployments), *routers]}, l3)
    hidden = secrets.all_values(deployments.values())
    common.finish(verdict["exit_code"], json, secrets.mask({"inventory": inv.name, "l3": l3, "exit_code": verdict["exit_code"], "hosts": verdict["hosts"]}, hidden),
                  [secrets.mask_text(line, hidden) for line in verdict["lines"]])


NOT_CHECKED_NOTE = "not checked"  # how a role's hicache_note says what its checks could not see (storage, nic_tuning)


def verify_verdict(outcomes: Mapping[str, Any], l3: bool) -> dict[str, Any]:
    """verify's judgement, pure: `outcomes` are the hosts' runner.HostResult in the order shown, each with the
    hicache_verify_report verify.judge made on the host (none: the host could not be checked), its gaps (what
    hicache_strict: false tolerates not checking: the host is degraded). {"exit_code", "hosts": each host's --json
    entry, "lines": the check table, the causes of failed checks, the summary line}."""
    from hicachectl.formats import report
    from hicachectl.ops import bench as benching
    from hicachectl.ops import verify

    hosts, code = {}, common.EXIT_OK
    for host, outcome in outcomes.items():
        verdict = outcome.facts.get("hicache_verify_report")
        if verdict is None:
            why = common.said(outcome.failures) or ("not verified: the proof stops restarting servers after a failed batch"
                                                    if l3 and outcome.status == "not run" else outcome.status)
            hosts[host] = {"ok": False, "status": outcome.status if outcome.status != "ok" else "failed", "error": why, "checks": [], "findings": []}
            code = common.EXIT_NOT_CHECKED  # whatever the others
            continue
        # A tolerated gap: a check not made (the host cannot tell or cannot do it), or one made and not met (`checked`: a
        # ToS set but not in effect), a failure the role tolerates; either way the host is degraded, never passed.
        gaps = [{"check": gap.task, "status": verify.FAIL if gap.checked else verify.NOT_CHECKED, "detail": gap.reason,
                 "cause": f"tolerated: {gap.why_tolerated}"} for gap in outcome.gaps]
        # What a role's checks could not see (the NFS client's pNFS layout, a NIC setting the inventory leaves): not checked,
        # said so in the table and counted, not a gap the inventory tolerates (the host is not degraded by it).
        unseen = [{"check": note.task, "status": verify.NOT_CHECKED, "detail": note.text[len(NOT_CHECKED_NOTE):].lstrip(": ").removeprefix("on "),
                   "cause": ""} for note in outcome.notes if note.text.startswith(NOT_CHECKED_NOTE)]
        ok = verdict["ok"] and not outcome.interrupted
        hosts[host] = {"ok": ok, "status": "passed" if ok and not gaps else ("degraded" if ok else "failed"), "checks": gaps + unseen + verdict["checks"],
                       "findings": verdict.get("findings") or []}
        if not ok and code == common.EXIT_OK:
            code = common.EXIT_INVALID
    lines = [report.table(["host", "check", "result", "detail"],
                          [[h, c["check"], c["status"], c["detail"]] for h, r in hosts.items() for c in r["checks"]]
                          + [[h, "-", "error", r["error"]] for h, r in hosts.items() if "error" in r])]
    lines += [f"{host}: {c['check']}: {c['cause']}" for host, r in hosts.items() for c in r["checks"] if c["status"] == verify.FAIL and c["cause"]]
    # What the numbers say beside the checks (L3 slower than recompute): bench's finding, with its levers, said once.
    lines += benching.finding_lines([f for r in hosts.values() for f in r.get("findings", [])], levers_once=True)
    unchecked = sum(c["status"] == verify.NOT_CHECKED for r in hosts.values() for c in r["checks"])
    degraded = sorted(h for h, r in hosts.items() if r.get("status") == "degraded")
    tolerated = sum(c["status"] == verify.FAIL for r in hosts.values() if r.get("status") == "degraded" for c in r["checks"])
    said = ([f"{unchecked} check(s) not made"] if unchecked else []) + ([f"{tolerated} failure(s) tolerated"] if tolerated else [])
    said += [f"degraded: {', '.join(degraded)}"] if degraded and said else []
    slower = [h for h, r in hosts.items() if r.get("findings")]
    said += [f"L3 slower than recompute on {', '.join(slower)}: see the finding"] if slower else []
    lines.append("verify: " + ("FAILED" if code != common.EXIT_OK else "passed, DEGRADED" if degraded else "passed")
                 + (f" ({'; '.join(said)})" if said else ""))
    return {"exit_code": code, "hosts": hosts, "lines": lines}
