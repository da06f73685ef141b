"""Prometheus and Grafana for an inventory's servers: scrape targets, alert rules, a dashboard. No I/O.

`render(inventory_name, deployments, connections)` returns the files `hicachectl monitoring --out DIR` writes:
  prometheus.yml                 a working Prometheus config: the scrape job reading the targets, the rules
  targets/sglang.json            file_sd targets, one per server (host:port), labelled inventory, inventory_host,
                                 served_model, hicache_write_policy
  targets/router.json            with routers (group hicache_routers): one per router, at its --prometheus-port, job
                                 hicache-router
  rules/hicache-alerts.yml       alert rules (server down, L3 backups dropped or stalled, prefetch deadlines and
                                 unfulfilled prefetches, storage hit share collapsing)
  grafana/hicache-dashboard.json a Grafana dashboard (fleet row and per-server row; variables datasource, instance)

Every metric is one SGLang exports with --enable-metrics. Names and labels were read from
python/sglang/srt/observability/metrics_collector.py in the sglang 0.5.20, 0.5.21 and 0.5.23 wheels on PyPI
(earlier releases kept the same names in python/sglang/srt/metrics/collector.py); `SGLANG_METRICS` below names the
collector each comes from. The target labels avoid SGLang's own label names (model_name, storage_backend, tp_rank,
...), so nothing is renamed `exported_*` at scrape time.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

import yaml

from hicachectl.ops import verify
from hicachectl.ops.metrics import SCHEDULER_ONCE, STORAGE_ONCE
from hicachectl.plans import router

SERVER_JOB = "hicache-sglang"
ROUTER_JOB = "hicache-router"  # the hosts of group hicache_routers (their smg_* metrics)
TARGETS_FILE = "targets/sglang.json"
ROUTER_TARGETS_FILE = "targets/router.json"
RULES_FILE = "rules/hicache-alerts.yml"
DASHBOARD_FILE = "grafana/hicache-dashboard.json"
PROMETHEUS_FILE = "prometheus.yml"
DASHBOARD_UID = "hicache-deploy"

_SRC = "python/sglang/srt/observability/metrics_collector.py (sglang 0.5.20, 0.5.21, 0.5.23)"
# name -> (type, the SGLang collector that registers it, its labels besides the collector's own). Storage metrics
# come from every TP, PP and attention-CP rank of a server, each counting the same tokens (labels storage_backend,
# tp_rank, dp_rank, pp_rank, pp_size, attn_cp_rank, attn_cp_size: python/sglang/srt/mem_cache/unified_cache/
# storage_attachment.py): the queries read rank 0 of each (metrics.STORAGE_ONCE) and sum the DP ranks, as
# hicachectl/ops/metrics.py does (the reasons are there). Scheduler gauges come from attention-TP rank 0 only, but from
# every pipeline stage, each scheduling the same requests: read at pp_rank 0 (metrics.SCHEDULER_ONCE), then summed.
SGLANG_METRICS: dict[str, tuple[str, str]] = {
    "sglang:num_running_reqs": ("gauge", f"SchedulerMetricsCollector, {_SRC}"),
    "sglang:num_queue_reqs": ("gauge", f"SchedulerMetricsCollector, {_SRC}"),
    "sglang:prompt_tokens_total": ("counter", f"TokenizerMetricsCollector (labels model_name, engine_type, is_streaming), {_SRC}"),
    "sglang:cached_tokens_total": ("counter", f"TokenizerMetricsCollector (label cache_source = device | host | storage, "
                                              f"or total when the request carried no per-tier details), {_SRC}"),
    "sglang:time_to_first_token_seconds": ("histogram", f"TokenizerMetricsCollector (series _bucket/_sum/_count; le, is_streaming), {_SRC}"),
    "sglang:backuped_tokens_total": ("counter", f"StorageMetricsCollector, {_SRC}"),
    "sglang:prefetched_tokens_total": ("counter", f"StorageMetricsCollector, {_SRC}"),
    "sglang:storage_prefetch_hit_tokens_total": ("counter", f"StorageMetricsCollector, {_SRC}"),
    "sglang:storage_prefetch_unfulfilled_tokens_total": (
        "counter", f"StorageMetricsCollector (label reason, every value pre-created at 0: below_threshold, host_capacity, "
                   f"device_capacity, device_covered, storage_transfer, dropped, ...; deadline from 0.5.23 = the "
                   f"prefetch stop policy ended the read; before 0.5.23 a timed-out read counted as storage_transfer), {_SRC}"),
    "sglang:hicache_backup_dropped_tokens_total": ("counter", f"StorageMetricsCollector (appears with the first drop), {_SRC}"),
}
# Prefetch outcomes that are not trouble: too short to fetch, or already on the device.
BENIGN_UNFULFILLED = "below_threshold|device_covered"
# A storage read that did not finish: the timeout policy's deadline (0.5.23+) or the transfer itself.
PREFETCH_TIMEOUT_REASONS = "deadline|storage_transfer"


@dataclasses.dataclass(frozen=True)
class Target:
    address: str  # host:port Prometheus scrapes (/metrics)
    labels: dict[str, str]
    job: str = SERVER_JOB


@dataclasses.dataclass
class Monitoring:
    files: dict[str, str]  # relative path -> content
    targets: list[Target]
    notes: list[str]  # what the operator should know (a server Prometheus cannot reach, metrics off)


# --- targets --------------------------------------------------------------------------------------------

_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_WILDCARD = ("0.0.0.0", "::", "")


def _hostport(host: str, port: int) -> str:
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]:{port}"
    except ValueError:
        pass
    return f"{host}:{port}"


def _is_local(inventory_host: str, connection: Mapping[str, Any]) -> bool:
    return connection.get("ansible_connection") == "local" or (connection.get("ansible_host") or inventory_host) in _LOOPBACK


def server_target(inventory_name: str, d: Any, connection: Mapping[str, Any]) -> tuple[Target, list[str]]:
    """Where Prometheus scrapes one server: its hicache_worker_url when the inventory gives one (where the network
    reaches it: the routers use it too; #34: two servers behind one ansible_host became one target); else the address
    it binds when that is a specific one, else the address Ansible reaches the host at (ansible_host, else the
    inventory name), and the server's port."""
    labels = {"inventory": inventory_name, "inventory_host": d.inventory_host, "served_model": str(d.served_name),
              "hicache_write_policy": verify.write_policy(d),
              "hicache_storage_backend": d.storage_backend or "none"}
    notes = []
    if not d.enable_metrics:
        notes.append(f"{d.inventory_host}: hicache_enable_metrics is false: SGLang exports no sglang:* metrics, only `up` will be seen.")
    if not d.storage_backend:
        notes.append(f"{d.inventory_host}: no hicache_storage_backend: the L3 panels and alerts stay empty for it.")
    if d.worker_url:
        url = urllib.parse.urlsplit(router.normalize(d.worker_url))
        if url.scheme == "https":
            labels["__scheme__"] = "https"  # file_sd: a target group's own scheme (Prometheus' relabelling input)
        return Target(url.netloc, labels), notes
    bind = d.effective_host
    reached = str(connection.get("ansible_host") or d.inventory_host)
    host = reached if bind in _WILDCARD or bind in _LOOPBACK else bind
    if bind in _LOOPBACK and not _is_local(d.inventory_host, connection):
        notes.insert(0, f"{d.inventory_host}: the server listens on {bind} only (hicache_host): a Prometheus on another machine "
                     f"cannot scrape {_hostport(reached, d.effective_port)}; set hicache_host to 0.0.0.0 or the host's address.")
    return Target(_hostport(host, d.effective_port), labels), notes


def router_address(d: Any, connection: Mapping[str, Any]) -> tuple[tuple[str, int], list[str]]:
    """Where Prometheus scrapes one router (a host of group hicache_routers): its --prometheus-host when that is a
    specific address, else the address Ansible reaches the host at; its --prometheus-port (hicachectl/plans/router.py
    launch_argv: the router binds its metrics to hicache_router_host)."""
    bind = str(d.router_host or "0.0.0.0")
    reached = str(connection.get("ansible_host") or d.inventory_host)
    host = reached if bind in _WILDCARD or bind in _LOOPBACK or bind == "localhost" else bind
    notes = []
    if (bind in _LOOPBACK or bind == "localhost") and not _is_local(d.inventory_host, connection):
        notes.append(f"{d.inventory_host}: the router listens on {bind} only (hicache_router_host): a Prometheus on another machine "
                     f"cannot scrape {_hostport(reached, d.router_prometheus_port)}; set hicache_router_host to 0.0.0.0 or the host's address.")
    return (host, int(d.router_prometheus_port)), notes


def router_targets(inventory_name: str, routers: Mapping[str, tuple[str, int]] | None = None) -> list[Target]:
    """The routers: name -> (address, port) gives targets of job hicache-router, written to targets/router.json and
    scraped by their own job."""
    return [Target(_hostport(addr, port), {"inventory": inventory_name, "inventory_host": name}, ROUTER_JOB)
            for name, (addr, port) in sorted((routers or {}).items())]


def file_sd(targets: list[Target]) -> list[dict[str, Any]]:
    """Prometheus file_sd: one group per target, so each keeps its own labels."""
    return [{"targets": [t.address], "labels": dict(t.labels)} for t in targets]


def prometheus_config(with_routers: bool, scrape_interval: str = "15s", evaluation_interval: str = "15s") -> dict[str, Any]:
    """A whole prometheus.yml; file paths are relative to its own directory (Prometheus resolves them so)."""
    jobs = [{"job_name": SERVER_JOB, "metrics_path": "/metrics", "file_sd_configs": [{"files": [TARGETS_FILE]}]}]
    if with_routers:
        jobs.append({"job_name": ROUTER_JOB, "metrics_path": "/metrics", "file_sd_configs": [{"files": [ROUTER_TARGETS_FILE]}]})
    return {"global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval},
            "rule_files": [RULES_FILE], "scrape_configs": jobs}


# --- PromQL -----------------------------------------------------------------------------------------------

def _sel(metric: str, *matchers: str) -> str:
    return f"{metric}{{{','.join(matchers)}}}"


def _rate(metric: str, window: str, *matchers: str) -> str:
    return f"rate({_sel(metric, *matchers)}[{window}])"


def _zero_where(expr_by: str, like: str) -> str:
    """`expr_by`, or 0 for each group where `like` has data: a counter SGLang creates only at its first increment
    (a storage hit, a dropped backup) reads 0, not nothing, on a server that is up."""
    return f"({expr_by} or 0 * {like})"


# --- alert rules ------------------------------------------------------------------------------------------

def _storage_share(by: str, window: str, offset: str = "") -> str:
    off = f" offset {offset}" if offset else ""
    prompt = f"sum by ({by}) (rate(sglang:prompt_tokens_total[{window}]{off}))"
    storage = f"sum by ({by}) (rate(sglang:cached_tokens_total{{cache_source=\"storage\"}}[{window}]{off}))"
    return f"({_zero_where(storage, '(' + prompt + ')')} / {prompt})"


def alert_rules(down_for: str = "1m") -> dict[str, Any]:
    by = "instance, inventory_host"
    rank0 = STORAGE_ONCE  # each token once across TP, PP and attention-CP ranks
    prompt_15m = f"sum by ({by}) (increase(sglang:prompt_tokens_total[15m]))"
    cached_15m = f"sum by ({by}) (increase(sglang:cached_tokens_total[15m]))"
    uncached_15m = f"({prompt_15m} - {_zero_where(cached_15m, '(' + prompt_15m + ')')})"
    rules = [
        {"alert": "HiCacheServerDown",
         "expr": f'up{{job="{SERVER_JOB}"}} == 0',
         "for": down_for,
         "labels": {"severity": "critical"},
         "annotations": {
             "summary": "SGLang server {{ $labels.inventory_host }} ({{ $labels.instance }}) is down",
             "description": "Prometheus cannot scrape {{ $labels.instance }} (inventory host {{ $labels.inventory_host }}, model "
                            "{{ $labels.served_model }}) for " + down_for + ": the server is stopped, crashed, still loading, or "
                            "unreachable. Run `hicachectl status -i {{ $labels.inventory }}` and read the server's journal on the host "
                            "(`journalctl -u sglang-hicache`, or its hicache_service_name)."}},
        {"alert": "HiCacheL3BackupDropped",
         "expr": f"sum by ({by}) (increase(sglang:hicache_backup_dropped_tokens_total{{{rank0}}}[10m])) > 0",
         "for": "5m",
         "labels": {"severity": "warning"},
         "annotations": {
             "summary": "{{ $labels.inventory_host }} ({{ $labels.instance }}) drops KV backups to L3",
             "description": "{{ $value }} tokens in 10 minutes never reached the storage tier on {{ $labels.instance }} "
                            "(sglang:hicache_backup_dropped_tokens_total): the write path lags device churn. Those prefixes "
                            "will miss in L3; check the storage bandwidth (sglang:backup_bandwidth) and the host pool size."}},
        {"alert": "HiCacheL3BackupStalled",
         "expr": f"{uncached_15m} > 10000"
                 f" and on (instance) up{{job=\"{SERVER_JOB}\",hicache_write_policy=\"write_through\",hicache_storage_backend!=\"none\"}} == 1"
                 f" unless on (instance) sum by (instance) (increase(sglang:backuped_tokens_total{{{rank0}}}[15m])) > 0",
         "for": "5m",
         "labels": {"severity": "critical"},
         "annotations": {
             "summary": "{{ $labels.inventory_host }} ({{ $labels.instance }}) writes nothing to L3",
             "description": "{{ $labels.instance }} computed {{ $value }} new prompt tokens in 15 minutes with write_through, "
                            "yet backed up none to the storage tier (sglang:backuped_tokens_total): L3 writes are failing "
                            "or the storage backend is not attached. Check the server's log for the backend and the mount."}},
        {"alert": "HiCachePrefetchTimeouts",
         "expr": f"sum by ({by}) (rate(sglang:storage_prefetch_unfulfilled_tokens_total{{{rank0},reason=~\"{PREFETCH_TIMEOUT_REASONS}\"}}[10m]))"
                 f" / sum by ({by}) (rate(sglang:storage_prefetch_hit_tokens_total{{{rank0}}}[10m])) > 0.1",
         "for": "10m",
         "labels": {"severity": "warning"},
         "annotations": {
             "summary": "{{ $labels.inventory_host }} ({{ $labels.instance }}): L3 prefetches time out",
             "description": "On {{ $labels.instance }}, {{ $value | humanizePercentage }} of the tokens found in L3 were not "
                            "read in time (reason deadline or storage_transfer): the storage is too slow for the prefetch "
                            "timeout (prefetch_timeout_base / prefetch_timeout_per_ki_token) or failing."}},
        {"alert": "HiCachePrefetchUnfulfilled",
         "expr": f"sum by ({by}) (rate(sglang:storage_prefetch_unfulfilled_tokens_total{{{rank0},reason!~\"{BENIGN_UNFULFILLED}|{PREFETCH_TIMEOUT_REASONS}\"}}[15m]))"
                 f" / sum by ({by}) (rate(sglang:storage_prefetch_hit_tokens_total{{{rank0}}}[15m])) > 0.25",
         "for": "15m",
         "labels": {"severity": "warning"},
         "annotations": {
             "summary": "{{ $labels.inventory_host }} ({{ $labels.instance }}): L3 hits are not used",
             "description": "On {{ $labels.instance }}, {{ $value | humanizePercentage }} of the tokens found in L3 were "
                            "not used (sglang:storage_prefetch_unfulfilled_tokens_total, reasons such as host_capacity, "
                            "device_capacity, dropped): the host pool (hicache_ratio / hicache_size) is likely too small."}},
        {"alert": "HiCacheStorageHitRateCollapsed",
         "expr": f"{_storage_share(by, '15m')} < 0.5 * {_storage_share(by, '15m', '1h')}"
                 f" and on (instance) {_storage_share(by, '15m', '1h')} > 0.1",
         "for": "10m",
         "labels": {"severity": "warning"},
         "annotations": {
             "summary": "{{ $labels.inventory_host }} ({{ $labels.instance }}): the L3 hit share collapsed",
             "description": "The share of prompt tokens served from storage on {{ $labels.instance }} is {{ $value | "
                            "humanizePercentage }}, under half of what it was an hour ago. After a change this is most "
                            "often a new page size or served model name (every L3 key changes), a new storage path, or an "
                            "unmounted tier; run `hicachectl verify --l3`."}},
        # The routers' own job (targets/router.json): only `up`, Prometheus' own series, is judged here; what a router
        # thinks of its workers, `hicachectl verify` and `status` ask the router itself.
        {"alert": "HiCacheRouterDown",
         "expr": f'up{{job="{ROUTER_JOB}"}} == 0',
         "for": down_for,
         "labels": {"severity": "critical"},
         "annotations": {
             "summary": "SGLang router {{ $labels.inventory_host }} ({{ $labels.instance }}) is down",
             "description": "Prometheus cannot scrape the router's metrics at {{ $labels.instance }} (inventory host "
                            "{{ $labels.inventory_host }}) for " + down_for + ": clients sent to it get no answer. Run "
                            "`hicachectl status -i {{ $labels.inventory }}` and read the router's journal on the host "
                            "(`journalctl -u sglang-router`, or its hicache_router_service_name)."}},
    ]
    return {"groups": [{"name": "hicache", "rules": rules}]}


# --- dashboard --------------------------------------------------------------------------------------------

INSTANCE = 'instance=~"$instance"'
RATE = "$__rate_interval"


def _queries(by: str | None) -> list[tuple[str, str, list[tuple[str, str]], str]]:
    """(title, unit, [(legend, expr)], description) for the fleet (by None) or per server (by labels)."""
    def agg(expr: str, extra: str = "") -> str:
        keys = ", ".join(x for x in (by, extra) if x)
        return f"sum by ({keys}) ({expr})" if keys else f"sum({expr})"

    who = "{{inventory_host}} " if by else ""
    rank0 = STORAGE_ONCE  # each token once across TP, PP and attention-CP ranks
    prompt = agg(_rate("sglang:prompt_tokens_total", RATE, INSTANCE))
    cached = agg(_rate("sglang:cached_tokens_total", RATE, INSTANCE))
    storage = agg(_rate("sglang:cached_tokens_total", RATE, INSTANCE, 'cache_source="storage"'))
    backuped = agg(_rate("sglang:backuped_tokens_total", RATE, INSTANCE, rank0))

    def q(p: float) -> str:
        return f"histogram_quantile({p}, {agg(_rate('sglang:time_to_first_token_seconds_bucket', RATE, INSTANCE), 'le')})"

    return [
        ("Prompt tokens served from device / host / storage, and computed", "tokens/s",
         [(who + "{{cache_source}}", agg(_rate("sglang:cached_tokens_total", RATE, INSTANCE), "cache_source")),
          (who + "computed (not cached)", f"{prompt} - {_zero_where(cached, '(' + prompt + ')')}")],
         "sglang:cached_tokens_total by cache_source (device, host, storage; total when SGLang had no per-tier detail)"),
        ("Storage (L3) hit share of prompt tokens", "percentunit",
         [(who + "storage share", f"{_zero_where(storage, '(' + prompt + ')')} / {prompt}")],
         "cached_tokens_total{cache_source=storage} / prompt_tokens_total"),
        ("L3 tokens backed up and prefetched", "tokens/s",
         [(who + "backed up", backuped),
          (who + "prefetched", agg(_rate("sglang:prefetched_tokens_total", RATE, INSTANCE, rank0))),
          (who + "found in L3", agg(_rate("sglang:storage_prefetch_hit_tokens_total", RATE, INSTANCE, rank0)))],
         "StorageMetricsCollector, rank 0 of the TP, PP and attention-CP ranks (they count the same tokens), DP ranks summed"),
        ("L3 trouble: prefetch unfulfilled by reason, backups dropped", "tokens/s",
         [(who + "unfulfilled: {{reason}}", agg(_rate("sglang:storage_prefetch_unfulfilled_tokens_total", RATE, INSTANCE, rank0), "reason")),
          (who + "backup dropped", _zero_where(agg(_rate("sglang:hicache_backup_dropped_tokens_total", RATE, INSTANCE, rank0)), "(" + backuped + ")"))],
         "below_threshold and device_covered are normal; deadline/storage_transfer mean slow or failing reads"),
        ("Time to first token (p50 / p90 / p99)", "s",
         [(who + "p50", q(0.5)), (who + "p90", q(0.9)), (who + "p99", q(0.99))],
         "sglang:time_to_first_token_seconds_bucket"),
        ("Requests running and queued", "short",
         [(who + "running", agg(_sel("sglang:num_running_reqs", INSTANCE, SCHEDULER_ONCE))),
          (who + "queued", agg(_sel("sglang:num_queue_reqs", INSTANCE, SCHEDULER_ONCE)))],
         "sglang:num_running_reqs, sglang:num_queue_reqs (pipeline stage 0: every stage schedules the same requests)"),
        ("Servers up", "short",
         [(who + "up", agg(_sel("up", f'job="{SERVER_JOB}"', INSTANCE)))],
         "Prometheus' up for job " + SERVER_JOB),
    ]


def dashboard(inventory_name: str) -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    next_id = iter(range(1, 1000))
    y = 0
    for row_title, by in ((f"Fleet ({inventory_name})", None), ("Per server", "instance, inventory_host")):
        panels.append({"id": next(next_id), "type": "row", "title": row_title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        y += 1
        for i, (title, unit, targets, description) in enumerate(_queries(by)):
            panels.append({
                "id": next(next_id), "type": "timeseries", "title": title + ("" if by else " (fleet)"), "description": description,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": y + 8 * (i // 2)},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
                "targets": [{"refId": chr(ord("A") + n), "expr": expr, "legendFormat": legend,
                             "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                            for n, (legend, expr) in enumerate(targets)],
            })
        y += 8 * ((len(_queries(by)) + 1) // 2)
    panels.append({"id": next(next_id), "type": "alertlist", "title": "HiCache alerts",
                   "gridPos": {"h": 6, "w": 24, "x": 0, "y": y},
                   "options": {"alertName": "HiCache", "stateFilter": {"firing": True, "pending": True}, "alertInstanceLabelFilter": ""}})
    return {
        "uid": DASHBOARD_UID, "title": f"HiCache: {inventory_name}", "tags": ["sglang", "hicache"], "timezone": "",
        "schemaVersion": 39, "version": 1, "editable": True, "refresh": "30s", "time": {"from": "now-3h", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
            {"name": "instance", "type": "query", "label": "server", "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": {"query": f'label_values(up{{job="{SERVER_JOB}"}}, instance)', "refId": "instance"},
             "definition": f'label_values(up{{job="{SERVER_JOB}"}}, instance)',
             "multi": True, "includeAll": True, "allValue": ".*", "current": {"text": "All", "value": "$__all"}, "refresh": 2},
        ]},
        "panels": panels,
    }


def panel_queries(board: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(panel title, refId, expr) of every query of a dashboard."""
    return [(p["title"], t["refId"], t["expr"]) for p in board["panels"] for t in p.get("targets", [])]


def concrete(expr: str, instance: str = ".*", rate_interval: str = "1m") -> str:
    """A dashboard query as Prometheus evaluates it once Grafana has put its variables in."""
    return expr.replace("$__rate_interval", rate_interval).replace("$instance", instance)


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACES = re.compile(r"\{[^{}]*\}")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_RANGE = re.compile(r"\[[^\]]*\]")
_WORD = re.compile(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?")
_KEYWORDS = {"and", "or", "unless", "offset", "bool", "by", "without", "on", "ignoring", "group_left", "group_right", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: every word that is not a function, keyword, label or duration."""
    text = _RANGE.sub(" ", _GROUPING.sub(" ", _BRACES.sub(" ", _STRING.sub('""', expr))))
    return {m[1] for m in _WORD.finditer(text) if not m[2] and m[1].lower() not in _KEYWORDS and not m[1].startswith("$")}


def base_metric(name: str) -> str:
    """`sglang:time_to_first_token_seconds_bucket` -> the histogram's name."""
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in SGLANG_METRICS:
            return name[: -len(suffix)]
    return name


# --- all of it --------------------------------------------------------------------------------------------

def render(inventory_name: str, deployments: Mapping[str, Any], connections: Mapping[str, Mapping[str, Any]],
           routers: Mapping[str, tuple[str, int]] | None = None, down_for: str = "1m") -> Monitoring:
    targets, notes = [], []
    for name, d in deployments.items():
        target, host_notes = server_target(inventory_name, d, connections.get(name) or {})
        targets.append(target)
        notes.extend(host_notes)
    router = router_targets(inventory_name, routers)
    files = {
        PROMETHEUS_FILE: "# Rendered by hicachectl monitoring: merge the scrape job and rule_files into your own config.\n"
                         + yaml.safe_dump(prometheus_config(bool(router)), sort_keys=False),
        TARGETS_FILE: json.dumps(file_sd(targets), indent=2) + "\n",
        RULES_FILE: "# Rendered by hicachectl monitoring. Metric names: SGLang's " + _SRC + ".\n"
                    + yaml.safe_dump(alert_rules(down_for), sort_keys=False, width=1000),
        DASHBOARD_FILE: json.dumps(dashboard(inventory_name), indent=2) + "\n",
    }
    if router:
        files[ROUTER_TARGETS_FILE] = json.dumps(file_sd(router), indent=2) + "\n"
    return Monitoring(files=files, targets=targets + router, notes=notes)
