"""Cold vs warm time-to-first-token, the seeds' method.

For each concurrency level c: c unique prompts (a fresh salt, so L3 is cold for them) are sent at once
and their TTFT measured from the stream; then, once /metrics shows their pages written to L3, the
server is reset (restarted, or its device and host caches flushed) and the same prompts are sent
again, so the warm hits come from L3. Output length is 1, as in the seeds (ISL~120k, OSL=1).

Through a router (`bench --router`) the prompts go to the router and the metrics are the sum of every
server's /metrics (the router has none of SGLang's); the reset restarts every server, each taken out of the
router and put back once healthy, so the router routes the warm prompts afresh: their L3 hits are what the
fleet serves from L3 as clients reach it (any server with a shared tier, only the writer with a host's own).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import http.client
import json
import statistics
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from hicachectl.config import secrets
from hicachectl.formats import prompts
from hicachectl.ops import metrics


class BenchError(RuntimeError):
    pass


@dataclasses.dataclass
class Target:
    base_url: str
    model: str | None = None  # None: the first of /v1/models
    reset: Callable[[], None] | None = None  # None: POST /flush_cache (L3 is kept)
    reset_label: str = "flush_cache"
    metrics_urls: list[str] | None = None  # the servers behind a router (their /metrics summed); None: base_url
    admin_key: str | None = dataclasses.field(default=None, repr=False)  # for /flush_cache, when the server has one


@dataclasses.dataclass
class Request:
    ttft: float
    prompt_tokens: int
    cached_tokens: int


@dataclasses.dataclass
class Phase:
    requests: list[Request]
    storage_tokens: float | None  # tokens loaded from L3 during the phase (metrics)

    def ttft(self, stat: str) -> float:
        values = [r.ttft for r in self.requests]
        if stat == "mean":
            return statistics.fmean(values)
        if len(values) == 1:
            return values[0]
        return statistics.quantiles(values, n=100, method="inclusive")[{"p50": 49, "p90": 89}[stat]]

    @property
    def storage_share(self) -> float | None:
        """Share of the prompt tokens loaded from L3: from the metrics, else from the responses' cached tokens."""
        prompt = sum(r.prompt_tokens for r in self.requests)
        if self.storage_tokens is not None and prompt:
            return min(self.storage_tokens / prompt, 1.0)
        return sum(r.cached_tokens for r in self.requests) / prompt if prompt else None


@dataclasses.dataclass
class Level:
    concurrency: int
    cold: Phase
    warm: Phase
    backed_up_tokens: float | None

    @property
    def speedup(self) -> float:
        return self.cold.ttft("mean") / self.warm.ttft("mean")


def _get(url: str, timeout: float = 30) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (urllib.error.URLError, OSError) as exc:  # -1, and why nothing answered
        reason = getattr(exc, "reason", None) or exc
        return -1, (getattr(reason, "strerror", None) or str(reason)).lower()


def wait_healthy(base_url: str, timeout: float, sleep=time.sleep) -> None:
    deadline = time.monotonic() + timeout
    while _get(base_url + "/health", timeout=60)[0] != 200:
        if time.monotonic() > deadline:
            raise BenchError(f"{base_url}/health did not answer 200 within {timeout:.0f} s")
        sleep(1)


def server_model(base_url: str) -> str:
    status, body = _get(base_url + "/v1/models")
    if status == -1:
        raise BenchError(f"nothing answers at {base_url} ({body}): is the server up (`hicachectl status`)?")
    if status != 200:
        raise BenchError(f"{base_url}/v1/models answered {status}: is the server up (`hicachectl status`)?")
    return json.loads(body)["data"][0]["id"]


def page_size(base_url: str) -> int:
    status, body = _get(base_url + "/server_info")
    return int(json.loads(body).get("page_size") or 1) if status == 200 else 1


def read_metrics(base_url: str) -> str | None:
    status, body = _get(base_url + "/metrics")
    return body if status == 200 else None


def target_metrics(target: Target) -> str | None:
    """The target's /metrics text; behind a router every server's, one after the other (metrics.total sums the series),
    None when one of them does not answer (a partial sum would understate the L3 hits)."""
    if not target.metrics_urls:
        return read_metrics(target.base_url)
    texts = [read_metrics(url) for url in target.metrics_urls]
    return None if any(t is None for t in texts) else "".join(texts)


def stream_ttft(base_url: str, body: bytes, timeout: float) -> Request:
    """Send one prepared request; TTFT is when the first generated token arrives in the stream."""
    url = urllib.parse.urlsplit(base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=timeout)
    try:
        start = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise BenchError(f"the server answered {response.status}: {response.read(500).decode(errors='replace')}")
        ttft, usage = None, {}
        for raw in response:
            line = raw.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if ttft is None and any((c.get("delta") or {}).get("content") is not None for c in chunk.get("choices") or []):
                ttft = time.perf_counter() - start
            usage = chunk.get("usage") or usage
        if ttft is None:
            raise BenchError("the stream ended without a token")
        return Request(ttft, int(usage.get("prompt_tokens", 0)), int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0))
    finally:
        conn.close()


def send_all(base_url: str, bodies: list[bytes], timeout: float, done: Callable[[], None]) -> list[Request]:
    """All requests at once (total prompts = concurrency), each on its own connection."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        futures = [pool.submit(stream_ttft, base_url, body, timeout) for body in bodies]
        for future in concurrent.futures.as_completed(futures):
            future.result()
            done()
        return [f.result() for f in futures]


def wait_for_backup(read: Callable[[], str | None], before: float | None, expected: int, timeout: float, sleep=time.sleep) -> float | None:
    """Tokens written to L3 since `before`, once all `expected` are there or the count stops growing."""
    if before is None:
        return None
    deadline, last, still = time.monotonic() + timeout, -1.0, 0
    while True:
        written = (metrics.total(read(), metrics.BACKUPED) or 0) - before
        if written >= expected or time.monotonic() > deadline:
            return written
        still = still + 1 if written == last else 0
        if still >= 5 and written > 0:
            return written
        last = written
        sleep(1)


def flush_cache(target: Target) -> None:
    """POST /flush_cache: SGLang asks for the admin key there when the server has one (utils/auth.py, ADMIN_OPTIONAL)."""
    try:
        urllib.request.urlopen(urllib.request.Request(target.base_url + "/flush_cache", method="POST", headers=secrets.bearer(target.admin_key)),
                               timeout=60).close()
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            given = "refused the key in HICACHE_ADMIN_API_KEY" if target.admin_key else "asks for the server's admin API key"
            raise BenchError(f"{target.base_url}/flush_cache answered {exc.code}: the server {given}; set HICACHE_ADMIN_API_KEY "
                             "to the server's hicache_admin_api_key, or give --restart-command") from exc
        raise


def run_level(target: Target, concurrency: int, input_len: int, salt: str, *, timeout: float, done: Callable[[], None]) -> Level:
    model = target.model or server_model(target.base_url)
    bodies = [json.dumps(prompts.chat_request(model, prompts.prompt(f"{salt}-c{concurrency}-{i}", input_len), stream=True)).encode()
              for i in range(concurrency)]
    page = page_size(target.metrics_urls[0] if target.metrics_urls else target.base_url)
    start_metrics = target_metrics(target)
    cold_requests = send_all(target.base_url, bodies, timeout, done)
    cold_metrics = target_metrics(target)
    cold = Phase(cold_requests, metrics.delta(cold_metrics, start_metrics, metrics.storage_hits))
    expected = sum(r.prompt_tokens // page * page for r in cold_requests)
    backed_up = wait_for_backup(lambda: target_metrics(target), metrics.total(start_metrics, metrics.BACKUPED), expected, timeout)
    if target.reset is None:
        flush_cache(target)
    else:
        target.reset()
    wait_healthy(target.base_url, timeout)
    warm_start = target_metrics(target)
    warm_requests = send_all(target.base_url, bodies, timeout, done)
    warm_metrics = target_metrics(target)
    warm = Phase(warm_requests, metrics.delta(warm_metrics, warm_start, metrics.storage_hits))
    return Level(concurrency, cold, warm, backed_up)


def summary(levels: list[Level]) -> list[dict[str, Any]]:
    rows = []
    for level in levels:
        share = level.warm.storage_share
        rows.append({
            "concurrency": level.concurrency,
            **{f"{phase}_{stat}_s": round(getattr(level, phase).ttft(stat), 3) for phase in ("cold", "warm") for stat in ("mean", "p50", "p90")},
            "speedup": round(level.speedup, 2),
            "prompt_tokens": round(statistics.fmean(r.prompt_tokens for r in level.cold.requests)),
            "warm_storage_share": None if share is None else round(share, 4),
            "backed_up_tokens": level.backed_up_tokens,
        })
    return rows


def table_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    def share(v):
        return "-" if v is None else f"{v:.1%}"
    return [[str(r["concurrency"]), str(r["prompt_tokens"]),
             f"{r['cold_mean_s']:.2f} / {r['cold_p50_s']:.2f} / {r['cold_p90_s']:.2f}",
             f"{r['warm_mean_s']:.2f} / {r['warm_p50_s']:.2f} / {r['warm_p90_s']:.2f}",
             f"{r['speedup']:.2f}x", share(r["warm_storage_share"])] for r in rows]


TABLE_HEADERS = ["concurrency", "prompt tokens", "cold TTFT s mean/p50/p90", "warm TTFT s mean/p50/p90", "speedup", "warm tokens from L3"]


# matplotlib (and numpy, which it needs) are the optional extra `bench` (pyproject.toml): only the chart needs them.
CHART_EXTRA = "pip install 'hicache-deploy[bench]'"


class ChartUnavailable(RuntimeError):
    """matplotlib cannot be imported: bench measures and reports all the same, without the PNG."""


def chart(rows: list[dict[str, Any]], path, title: str) -> None:
    """TTFT against concurrency, cold and warm (mean, with the p50-p90 range shaded). ChartUnavailable without
    matplotlib (the extra hicache-deploy[bench])."""
    try:
        import matplotlib
    except ImportError as exc:  # not installed (ModuleNotFoundError), or installed but broken (its numpy, its C parts)
        missing = isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] in ("matplotlib", "numpy")
        raise ChartUnavailable(f"the chart needs matplotlib, which {'is not installed' if missing else f'cannot be imported ({exc})'}: "
                               f"{CHART_EXTRA}") from exc

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(7, 4.2), dpi=120)
    x = [r["concurrency"] for r in rows]
    for phase, colour in (("cold", "#c0392b"), ("warm", "#2471a3")):
        axes.plot(x, [r[f"{phase}_mean_s"] for r in rows], marker="o", color=colour, label=f"{phase} (mean)")
        axes.fill_between(x, [r[f"{phase}_p50_s"] for r in rows], [r[f"{phase}_p90_s"] for r in rows], color=colour, alpha=0.15,
                          label=f"{phase} p50-p90")
    for r in rows:
        axes.annotate(f"{r['speedup']:.1f}x", (r["concurrency"], r["warm_mean_s"]), textcoords="offset points", xytext=(0, -14), ha="center", fontsize=8)
    axes.set_xscale("log", base=2)
    axes.set_xticks(x, [str(c) for c in x])
    axes.set_xlabel("concurrency (total prompts = concurrency)")
    axes.set_ylabel("time to first token (s)")
    axes.set_ylim(bottom=0)
    axes.set_title(title, fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)
