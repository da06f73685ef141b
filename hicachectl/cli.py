"""hicachectl: deploy SGLang HiCache servers. Each command validates, calls the core, reports.

Exit codes: 0 ok, 1 invalid inventory or a failed host, 2 usage (unknown inventory, bad option).
Heavy imports (Ansible, Jinja) happen inside the commands so `--help` stays instant.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n")[0],
                  pretty_exceptions_enable=False)

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2

InventoryOpt = typer.Option(..., "--inventory", "-i", help="Inventory name under inventories/, or a path.")
LimitOpt = typer.Option(None, "--limit", "-l", help="Only these hosts (an Ansible host pattern).")
JsonOpt = typer.Option(False, "--json", help="Machine-readable output on stdout.")


def _say(message: str) -> None:
    typer.echo(message, err=True)


def _load(inventory: str, limit: str | None):
    from hicachectl import inventory as inv

    try:
        return inv.load(inventory, limit)
    except inv.InventoryError as exc:
        _say(f"error: {exc}")
        raise typer.Exit(EXIT_USAGE) from exc


def _check(inventory: str, limit: str | None, overrides: dict | None = None):
    """Load and check every host; nothing is contacted. Returns (inventory, deployments, findings)."""
    from hicachectl import rules

    inv = _load(inventory, limit)
    deployments, findings = {}, []
    for host, variables in inv.hosts.items():
        deployment, host_findings = rules.check_host(host, {**variables, **(overrides or {})})
        deployments[host] = deployment
        findings.extend(host_findings)
    return inv, deployments, findings


def _print_findings(inv, findings) -> None:
    for finding in findings:
        _say(finding.format(inv.name))


@app.command()
def validate(inventory: str = InventoryOpt, limit: str | None = LimitOpt, json: bool = JsonOpt) -> None:
    """Check every host's variables against SGLang's, NIXL's and the storage's rules. Touches no host."""
    from hicachectl import report, rules

    inv, deployments, findings = _check(inventory, limit)
    ok = not rules.has_errors(findings)
    if json:
        report.emit_json({"inventory": inv.name, "path": str(inv.path), "ok": ok, "hosts": sorted(deployments),
                          "findings": [f.as_dict() for f in findings]})
    else:
        _print_findings(inv, findings)
        errors = sum(f.level == rules.ERROR for f in findings)
        typer.echo(f"inventory {inv.name}: {len(deployments)} host(s), {errors} error(s), {len(findings) - errors} warning(s)"
                   + (": valid." if ok else ": invalid, nothing was deployed."))
    raise typer.Exit(EXIT_OK if ok else EXIT_INVALID)


@app.command()
def render(inventory: str = InventoryOpt, host: str | None = typer.Option(None, "--host", help="Only this host."),
           out: pathlib.Path | None = typer.Option(None, "--out", help="Write <out>/<host>/<file> instead of printing."),
           json: bool = JsonOpt) -> None:
    """Show (or write) the exact start.sh, run.sh and backend config each host would receive."""
    from hicachectl import launch, report, rules
    from hicachectl import render as rendering

    inv, deployments, findings = _check(inventory, host)
    if rules.has_errors(findings):
        _print_findings(inv, findings)
        _say("invalid inventory: nothing rendered.")
        raise typer.Exit(EXIT_INVALID)
    payload = {}
    for name, deployment in deployments.items():
        files = rendering.files(deployment)
        payload[name] = dict(launch.summary(deployment), files={f.name: f.content for f in files})
        if out is not None:
            target = out / name
            target.mkdir(parents=True, exist_ok=True)
            for f in files:
                (target / f.name).write_text(f.content)
                (target / f.name).chmod(int(f.mode, 8))
            _say(f"{name}: wrote {', '.join(f.name for f in files)} to {target}")
        elif not json:
            for f in files:
                typer.echo(f"==> {name}/{f.name} <==\n{f.content}")
    if json:
        report.emit_json({"inventory": inv.name, "hosts": payload})


@app.command()
def init(profile: str = typer.Option(..., help="One of the shipped inventories: vast, netapp, adp, local."),
         hosts: str = typer.Option(..., help="Comma-separated host names."),
         out: pathlib.Path = typer.Option(..., help="New inventory directory.")) -> None:
    """Start a new inventory from a profile."""
    from hicachectl import scaffold

    try:
        written = scaffold.init(profile, [h.strip() for h in hosts.split(",") if h.strip()], out)
    except scaffold.ScaffoldError as exc:
        _say(f"error: {exc}")
        raise typer.Exit(EXIT_USAGE) from exc
    for path in written:
        typer.echo(f"wrote {path}")
    typer.echo(f"next: edit {out}/group_vars/all.yml, then `hicachectl validate --inventory {out}`.")


@app.command()
def size(config: pathlib.Path = typer.Option(..., "--config", help="The model's config.json, or its directory."),
         inventory: str | None = typer.Option(None, "--inventory", "-i", help="Take tp, pp, page size and workload from this inventory."),
         host: str | None = typer.Option(None, "--host", help="The inventory host to read (default: the first)."),
         tp: int | None = typer.Option(None, "--tp", help="Tensor parallel ranks."),
         pp: int | None = typer.Option(None, "--pp", help="Pipeline parallel stages."),
         page_size: int | None = typer.Option(None, "--page-size", help="Tokens per page."),
         kv_dtype: str | None = typer.Option(None, "--kv-cache-dtype", help="auto (the model's dtype), bf16, fp8_e4m3, ..."),
         context: int | None = typer.Option(None, "--context", help="Tokens per request (default 131072)."),
         concurrency: int | None = typer.Option(None, "--concurrency", help="Requests in flight."),
         prefixes: int | None = typer.Option(None, "--prefixes", help="Distinct prefixes L3 must keep."),
         ttft: float | None = typer.Option(None, "--target-ttft", help="Warm TTFT target in seconds: gives the L3 read bandwidth needed."),
         json: bool = JsonOpt) -> None:
    """KV bytes per token and page, host pool per rank, L3 capacity and bandwidth for a model. Touches no host."""
    from hicachectl import report, sizing

    overrides = dict(tp_size=tp, pp_size=pp, page_size=page_size, kv_cache_dtype=kv_dtype, context_tokens=context,
                     concurrency=concurrency, prefixes=prefixes, target_warm_ttft_s=ttft)
    try:
        shape = sizing.model_shape(sizing.load_config(config))
        if inventory:
            _, deployments, _ = _check(inventory, host)
            d = next((d for d in deployments.values() if d is not None), None)
            if d is None:
                _say("error: the inventory has no valid host to read; run `hicachectl validate`.")
                raise typer.Exit(EXIT_INVALID)
            workload = sizing.workload_for(d, **overrides)
        else:
            workload = sizing.Workload(**{k: v for k, v in overrides.items() if v is not None})
        result = sizing.size(shape, workload)
    except sizing.SizingError as exc:
        _say(f"error: {exc}")
        raise typer.Exit(EXIT_INVALID) from exc
    if json:
        report.emit_json(result.as_dict())
    else:
        typer.echo(report.table(["quantity", "value"], sizing.lines(result)))


@app.command()
def plan(inventory: str = InventoryOpt, limit: str | None = LimitOpt, json: bool = JsonOpt,
         diff: bool = typer.Option(True, "--diff/--no-diff", help="Show the content of each planned change.")) -> None:
    """Dry run: what a deploy would change on each host (Ansible check mode with diff). Changes nothing."""
    _run("site.yml", inventory, limit, json, check=True, show_diff=diff, verb="would change")


@app.command()
def doctor(inventory: str = InventoryOpt, limit: str | None = LimitOpt, json: bool = JsonOpt) -> None:
    """What each host has (OS, GPUs, NICs, RDMA, NFS client, runtime, RAM, disk) against what its inventory needs.

    Exit 0: nothing required is missing; 1: a required item is missing; 2: a host could not be checked.
    """
    from hicachectl import report, rules, runner

    inv, deployments, findings = _check(inventory, limit)
    if rules.has_errors(findings):
        _print_findings(inv, findings)
        raise typer.Exit(EXIT_INVALID)
    result = runner.run_playbook("doctor.yml", inv.path, limit=limit)
    hosts = sorted(deployments)
    reports = {h: result.hosts[h].facts.get("__hicache_preflight") if h in result.hosts else None for h in hosts}
    unchecked = {h: "; ".join(result.hosts[h].reasons) if h in result.hosts else "not run" for h, r in reports.items() if r is None}
    missing = {h: r["required_missing"] for h, r in reports.items() if r and r["required_missing"]}
    code = 2 if unchecked else (EXIT_INVALID if missing else EXIT_OK)
    if json:
        report.emit_json({"inventory": inv.name, "exit_code": code, "hosts": {h: r or {"error": unchecked[h]} for h, r in reports.items()}})
        raise typer.Exit(code)
    items = list(dict.fromkeys(c["item"] for r in reports.values() if r for c in r["checks"]))
    cells = {h: {c["item"]: c["status"] + (" (required)" if c["blocking"] else "") for c in r["checks"]} for h, r in reports.items() if r}
    typer.echo(report.table(["item"] + hosts, [[item] + [cells.get(h, {}).get(item, "-" if h in cells else "?") for h in hosts] for item in items]))
    for host, r in reports.items():
        for c in (r or {}).get("checks", []):
            if c["status"] not in ("ok", "info"):
                typer.echo(f"{host}: {c['item']}: {c['detail']}" + (" [required by the inventory]" if c["blocking"] else ""))
    for host, reason in unchecked.items():
        typer.echo(f"{host}: could not be checked: {reason}")
    raise typer.Exit(code)


@app.command()
def deploy(inventory: str = InventoryOpt, limit: str | None = LimitOpt, json: bool = JsonOpt,
           check: bool = typer.Option(False, "--check", help="Dry run, as `plan`."),
           diff: bool = typer.Option(False, "--diff/--no-diff", help="Show the content of each change.")) -> None:
    """Validate, then bring every host to the inventory's state. A failed host does not stop the others."""
    _run("site.yml", inventory, limit, json, check=check, show_diff=diff or check, verb="would change" if check else "changed")


@app.command()
def status(inventory: str = InventoryOpt, limit: str | None = LimitOpt, json: bool = JsonOpt) -> None:
    """Per host: unit state, since when, image, config hash (and whether it is the inventory's), /health.

    Exit 0: every server is active, healthy and runs the inventory's config; 1 otherwise; 2: a host could not be read.
    """
    from hicachectl import report, rules, runner

    inv, deployments, findings = _check(inventory, limit)
    if rules.has_errors(findings):
        _print_findings(inv, findings)
        raise typer.Exit(EXIT_INVALID)
    result = runner.run_playbook("status.yml", inv.path, limit=limit)
    rows, data, code = [], {}, EXIT_OK
    for host in sorted(deployments):
        state = result.hosts[host].facts.get("__hicache_status") if host in result.hosts else None
        if state is None:
            reason = "; ".join(result.hosts[host].reasons) if host in result.hosts else "not run"
            data[host], code = {"error": reason}, 2
            rows.append([host, "?", "", "", "", "", reason])
            continue
        deployed = state["deployed"] or {}
        current = deployed.get("config_hash") == state["wanted_config_hash"]
        healthy = str(state["health"]) == "200"
        if code == EXIT_OK and not (state["unit"] == "active" and healthy and current):
            code = EXIT_INVALID
        data[host] = {**state, "current": current, "healthy": healthy}
        rows.append([host, state["unit"], state["since"], deployed.get("image", "-"),
                     (deployed.get("config_hash") or "-") + ("" if current else " (not the inventory's)"),
                     "ok" if healthy else str(state["health"]), ""])
    if json:
        report.emit_json({"inventory": inv.name, "exit_code": code, "hosts": data})
    else:
        typer.echo(report.table(["host", "unit", "since", "image", "config", "health", "error"], rows))
    raise typer.Exit(code)


@app.command()
def verify(inventory: str = InventoryOpt, limit: str | None = LimitOpt, json: bool = JsonOpt,
           l3: bool = typer.Option(False, "--l3", help="Also prove L3 persistence: write a long prompt, restart the server "
                                                        "(hicache_serial hosts at a time), and require hits from storage.")) -> None:
    """Check each host (mount, read-ahead, memlock, NICs) and its server (/health, served name, a chat
    completion, cache report, metrics). Changes nothing, except that --l3 restarts the servers.

    Exit 0: every check passed (or was skipped with its reason); 1: a check failed; 2: a host could not be checked.
    """
    from hicachectl import report, rules, runner

    inv, deployments, findings = _check(inventory, limit)
    if rules.has_errors(findings):
        _print_findings(inv, findings)
        raise typer.Exit(EXIT_INVALID)
    _say(f"verifying {len(deployments)} host(s) of {inv.name}" + (" with the L3 persistence proof (restarts each server)" if l3 else ""))
    result = runner.run_playbook("verify.yml", inv.path, limit=limit, extravars=_play_vars(deployments, l3, {"__hicache_verify_l3_requested": l3}),
                                 progress=lambda host, task, status: _say(f"  {host}: {task} ... {status}") if status != "ok" else None)
    hosts, code = {}, EXIT_OK
    for host in sorted(deployments):
        outcome = result.hosts.get(host)
        verdict = outcome.facts.get("__hicache_verify_result") if outcome else None
        if verdict is None:
            why = "; ".join(outcome.reasons) if outcome else ("not verified: the proof stops restarting servers after a failed batch"
                                                              if l3 else "not run")
            hosts[host] = {"ok": False, "error": why, "checks": []}
            code = 2
            continue
        skips = [dict(zip(("check", "detail"), skip.split(" : ", 1)[-1].split(": ", 1), strict=False), status="skip", cause="")
                 for skip in outcome.skips if ": condition false: " not in skip]
        hosts[host] = {"ok": verdict["ok"], "checks": skips + verdict["checks"]}
        if not verdict["ok"] and code == EXIT_OK:
            code = EXIT_INVALID
    if json:
        report.emit_json({"inventory": inv.name, "l3": l3, "exit_code": code, "hosts": hosts})
        raise typer.Exit(code)
    typer.echo(report.table(["host", "check", "result", "detail"],
                            [[h, c["check"], c["status"], c["detail"]] for h, r in hosts.items() for c in r["checks"]]
                            + [[h, "-", "error", r["error"]] for h, r in hosts.items() if "error" in r]))
    for host, r in hosts.items():
        for c in r["checks"]:
            if c["status"] == "fail" and c["cause"]:
                typer.echo(f"{host}: {c['check']}: {c['cause']}")
    skipped = sum(c["status"] == "skip" for r in hosts.values() for c in r["checks"])
    typer.echo("verify: " + ("passed" if code == EXIT_OK else "FAILED") + (f" ({skipped} check(s) skipped, not proven)" if skipped else ""))
    raise typer.Exit(code)


@app.command()
def bench(inventory: str | None = typer.Option(None, "--inventory", "-i", help="Benchmark a host of this inventory (reached over SSH as Ansible reaches it)."),
          host: str | None = typer.Option(None, "--host", help="The inventory host (default: the first)."),
          url: str | None = typer.Option(None, "--url", help="Or a server's base URL, e.g. http://gpu-01:8000."),
          concurrency: str = typer.Option("1,2,4,8,16,32,64", "--concurrency", help="Comma-separated levels; total prompts = concurrency."),
          input_len: int = typer.Option(120_000, "--input-len", help="Prompt length in words (about one token each)."),
          restart_command: str | None = typer.Option(None, "--restart-command", help="With --url: shell command that restarts the server "
                                                     "between cold and warm (default: POST /flush_cache, which keeps L3)."),
          out: pathlib.Path | None = typer.Option(None, "--out", help="Directory for bench.json and bench.png (default: ./hicache-bench-<time>)."),
          timeout: float = typer.Option(3600, "--timeout", help="Seconds any one step may take (a 120k prompt at 64 concurrent is slow cold)."),
          json: bool = JsonOpt) -> None:
    """Cold vs warm time-to-first-token per concurrency level, warm answered from L3 after a restart (the seeds' method).

    Exit 0: measured; 1: the server failed or could not be reached; 2: usage.
    """
    import datetime
    import json as jsonlib
    import secrets
    import sys

    from hicachectl import bench as benching
    from hicachectl import report

    try:
        levels = sorted({int(c) for c in concurrency.split(",") if c.strip()})
    except ValueError:
        levels = []
    if (inventory is None) == (url is None) or not levels or min(levels) < 1 or input_len < 1:
        _say("error: give exactly one of --inventory and --url, concurrency levels >= 1 and --input-len >= 1.")
        raise typer.Exit(EXIT_USAGE)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
    salt = f"{stamp}-{secrets.token_hex(4)}"  # never a prompt an earlier run put on L3
    out = out or pathlib.Path(f"hicache-bench-{stamp}")
    with _bench_target(inventory, host, url, restart_command) as (target, label):
        _say(f"bench {label}: {input_len} words x concurrency {levels}; warm after {target.reset_label}")
        results = []
        try:
            with typer.progressbar(length=2 * sum(levels), label="requests", file=sys.stderr) as bar:
                for level in levels:
                    results.append(benching.run_level(target, level, input_len, salt, timeout=timeout, done=lambda: bar.update(1)))
        except (benching.BenchError, OSError) as exc:
            _say(f"error: {exc}")
            raise typer.Exit(EXIT_INVALID) from exc
    rows = benching.summary(results)
    data = {"target": label, "input_words": input_len, "output_tokens": 1, "warm_after": target.reset_label, "salt": salt, "levels": rows,
            "requests": {r.concurrency: {"cold": [dataclasses.asdict(q) for q in r.cold.requests],
                                         "warm": [dataclasses.asdict(q) for q in r.warm.requests]} for r in results}}
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(jsonlib.dumps(data, indent=2) + "\n")
    benching.chart(rows, out / "bench.png", f"{label}: cold vs warm TTFT, ~{input_len} tokens, OSL 1")
    if json:
        report.emit_json(data)
    else:
        typer.echo(report.table(benching.TABLE_HEADERS, benching.table_rows(rows)))
        typer.echo(f"wrote {out / 'bench.json'} and {out / 'bench.png'}")


@contextlib.contextmanager
def _bench_target(inventory: str | None, host: str | None, url: str | None, restart_command: str | None):
    """(target, label): an inventory host through an SSH tunnel, restarted by the restart playbook; or a URL."""
    import subprocess

    from hicachectl import bench as benching
    from hicachectl import inventory as inventories
    from hicachectl import rules, runner, tunnel

    if inventory is None:
        def run_restart_command() -> None:
            if subprocess.run(restart_command, shell=True).returncode != 0:
                raise benching.BenchError(f"the restart command failed: {restart_command}")

        yield (benching.Target(url.rstrip("/"), None, run_restart_command if restart_command else None,
                               "restart command" if restart_command else "flush_cache (device and host caches; L3 kept)"), url)
        return
    inv, deployments, findings = _check(inventory, host)
    if rules.has_errors(findings):
        _print_findings(inv, findings)
        raise typer.Exit(EXIT_INVALID)
    name, d = next(iter(deployments.items()))

    def restart() -> None:
        result = runner.run_playbook("restart.yml", inv.path, limit=name, extravars={"hicache_serial": 1, "hicache_max_fail_percentage": 0})
        if not result.succeeded:
            raise benching.BenchError(f"restarting {name} failed: {'; '.join(result.hosts[name].reasons) if name in result.hosts else 'not run'}")

    with tunnel.forward(inventories.connection(inventory, name), name, d.effective_port, d.local_host) as base_url:
        yield benching.Target(base_url, d.served_name, restart, f"restart of {name} (hicachectl restart)"), f"{name} of {inv.name}"


@app.command()
def upgrade(image: str = typer.Option(..., "--image", help="The new image, pinned by tag or digest."),
            inventory: str = InventoryOpt, limit: str | None = LimitOpt, json: bool = JsonOpt,
            check: bool = typer.Option(False, "--check", help="Dry run.")) -> None:
    """Roll a new image out in batches (hicache_serial, default 1 host); a batch that does not become
    healthy is rolled back to its previous config and image, and the rollout stops there."""
    _run("site.yml", inventory, limit, json, check=check, show_diff=check, verb="would change" if check else "changed",
         extravars={"hicache_image": image}, rolling=True)


@app.command()
def restart(inventory: str = InventoryOpt, limit: str | None = LimitOpt, json: bool = JsonOpt,
            check: bool = typer.Option(False, "--check", help="Dry run.")) -> None:
    """Restart the servers in batches (hicache_serial, default 1 host), each waited for on /health."""
    _run("restart.yml", inventory, limit, json, check=check, show_diff=False, verb="would change" if check else "changed", rolling=True)


@app.command()
def rollback(inventory: str = InventoryOpt, limit: str | None = LimitOpt, json: bool = JsonOpt,
             check: bool = typer.Option(False, "--check", help="Dry run.")) -> None:
    """Put each host's previous config (and image) back, restart, and wait for /health."""
    _run("rollback.yml", inventory, limit, json, check=check, show_diff=check, verb="would change" if check else "changed", rolling=True)


def _play_vars(deployments: dict, rolling: bool, extravars: dict | None = None) -> dict:
    """Batch size and failure tolerance for the play (play keywords cannot read inventory variables)."""
    extravars = dict(extravars or {})
    if deployments and all(d is not None for d in deployments.values()):
        first = next(iter(deployments.values()))
        extravars.setdefault("hicache_serial", 1 if rolling and not first.serial else first.serial)
        extravars.setdefault("hicache_max_fail_percentage", 0 if rolling else first.max_fail_percentage)
    return extravars


def _run(playbook: str, inventory: str, limit: str | None, json: bool, *, check: bool, show_diff: bool, verb: str,
         extravars: dict | None = None, rolling: bool = False) -> None:
    from hicachectl import report, rules, runner

    inv, deployments, findings = _check(inventory, limit, extravars)
    if rules.has_errors(findings):
        _print_findings(inv, findings)
        _say("invalid inventory: no host was contacted.")
        raise typer.Exit(EXIT_INVALID)

    def progress(host: str, task: str, status: str) -> None:
        if status != "ok":
            _say(f"  {host}: {task} ... {status}")

    _say(f"{'checking' if check else 'running'} {playbook} on {len(deployments)} host(s) of {inv.name}")
    extravars = _play_vars(deployments, rolling, extravars)
    result = runner.run_playbook(playbook, inv.path, limit=limit, check=check, diff=show_diff or check, progress=progress, extravars=extravars)
    if json:
        report.emit_json({"inventory": inv.name, "check": check, "ok": result.succeeded,
                          "hosts": {h: r.as_dict() for h, r in sorted(result.hosts.items())}})
    else:
        for name, host in sorted(result.hosts.items()):
            for change in host.changes:
                typer.echo(f"{name}: {verb}: {change.task}" + (f" [{change.item}]" if change.item else ""))
                if show_diff:
                    for entry in change.diff:
                        text = report.unified_diff(entry)
                        if text:
                            typer.echo(text.rstrip("\n"))
        for name, host in sorted(result.hosts.items()):
            for note in host.notes:
                typer.echo(f"{name}: note: {note}")
            for skip in host.skips:
                if ": condition false: " not in skip:  # a step this host cannot do, with its reason
                    typer.echo(f"{name}: skipped: {skip}")
        typer.echo("")
        typer.echo(report.table(["host", "status", "ok", "changed", "failed", "skipped", "reason"],
                                [[h.host, verb if check and h.status == "changed" else h.status, h.ok, h.changed, h.failed, h.skipped, "; ".join(h.reasons)]
                                 for h in sorted(result.hosts.values(), key=lambda r: r.host)]))
    raise typer.Exit(EXIT_OK if result.succeeded else EXIT_INVALID)
