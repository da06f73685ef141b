"""The commands that touch no host: validate, render, init, size, and monitoring (it renders files, as render
does, for the operator's Prometheus and Grafana). Each reads the inventory through the common guard
(hicachectl.cli_common) and reports as every command does."""

from __future__ import annotations

import pathlib

import typer

from hicachectl import cli_common as common


@common.with_vault
def validate(inventory: str = common.InventoryOpt, limit: str | None = common.LimitOpt, json: bool = common.JsonOpt) -> None:
    """Check every host's variables against SGLang's, NIXL's and the storage's rules. Touches no host."""
    from hicachectl import rules

    inv, deployments, findings = common.check(inventory, limit)  # never refused: the findings are validate's report
    ok = not rules.has_errors(findings)
    namespaces = _namespaces(deployments)
    lines = []
    if not json:
        common.print_findings(inv, findings)
        lines = [f"{rules.compact_hosts(hosts)}: {line}" for line, hosts in _grouped(namespaces, "line").items()]  # identical servers: one line
        errors = sum(f.level == rules.ERROR for f in findings)
        lines.append(f"inventory {inv.name}: {len(deployments)} host(s), {errors} error(s), {len(findings) - errors} warning(s)"
                     + (": valid." if ok else ": invalid, nothing was deployed."))
    common.finish(common.EXIT_OK if ok else common.EXIT_INVALID, json,
                  {"inventory": inv.name, "path": str(inv.path), "ok": ok, "hosts": sorted(deployments),
                   "findings": [f.as_dict() for f in findings], "l3_namespaces": namespaces}, lines)


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


@common.with_vault
def render(inventory: str = common.InventoryOpt, host: str | None = typer.Option(None, "--host", help="Only this host."),
           out: pathlib.Path | None = typer.Option(None, "--out", help="Write <out>/<host>/<file> instead of printing."),
           force: bool = typer.Option(False, "--force", help="With --out: replace files already there."),
           json: bool = common.JsonOpt) -> None:
    """Show (or write) the exact start.sh, run.sh and backend config each host would receive."""
    from hicachectl import launch, secrets
    from hicachectl import render as rendering

    inv, deployments = common.guard(inventory, host, common.NOTHING_RENDERED)
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
            common.say(f"{name}: wrote {', '.join(f.name for f in files)} to {target}")
        elif not json:
            for f in files:
                typer.echo(secrets.mask_text(f"==> {name}/{f.name} <==\n{f.shown}", hidden))
    common.finish(common.EXIT_OK, json, {"inventory": inv.name, "hosts": payload})  # the text was printed host by host


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
    """render --out (and monitoring --out) writes <out>/<folder>/<file>: never over a file that is there, unless --force."""
    blocking = [p for p in [out, *(out / h for h in files)] if p.exists() and not p.is_dir()]
    if blocking:
        raise common.usage(f"--out: {blocking[0]} is a file, not a directory; nothing was written.")
    there = [out / h / f for h, names in files.items() for f in names if (out / h / f).exists() or (out / h / f).is_symlink()]
    if there and not force:
        raise common.usage(f"--out: {len(there)} file(s) already there ({there[0]}{', ...' if len(there) > 1 else ''}); "
                           "nothing was written. Add --force to replace them, or choose another --out.")
    for path in there:
        path.unlink()


def init(profile: str = typer.Option(..., help="One of the shipped inventories: vast, netapp, adp, local."),
         hosts: str = typer.Option(..., help="Comma-separated host names."),
         out: pathlib.Path = typer.Option(..., help="New inventory directory.")) -> None:
    """Start a new inventory from a profile."""
    from hicachectl import scaffold

    try:
        written = scaffold.init(profile, [h.strip() for h in hosts.split(",") if h.strip()], out)
    except scaffold.ScaffoldError as exc:
        common.say(f"error: {exc}")
        raise typer.Exit(common.EXIT_USAGE) from exc
    for path in written:
        typer.echo(f"wrote {path}")
    name = out.name if out.resolve().parent == pathlib.Path.cwd().resolve() / "inventories" else str(out)
    typer.echo(f"next: edit {out}/group_vars/all.yml, then `hicachectl validate -i {name}`.")


@common.with_vault
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
         json: bool = common.JsonOpt) -> None:
    """KV bytes per token and page, host pool per rank, L3 capacity and bandwidth for a model. Touches no host."""
    from hicachectl import report, sizing

    overrides = dict(tp_size=tp, pp_size=pp, page_size=page_size, kv_cache_dtype=kv_dtype, context_tokens=context,
                     concurrency=concurrency, prefixes=prefixes, target_warm_ttft_s=ttft)
    if not config.exists():
        raise common.usage(f"--config {config}: no such file or directory.")
    try:
        shape = sizing.model_shape(sizing.load_config(config))
    except sizing.SizingError as exc:  # the model's config cannot be read or sized: invalid input, as an inventory
        common.say(f"error: {exc}")
        raise typer.Exit(common.EXIT_INVALID) from exc
    try:
        if inventory:
            # Not refused when invalid: any one valid host gives the shape (validate names what is wrong with the others).
            _, deployments, _ = common.check(inventory, host)
            d = next((d for d in deployments.values() if d is not None), None)
            if d is None:
                common.say("error: the inventory has no valid host to read; run `hicachectl validate`.")
                raise typer.Exit(common.EXIT_INVALID)
            workload = sizing.workload_for(d, **overrides)
        else:
            workload = sizing.Workload(**{k: v for k, v in overrides.items() if v is not None})
        result = sizing.size(shape, workload)
    except sizing.SizingError as exc:  # a shape or workload value it cannot use: a bad option value
        raise common.usage(str(exc)) from exc
    common.finish(common.EXIT_OK, json, result.as_dict(), [report.table(["quantity", "value"], sizing.lines(result))])


@common.with_vault
def monitoring(inventory: str = common.InventoryOpt,
               out: pathlib.Path = typer.Option(..., "--out", help="Directory for prometheus.yml, targets/, rules/ and grafana/."),
               force: bool = typer.Option(False, "--force", help="Replace files already there.")) -> None:
    """Prometheus scrape targets (file_sd), alert rules and a Grafana dashboard for the inventory's servers. Touches no host."""
    from hicachectl import monitoring as monitor

    inv, deployments = common.guard(inventory, None, common.NOTHING_RENDERED)
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
        common.say(f"note: {note}")
    typer.echo(f"wrote {', '.join(rendered.files)} to {out}: {len(rendered.targets)} target(s); "
               f"load {out / monitor.DASHBOARD_FILE} into Grafana.")
