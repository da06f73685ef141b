"""`hicachectl l3`: the namespaces on each L3 tier, and `--prune` (hicachectl/ops/l3.py decides, playbooks/l3.yml reads
and removes). hicachectl/cli/main.py registers it; the inventory is guarded as every command's (hicachectl.cli.common).

Each tier is read on one of its hosts (the first of --limit's that can be reached). `--prune` also reads, on every
server of the inventory, what it runs (deployed.json), lists what it would remove and removes nothing; `--prune
--yes` removes it: only unused namespaces of the form `auto` derives, never one a server of the inventory uses or
runs, never one written less than --min-age hours ago, never on a tier with a server not checked, never the tier's
directory, pages written without a namespace, or a server's model, base or cfg directory.
"""

from __future__ import annotations

import time

import typer

from hicachectl.cli import common


@common.with_vault
def l3(inventory: str = common.InventoryOpt, limit: str | None = common.LimitOpt, json: bool = common.JsonOpt,
       prune: bool = typer.Option(False, "--prune", help="Also name the unused namespaces --yes would remove: of the form auto "
                                                         "derives, used by no server of the inventory (whatever --limit) "
                                                         "and run by none (each server's deployed.json is read); a dry run unless --yes."),
       yes: bool = typer.Option(False, "--yes", help="With --prune: remove them."),
       min_age: float = typer.Option(24.0, "--min-age", metavar="HOURS",
                                     help="With --prune: keep a namespace with a page written less than HOURS ago "
                                          "(a server may still use it); 0 keeps none for its age.")) -> None:
    """List the namespaces on each L3 tier (size, pages, last use, the servers using each); --prune removes the
    unused ones (dry run without --yes). Reads one host per tier; --prune also reads every server's deployed.json.

    Only names of the form `auto` derives are ever removed (a literal namespace, `models`, `backup` are listed,
    kept); never a namespace the inventory's servers use or the running servers write into (deployed.json: an
    inventory edited and not yet deployed still runs the old one), never one written less than --min-age hours ago,
    never one that is, holds or lies in a server's model, base or cfg directory, or holds a mount point; nothing
    on a tier one of whose servers could not be checked (unreachable).

    Exit 0: every tier was read (and what --prune --yes chose was removed); 1: invalid inventory, a tier that
    could not be read, a removal that failed, with --prune a server whose deployed.json could not be read
    (unreachable: nothing is pruned on its tier); 2: usage (--yes without --prune, a negative --min-age, a --limit
    that matches no server).
    """
    from hicachectl.cli import runner
    from hicachectl.config import inventory as inventories
    from hicachectl.ops import l3 as core

    if yes and not prune:
        raise common.usage("--yes goes with --prune (it confirms the removal).")
    if min_age < 0:
        raise common.usage(f"--min-age {min_age:g}: hours, 0 or more.")
    # Every server of the inventory, whatever --limit: the namespaces in use and the tiers' members.
    inv, deployments, findings = common.check(inventory, None)
    limited = list(deployments)
    if limit:
        try:
            limited = list(inventories.load(inventory, limit).hosts)
        except inventories.InventoryError as exc:  # the whole inventory loaded: the pattern is what is wrong
            raise common.usage(f"--limit {limit!r} matches no server of inventory {inv.name}: {exc}") from exc
        if not limited:
            raise common.usage(f"--limit {limit!r} matches no server of inventory {inv.name} (only router hosts: "
                               "a router has no L3 tier).")
    # Refused for an error on a host it reads (--limit's, or one across hosts); --prune needs every host valid.
    common.refuse_invalid(inv, findings, common.NOTHING_CONTACTED, judged=[f for f in findings if f.host in limited or f.host not in deployments])
    if prune:
        common.refuse_invalid(inv, findings, "cannot tell which namespaces the hosts with errors use: nothing is pruned until the whole inventory is valid.")
    used = core.in_use(deployments)
    paths = core.protected(deployments)
    tiers, left_out = core.tiers(deployments)
    tiers = [t for t in tiers if core.reader_order(t, limited)]
    left_out = {h: why for h, why in left_out.items() if h in limited}
    seconds = min_age * 3600

    reports, states = _read(inv, tiers, limited, list(deployments) if prune else None)
    runs, unknown = core.running(states) if prune else ({}, {})

    def decide(tier, listing):
        return core.rows(tier, listing, used, runs=runs, unchecked={h: unknown[h] for h in tier.hosts if h in unknown},
                         paths=paths, min_age=seconds, now=listing.get("now") or time.time())

    decided = {t.name: decide(t, reports[t.name][1]) for t in tiers if reports[t.name][1] is not None}
    removal = {reports[t.name][0]: [r.namespace for r in core.prunable(decided[t.name])] for t in tiers if t.name in decided}
    removal = {host: names for host, names in removal.items() if names}
    outcome: dict[str, dict] = {}
    if prune and yes and removal:
        common.say(f"removing {sum(map(len, removal.values()))} unused namespace(s) on {len(removal)} tier(s)")
        # Every server again: the playbook reads what each runs and keeps it, or holds a tier with a server not checked.
        result = runner.run_playbook("l3.yml", inv.path, limit=",".join(deployments), hosts=list(deployments),
                                     extravars={"__hicache_l3_prune": removal, "__hicache_l3_keep": sorted({*used, *runs}),
                                                "__hicache_l3_readers": list(removal), "__hicache_l3_min_age": seconds})
        by_host = {reports[t.name][0]: t for t in tiers if t.name in decided}
        for host in removal:
            tier = by_host[host]
            fact = result.hosts[host].facts.get("hicache_l3_report") or {}
            if "entries" not in fact:
                outcome[tier.name] = {"prune_error": common.why_failed(result.hosts[host]), "removed": [], "refused": [], "removal_errors": []}
                continue
            outcome[tier.name] = {k: fact.get(k) or [] for k in ("removed", "refused", "removal_errors")}
            reports[tier.name] = (host, fact, None)
            decided[tier.name] = decide(tier, fact)

    code = common.EXIT_OK
    payload = []
    for tier in tiers:
        host, listing, error = reports[tier.name]
        entry = {**tier.as_dict(), "read_on": host, "error": error, "path": (listing or {}).get("path"),
                 "exists": (listing or {}).get("exists"), "fs": (listing or {}).get("fs"),
                 "budget": core.budget(tier, deployments, decided.get(tier.name, []), (listing or {}).get("fs")),
                 "namespaces": [r.as_dict() for r in decided.get(tier.name, [])]}
        if listing is None:
            code = common.EXIT_INVALID
        if prune:
            entry["not_checked"] = {h: unknown[h] for h in tier.hosts if h in unknown}
            if entry["not_checked"]:  # a server not checked: nothing is pruned on its tier, and the run is not clean
                code = common.EXIT_INVALID
            done = outcome.get(tier.name)
            if not yes:
                entry["would_remove"] = removal.get(host, []) if listing is not None else []
            if done is not None:
                entry.update(done)
                if done.get("prune_error") or done["removal_errors"]:
                    code = common.EXIT_INVALID
        payload.append(entry)
    common.finish(code, json, {"inventory": inv.name, "prune": prune, "dry_run": prune and not yes, "exit_code": code,
                               "min_age_hours": min_age, "in_use": used, "running": runs, "not_checked": unknown,
                               "left_out": left_out, "tiers": payload},
                  _lines(tiers, payload, decided, left_out, prune=prune, yes=yes, ok=code == common.EXIT_OK))


def _lines(tiers, payload, decided, left_out, *, prune: bool, yes: bool, ok: bool):
    """l3's text: each tier's namespaces (a table), what --prune did or would do there, the servers left out."""
    from hicachectl.formats import report
    from hicachectl.ops import l3 as core

    for tier, entry in zip(tiers, payload, strict=True):
        who = f"shared by {', '.join(tier.hosts)}" if tier.shared else "its own"
        if entry["error"]:
            yield f"tier {tier.name} ({who}): NOT READ: {entry['error']}"
            continue
        yield f"tier {tier.name} ({who}): {entry['path']}, read on {entry['read_on']}"
        if entry.get("fs"):
            yield f"  filesystem: {core.size(entry['fs']['free'])} free of {core.size(entry['fs']['size'])}"
        if entry.get("budget"):
            b = entry["budget"]
            yield (f"  budget: {core.size(b['bytes'])} of {core.size(b['budget_bytes'])} ({b['fill']:.0%}), free-space floor "
                   f"{b['free_floor_pct']}%, collected on {b['collector']}")
            for name, spec in b["namespaces"].items():
                share = f"{spec['share_pct']}%" if spec["share_pct"] is not None else "equal part"
                yield f"    {name}: {core.size(spec['bytes'])} of its share {core.size(spec['quota_bytes'])} ({share})"
        if not entry["exists"]:
            yield "  the directory does not exist yet (no page written)"
        elif not decided[tier.name]:
            yield "  empty"
        else:
            yield report.table(core.HEADERS, [r.cells() for r in decided[tier.name]])
        for name, why in entry.get("not_checked", {}).items():
            yield f"  nothing is pruned on this tier: not checked what {name} runs ({why})"
        for name in entry.get("removed", []):
            yield f"  removed {name}"
        for item in entry.get("refused", []):
            yield f"  kept {item['name']}: {item['reason']}"
        for item in entry.get("removal_errors", []):
            yield f"  FAILED to remove {item['name']}: {item['reason']}"
        if entry.get("prune_error"):
            yield f"  removal NOT RUN: {entry['prune_error']}"
        for name in entry.get("would_remove", []):
            yield f"  would remove {name}"
    for host, why in left_out.items():
        yield f"{host}: not listed: {why}"
    if prune and not yes:
        count = sum(len(e.get("would_remove", [])) for e in payload)
        yield f"dry run: {count} unused namespace(s) would be removed; nothing was removed" + ("; add --yes to remove them." if count else ".")
    elif prune:
        yield f"removed {sum(len(e.get('removed', [])) for e in payload)} namespace(s)." if ok else "prune: FAILED (see above)."


def _read(inv, tiers, limited, servers=None) -> tuple[dict, dict]:
    """(tier name -> (host read on, its hicache_l3_report or None, why not read), server -> what it runs or why
    not read). One host per tier per round, the next of the tier's hosts in --limit when one cannot be read. With
    `servers` (--prune), the first round also reads each server's deployed.json, on every one of them."""
    from hicachectl.cli import runner

    candidates = {t.name: _order(t, limited) for t in tiers}
    out: dict = {t.name: (None, None, "no host of this tier in --limit") for t in tiers}
    tried: dict[str, list[str]] = {t.name: [] for t in tiers}
    states: dict = {}
    first = True
    while any(candidates.values()):
        batch = {name: hosts.pop(0) for name, hosts in candidates.items() if hosts}
        if first and servers:
            common.say(f"reading what {len(servers)} server(s) run, and {len(batch)} tier(s) on {', '.join(batch.values())}")
            result = runner.run_playbook("l3.yml", inv.path, limit=",".join(servers), hosts=list(servers),
                                         extravars={"__hicache_l3_running": True, "__hicache_l3_readers": list(batch.values())})
            for host in servers:
                running = (result.hosts[host].facts.get("hicache_l3_report") or {}).get("running")
                states[host] = running if running is not None else f"not read: {common.why_failed(result.hosts[host])}"
        else:
            common.say(f"reading {len(batch)} tier(s) on {', '.join(batch.values())}")
            result = runner.run_playbook("l3.yml", inv.path, limit=",".join(batch.values()), hosts=list(batch.values()))
        first = False
        for name, host in batch.items():
            fact = result.hosts[host].facts.get("hicache_l3_report") or {}
            if "entries" in fact:
                out[name] = (host, fact, None)
                candidates[name] = []
            else:
                tried[name].append(f"{host}: {common.why_failed(result.hosts[host])}")
                out[name] = (None, None, "; ".join(tried[name]))
    return out, states


def _order(tier, limited) -> list[str]:
    from hicachectl.ops import l3 as core

    return core.reader_order(tier, limited)

