"""hicachectl: deploy SGLang HiCache servers. Each command validates, calls the core, reports.

Exit codes: EXIT_CODES below (the README's table is generated from it). Heavy imports (Ansible, Jinja)
happen inside the commands so `--help` stays instant.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import pathlib
import sys

import typer

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2
# The one table of exit codes: `python -m hicachectl.readme --write` puts it in the README.
EXIT_CODES = {
    EXIT_OK: "ok: valid, rendered, deployed, measured",
    EXIT_INVALID: "invalid inventory (a finding, a YAML error, an encrypted value without its password) or model config, a host that failed, "
                  "was unreachable, interrupted or never reached, a server bench could not reach, or an unexpected error "
                  "(one line; the details in a file it names)",
    EXIT_USAGE: "usage: an unknown command or option, a bad option value (`size --tp 0`, `bench --concurrency 0`, a vault "
                "password file that does not exist), an unknown inventory, `render --out` onto existing files without `--force`",
}
# doctor, verify and status follow DeepOps: 2 also means a host could not be checked.
CHECK_EXIT_CODES = {
    EXIT_OK: "nothing required is missing; every check passed (`not checked` only where `hicache_strict: false` tolerates it)",
    EXIT_INVALID: "a required item is missing, a check failed, a server is not healthy or not running the inventory's config",
    EXIT_USAGE: "a host could not be checked (or a usage error, as for every command)",
}
CHECK_COMMANDS = ("doctor", "verify", "status")


class _App(typer.Typer):
    """The typer app, with one handler for what no command expected: one line, the details in a file."""

    def __call__(self, *args, **kwargs):
        try:
            return super().__call__(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the last resort: never a traceback unless asked for
            raise SystemExit(_unexpected(exc)) from None


app = _App(add_completion=False, no_args_is_help=True, help=__doc__.split("\n")[0], pretty_exceptions_enable=False)
_DEBUG = "--debug" in sys.argv[1:2]


def _unexpected(exc: BaseException) -> int:
    """One line for an unexpected error; the traceback goes to a file (0600) and, with --debug, to stderr."""
    import datetime
    import os
    import tempfile
    import traceback

    text = "".join(traceback.format_exception(exc))
    if _DEBUG:
        sys.stderr.write(text)
    where = None
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
    home = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
    for folder in (pathlib.Path(os.environ["HICACHE_CACHE"]) if os.environ.get("HICACHE_CACHE") else home / "hicache-deploy",
                   pathlib.Path(tempfile.gettempdir())):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=f"hicachectl-error-{stamp}-", suffix=".txt", dir=folder)
            with os.fdopen(fd, "w") as handle:
                handle.write(f"hicachectl {_version()}: {' '.join(sys.argv[1:])}\n\n{text}")
            where = name
            break
        except OSError:
            continue
    message = " ".join(str(exc).split()) or "(no message)"
    _say(f"error: unexpected {type(exc).__name__}: {message[:300]}"
         + (f" (details in {where}" + ("" if _DEBUG else "; --debug shows them here") + ")" if where else ""))
    return EXIT_INVALID


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("hicache-deploy")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"hicachectl {_version()}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True, help="Print the version and exit."),
          debug: bool = typer.Option(False, "--debug", help="Show the traceback of an unexpected error (it is always written to a file).")) -> None:
    """Deploy SGLang HiCache servers: validate, render, plan, deploy, verify, bench."""
    global _DEBUG
    _DEBUG = _DEBUG or debug


InventoryOpt = typer.Option(..., "--inventory", "-i", help="Inventory: ./inventories/NAME, a path, or a shipped profile (vast, netapp, adp, local).")
LimitOpt = typer.Option(None, "--limit", "-l", help="Only these hosts (an Ansible host pattern).")
JsonOpt = typer.Option(False, "--json", help="Machine-readable output on stdout.")
# Vault, as ansible-playbook takes it; ANSIBLE_VAULT_PASSWORD_FILE and ANSIBLE_VAULT_IDENTITY_LIST work as well.
VaultPasswordFileOpt = typer.Option([], "--vault-password-file", help="Vault password file (or client script); repeatable.",
                                    rich_help_panel="Vault")
VaultIdOpt = typer.Option([], "--vault-id", help="Vault identity ID@SOURCE, SOURCE a file, a script or `prompt`; repeatable.",
                          rich_help_panel="Vault")
AskVaultPassOpt = typer.Option(False, "--ask-vault-pass", help="Ask for the vault password.", rich_help_panel="Vault")


def _with_vault(command):
    """Gives a command that loads an inventory the vault options; they reach the in-process loader and every
    playbook the command runs (hicachectl.inventory.use_vault)."""
    signature = inspect.signature(command, eval_str=True)
    added = {"vault_password_file": (list[str], VaultPasswordFileOpt), "vault_id": (list[str], VaultIdOpt),
             "ask_vault_pass": (bool, AskVaultPassOpt)}

    @functools.wraps(command)
    def wrapper(*args, vault_password_file: list[str], vault_id: list[str], ask_vault_pass: bool, **kwargs):
        from hicachectl import inventory

        inventory.use_vault(inventory.VaultOptions(tuple(vault_password_file or ()), tuple(vault_id or ()), bool(ask_vault_pass)))
        return command(*args, **kwargs)

    wrapper.__signature__ = signature.replace(parameters=[*signature.parameters.values(), *(
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind) for name, (kind, option) in added.items())])
    wrapper.__annotations__ = {**{n: p.annotation for n, p in signature.parameters.items()}, **{n: k for n, (k, _) in added.items()}}
    return wrapper


def _say(message: str) -> None:
    typer.echo(message, err=True)


def _usage(message: str) -> typer.Exit:
    """A bad option value: one line, exit 2 (as typer's own usage errors)."""
    _say(f"error: {message}")
    return typer.Exit(EXIT_USAGE)


def _load(inventory: str, limit: str | None):
    from hicachectl import inventory as inv

    try:
        loaded = inv.load(inventory, limit)
    except inv.InventoryError as exc:
        _say(f"error: {exc}")
        raise typer.Exit(exc.exit_code) from exc
    for note in loaded.notes:
        _say(f"note: Ansible, reading {loaded.path}: {note}")
    return loaded


def _check(inventory: str, limit: str | None, overrides: dict | None = None):
    """Load and check every host; nothing is contacted. Returns (inventory, deployments, findings)."""
    from hicachectl import rules

    inv = _load(inventory, limit)
    deployments, findings = {}, []
    for host, variables in inv.hosts.items():
        deployment, host_findings = rules.check_host(host, {**variables, **(overrides or {})})
        deployments[host] = deployment
        findings.extend(host_findings)
    findings.extend(rules.check_fleet(inv.hosts, getattr(inv, "connections", None)))  # across hosts: one machine twice
    findings.extend(rules.check_shared_tiers(deployments))
    findings.extend(rules.check_routed(deployments, getattr(inv, "routers", {})))
    for host, variables in getattr(inv, "routers", {}).items():  # a router host: only the router's variables
        findings.extend(rules.check_host(host, {**variables, **(overrides or {})}, role="router")[1])
    return inv, deployments, _masked_findings(findings, inv.hosts.values())


def _masked_findings(findings: list, host_variables) -> list:
    """Findings never quote a secret value (a finding may quote the value it refuses): ******** instead."""
    from hicachectl import secrets

    hidden = secrets.all_values(host_variables)
    return [dataclasses.replace(f, message=secrets.mask_text(f.message, hidden), fix=secrets.mask_text(f.fix, hidden))
            for f in findings] if hidden else findings


def _print_findings(inv, findings) -> None:
    """The same finding on many hosts is one line, the hosts counted and named compactly (--json keeps one per host)."""
    from hicachectl import rules

    for finding, hosts in rules.group_findings(findings):
        _say(finding.format(inv.name, hosts))


@app.command()
@_with_vault
def validate(inventory: str = InventoryOpt, limit: str | None = LimitOpt, json: bool = JsonOpt) -> None:
    """Check every host's variables against SGLang's, NIXL's and the storage's rules. Touches no host."""
    from hicachectl import report, rules

    inv, deployments, findings = _check(inventory, limit)
    ok = not rules.has_errors(findings)
    namespaces = _namespaces(deployments)
    if json:
        report.emit_json({"inventory": inv.name, "path": str(inv.path), "ok": ok, "hosts": sorted(deployments),
                          "findings": [f.as_dict() for f in findings], "l3_namespaces": namespaces})
    else:
        _print_findings(inv, findings)
        for line, hosts in _grouped(namespaces, "line").items():  # identical servers: one line
            typer.echo(f"{rules.compact_hosts(hosts)}: {line}")
        errors = sum(f.level == rules.ERROR for f in findings)
        typer.echo(f"inventory {inv.name}: {len(deployments)} host(s), {errors} error(s), {len(findings) - errors} warning(s)"
                   + (": valid." if ok else ": invalid, nothing was deployed."))
    raise typer.Exit(EXIT_OK if ok else EXIT_INVALID)


def _namespaces(deployments: dict) -> dict:
    """validate's account of each valid server's L3 namespace (hicachectl/l3.py): its line, the namespace, what it is
    derived from, whether it is off (the rule l3-namespace-off warns about it)."""
    from hicachectl import l3, namespace

    return {host: {"namespace": namespace.of(d), "line": l3.describe(d), "components": namespace.components(d),
                   "off": l3.is_off(d)}
            for host, d in deployments.items() if d is not None}


def _grouped(namespaces: dict, key: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for host, entry in namespaces.items():
        if entry[key]:
            out.setdefault(entry[key], []).append(host)
    return out


@app.command()
@_with_vault
def render(inventory: str = InventoryOpt, host: str | None = typer.Option(None, "--host", help="Only this host."),
           out: pathlib.Path | None = typer.Option(None, "--out", help="Write <out>/<host>/<file> instead of printing."),
           force: bool = typer.Option(False, "--force", help="With --out: replace files already there."),
           json: bool = JsonOpt) -> None:
    """Show (or write) the exact start.sh, run.sh and backend config each host would receive."""
    from hicachectl import launch, report, rules, secrets
    from hicachectl import render as rendering

    inv, deployments, findings = _check(inventory, host)
    if rules.has_errors(findings):
        _print_findings(inv, findings)
        _say("invalid inventory: nothing rendered.")
        raise typer.Exit(EXIT_INVALID)
    hidden = secrets.all_values(deployments.values())  # shown as ******** (files holding secrets show their masked text)
    if out is not None:
        _clear_out(out, {name: [f.name for f in rendering.files(d)] for name, d in deployments.items()}, force)
    payload = {}
    for name, deployment in deployments.items():
        files = rendering.files(deployment)
        payload[name] = secrets.mask(dict(launch.summary(deployment), files={f.name: f.shown for f in files}), hidden)
        if out is not None:
            target = out / name
            target.mkdir(parents=True, exist_ok=True)
            for f in files:
                _write_rendered(target / f.name, f.content, int(f.mode, 8))
            _say(f"{name}: wrote {', '.join(f.name for f in files)} to {target}")
        elif not json:
            for f in files:
                typer.echo(secrets.mask_text(f"==> {name}/{f.name} <==\n{f.shown}", hidden))
    if json:
        report.emit_json({"inventory": inv.name, "hosts": payload})


def _write_rendered(path: pathlib.Path, content: str, mode: int) -> None:
    """A new file created with its mode (a 0600 secrets file is never readable by others, not even for a moment)."""
    import os

    if path.is_symlink() or path.exists():
        path.unlink()  # _clear_out refused files already there unless --force; never write through a symlink
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
    with os.fdopen(fd, "w") as handle:
        os.fchmod(handle.fileno(), mode)  # the umask may have taken bits off
        handle.write(content)


def _clear_out(out: pathlib.Path, files: dict[str, list[str]], force: bool) -> None:
    """render --out writes <out>/<host>/<file>: never over a file that is there, unless --force."""
    blocking = [p for p in [out, *(out / h for h in files)] if p.exists() and not p.is_dir()]
    if blocking:
        raise _usage(f"--out: {blocking[0]} is a file, not a directory; nothing was written.")
    there = [out / h / f for h, names in files.items() for f in names if (out / h / f).exists() or (out / h / f).is_symlink()]
    if there and not force:
        raise _usage(f"--out: {len(there)} file(s) already there ({there[0]}{', ...' if len(there) > 1 else ''}); "
                     "nothing was written. Add --force to replace them, or choose another --out.")
    for path in there:
        path.unlink()


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
    name = out.name if out.resolve().parent == pathlib.Path.cwd().resolve() / "inventories" else str(out)
    typer.echo(f"next: edit {out}/group_vars/all.yml, then `hicachectl validate -i {name}`.")


@app.command()
@_with_vault
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
    if not config.exists():
        raise _usage(f"--config {config}: no such file or directory.")
    try:
        shape = sizing.model_shape(sizing.load_config(config))
    except sizing.SizingError as exc:  # the model's config cannot be read or sized: invalid input, as an inventory
        _say(f"error: {exc}")
        raise typer.Exit(EXIT_INVALID) from exc
    try:
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
    except sizing.SizingError as exc:  # a shape or workload value it cannot use: a bad option value
        raise _usage(str(exc)) from exc
    if json:
        report.emit_json(result.as_dict())
    else:
        typer.echo(report.table(["quantity", "value"], sizing.lines(result)))


@app.command()
@_with_vault
def plan(inventory: str = InventoryOpt, limit: str | None = LimitOpt, json: bool = JsonOpt,
         diff: bool = typer.Option(True, "--diff/--no-diff", help="Show the content of each planned change.")) -> None:
    """Dry run: what a deploy would change on each host (Ansible check mode with diff). Changes nothing."""
    _run("site.yml", inventory, limit, json, check=True, show_diff=diff, verb="would change")


@app.command()
@_with_vault
def doctor(inventory: str = InventoryOpt, limit: str | None = LimitOpt, json: bool = JsonOpt) -> None:
    """What each host has (OS, GPUs, NICs, RDMA, NFS client, runtime, RAM, disk) against what its inventory needs.

    Exit 0: nothing required is missing; 1: a required item is missing; 2: a host could not be checked.
    """
    from hicachectl import preflight, report, rules, runner

    inv, deployments, findings = _check(inventory, limit)
    if rules.has_errors(findings):
        _print_findings(inv, findings)
        raise typer.Exit(EXIT_INVALID)
    result = runner.run_playbook("doctor.yml", inv.path, limit=limit)
    hosts = sorted(deployments)
    reports = {h: result.hosts[h].facts.get("hicache_preflight_report") if h in result.hosts else None for h in hosts}
    unchecked = {h: "; ".join(map(str, result.hosts[h].reasons)) if h in result.hosts else "not run" for h, r in reports.items() if r is None}
    code = preflight.doctor_exit_code(reports)
    if json:
        report.emit_json({"inventory": inv.name, "exit_code": code,
                          "hosts": {h: dict(r, status=preflight.host_status(r)) if r else {"status": preflight.host_status(r), "error": unchecked[h]}
                                    for h, r in reports.items()}})
        raise typer.Exit(code)
    items = list(dict.fromkeys(c["item"] for r in reports.values() if r for c in r["checks"]))
    cells = {h: {c["item"]: c["status"] + (" (required)" if c["blocking"] else "") for c in r["checks"]} for h, r in reports.items() if r}
    typer.echo(report.table(["item"] + hosts, [[item] + [cells.get(h, {}).get(item, "-" if h in cells else "?") for h in hosts] for item in items]))
    for host, r in reports.items():
        for c in (r or {}).get("checks", []):
            if c["status"] in (preflight.MISSING, preflight.WARN):
                typer.echo(f"{host}: {c['item']}: {c['detail']}" + (" [required by the inventory]" if c["blocking"] else ""))
    for host, reason in unchecked.items():
        typer.echo(f"{host}: could not be checked: {reason}")
    raise typer.Exit(code)


@app.command()
@_with_vault
def deploy(inventory: str = InventoryOpt, limit: str | None = LimitOpt, json: bool = JsonOpt,
           check: bool = typer.Option(False, "--check", help="Dry run, as `plan`."),
           diff: bool = typer.Option(False, "--diff/--no-diff", help="Show the content of each change.")) -> None:
    """Validate, then bring every host to the inventory's state. A failed host does not stop the others."""
    _run("site.yml", inventory, limit, json, check=check, show_diff=diff or check, verb="would change" if check else "changed")


@app.command()
@_with_vault
def status(inventory: str = InventoryOpt, limit: str | None = LimitOpt, json: bool = JsonOpt) -> None:
    """Per host: unit state, since when, image, the config it runs (the inventory's, pending restart, or
    another), /health, and whether the running server (/server_info) agrees with the inventory.

    Exit 0: every server is active, healthy and runs the inventory's config; 1 otherwise (not deployed
    included); 2: a host could not be read.
    """
    from hicachectl import report, rules, runner
    from hicachectl import status as judging

    inv, deployments, findings = _check(inventory, limit)
    if rules.has_errors(findings):
        _print_findings(inv, findings)
        raise typer.Exit(EXIT_INVALID)
    result = runner.run_playbook("status.yml", inv.path, limit=limit, hosts=deployments)
    rows, data, code = [], {}, EXIT_OK
    for host in sorted(deployments):
        state = result.hosts[host].facts.get("hicache_status_report")
        if state is None:
            reason = "; ".join(result.hosts[host].reasons) or result.hosts[host].status
            data[host], code = {"ok": False, "error": reason}, 2
            rows.append([host, "?", "", "", "", "", reason])
            continue
        verdict = judging.judge(deployments[host], state)
        if code == EXIT_OK and not verdict["ok"]:
            code = EXIT_INVALID
        deployed = state["deployed"] or {}
        data[host] = {**state, **verdict, "current": verdict["config"] == judging.CURRENT}
        if verdict["config"] == judging.NONE:
            rows.append([host, "not deployed", "", "", "", "", "; ".join(verdict["problems"])])
            continue
        rows.append([host, state["unit"], state["since"], deployed.get("image", "-"),
                     f"{deployed.get('config_hash') or '-'} ({verdict['config']})",
                     "ok" if verdict["healthy"] else ("down" if int(state["health"] or -1) <= 0 else str(state["health"])),
                     "; ".join(verdict["problems"])])
    if json:
        report.emit_json({"inventory": inv.name, "exit_code": code, "hosts": data})
    else:
        typer.echo(report.table(["host", "unit", "since", "image", "config", "health", "problem"], rows))
    raise typer.Exit(code)


@app.command()
@_with_vault
def verify(inventory: str = InventoryOpt, limit: str | None = LimitOpt, json: bool = JsonOpt,
           l3: bool = typer.Option(False, "--l3", help="Also prove L3 persistence: write a long prompt, restart the server "
                                                        "(hicache_serial hosts at a time), and require hits from storage.")) -> None:
    """Check each host (mount, read-ahead, memlock, NICs) and its server (/health, served name, a chat
    completion, cache report, metrics). Changes nothing, except that --l3 restarts the servers.

    Exit 0: every check passed, or could not be made only where the inventory tolerates it (hicache_strict:
    false; the host is shown degraded); 1: a check failed; 2: a host could not be checked.
    """
    from hicachectl import report, rules, runner, verify

    inv, deployments, findings = _check(inventory, limit)
    if rules.has_errors(findings):
        _print_findings(inv, findings)
        raise typer.Exit(EXIT_INVALID)
    _say(f"verifying {len(deployments)} host(s) of {inv.name}" + (" with the L3 persistence proof (restarts each server)" if l3 else ""))
    run_id = _new_run_id()
    routers = sorted(getattr(inv, "routers", {}))  # router hosts: verify_routers.yml asks their SGLang router
    result = runner.run_playbook("verify.yml", inv.path, limit=limit, hosts=[*deployments, *routers], routers=routers,
                                 extravars=_play_vars(deployments, l3, {"__hicache_verify_l3_requested": l3, "__hicache_run_id": run_id}),
                                 progress=lambda host, task, status: _say(f"  {host}: {task} ... {status}") if status != "ok" else None)
    _release_locks_after(result, inv, run_id)
    hosts, code = {}, EXIT_OK
    for host in [*sorted(deployments), *routers]:
        outcome = result.hosts[host]
        verdict = outcome.facts.get("hicache_verify_report")
        if verdict is None:
            why = "; ".join(outcome.reasons) or ("not verified: the proof stops restarting servers after a failed batch"
                                                 if l3 and outcome.status == "not run" else outcome.status)
            hosts[host] = {"ok": False, "status": outcome.status if outcome.status != "ok" else "failed", "error": why, "checks": []}
            code = 2
            continue
        # What the inventory tolerates not having (hicache_strict: false) was not checked: the host is degraded.
        gaps = [{"check": gap.task, "status": verify.NOT_CHECKED, "detail": gap.reason, "cause": "tolerated: hicache_strict is false"}
                for gap in outcome.gaps]
        ok = verdict["ok"] and not outcome.interrupted
        hosts[host] = {"ok": ok, "status": "passed" if ok and not gaps else ("degraded" if ok else "failed"), "checks": gaps + verdict["checks"]}
        if not ok and code == EXIT_OK:
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
    unchecked = sum(c["status"] == verify.NOT_CHECKED for r in hosts.values() for c in r["checks"])
    degraded = sorted(h for h, r in hosts.items() if r.get("status") == "degraded")
    typer.echo("verify: " + ("FAILED" if code != EXIT_OK else "passed, DEGRADED" if degraded else "passed")
               + (f" ({unchecked} check(s) not made" + (f"; degraded: {', '.join(degraded)}" if degraded else "") + ")" if unchecked else ""))
    raise typer.Exit(code)


@app.command()
@_with_vault
def bench(inventory: str | None = typer.Option(None, "--inventory", "-i", help="Benchmark a host of this inventory (reached over SSH as Ansible reaches it)."),
          host: str | None = typer.Option(None, "--host", help="The inventory host (default: the first; with --router, the first router)."),
          router: bool = typer.Option(False, "--router", help="With --inventory: send the prompts through the inventory's router (group "
                                      "hicache_routers); metrics are every server's; warm after a restart of every server, each drained."),
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
    if (inventory is None) == (url is None):
        raise _usage("give exactly one of --inventory and --url.")
    if router and inventory is None:
        raise _usage("--router needs --inventory (the router and its servers are the inventory's).")
    if not levels or min(levels) < 1:
        raise _usage(f"--concurrency {concurrency!r}: give whole numbers >= 1 separated by commas, e.g. 1,2,4.")
    if input_len < 1:
        raise _usage(f"--input-len {input_len}: give at least 1.")
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
    salt = f"{stamp}-{secrets.token_hex(4)}"  # never a prompt an earlier run put on L3
    out = out or pathlib.Path(f"hicache-bench-{stamp}")
    with _bench_target(inventory, host, url, restart_command, router) as (target, label):
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
def _bench_target(inventory: str | None, host: str | None, url: str | None, restart_command: str | None, through_router: bool = False):
    """(target, label): an inventory host through an SSH tunnel, restarted by the restart playbook; the inventory's
    router and every server behind it (tunnels to each), every server restarted; or a URL."""
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
    if through_router:
        yield from _router_target(inventory, host)
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

    try:
        conn = inventories.connection(inventory, name)
    except inventories.InventoryError as exc:
        _say(f"error: {exc}")
        raise typer.Exit(exc.exit_code) from exc
    with contextlib.ExitStack() as stack:
        try:
            base_url = stack.enter_context(tunnel.forward(conn, name, d.effective_port, d.local_host))
        except Exception as exc:  # paramiko's and the socket's: say what could not be reached
            if not isinstance(exc, OSError | EOFError) and not type(exc).__module__.startswith("paramiko"):
                raise
            where = f"{conn.get('ansible_host', name)}:{conn.get('ansible_port', 22)}"
            _say(f"error: cannot open the bench tunnel to {name}: SSH at {where} did not let us in ({exc or type(exc).__name__}).")
            raise typer.Exit(EXIT_INVALID) from exc
        yield benching.Target(base_url, d.served_name, restart, f"restart of {name} (hicachectl restart)"), f"{name} of {inv.name}"


def _router_target(inventory: str, host: str | None):
    """bench --router: the router (tunnel to its port) with the /metrics of every server (a tunnel to each); the
    reset restarts every server through restart.yml (each out of the router until it is healthy again)."""
    from hicachectl import bench as benching
    from hicachectl import inventory as inventories
    from hicachectl import router, rules, runner, tunnel

    inv, deployments, findings = _check(inventory, None)
    if rules.has_errors(findings):
        _print_findings(inv, findings)
        raise typer.Exit(EXIT_INVALID)
    routers = getattr(inv, "routers", {})
    if not routers:
        raise _usage(f"inventory {inv.name} has no router: --router needs a host in group hicache_routers.")
    if host is not None and host not in routers:
        raise _usage(f"--host {host}: not a router of {inv.name} (its routers: {', '.join(routers)}).")
    name = host or next(iter(routers))
    d_router = router.check_router_host(name, routers[name])[0]

    def restart() -> None:
        # one server at a time: the others keep serving through the router (the bench's own prompts wait for it)
        result = runner.run_playbook("restart.yml", inv.path, extravars={"hicache_serial": 1, "hicache_max_fail_percentage": 0})
        if not result.succeeded:
            bad = [h for h, r in result.hosts.items() if r.reasons]
            raise benching.BenchError("restarting the servers failed: " + "; ".join(f"{h}: {'; '.join(result.hosts[h].reasons)}" for h in bad))

    with contextlib.ExitStack() as stack:
        urls = {}
        for target_host, port, address in [(name, d_router.router_port, "127.0.0.1" if d_router.router_host in ("0.0.0.0", "localhost") else d_router.router_host)] + \
                [(s, d.effective_port, d.local_host) for s, d in deployments.items()]:
            try:
                conn = inventories.connection(inventory, target_host)
                urls[target_host] = stack.enter_context(tunnel.forward(conn, target_host, port, address))
            except inventories.InventoryError as exc:
                _say(f"error: {exc}")
                raise typer.Exit(exc.exit_code) from exc
            except Exception as exc:  # paramiko's and the socket's: say what could not be reached
                if not isinstance(exc, OSError | EOFError) and not type(exc).__module__.startswith("paramiko"):
                    raise
                _say(f"error: cannot open the bench tunnel to {target_host}: {exc or type(exc).__name__}.")
                raise typer.Exit(EXIT_INVALID) from exc
        served = {d.served_name for d in deployments.values()}
        yield (benching.Target(urls[name], next(iter(served)) if len(served) == 1 else None, restart,
                               f"restart of every server behind {name} (hicachectl restart, each drained)",
                               [urls[s] for s in deployments]),
               f"router {name} of {inv.name} ({len(deployments)} servers)")


@app.command()
@_with_vault
def upgrade(image: str = typer.Option(..., "--image", help="The new image, pinned by tag or digest."),
            inventory: str = InventoryOpt, limit: str | None = LimitOpt, json: bool = JsonOpt,
            check: bool = typer.Option(False, "--check", help="Dry run.")) -> None:
    """Roll a new image out in batches (hicache_serial, default 1 host); a batch that does not become
    healthy is rolled back to its previous config and image, and the rollout stops there."""
    _run("site.yml", inventory, limit, json, check=check, show_diff=check, verb="would change" if check else "changed",
         extravars={"hicache_image": image}, rolling=True)


@app.command()
@_with_vault
def restart(inventory: str = InventoryOpt, limit: str | None = LimitOpt, json: bool = JsonOpt,
            check: bool = typer.Option(False, "--check", help="Dry run.")) -> None:
    """Restart the servers in batches (hicache_serial, default 1 host), each waited for on /health."""
    _run("restart.yml", inventory, limit, json, check=check, show_diff=False, verb="would change" if check else "changed", rolling=True)


@app.command()
@_with_vault
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


def _new_run_id() -> str:
    """Names the run in the hosts' locks; chosen here so the CLI can release them after an interrupted run."""
    import datetime
    import secrets

    return f"{datetime.datetime.now(datetime.UTC):%Y%m%dT%H%M%S}-{secrets.token_hex(4)}"


def _release_locks_after(result, inv, run_id: str) -> None:
    """A run cut short, or a host that failed or was never reached (a stopped rollout), may keep this run's
    lock: release them (only this run's), or name them."""
    from hicachectl import runner

    held = sorted(result.hosts) if result.interrupted else sorted(h for h, r in result.hosts.items() if not r.good)
    if not held:
        return
    released = runner.run_playbook("unlock.yml", inv.path, limit=",".join(held), hosts=held, extravars={"__hicache_run_id": run_id})
    for host in held:
        outcome = released.hosts[host]
        if outcome.good:
            result.hosts[host].notes.append(f"released the deploy lock of run {run_id} (if it held one)")
        else:
            why = "; ".join(outcome.reasons) or outcome.status
            result.hosts[host].notes.append(f"the deploy lock of run {run_id} may still be held on this host "
                                            f"(/run/hicache-deploy.lock): could not release it: {why}. Remove that file once no run uses the host.")


def _host_reason(h) -> str:
    parts = list(h.reasons)
    if h.interrupted:
        parts.append("the run was cut short before this host finished: its state is unknown; run the command again")
    if h.status == "not run":
        parts.append("the run never reached this host (an earlier batch failed, or the play stopped)")
    parts += [f"{g.task}: {g.reason}" for g in h.gaps]
    return "; ".join(dict.fromkeys(parts))


def _run(playbook: str, inventory: str, limit: str | None, json: bool, *, check: bool, show_diff: bool, verb: str,
         extravars: dict | None = None, rolling: bool = False) -> None:
    from hicachectl import report, rules, runner, secrets

    inv, deployments, findings = _check(inventory, limit, extravars)
    if rules.has_errors(findings):
        _print_findings(inv, findings)
        _say("invalid inventory: no host was contacted.")
        raise typer.Exit(EXIT_INVALID)
    # diffs (an old start.sh's), notes and reasons show them as ********; a router's too (its index URL)
    hidden = secrets.all_values([*deployments.values(), *getattr(inv, "routers", {}).values()])

    def progress(host: str, task: str, status: str) -> None:
        if status != "ok":
            _say(f"  {host}: {task} ... {status}")

    # site.yml ends with the routers' play; the other playbooks run on servers only
    routers = list(inv.routers) if playbook == "site.yml" else []
    routers_said = f" and {len(routers)} router(s)" if routers else ""
    _say(f"{'checking' if check else 'running'} {playbook} on {len(deployments)} host(s){routers_said} of {inv.name}")
    run_id = _new_run_id()
    # With routers a change rolls one server at a time by default (hicache_serial 0 would take every server out of
    # the routers at once): the others serve meanwhile.
    extravars = _play_vars(deployments, rolling or bool(getattr(inv, "routers", {})), {**(extravars or {}), "__hicache_run_id": run_id})
    result = runner.run_playbook(playbook, inv.path, limit=limit, check=check, diff=show_diff or check, progress=progress,
                                 extravars=extravars, hosts=[*deployments, *routers], routers=routers)
    _release_locks_after(result, inv, run_id)
    if json:
        report.emit_json(secrets.mask({"inventory": inv.name, "check": check, "ok": result.succeeded, "interrupted": result.interrupted,
                                       "hosts": {h: r.as_dict() | {"reason": _host_reason(r)} for h, r in sorted(result.hosts.items())}}, hidden))
    else:
        for name, host in sorted(result.hosts.items()):
            for change in host.changes:
                typer.echo(f"{name}: {verb}: {change.task}" + (f" [{change.item}]" if change.item else ""))
                if show_diff:
                    for entry in change.diff:
                        text = secrets.mask_text(report.unified_diff(entry), hidden)
                        if text:
                            typer.echo(text.rstrip("\n"))
        for name, host in sorted(result.hosts.items()):
            for note in host.notes:
                typer.echo(secrets.mask_text(f"{name}: note: {note}", hidden))
            for gap in host.gaps:
                typer.echo(secrets.mask_text(f"{name}: degraded: {gap}", hidden))
        if result.interrupted:
            typer.echo(f"INTERRUPTED: {result.interrupted}; no host's outcome is known.")
        typer.echo("")
        typer.echo(report.table(["host", "status", "ok", "changed", "failed", "reason"],
                                [[h.host, verb if check and h.status == "changed" else h.status, h.ok, h.changed, h.failed,
                                  secrets.mask_text(_host_reason(h), hidden)]
                                 for h in sorted(result.hosts.values(), key=lambda r: r.host)]))
    raise typer.Exit(EXIT_OK if result.succeeded else EXIT_INVALID)


@app.command()
@_with_vault
def monitoring(inventory: str = InventoryOpt,
               out: pathlib.Path = typer.Option(..., "--out", help="Directory for prometheus.yml, targets/, rules/ and grafana/."),
               force: bool = typer.Option(False, "--force", help="Replace files already there.")) -> None:
    """Prometheus scrape targets (file_sd), alert rules and a Grafana dashboard for the inventory's servers. Touches no host."""
    from hicachectl import monitoring as monitor
    from hicachectl import rules

    inv, deployments, findings = _check(inventory, None)
    if rules.has_errors(findings):
        _print_findings(inv, findings)
        _say("invalid inventory: nothing rendered.")
        raise typer.Exit(EXIT_INVALID)
    rendered = monitor.render(inv.path.name, deployments, getattr(inv, "connections", None) or {})
    folders: dict[str, list[str]] = {}
    for relative in rendered.files:
        folder, _, name = relative.rpartition("/")
        folders.setdefault(folder or ".", []).append(name)
    _clear_out(out, folders, force)
    for relative, content in rendered.files.items():
        (out / relative).parent.mkdir(parents=True, exist_ok=True)
        _write_rendered(out / relative, content, 0o644)
    for note in rendered.notes:
        _say(f"note: {note}")
    typer.echo(f"wrote {', '.join(rendered.files)} to {out}: {len(rendered.targets)} target(s); "
               f"load {out / monitor.DASHBOARD_FILE} into Grafana.")


from hicachectl import cli_l3  # noqa: E402,F401 - registers `l3` (hicachectl/cli_l3.py) on the app, with the helpers above
