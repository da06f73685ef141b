"""What every hicachectl command shares: its options, the one guard that checks an inventory and refuses an
invalid one before any host is contacted, and the one way a command ends (its --json payload or its text, then its
exit code), with the report of a playbook run (changes, notes, gaps, the host table).

Failures, gaps, skips and notes reach here as records (hicachectl.cli.runner.Record, Note) and are rendered here, never
parsed back out of text. Heavy imports (Ansible, Jinja) happen inside the functions, so `--help` stays instant.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Iterable
from typing import NoReturn

import typer

# The exit codes every command uses; what each means is hicachectl.cli.main.EXIT_CODES (the README's table).
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
    playbook the command runs (hicachectl.config.inventory.use_vault)."""
    signature = inspect.signature(command, eval_str=True)
    added = {"vault_password_file": (list[str], VaultPasswordFileOpt), "vault_id": (list[str], VaultIdOpt),
             "ask_vault_pass": (bool, AskVaultPassOpt)}

    @functools.wraps(command)
    def wrapper(*args, vault_password_file: list[str], vault_id: list[str], ask_vault_pass: bool, **kwargs):
        from hicachectl.config import inventory

        inventory.use_vault(inventory.VaultOptions(tuple(vault_password_file or ()), tuple(vault_id or ()), bool(ask_vault_pass)))
        return command(*args, **kwargs)

    wrapper.__signature__ = signature.replace(parameters=[*signature.parameters.values(), *(
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind) for name, (kind, option) in added.items())])
    wrapper.__annotations__ = {**{n: p.annotation for n, p in signature.parameters.items()}, **{n: k for n, (k, _) in added.items()}}
    return wrapper


def counted(servers, routers=()) -> str:
    """How validate, deploy and verify count an inventory's hosts: "2 server(s) and 1 router(s)", or "2 host(s)"
    when it has no router."""
    return f"{len(servers)} server(s) and {len(routers)} router(s)" if routers else f"{len(servers)} host(s)"


def say(message: str) -> None:
    """To stderr: stdout carries only the command's result (its table, its files, its --json)."""
    typer.echo(message, err=True)


def usage(message: str) -> typer.Exit:
    """A bad option value: one line, exit 2 (as typer's own usage errors)."""
    say(f"error: {message}")
    return typer.Exit(EXIT_USAGE)


def load(inventory: str, limit: str | None):
    """The inventory as Ansible reads it; one `error:` line and its exit code when it cannot be read."""
    from hicachectl.config import inventory as inv

    try:
        loaded = inv.load(inventory, limit)
    except inv.InventoryError as exc:
        say(f"error: {exc}")
        raise typer.Exit(exc.exit_code) from exc
    for note in loaded.notes:
        say(f"note: Ansible, reading {loaded.path}: {note}")
    return loaded


def check(inventory: str, limit: str | None, overrides: dict | None = None, *, offline: bool = False):
    """Load and check every host; nothing is contacted. Returns (inventory, deployments, findings). `offline`: for a
    command that only shows files (render, monitoring, size), where a profile's placeholders are warnings, not errors."""
    from hicachectl import rules
    from hicachectl.config import schema
    from hicachectl.rules.variables import misspelled_variables, orphan_group_vars, orphan_host_vars, plain_text_secrets, refuse_placeholders

    inv = load(inventory, limit)
    deployments, findings = {}, []
    for host, variables in inv.hosts.items():
        deployment, host_findings = rules.check_host(host, {**variables, **(overrides or {})})
        deployments[host] = deployment
        findings.extend(host_findings)
    findings.extend(rules.check_fleet(inv.hosts, getattr(inv, "connections", None)))  # across hosts: one machine twice
    # the routers among themselves (a router may share a machine with a server: check_router_clash judges that)
    findings.extend(rules.check_routers(getattr(inv, "routers", {}), getattr(inv, "connections", None)))
    findings.extend(rules.check_server_or_router(getattr(inv, "in_both", ())))
    for host, typos in getattr(inv, "misspelled", {}).items():
        findings.extend(misspelled_variables(host, typos))
    findings.extend(orphan_host_vars(getattr(inv, "orphan_host_vars", {})))
    findings.extend(orphan_group_vars(getattr(inv, "orphan_group_vars", {})))
    findings.extend(rules.check_shared_tiers(deployments))
    findings.extend(rules.check_routed(deployments, getattr(inv, "routers", {}), getattr(inv, "connections", None)))
    for host, variables in getattr(inv, "routers", {}).items():  # a router host: only the router's variables
        findings.extend(rules.check_host(host, {**variables, **(overrides or {})}, role="router")[1])
    every = {**inv.hosts, **getattr(inv, "routers", {})}
    router_reads = {v.name for v in schema.role_variables("router")}  # a router host: what the router role reads
    for host, written in getattr(inv, "plain_secrets", {}).items():  # a hub token in clear in group_vars: Vault, please
        if host in getattr(inv, "routers", {}):
            written = {path: where for path, where in written.items() if path.split(".")[0] in router_reads}
        findings.extend(plain_text_secrets(host, written, every.get(host, {})))
    if not offline:
        findings = refuse_placeholders(findings)
    return inv, deployments, _masked_findings(findings, every.values())


def refuse_invalid(inv, findings: list, refusal: str | None = None, *, judged: list | None = None) -> None:
    """Stop (exit 1) when an error is among `judged` (default: every finding): every finding is shown, then
    `refusal`, what was not done."""
    from hicachectl import rules

    if rules.has_errors(findings if judged is None else judged):
        print_findings(inv, findings)
        if refusal:
            say(refusal)
        raise typer.Exit(EXIT_INVALID)


def guard(inventory: str, limit: str | None, refusal: str | None = None, overrides: dict | None = None, *, offline: bool = False):
    """The guard in front of every command that uses an inventory's hosts: check it, refuse it when invalid.
    Returns (inventory, deployments), every deployment valid."""
    inv, deployments, findings = check(inventory, limit, overrides, offline=offline)
    refuse_invalid(inv, findings, refusal)
    return inv, deployments


def _masked_findings(findings: list, host_variables) -> list:
    """Findings never quote a secret value (a finding may quote the value it refuses): ******** instead."""
    from hicachectl.config import secrets

    hidden = secrets.all_values(host_variables)
    return [dataclasses.replace(f, message=secrets.mask_text(f.message, hidden), fix=secrets.mask_text(f.fix, hidden))
            for f in findings] if hidden else findings


def print_findings(inv, findings) -> None:
    """The same finding on many hosts is one line, the hosts counted and named compactly (--json keeps one per host)."""
    from hicachectl import rules

    for finding, hosts in rules.group_findings(findings):
        say(finding.format(inv.name, hosts))


class Finished(typer.Exit):
    """A command's end after its report (finish): its exit code is the report's, not a usage error's."""


def finish(code: int, json: bool, payload, text: Iterable[str] = ()) -> NoReturn:
    """The one way a command ends: with --json its payload on stdout, else its text; then its exit code."""
    from hicachectl.formats import report

    if json:
        report.emit_json(payload)
    else:
        for line in text:
            typer.echo(line)
    raise Finished(code)


def progress(host: str, task: str, status: str) -> None:
    """A playbook's progress, as it happens: what is not simply ok (changed, failed, a long step still running)."""
    if status != "ok":
        say(f"  {host}: {task} ... {status}")


class Progress:
    """The progress of a run that changes hosts, on stderr as it happens: `  host: task ... status` for what is not
    simply ok. A task says each status once per host while it runs (a loop reports each item, then itself: one line).
    With `changes=False` a change is not said here: the report lists each change with its content (plan, --check,
    --diff), so every change is said once, there; otherwise this line is where it is said (report_run lists none)."""

    def __init__(self, changes: bool = True):
        self.changes = changes
        self.current: dict[str, tuple[str, set[str]]] = {}  # host -> (its task under way, the statuses said for it)

    def __call__(self, host: str, task: str, status: str) -> None:
        current, said_now = self.current.get(host, (None, set()))
        if current != task:
            said_now = set()
            self.current[host] = (task, said_now)
        if status == "ok" or (status == "changed" and not self.changes) or status in said_now:
            return
        said_now.add(status)
        say(f"  {host}: {task} ... {status}")


def lists_changes(check: bool, show_diff: bool) -> bool:
    """Whether a run's report lists each change (with its content): in check mode (what would change is the plan) and
    with --diff. Otherwise the progress said each change as it happened (Progress), and the report does not again."""
    return check or show_diff


def said(records: Iterable) -> str:
    """Records (failures, gaps) as one line: "task: reason; task (item): reason"."""
    return "; ".join(map(str, records))


def why_failed(outcome) -> str:
    """Why a host of a run has no result: its failures, else its status ("not run", "interrupted")."""
    return said(outcome.failures) or outcome.status


def host_reasons(h) -> list[str]:
    """The parts of a host's reason, each once: failures, what cut it short, tolerated gaps."""
    parts = [str(f) for f in h.failures]
    if h.interrupted:
        parts.append("the run was cut short before this host finished: its state is unknown; run the command again")
    if h.status == "not run":
        parts.append("the run never reached this host (an earlier batch failed, or the play stopped)")
    parts += [str(g) for g in h.gaps]
    return list(dict.fromkeys(parts))


def host_reason(h) -> str:
    """The reason of a run's table as one text (its --json "reason"): host_reasons joined by "; "."""
    return "; ".join(host_reasons(h))


# What a dry run found that deploy would refuse on a host (roles/sglang_image/tasks/downgrade.yml sets it in check mode).
REFUSAL_FACT = "hicache_refusal"


def plan_exit_code(result) -> int:
    """plan --detailed-exitcode (Terraform's plan -detailed-exitcode): 1 when a host failed, was not reached, or would
    be refused by deploy; else 2 when any host would change; else 0."""
    if not result.succeeded or any(r.facts.get(REFUSAL_FACT) for r in result.hosts.values()):
        return EXIT_INVALID
    return EXIT_USAGE if any(r.changed for r in result.hosts.values()) else EXIT_OK


def report_run(inv, result, *, json: bool, check: bool, verb: str, show_diff: bool, hidden, exit_code: int | None = None) -> NoReturn:
    """The report of a playbook run: each change with its diff (in check mode and with --diff: lists_changes; else
    the progress said each as it happened), each failure, note and gap in full, the host table; or --json (every
    change, always).
    Secret values (`hidden`) show as ********. Exit 0 when every host ended ok, changed or degraded, else 1 (or
    `exit_code`, plan --detailed-exitcode's)."""
    from hicachectl.config import secrets

    payload = secrets.mask({"inventory": inv.name, "check": check, "ok": result.succeeded, "interrupted": result.interrupted,
                            "hosts": {h: r.as_dict() | {"reason": host_reason(r)} for h, r in sorted(result.hosts.items())}}, hidden)
    if exit_code is None:
        exit_code = EXIT_OK if result.succeeded else EXIT_INVALID
    finish(exit_code, json, payload,
           _run_lines(result, check=check, verb=verb, show_diff=show_diff, hidden=hidden))


# The host table of a run: a line is at most this wide (the reason column wraps under itself), and beyond this many
# hosts, hosts with one outcome (status, counts, reason) share a row, named as validate names them (gpu-[01:04]).
TABLE_WIDTH = 120
GROUP_ABOVE = 8
# A group is one row only if its hosts fold into this many names at most (every host stays named in the table).
GROUP_NAMES = 6


def _group_name(hosts: list[str]) -> str | None:
    """The hosts of one outcome as one table cell (gpu-[01:04], cpu-a), or None when they do not fold into a few names."""
    from hicachectl.rules import compact_hosts

    named = compact_hosts(hosts, limit=len(hosts))
    return named if named.count(", ") < GROUP_NAMES else None


def run_table(hosts: Iterable, *, check: bool, verb: str, hidden) -> str:
    """The host table of a run: status, counts and the reason, wrapped within its column (an SSH error's own line
    breaks never split a row); with more than GROUP_ABOVE hosts, those with one outcome on one row."""
    from hicachectl.config import secrets
    from hicachectl.formats import report

    rows = [[h.host, verb if check and h.status == "changed" else h.status, h.ok, h.changed, h.failed,
             [secrets.mask_text(part, hidden) for part in host_reasons(h)]] for h in sorted(hosts, key=lambda r: r.host)]
    if len(rows) > GROUP_ABOVE:
        rows = report.grouped(rows, _group_name)
    return report.table(["host", "status", "ok", "changed", "failed", "reason"], rows, width=TABLE_WIDTH)


def _same_changes(hosts, hidden) -> list[tuple[str, list, str]]:
    """(the hosts' names as one, their changes, whose content is shown) for each group of hosts with the same changes,
    in host order; a host without changes is in none. Changes that differ only where each host's own name stands (every
    rendered file says whom it is for, and installed.json a digest of them) are the same: the group shows its first host's
    content, and says so."""
    import json as jsonlib
    import re

    from hicachectl.config import secrets
    from hicachectl.rules import compact_hosts

    def without(name: str, value):
        """`value` with the host's name (a whole word: gpu-1 is not in gpu-10) and installed.json's config_hash (a digest
        of the files, so it differs with the name they hold: sglang_server.deployed) set aside, in every string it holds."""
        if isinstance(value, str):
            value = re.sub(rf"(?<![\w.-]){re.escape(name)}(?![\w.-])", "\0", value)
            return re.sub(r'("config_hash": ")[0-9a-f]{16}"', r'\1#"', value)
        if isinstance(value, dict):
            return {k: without(name, v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [without(name, v) for v in value]
        return value

    groups: dict[str, list] = {}
    for name, host in hosts:
        if host.changes:
            changes = [[c.task, c.item, c.diff] for c in host.changes]
            text = secrets.mask_text(jsonlib.dumps(changes, sort_keys=True, default=str), hidden)
            key = secrets.mask_text(jsonlib.dumps(without(name, changes), sort_keys=True, default=str), hidden)
            group = groups.setdefault(key, [name, host.changes, [], set()])
            group[2].append(name)
            group[3].add(text)
    return [(compact_hosts(names, limit=len(names)), changes, first if len(texts) > 1 else "")
            for first, changes, names, texts in groups.values()]


def _run_lines(result, *, check: bool, verb: str, show_diff: bool, hidden) -> Iterable[str]:
    from hicachectl.config import secrets
    from hicachectl.formats import report

    hosts = sorted(result.hosts.items())
    if lists_changes(check, show_diff):
        # Hosts whose changes are the same, content and all, are said once (gpu-[01:08]: would change: ...): a first
        # plan of a fleet is as long as one host's. Without --diff a change is one line with its size.
        for names, changes, shown in _same_changes(hosts, hidden):
            if show_diff and shown:
                yield f"{names}: {shown}'s changes shown; each host's differ only in its own name (and so the config's digest)"
            for change in changes:
                line = f"{names}: {verb}: {change.task}" + (f" [{change.item}]" if change.item else "")
                if show_diff:
                    yield line
                    for entry in change.diff:
                        text = secrets.mask_text(report.unified_diff(entry), hidden)
                        if text:
                            yield text.rstrip("\n")
                else:
                    size = report.diff_summary(list(change.diff))
                    yield line + (f" ({size})" if size else "")
    # Every record in full, one line each (an SSH error's own line breaks as " / "), before the table that wraps them.
    for name, host in hosts:
        for failure in host.failures:
            said = f"{name}: {failure}" if failure.task == "unreachable" else f"{name}: failed: {failure}"
            yield secrets.mask_text(report.one_line(said), hidden)
        for note in host.notes:
            yield secrets.mask_text(f"{name}: note: {note.text}", hidden)
        for gap in host.gaps:
            yield secrets.mask_text(f"{name}: degraded: {gap}", hidden)
    if result.interrupted:
        yield f"INTERRUPTED: {result.interrupted}; no host's outcome is known."
    yield ""
    yield run_table(result.hosts.values(), check=check, verb=verb, hidden=hidden)
