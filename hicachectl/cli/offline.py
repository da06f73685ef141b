"""The commands that touch no host: validate, render, init, size, and monitoring (it renders files, as render
does, for the operator's Prometheus and Grafana). Each reads the inventory through the common guard
(hicachectl.cli.common) and reports as every command does."""

from __future__ import annotations

import pathlib
from typing import Any

import typer

from hicachectl.cli import common
from hicachectl.config.deployment import Deployment


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
        # counted as printed: a finding shared by many hosts is one line, and one error (#34: "4 errors" for 2 lines)
        printed = rules.group_findings(findings)
        errors = sum(f.level == rules.ERROR for f, _ in printed)
        routers = getattr(inv, "routers", None) or {}
        lines.append(f"inventory {inv.name}: {common.counted(deployments, routers)}, {errors} error(s), {len(printed) - errors} warning(s)"
                     + (": valid." if ok else ": invalid, nothing was deployed."))
    common.finish(common.EXIT_OK if ok else common.EXIT_INVALID, json,
                  {"inventory": inv.name, "path": str(inv.path), "ok": ok, "hosts": sorted(deployments),
                   "routers": sorted(getattr(inv, "routers", None) or {}),
                   "findings": [f.as_dict() for f in findings], "l3_namespaces": namespaces}, lines)


def _namespaces(deployments: dict) -> dict:
    """validate's account of each valid server's L3 namespace (hicachectl/ops/l3.py): its line, the namespace, what it is
    derived from, whether it is off (the rule l3-namespace-off warns about it)."""
    from hicachectl.config import namespace
    from hicachectl.ops import l3

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
def render(inventory: str = common.InventoryOpt, host: str | None = typer.Option(None, "--host", help="Only this host (a server or a router)."),
           out: pathlib.Path | None = typer.Option(None, "--out", help="Write <out>/<host>/<file> (the server's config directory) and "
                                                   "<out>/<host>.rootfs/<path> (every other file) instead of printing."),
           force: bool = typer.Option(False, "--force", help="With --out: replace files already there."),
           json: bool = common.JsonOpt) -> None:
    """Show (or write) every file each host would receive: a server's start.sh, run.sh, backend config and unit, the
    fstab block, sysctl.d, modprobe.d, nfs.conf.d, limits.d, the NIC config and units; a router's workers file and unit.
    Files the NVIDIA Container Toolkit writes for the container runtime are named with the command (not written by --out)."""
    from hicachectl.config import secrets
    from hicachectl.plans import host_files, launch
    from hicachectl.plans import sglang_server as rendering

    inv, deployments = common.guard(inventory, host, common.NOTHING_RENDERED, offline=True)
    routers = _router_deployments(inventory, inv)
    hidden = secrets.all_values([*deployments.values(), *(d for d, _ in routers.values())])  # shown as ******** (files holding secrets show their masked text)
    fleet = common.check(inventory, None, offline=True)[1]  # every server: which one collects a tier with a budget
    per_host = {name: host_files.server_host_files(d, fleet) for name, d in deployments.items()}
    per_host.update({name: host_files.router_host_files(d, servers) for name, (d, servers) in routers.items()})
    if out is not None:
        folders: dict[str, list[str]] = {}
        for name, d in _deployment_of(deployments, routers).items():
            for f in per_host[name].files:
                folder, relative = _out_place(name, d, f)
                folders.setdefault(folder, []).append(relative)
        _clear_out(out, folders, force)
    payload = {}
    for name, d in _deployment_of(deployments, routers).items():
        written, removed = per_host[name].files, per_host[name].removed
        if name in deployments:
            entry = dict(launch.summary(d), role="server", files={f.name: f.shown for f in rendering.files(d)})
        else:
            entry = {"host": name, "role": "router"}
        tool_files, kept = per_host[name].tool_files, per_host[name].kept
        payload[name] = secrets.mask(dict(entry, host_files=[f.as_dict() for f in written],
                                          removed_files=[{"role": role, "path": path} for role, path in removed],
                                          tool_files=[f.as_dict() for f in tool_files], kept=[k.as_dict() for k in kept]), hidden)
        if out is not None:
            for f in written:
                target = out.joinpath(*_out_place(name, d, f))
                target.parent.mkdir(parents=True, exist_ok=True)
                _write_rendered(target, f.content, int(f.mode, 8))
            common.say(f"{name}: wrote {len(written)} file(s) to {out / name}")
        elif not json:
            for f in written:
                typer.echo(secrets.mask_text(_shown_file(name, d, f), hidden))
            for role, path in removed:
                typer.echo(f"==> {name}:{path} ({role}) <==\nremoved if present (this inventory does not need it)\n")
            for f in tool_files:
                typer.echo(f"==> {name}:{f.path} ({f.role}) <==\nwritten by `{f.command}` {f.when}; its content is the tool's\n")
            for k in kept:  # a router's pip arguments may name an index URL that holds a credential
                typer.echo(secrets.mask_text(f"==> {name}:{k.path} ({k.role}) <==\n{k.what}\n", hidden))
    common.finish(common.EXIT_OK, json, {"inventory": inv.name, "hosts": payload})  # the text was printed host by host


def _router_deployments(inventory: str, inv) -> dict:
    """The selected router hosts: {name: (deployment, every server's variables)}. A router's workers are all the
    inventory's servers, whatever --host selects, so they are read from the whole inventory."""
    from hicachectl.plans import router

    if not getattr(inv, "routers", None):
        return {}
    whole = common.load(inventory, None)
    servers = {name: {**variables, **{k: v for k, v in (whole.connections.get(name) or {}).items() if k == "ansible_host"}}
               for name, variables in whole.hosts.items()}
    return {name: (router.check_router_host(name, variables)[0], servers) for name, variables in inv.routers.items()}


def _deployment_of(deployments: dict, routers: dict) -> dict:
    """Every selected host's deployment, servers first, in the inventory's order."""
    return {**deployments, **{name: d for name, (d, _) in routers.items()}}


def _in_cfg_dir(d: Deployment, f) -> bool:
    return f.role == "sglang_server" and f.path.rsplit("/", 1)[0] == d.cfg_dir.rstrip("/")


def _out_place(host: str, d: Deployment, f) -> tuple[str, str]:
    """Where --out writes a host file: (folder below <out>, path below it). The config directory's files go to
    <out>/<host>/<file>, as they always did; every other file to <out>/<host>.rootfs/<its path>, so <out>/<host>
    stays the config directory alone."""
    if _in_cfg_dir(d, f):
        return host, f.path.rsplit("/", 1)[1]
    return f"{host}.rootfs", f.path.lstrip("/")


def _shown_file(host: str, d: Deployment, f) -> str:
    """One file as render prints it. The NIC program is the collection's own file, the same on every host: its
    digest stands for its 241 lines (--json holds the text)."""
    from hicachectl.plans import host_files

    if _in_cfg_dir(d, f):
        return f"==> {host}/{f.path.rsplit('/', 1)[1]} <==\n{f.shown}"
    head = f"==> {host}:{f.path} ({f.role}, mode {f.mode}{', ' + f.part if f.part else ''}) <=="
    if f.role == "nic_tuning" and f.content == host_files.nic_program_text():
        return f"{head}\nthe collection's NIC program, {len(f.content.splitlines())} lines, sha256 {f.sha256[:16]} (render --json holds its text)\n"
    return f"{head}\n{f.shown}"


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
         hosts: str = typer.Option(..., help="Comma-separated server names; NAME=[USER@]ADDRESS[:PORT] sets its ansible_host, "
                                   "ansible_user and ansible_port ([ADDRESS]:PORT for IPv6)."),
         routers: str = typer.Option("", "--routers", help="Comma-separated router hosts (group hicache_routers), as --hosts names them."),
         out: pathlib.Path = typer.Option(..., help="New inventory directory."),
         json: bool = common.JsonOpt) -> None:
    """Start a new inventory from a profile, and say which of its values are placeholders to fill in."""
    from hicachectl.cli import scaffold

    servers, router_names = _named(hosts), _named(routers)
    clash = sorted(set(servers) & set(router_names))
    if clash:
        raise common.usage(f"--routers: {', '.join(clash)} is named in --hosts too; a host is a server or a router, not both.")
    # Every check before the first file is written: a refused init leaves --out as it was.
    bad = [h for h in router_names if not scaffold._HOST_NAME.match(h)]
    if bad:
        raise common.usage(f"--routers: not a host name: {', '.join(map(repr, bad))}.")
    if out.exists() and not out.is_dir():
        raise common.usage(f"--out {out} is a file; give a new directory (or an empty one).")
    try:
        written = scaffold.init(profile, list(servers), out)
    except scaffold.ScaffoldError as exc:
        common.say(f"error: {exc}")
        raise typer.Exit(common.EXIT_USAGE) from exc
    if router_names or any(servers.values()):
        _place_hosts(out / "hosts.yml", servers, router_names)
    _own_namespace(out)
    fill_in = _fill_in(out, list(router_names))
    name = out.name if out.resolve().parent == pathlib.Path.cwd().resolve() / "inventories" else str(out)
    next_step = f"edit {out}/group_vars/all.yml, then `hicachectl validate -i {name}`."
    if json:
        import json as json_module

        typer.echo(json_module.dumps({"inventory": str(out), "written": [str(p) for p in written],
                                      "fill_in": [{"variable": v, "file": f, "why": why} for v, f, why in fill_in], "next": next_step}, indent=1))
        return
    for path in written:
        typer.echo(f"wrote {path}")
    for variable, path, why in fill_in:
        typer.echo(f"fill in: {variable} in {path} ({why})")
    typer.echo(f"next: {next_step}")


def _named(text: str) -> dict[str, dict[str, Any]]:
    """"a,b=10.0.0.2,c=ops@[fd00::3]:2222" -> {"a": {}, "b": {"ansible_host": "10.0.0.2"}, "c": {"ansible_user": "ops",
    "ansible_host": "fd00::3", "ansible_port": 2222}}: host names, each with how SSH reaches it when given."""
    from hicachectl.config.inventory import ROUTERS, SERVERS

    out: dict[str, dict[str, Any]] = {}
    for word in (w.strip() for w in text.split(",")):
        if word:
            name, _, where = (part.strip() for part in word.partition("="))
            if not name:
                raise common.usage(f"{word!r}: a host needs a name before '='.")
            if name in out:
                raise common.usage(f"{name} is named twice; each host once.")
            if name in ("all", "ungrouped", SERVERS, ROUTERS):
                raise common.usage(f"{name} is a group's name in the inventory, not a host's; name the host otherwise.")
            out[name] = _connection(name, where)
    return out


def _connection(name: str, where: str) -> dict[str, Any]:
    """[USER@]ADDRESS[:PORT] as Ansible's connection variables; [ADDRESS]:PORT for IPv6 (a bare IPv6 has no port)."""
    from hicachectl.formats.urls import has_blank_or_control, is_host_address

    if not where:
        return {}
    user, _, address = where.rpartition("@")
    port = None
    if address.startswith("["):
        address, _, rest = address[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else (rest or None)
        if rest and not rest.startswith(":"):
            raise common.usage(f"--hosts {name}={where}: after [ADDRESS] comes :PORT.")
    elif address.count(":") == 1:
        address, _, port = address.partition(":")
    if not address or (user == "" and "@" in where):
        raise common.usage(f"--hosts {name}={where}: give [USER@]ADDRESS[:PORT].")
    if has_blank_or_control(user):
        raise common.usage(f"--hosts {name}={where}: {user!r} is not a user name.")
    if not is_host_address(address):
        raise common.usage(f"--hosts {name}={where}: {address!r} is neither an IP address nor a DNS name.")
    found: dict[str, Any] = {"ansible_host": address}
    if user:
        found["ansible_user"] = user
    if port is not None:
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise common.usage(f"--hosts {name}={where}: the SSH port {port!r} is not a number from 1 to 65535.")
        found["ansible_port"] = int(port)
    return found


def _place_hosts(hosts_file: pathlib.Path, servers: dict, routers: dict) -> None:
    """The routers (group hicache_routers) and each host's ansible_host, added to the hosts.yml init wrote; its
    header comment is kept."""
    import yaml

    text = hosts_file.read_text()
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith(("---", "#")))
    inventory = yaml.safe_load(text)
    children = inventory["all"]["children"]
    for name, connection in servers.items():
        if connection:
            children["hicache_servers"]["hosts"][name] = {**(children["hicache_servers"]["hosts"][name] or {}), **connection}
    if routers:
        children["hicache_routers"] = {"hosts": {h: (connection or None) for h, connection in routers.items()}}
    hosts_file.write_text(header + yaml.safe_dump(inventory, sort_keys=False))


# The shipped profiles keep the L3 namespace off only to reproduce their documents' directory layout flag for flag
# (tests/test_seeds.py), and validate warns about it (l3-namespace-off). A new inventory reproduces nothing: it
# starts with the catalogue's default, auto.
_NAMESPACE_OFF = 'hicache_l3_namespace: "off"'


def _own_namespace(out: pathlib.Path) -> None:
    for path in sorted((out / "group_vars").rglob("*.yml")):
        lines = path.read_text().splitlines(keepends=True)
        if not any(line.strip() == _NAMESPACE_OFF for line in lines):
            continue
        kept = [line for line in lines if line.strip() != _NAMESPACE_OFF and not
                (line.startswith("#") and "namespace" in line.lower() and "warns" in line.lower())]
        kept.append("# Each server's pages in a directory derived from its page format (`hicachectl validate` names it); the\n"
                    "# profile's document wrote into the tier itself (off).\nhicache_l3_namespace: auto\n")
        path.write_text("".join(kept))


def _fill_in(out: pathlib.Path, routers: list[str] = ()) -> list[tuple[str, str, str]]:
    """What the new inventory still holds of the profile's placeholders (documentation addresses and names), and,
    with routers, a server address they cannot reach (the profile's loopback bind: validate's router-reach)."""
    import yaml

    from hicachectl.formats.urls import is_loopback
    from hicachectl.rules.variables import placeholders

    lines = []
    for path in sorted((out / "group_vars").rglob("*.yml")):
        values = yaml.safe_load(path.read_text()) or {}
        for name, value in values.items():
            found = placeholders(str(value)) if isinstance(value, (str, list)) else []
            if found:
                lines.append((name, str(path), f"{', '.join(found)} is a documentation placeholder"))
        if routers and path.name == "all.yml" and is_loopback(str(values.get("hicache_host") or "127.0.0.1")):
            lines.append(("hicache_host", str(path), f"{values.get('hicache_host') or '127.0.0.1, SGLang default,'} is loopback: "
                          f"the routers ({', '.join(routers)}) cannot reach it; set an address they reach, or 0.0.0.0"))
    return lines


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
    from hicachectl.config import sizing
    from hicachectl.formats import report

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
            _, deployments, _ = common.check(inventory, host, offline=True)
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
               force: bool = typer.Option(False, "--force", help="Replace files already there."),
               json: bool = common.JsonOpt) -> None:
    """Prometheus scrape targets (file_sd), alert rules and a Grafana dashboard for the inventory's servers. Touches no host."""
    from hicachectl.ops import monitoring as monitor
    from hicachectl.plans import router

    inv, deployments = common.guard(inventory, None, common.NOTHING_RENDERED, offline=True)
    connections = getattr(inv, "connections", None) or {}
    routers, router_notes = {}, []
    for name, variables in (getattr(inv, "routers", None) or {}).items():
        routers[name], notes = monitor.router_address(router.check_router_host(name, variables)[0], connections.get(name) or {})
        router_notes += notes
    rendered = monitor.render(inv.path.name, deployments, connections, routers)
    folders: dict[str, list[str]] = {}
    for relative in rendered.files:
        folder, _, name = relative.rpartition("/")
        folders.setdefault(folder or ".", []).append(name)
    _clear_out(out, folders, force)
    for relative, content in rendered.files.items():
        (out / relative).parent.mkdir(parents=True, exist_ok=True)
        _write_rendered(out / relative, content, 0o644)
    if json:
        import json as json_module

        typer.echo(json_module.dumps({"out": str(out), "written": [str(out / f) for f in rendered.files], "targets": len(rendered.targets),
                                      "dashboard": str(out / monitor.DASHBOARD_FILE), "notes": [*rendered.notes, *router_notes]}, indent=1))
        return
    for note in [*rendered.notes, *router_notes]:
        common.say(f"note: {note}")
    typer.echo(f"wrote {', '.join(rendered.files)} to {out}: {len(rendered.targets)} target(s); "
               f"load {out / monitor.DASHBOARD_FILE} into Grafana.")
