"""What every hicachectl command shares: its options, the one guard that checks an inventory and refuses an
invalid one before any host is contacted, and the one way a command ends (its --json payload or its text, then its
exit code), with the report of a playbook run (changes, notes, gaps, the host table).

Failures, gaps, skips and notes reach here as records (hicachectl.runner.Record, Note) and are rendered here, never
parsed back out of text. Heavy imports (Ansible, Jinja) happen inside the functions, so `--help` stays instant.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Iterable
from typing import NoReturn

import typer

# The exit codes every command uses; what each means is hicachectl.cli.EXIT_CODES (the README's table).
EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2
# doctor, verify and status, as DeepOps: 2 also means a host could not be checked.
EXIT_NOT_CHECKED = EXIT_USAGE

# What a command says after the findings when it refuses an invalid inventory.
NOTHING_CONTACTED = "invalid inventory: no host was contacted."
NOTHING_RENDERED = "invalid inventory: nothing rendered."

InventoryOpt = typer.Option(..., "--inventory", "-i", help="Inventory: ./inventories/NAME, a path, or a shipped profile (vast, netapp, adp, local).")
LimitOpt = typer.Option(None, "--limit", "-l", help="Only these hosts (an Ansible host pattern).")
JsonOpt = typer.Option(False, "--json", help="Machine-readable output on stdout.")
# Vault, as ansible-playbook takes it; ANSIBLE_VAULT_PASSWORD_FILE and ANSIBLE_VAULT_IDENTITY_LIST work as well.
VaultPasswordFileOpt = typer.Option([], "--vault-password-file", help="Vault password file (or client script); repeatable.",
                                    rich_help_panel="Vault")
VaultIdOpt = typer.Option([], "--vault-id", help="Vault identity ID@SOURCE, SOURCE a file, a script or `prompt`; repeatable.",
                          rich_help_panel="Vault")
AskVaultPassOpt = typer.Option(False, "--ask-vault-pass", help="Ask for the vault password.", rich_help_panel="Vault")


def with_vault(command):
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


def say(message: str) -> None:
    """To stderr: stdout carries only the command's result (its table, its files, its --json)."""
    typer.echo(message, err=True)


def usage(message: str) -> typer.Exit:
    """A bad option value: one line, exit 2 (as typer's own usage errors)."""
    say(f"error: {message}")
    return typer.Exit(EXIT_USAGE)


def load(inventory: str, limit: str | None):
    """The inventory as Ansible reads it; one `error:` line and its exit code when it cannot be read."""
    from hicachectl import inventory as inv

    try:
        loaded = inv.load(inventory, limit)
    except inv.InventoryError as exc:
        say(f"error: {exc}")
        raise typer.Exit(exc.exit_code) from exc
    for note in loaded.notes:
        say(f"note: Ansible, reading {loaded.path}: {note}")
    return loaded


def check(inventory: str, limit: str | None, overrides: dict | None = None):
    """Load and check every host; nothing is contacted. Returns (inventory, deployments, findings)."""
    from hicachectl import rules

    inv = load(inventory, limit)
    deployments, findings = {}, []
    for host, variables in inv.hosts.items():
        deployment, host_findings = rules.check_host(host, {**variables, **(overrides or {})})
        deployments[host] = deployment
        findings.extend(host_findings)
    findings.extend(rules.check_fleet(inv.hosts, getattr(inv, "connections", None)))  # across hosts: one machine twice
    findings.extend(rules.check_shared_tiers(deployments))
    findings.extend(rules.check_routed(deployments, getattr(inv, "routers", {}), getattr(inv, "connections", None)))
    for host, variables in getattr(inv, "routers", {}).items():  # a router host: only the router's variables
        findings.extend(rules.check_host(host, {**variables, **(overrides or {})}, role="router")[1])
    return inv, deployments, _masked_findings(findings, inv.hosts.values())


def refuse_invalid(inv, findings: list, refusal: str | None = None, *, judged: list | None = None) -> None:
    """Stop (exit 1) when an error is among `judged` (default: every finding): every finding is shown, then
    `refusal`, what was not done."""
    from hicachectl import rules

    if rules.has_errors(findings if judged is None else judged):
        print_findings(inv, findings)
        if refusal:
            say(refusal)
        raise typer.Exit(EXIT_INVALID)


def guard(inventory: str, limit: str | None, refusal: str | None = None, overrides: dict | None = None):
    """The guard in front of every command that uses an inventory's hosts: check it, refuse it when invalid.
    Returns (inventory, deployments), every deployment valid."""
    inv, deployments, findings = check(inventory, limit, overrides)
    refuse_invalid(inv, findings, refusal)
    return inv, deployments


def _masked_findings(findings: list, host_variables) -> list:
    """Findings never quote a secret value (a finding may quote the value it refuses): ******** instead."""
    from hicachectl import secrets

    hidden = secrets.all_values(host_variables)
    return [dataclasses.replace(f, message=secrets.mask_text(f.message, hidden), fix=secrets.mask_text(f.fix, hidden))
            for f in findings] if hidden else findings


def print_findings(inv, findings) -> None:
    """The same finding on many hosts is one line, the hosts counted and named compactly (--json keeps one per host)."""
    from hicachectl import rules

    for finding, hosts in rules.group_findings(findings):
        say(finding.format(inv.name, hosts))


def finish(code: int, json: bool, payload, text: Iterable[str] = ()) -> NoReturn:
    """The one way a command ends: with --json its payload on stdout, else its text; then its exit code."""
    from hicachectl import report

    if json:
        report.emit_json(payload)
    else:
        for line in text:
            typer.echo(line)
    raise typer.Exit(code)


def progress(host: str, task: str, status: str) -> None:
    """A playbook's progress, as it happens: what is not simply ok (changed, failed, a long step still running)."""
    if status != "ok":
        say(f"  {host}: {task} ... {status}")


def said(records: Iterable) -> str:
    """Records (failures, gaps) as one line: "task: reason; task (item): reason"."""
    return "; ".join(map(str, records))


def why_failed(outcome) -> str:
    """Why a host of a run has no result: its failures, else its status ("not run", "interrupted")."""
    return said(outcome.failures) or outcome.status


def host_reason(h) -> str:
    """The reason column of a run's table (and its --json "reason"): failures, what cut it short, tolerated gaps."""
    parts = [str(f) for f in h.failures]
    if h.interrupted:
        parts.append("the run was cut short before this host finished: its state is unknown; run the command again")
    if h.status == "not run":
        parts.append("the run never reached this host (an earlier batch failed, or the play stopped)")
    parts += [str(g) for g in h.gaps]
    return "; ".join(dict.fromkeys(parts))


def report_run(inv, result, *, json: bool, check: bool, verb: str, show_diff: bool, hidden) -> NoReturn:
    """The report of a playbook run: each change (with its diff), note and gap, the host table; or --json. Secret
    values (`hidden`) show as ********. Exit 0 when every host ended ok, changed or degraded, else 1."""
    from hicachectl import secrets

    payload = secrets.mask({"inventory": inv.name, "check": check, "ok": result.succeeded, "interrupted": result.interrupted,
                            "hosts": {h: r.as_dict() | {"reason": host_reason(r)} for h, r in sorted(result.hosts.items())}}, hidden)
    finish(EXIT_OK if result.succeeded else EXIT_INVALID, json, payload,
           _run_lines(result, check=check, verb=verb, show_diff=show_diff, hidden=hidden))


def _run_lines(result, *, check: bool, verb: str, show_diff: bool, hidden) -> Iterable[str]:
    from hicachectl import report, secrets

    hosts = sorted(result.hosts.items())
    for name, host in hosts:
        for change in host.changes:
            yield f"{name}: {verb}: {change.task}" + (f" [{change.item}]" if change.item else "")
            if show_diff:
                for entry in change.diff:
                    text = secrets.mask_text(report.unified_diff(entry), hidden)
                    if text:
                        yield text.rstrip("\n")
    for name, host in hosts:
        for note in host.notes:
            yield secrets.mask_text(f"{name}: note: {note.text}", hidden)
        for gap in host.gaps:
            yield secrets.mask_text(f"{name}: degraded: {gap}", hidden)
    if result.interrupted:
        yield f"INTERRUPTED: {result.interrupted}; no host's outcome is known."
    yield ""
    yield report.table(["host", "status", "ok", "changed", "failed", "reason"],
                       [[h.host, verb if check and h.status == "changed" else h.status, h.ok, h.changed, h.failed,
                         secrets.mask_text(host_reason(h), hidden)]
                        for h in sorted(result.hosts.values(), key=lambda r: r.host)])
