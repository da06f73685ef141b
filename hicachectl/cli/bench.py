"""`hicachectl bench`: TTFT recomputed, from L3 and from host memory (hicachectl/ops/bench.py measures), against a target: a
server given by URL, an inventory's server through an SSH tunnel, or an inventory's router with every server behind
it. Between recompute and L3 the target is reset: a restart (restart.yml, or the operator's command) or /flush_cache.
Where L3 loses to recompute, the report says so as a finding with the settings that decide it."""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib

import typer

from hicachectl.cli import common


@common.with_vault
def bench(inventory: str | None = typer.Option(None, "--inventory", "-i", help="Benchmark a host of this inventory (reached over SSH as Ansible reaches it)."),
          host: str | None = typer.Option(None, "--host", help="The inventory host (default: the first; with --router, the first router)."),
          router: bool = typer.Option(False, "--router", help="With --inventory: send the prompts through the inventory's router (group "
                                      "hicache_routers); metrics are every server's; warm after a restart of every server, each drained."),
          url: str | None = typer.Option(None, "--url", help="Or a server's base URL, e.g. http://gpu-01:8000."),
          concurrency: str = typer.Option("1,2,4,8,16,32,64", "--concurrency", help="Comma-separated levels; total prompts = concurrency."),
          input_len: int = typer.Option(120_000, "--input-len", help="Prompt length in words (about one token each)."),
          restart_command: str | None = typer.Option(None, "--restart-command", help="With --url: shell command that restarts the server "
                                                     "between cold and warm (default: POST /flush_cache, which keeps L3; a server "
                                                     "with an admin API key needs it in HICACHE_ADMIN_API_KEY)."),
          out: pathlib.Path | None = typer.Option(None, "--out", help="Directory for bench.json and bench.png (default: ./hicache-bench-<time>); "
                                                "the chart needs matplotlib: pip install 'hicache-deploy[bench]'."),
          timeout: float = typer.Option(3600, "--timeout", help="Seconds any one step may take (a 120k prompt at 64 concurrent is slow cold)."),
          model_config: pathlib.Path | None = typer.Option(None, "--model-config", help="The model's config.json (or its directory): gives the "
                                                           "bytes per token, hence the GB/s read from L3 (default with -i: hicache_model_config)."),
          tier: bool = typer.Option(False, "--tier", help="With --inventory: also read each benched server's L3 tier as its backend reads it "
                                    "(page files, O_DIRECT and queue depth as the backend; fio where the host has it) and say what share of "
                                    "that raw bandwidth SGLang's backend reached."),
          tier_only: bool = typer.Option(False, "--tier-only", help="With --inventory: only read the L3 tiers as --tier does (each tier once, by "
                                         "its first server, or --host's), benching no server: a tier before its servers are deployed, or one without "
                                         "them; SGLang's share of the bandwidth is then not measured. Takes -i, --host, --model-config, --tier-bytes, --json."),
          tier_bytes: int = typer.Option(1 << 30, "--tier-bytes", help="With --tier: bytes written to and read from each tier (removed after)."),
          host_phase: bool = typer.Option(True, "--host-phase/--no-host-phase", help="Before the third phase, send unique filler prompts "
                                          "of more tokens than each server's GPU pool, so the prompts come back from host memory "
                                          "(costs the prefill of that many tokens per level); --no-host-phase: repeat without them."),
          json: bool = common.JsonOpt) -> None:
    """Time-to-first-token per concurrency level in three phases: recompute (cold), from L3 (after a restart or
    /flush_cache, which keep only L3) and from host memory (after filler traffic); the L3/recompute ratio, the GB/s
    read from L3, and a finding where L3 does not beat recompute (the VAST document's method, extended).

    Exit 0: measured (a finding included); 1: the server failed or could not be reached; 2: usage.
    """
    import datetime
    import json as jsonlib
    import secrets
    import sys

    from hicachectl.formats import report
    from hicachectl.ops import bench as benching

    try:
        levels = sorted({int(c) for c in concurrency.split(",") if c.strip()})
    except ValueError:
        levels = []
    if (inventory is None) == (url is None):
        raise common.usage("give exactly one of --inventory and --url.")
    if router and inventory is None:
        raise common.usage("--router needs --inventory (the router and its servers are the inventory's).")
    if not levels or min(levels) < 1:
        raise common.usage(f"--concurrency {concurrency!r}: give whole numbers >= 1 separated by commas, e.g. 1,2,4.")
    if input_len < 1:
        raise common.usage(f"--input-len {input_len}: give at least 1.")
    if (tier or tier_only) and inventory is None:
        raise common.usage(f"{'--tier-only' if tier_only else '--tier'} needs --inventory (the tier is read on the server's host, through Ansible).")
    if tier_only and (router or tier):
        raise common.usage(f"--tier-only benches no server: give --host or nothing (every tier), not {'--router' if router else '--tier'}.")
    if tier_bytes < 1:
        raise common.usage(f"--tier-bytes {tier_bytes}: give at least 1.")
    if model_config is not None and not model_config.exists():
        raise common.usage(f"--model-config {model_config}: no such file or directory.")
    if tier_only:
        tiers = _tier_bench(inventory, host, False, str(model_config) if model_config else None, tier_bytes, every=True)
        measured = [r for r in tiers.values() if r.get("gbps") is not None]
        code = common.EXIT_INVALID if not measured or any(r.get("gbps") is None and "skipped" not in r for r in tiers.values()) else common.EXIT_OK
        common.finish(code, json, {"tier": tiers, "tier_share": None},
                      [*benching.tier_lines(tiers, None), "SGLang's share of it: not measured (--tier-only benched no server; "
                                                           "`hicachectl bench -i ... --tier` measures both)"])
        return
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
    salt = f"{stamp}-{secrets.token_hex(4)}"  # never a prompt an earlier run put on L3
    out = out or pathlib.Path(f"hicache-bench-{stamp}")
    with _bench_target(inventory, host, url, restart_command, router) as (target, label):
        common.say(f"bench {label}: {input_len} words x concurrency {levels}; recompute, then from L3 (warm after {target.reset_label}), "
                   "then from host memory" + (" (filler traffic past the GPU pool)" if host_phase else " (--no-host-phase: a repeat)"))
        results = []
        try:
            info = benching.server_info(target.metrics_urls[0] if target.metrics_urls else target.base_url)
            with typer.progressbar(length=len(benching.PHASES) * sum(levels), label="requests", file=sys.stderr) as bar:
                for level in levels:
                    results.append(benching.run_level(target, level, input_len, salt, timeout=timeout, done=lambda: bar.update(1),
                                                       host_phase=host_phase))
        except (benching.BenchError, OSError) as exc:
            common.say(f"error: {exc}")
            raise typer.Exit(common.EXIT_INVALID) from exc
    per_token, basis = benching.l3_bytes_per_token(str(model_config) if model_config else target.model_config, info)
    rows = benching.summary(results, per_token)
    found = benching.findings(rows, info)
    tiers = _tier_bench(inventory, host, router, str(model_config) if model_config else None, tier_bytes) if tier else {}
    share = benching.tier_share(rows, tiers) if tier else None
    data = {"target": label, "input_words": input_len, "output_tokens": 1, "l3_after": target.reset_label, "salt": salt,
            "l3_bytes_per_token": per_token, "l3_bytes_basis": basis, "levels": rows, "findings": found,
            "requests": {r.concurrency: {name: [dataclasses.asdict(q) for q in getattr(r, name).requests] for name in benching.PHASES}
                         for r in results},
            **({"tier": tiers, "tier_share": share} if tier else {}),
            "warm_after": target.reset_label}  # the name before issue #35
    for per_level in data["requests"].values():  # and its phases' names: cold = recompute, warm = l3, repeat = host
        per_level.update(cold=per_level["recompute"], warm=per_level["l3"], repeat=per_level["host"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(jsonlib.dumps(data, indent=2) + "\n")
    written = [out / "bench.json"]
    try:
        benching.chart(rows, out / "bench.png", f"{label}: TTFT recomputed, from L3, from host memory; ~{input_len} tokens, OSL 1")
        written.append(out / "bench.png")
    except benching.ChartUnavailable as exc:  # measured all the same: exit 0, the table and bench.json, no PNG
        common.say(f"note: no bench.png: {exc}")
    # a tier that could not be read is a host that failed (exit 1), after everything measured is reported and written
    code = common.EXIT_INVALID if any(r.get("gbps") is None for r in tiers.values()) else common.EXIT_OK
    common.finish(code, json, {**data, "chart": str(written[1]) if len(written) > 1 else None},
                  [report.table(benching.TABLE_HEADERS, benching.table_rows(rows)), benching.HOST_NOTE, *benching.host_lines(rows),
                   *([] if per_token else [f"L3 read GB/s: {basis}"]), *benching.finding_lines(found),
                   *benching.tier_lines(tiers, share), f"wrote {' and '.join(map(str, written))}"])


def _tier_bench(inventory: str, host: str | None, through_router: bool, model_config: str | None, total: int,
                every: bool = False) -> dict[str, dict]:
    """bench --tier: playbooks/bench_tier.yml on the benched server (with --router, every server at once, as they read
    in the L3 phase), each reading its tier as its backend does (ops/bench.py tier_reads); host -> the module's result,
    or {"why": ...} where it could not be read. `every` (--tier-only): each tier once, by its first server (servers of
    one hicache_l3_share are one tier: two readers would share its bandwidth), the others {"skipped": why}, as is a
    server whose pages are not files on a tier."""
    from hicachectl.cli import runner
    from hicachectl.ops import bench as benching

    inv, deployments = common.guard(inventory, None if through_router else host)
    if not through_router and not every:
        deployments = dict([next(iter(deployments.items()))])
    plan, out = benching.tier_plan(deployments, model_config, total, once_per_tier=every)
    if plan:
        common.say(f"reading the L3 tier of {', '.join(plan)} ({total:,} bytes each, removed after)")
        result = runner.run_playbook("bench_tier.yml", inv.path, limit=",".join(plan), hosts=list(plan),
                                     extravars={"__hicache_tier_bench": plan})
        for name in plan:
            report = result.hosts[name].facts.get("hicache_tier_bench_report") if name in result.hosts else None
            if report and report.get("gbps") is not None:
                out[name].update({k: report.get(k) for k in ("bytes", "seconds", "gbps", "method", "read_bytes", "files", "queue_depth",
                                                             "direct", "cache_dropped", "notes", "fio")})
            else:
                out[name]["why"] = common.why_failed(result.hosts[name]) if name in result.hosts else "not run"
    return out


def _unreachable(exc: BaseException) -> bool:
    """paramiko's and the socket's errors: a host bench could not reach, said in one line (anything else is a bug)."""
    return isinstance(exc, OSError | EOFError) or type(exc).__module__.startswith("paramiko")


# A restart between cold and warm: one batch of one server, none allowed to fail (bench then stops).
RESTART_ONE_AT_A_TIME = {"hicache_serial": 1, "hicache_max_fail_percentage": 0}


@contextlib.contextmanager
def _bench_target(inventory: str | None, host: str | None, url: str | None, restart_command: str | None, through_router: bool = False):
    """(target, label): an inventory host through an SSH tunnel, restarted by the restart playbook; the inventory's
    router and every server behind it (tunnels to each), every server restarted; or a URL."""
    import subprocess

    from hicachectl.cli import runner
    from hicachectl.config import inventory as inventories
    from hicachectl.ops import bench as benching
    from hicachectl.ops import tunnel

    if inventory is None:
        import os

        def run_restart_command() -> None:
            if subprocess.run(restart_command, shell=True).returncode != 0:
                raise benching.BenchError(f"the restart command failed: {restart_command}")

        yield (benching.Target(url.rstrip("/"), None, run_restart_command if restart_command else None,
                               "restart command" if restart_command else "flush_cache (device and host caches; L3 kept)",
                               admin_key=os.environ.get("HICACHE_ADMIN_API_KEY") or None), url)
        return
    if through_router:
        yield from _router_target(inventory, host)
        return
    inv, deployments = common.guard(inventory, host)
    name, d = next(iter(deployments.items()))

    def restart() -> None:
        result = runner.run_playbook("restart.yml", inv.path, limit=name, extravars=dict(RESTART_ONE_AT_A_TIME))
        if not result.succeeded:
            raise benching.BenchError(f"restarting {name} failed: {common.said(result.hosts[name].failures) if name in result.hosts else 'not run'}")

    try:
        conn = inventories.connection(inventory, name)
    except inventories.InventoryError as exc:
        common.say(f"error: {exc}")
        raise typer.Exit(exc.exit_code) from exc
    with contextlib.ExitStack() as stack:
        try:
            base_url = stack.enter_context(tunnel.forward(conn, name, d.effective_port, d.local_host))
        except Exception as exc:
            if not _unreachable(exc):
                raise
            where = f"{conn.get('ansible_host', name)}:{conn.get('ansible_port', 22)}"
            common.say(f"error: cannot open the bench tunnel to {name}: SSH at {where} did not let us in ({exc or type(exc).__name__}).")
            raise typer.Exit(common.EXIT_INVALID) from exc
        yield (benching.Target(base_url, d.served_name, restart, f"restart of {name} (hicachectl restart)", model_config=d.model_config),
               f"{name} of {inv.name}")


def _router_target(inventory: str, host: str | None):
    """bench --router: the router (tunnel to its port) with the /metrics of every server (a tunnel to each); the
    reset restarts every server through restart.yml (each out of the router until it is healthy again)."""
    from hicachectl.cli import runner
    from hicachectl.config import inventory as inventories
    from hicachectl.ops import bench as benching
    from hicachectl.ops import tunnel
    from hicachectl.plans import router

    inv, deployments = common.guard(inventory, None)
    routers = getattr(inv, "routers", {})
    if not routers:
        raise common.usage(f"inventory {inv.name} has no router: --router needs a host in group hicache_routers.")
    if host is not None and host not in routers:
        raise common.usage(f"--host {host}: not a router of {inv.name} (its routers: {', '.join(routers)}).")
    name = host or next(iter(routers))
    d_router = router.check_router_host(name, routers[name])[0]

    def restart() -> None:
        # one server at a time: the others keep serving through the router (the bench's own prompts wait for it)
        result = runner.run_playbook("restart.yml", inv.path, extravars=dict(RESTART_ONE_AT_A_TIME))
        if not result.succeeded:
            bad = [h for h, r in result.hosts.items() if r.failures]
            raise benching.BenchError("restarting the servers failed: " + "; ".join(f"{h}: {common.said(result.hosts[h].failures)}" for h in bad))

    with contextlib.ExitStack() as stack:
        urls = {}
        for target_host, port, address in [(name, d_router.router_port, "127.0.0.1" if d_router.router_host in ("0.0.0.0", "localhost") else d_router.router_host)] + \
                [(s, d.effective_port, d.local_host) for s, d in deployments.items()]:
            try:
                conn = inventories.connection(inventory, target_host)
                urls[target_host] = stack.enter_context(tunnel.forward(conn, target_host, port, address))
            except inventories.InventoryError as exc:
                common.say(f"error: {exc}")
                raise typer.Exit(exc.exit_code) from exc
            except Exception as exc:
                if not _unreachable(exc):
                    raise
                common.say(f"error: cannot open the bench tunnel to {target_host}: {exc or type(exc).__name__}.")
                raise typer.Exit(common.EXIT_INVALID) from exc
        served = {d.served_name for d in deployments.values()}
        yield (benching.Target(urls[name], next(iter(served)) if len(served) == 1 else None, restart,
                               f"restart of every server behind {name} (hicachectl restart, each drained)",
                               [urls[s] for s in deployments],
                               model_config=next((d.model_config for d in deployments.values() if d.model_config), None)),
               f"router {name} of {inv.name} ({len(deployments)} servers)")
