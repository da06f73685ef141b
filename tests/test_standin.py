"""The SGLang stand-in itself: it must behave the way the lifecycle, verify and bench tests rely on. Its L3 pages are
written by SGLang's own HiCacheFile / HiCacheNixl (tests/standin/sglang_pages.py) from the CPU environment of
tests/infra/sglang_env.sh --storage, built here on first use (fleet.sglang_storage_env)."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import signal
import time
import urllib.error
import urllib.request

import pytest
from fleet import sglang_path, sglang_storage_env
from support import ROOT

STANDIN = ROOT / "tests/standin/sglang_standin.py"


@pytest.fixture(scope="module")
def sglang_env():
    """The env that gives the stand-in SGLang's storage backends (as install_standin's sglang_path does on a test host)."""
    return {"STANDIN_SGLANG_PATH": sglang_path(*sglang_storage_env())}


def ready(port, timeout=120):
    """Wait for /health: the stand-in answers 503 while SGLang's storage backends are being opened."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if get(f"http://127.0.0.1:{port}/health")[0] == 200:
            return port
        time.sleep(0.2)
    raise AssertionError(f"stand-in on {port} not healthy after {timeout} s")


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def chat(port, prompt, model="m"):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", method="POST",
                                 data=json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}]}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


@pytest.mark.slow  # SGLang's storage backends: a start imports torch and SGLang (5-20 s here)
def test_l3_hits_survive_a_restart_and_depend_on_name_and_page_size(standin, sglang_env):
    args = ("--served-model-name", "m", "--page-size", "4", "--hicache-storage-backend", "file", "--enable-metrics", "--enable-cache-report")
    prompt = " ".join(f"w{i}" for i in range(300))  # above SGLang's prefetch threshold (256 tokens)
    port, proc = standin(*args, env=sglang_env)
    ready(port)
    assert chat(port, prompt)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert "sglang:backuped_tokens_total" in get(f"http://127.0.0.1:{port}/metrics")[1]
    proc.kill()
    port, _ = standin(*args, env=sglang_env)
    assert chat(ready(port), prompt)["usage"]["prompt_tokens_details"]["cached_tokens"] == 300
    assert 'sglang:cached_tokens_total{cache_source="storage"} 300' in get(f"http://127.0.0.1:{port}/metrics")[1]
    other_page, _ = standin("--served-model-name", "m", "--page-size", "8", "--hicache-storage-backend", "file", "--enable-cache-report", env=sglang_env)
    ready(other_page)
    assert chat(other_page, prompt)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


@pytest.mark.slow  # SGLang's storage backends: a start imports torch and SGLang (5-20 s here)
def test_a_prefix_below_sglangs_prefetch_threshold_is_not_loaded_from_l3(standin, sglang_env):
    """SGLang 0.5.23 (managers/cache_controller.py, mem_cache/unified_radix_cache.py): the threshold is
    max(prefetch_threshold, page size), 256 tokens by default; fewer new tokens are not looked up in L3, and a hit of
    fewer tokens is not loaded but counted unfulfilled, reason below_threshold. The extra config's prefetch_threshold
    lowers it."""
    from hicachectl.ops import metrics
    args = ("--served-model-name", "m", "--page-size", "4", "--hicache-storage-backend", "file", "--enable-metrics", "--enable-cache-report")
    short = " ".join(f"p{i}" for i in range(200))  # 50 pages
    longer = short + " " + " ".join(f"q{i}" for i in range(100))  # the same 50 pages, then 25 new ones
    port, _ = standin(*args, env=sglang_env)
    assert chat(ready(port), short)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert metrics.total(get(f"http://127.0.0.1:{port}/metrics")[1], metrics.BACKUPED) == 200  # written through
    assert chat(port, short)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # too short to be looked up
    assert metrics.total(get(f"http://127.0.0.1:{port}/metrics")[1], metrics.STORAGE_HITS) == 0
    assert chat(port, longer)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # 200 found, fewer than 256: not loaded
    text = get(f"http://127.0.0.1:{port}/metrics")[1]
    assert metrics.total(text, metrics.STORAGE_HITS) == 200 and metrics.total(text, metrics.PREFETCH_UNFULFILLED, reason="below_threshold") == 200
    assert 'sglang:cached_tokens_total{cache_source="storage"} 0' in text
    low, _ = standin(*args, "--hicache-storage-backend-extra-config", '{"prefetch_threshold": 64}', env=sglang_env)
    assert chat(ready(low), short)["usage"]["prompt_tokens_details"]["cached_tokens"] == 200


def test_health_while_loading_and_a_server_that_never_becomes_healthy(standin):
    port, _ = standin(env={"STANDIN_LOAD_SECONDS": "1"})
    assert get(f"http://127.0.0.1:{port}/health")[0] == 503
    time.sleep(1.2)
    assert get(f"http://127.0.0.1:{port}/health")[0] == 200
    assert json.loads(get(f"http://127.0.0.1:{port}/v1/models")[1])["data"][0]["id"] == "/models/m"
    bad, _ = standin(env={"STANDIN_NEVER_HEALTHY": "1"})
    assert get(f"http://127.0.0.1:{bad}/health")[0] == 503


def test_broken_uring_exits_with_nixls_error(standin):
    _, proc = standin("--hicache-storage-backend", "nixl", "--hicache-storage-backend-extra-config", '{"use_uring": true}',
                    env={"STANDIN_URING_BROKEN": "1"})
    assert proc.wait(timeout=10) == 1 and "EBADF" in proc.stderr.read()


@pytest.mark.slow  # SGLang's storage backends: a start imports torch and SGLang (5-20 s here)
def test_kv_dtype_is_not_keyed_but_tp_rank_and_size_are_like_sglangs_file_backend(standin, sglang_env):
    """Two servers on one directory (a shared export): a server with another KV dtype reads the first's pages as its
    own (sglang#33268), one with another TP size finds none (HiCacheFile's suffix _<tp_rank>_<tp_size>)."""
    base = ("--served-model-name", "m", "--page-size", "4", "--hicache-storage-backend", "file", "--enable-cache-report")
    prompt = " ".join(f"s{i}" for i in range(300))
    writer, _ = standin(*base, env=sglang_env)
    info = json.loads(get(f"http://127.0.0.1:{ready(writer)}/server_info")[1])
    assert (info["kv_cache_dtype"], info["tp_size"], info["pp_size"], info["page_size"]) == ("auto", 1, 1, 4)
    assert chat(writer, prompt)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    fp8, _ = standin(*base, "--kv-cache-dtype", "fp8_e4m3", env=sglang_env)
    assert json.loads(get(f"http://127.0.0.1:{ready(fp8)}/server_info")[1])["kv_cache_dtype"] == "fp8_e4m3"
    assert chat(fp8, prompt)["usage"]["prompt_tokens_details"]["cached_tokens"] == 300  # stale format, read as its own
    tp2, _ = standin(*base, "--tp-size", "2", env=sglang_env)
    assert json.loads(get(f"http://127.0.0.1:{ready(tp2)}/server_info")[1])["tp_size"] == 2
    assert chat(tp2, prompt)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # TP is keyed: TP 1's pages are not its own


# SGLang 0.5.23's names (mem_cache/hicache_storage.py HiCacheFile, storage/nixl/hicache_nixl.py, nixl_routing.py): the page
# key (64 hex), '_' + the served name ('/' -> '-'), '_<tp_rank>_<tp_size>'; the file backend adds '.bin' (a hidden
# '.<uuid>.tmp' while writing), nixl adds '_k' / '_v' (page_first: zero copy, one file per part) in a bucket directory
# named by the key's blake2b hash.
FILE_NAME = re.compile(r"(?P<key>[0-9a-f]{64})_org-m_(?P<rank>[01])_2\.bin")
NIXL_NAME = re.compile(r"(?P<bucket>[0-9a-f]{2})/(?P<key>[0-9a-f]{64})_org-m_(?P<rank>[01])_2_(?P<part>[kv])")
PAGE_BYTES = 2 * 4 * 1 * 128 * 2 * 16  # k and v x 4 layers x 1 head x dim 128 x bf16 x 16 tokens (sglang_pages.MODEL)
PAGES = 17  # 272 tokens: above SGLang's prefetch threshold (256), below which nothing is loaded from L3


def nixl_bucket(name):
    """nixl_routing.route_key's bucket: the low 8 bits of the 64-bit blake2b of the file's key."""
    return f"{int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), 'big') & 0xff:02x}"


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["file", "nixl"])
def test_pages_on_the_tier_have_sglangs_names_and_layout(standin, sglang_env, tmp_path, backend):
    """A TP 2 server writes 17 pages of 16 tokens (above SGLang's prefetch threshold): the files are SGLang's, per page
    and rank (and k/v part for nixl), with the page's bytes; a restarted server reads them back. The stand-in's old store (flat <sha256> files) fails here."""
    tier = tmp_path / backend
    env = {**sglang_env, "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": str(tier), "SGLANG_HICACHE_NIXL_BACKEND_STORAGE_DIR": str(tier)}
    # NIXL's L3 cleaner (on by default) judges the whole filesystem (statvfs: 100 * (blocks - bavail) / blocks) and, at
    # 80 %, deletes the oldest pages: on a machine whose /tmp reads 80 % so (seen here: 80.4 % with 50 of 252 GB
    # available) it emptied this tier between the two servers. The cleaner is validate's subject, not this test's.
    extra = ("--hicache-storage-backend-extra-config", '{"plugin": {"posix": {"active": true}}, "l3_cleaner_enabled": false}') \
        if backend == "nixl" else ()
    args = ("--served-model-name", "org/m", "--page-size", "16", "--tp-size", "2", "--hicache-storage-backend", backend, *extra,
            "--enable-cache-report")
    prompt = " ".join(f"t{i}" for i in range(16 * PAGES + 5))  # full pages, 5 tokens left over (never stored)
    port, proc = standin(*args, env=env)
    assert chat(ready(port), prompt, model="org/m")["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    files = sorted(str(p.relative_to(tier)) for p in tier.rglob("*") if p.is_file())
    if backend == "file":
        matched = [FILE_NAME.fullmatch(f) for f in files]
        assert all(matched) and len(files) == PAGES * 2, files  # a file per page and rank
        assert all((tier / f).stat().st_size == PAGE_BYTES for f in files)
    else:
        matched = [NIXL_NAME.fullmatch(f) for f in files]
        assert all(matched) and len(files) == PAGES * 2 * 2, files  # a file per page, rank and part
        assert all(m["bucket"] == nixl_bucket(f.split("/")[1]) for m, f in zip(matched, files, strict=True))
        assert all((tier / f).stat().st_size == PAGE_BYTES // 2 for f in files)
        assert sorted(p.name for p in tier.iterdir()) == [f"{i:02x}" for i in range(256)]  # NIXL creates every bucket
    assert len({m["key"] for m in matched}) == PAGES and {m["rank"] for m in matched} == {"0", "1"}
    proc.kill()
    again, _ = standin(*args, env=env)
    assert chat(ready(again), prompt, model="org/m")["usage"]["prompt_tokens_details"]["cached_tokens"] == PAGES * 16


def call(url, method="GET", key=None):
    req = urllib.request.Request(url, method=method, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_the_storage_backend_api_answers_as_sglangs_and_needs_its_admin_key(standin):
    """SGLang 0.5.21-0.5.23 entrypoints/http_server.py: GET /hicache/storage-backend is refused with 400 on a server
    started without --admin-api-key (so is DELETE), 401 without the bearer token (utils/auth.py ADMIN_OPTIONAL), and
    answers the tokenizer's four fields; a stand-in told it predates sglang#15892 answers 404."""
    plain, _ = standin()
    code, body = call(f"http://127.0.0.1:{plain}/hicache/storage-backend")
    assert code == 400 and "requires admin API key" in json.loads(body)["error"]
    assert call(f"http://127.0.0.1:{plain}/hicache/storage-backend", "DELETE")[0] == 400
    keyed, _ = standin("--admin-api-key", "k", "--hicache-write-policy", "write_back")
    url = f"http://127.0.0.1:{keyed}/hicache/storage-backend"
    assert call(url) == (401, json.dumps({"error": "Unauthorized"})) and call(url, key="wrong")[0] == 401
    code, body = call(url, key="k")
    assert code == 200 and json.loads(body) == {"hicache_storage_backend": None, "hicache_storage_backend_extra_config": None,
                                                "hicache_storage_prefetch_policy": "timeout", "hicache_write_policy": "write_back"}
    old, _ = standin("--admin-api-key", "k", env={"STANDIN_NO_STORAGE_BACKEND_API": "1"})
    assert call(f"http://127.0.0.1:{old}/hicache/storage-backend", key="k")[0] == 404


@pytest.mark.slow  # SGLang's storage backends: a start imports torch and SGLang (5-20 s here)
def test_a_detach_shows_in_the_storage_backend_api_and_stops_l3_and_verify_names_it(standin, sglang_env):
    """DELETE /hicache/storage-backend as SGLang serves it: GET then answers null, no page is written or read (the
    storage metrics stay, as SGLang keeps its collector), and verify's check fails naming the backend. The storage
    metrics carry SGLang's labels, one series per TP and PP rank, and metrics.total counts them once."""
    from helpers import deployment

    from hicachectl.ops import metrics, verify
    args = ("--served-model-name", "m", "--page-size", "4", "--tp-size", "2", "--pp-size", "2", "--hicache-storage-backend", "file",
            "--enable-metrics", "--enable-cache-report", "--admin-api-key", "k")
    port, _ = standin(*args, env=sglang_env)
    url = f"http://127.0.0.1:{ready(port)}/hicache/storage-backend"
    d = deployment("local", page_size=4, storage_backend="file")
    code, body = call(url, key="k")
    assert verify.storage_backend_check(d, {"status": code, "json": json.loads(body)})["status"] == "pass"
    long_a = " ".join(f"a{i}" for i in range(300))  # above SGLang's prefetch threshold: read from L3 while attached
    assert chat(port, long_a)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    text = get(f"http://127.0.0.1:{port}/metrics")[1]
    assert text.count("sglang:backuped_tokens_total{") == 4 and 'pp_rank="1",pp_size="2",attn_cp_rank="0"' in text
    assert metrics.total(text, metrics.BACKUPED) == 300
    assert call(url, "DELETE", key="k") == (200, "HiCache storage backend detached.\n")
    code, body = call(url, key="k")
    check = verify.storage_backend_check(d, {"status": code, "json": json.loads(body)})
    assert check["status"] == "fail" and "file was detached at runtime" in check["detail"]
    assert chat(port, long_a)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # no L3 read (300 before the detach)
    chat(port, " ".join(f"b{i}" for i in range(300)))
    assert metrics.total(get(f"http://127.0.0.1:{port}/metrics")[1], metrics.BACKUPED) == 300  # nothing written since


def test_sigterm_stops_the_stand_in_even_as_a_containers_pid_1(standin):
    """SGLang stops on SIGTERM (uvicorn's handlers); so must the stand-in, also as PID 1 of a PID namespace, as in a
    container, where a signal without a handler is ignored and `docker stop` waits out its whole timeout."""
    # --kill-child: the stand-in goes with unshare when the fixture kills it (a PID 1 that ignores SIGTERM would not)
    _, outer = standin(launcher=["unshare", "--pid", "--fork", "--kill-child"])
    assert outer.poll() is None, outer.stderr.read()
    pid1 = int((pathlib.Path(f"/proc/{outer.pid}/task/{outer.pid}/children")).read_text().split()[0])
    nspid = pathlib.Path(f"/proc/{pid1}/status").read_text().split("NSpid:")[1].splitlines()[0].split()
    assert nspid[-1] == "1", nspid  # PID 1 in its namespace
    os.kill(pid1, signal.SIGTERM)
    assert outer.wait(timeout=10) == 0
    assert "stopping on SIGTERM" in outer.stdout.read()


def cached_by_source(port, prompt):
    """SGLang's sglext.cached_tokens_details of a chat request that asks for it ({} when nothing was cached)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", method="POST",
                                 data=json.dumps({"model": "m", "messages": [{"role": "user", "content": prompt}],
                                                  "return_cached_tokens_details": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        details = (json.loads(r.read()).get("sglext") or {}).get("cached_tokens_details") or {}
    return {k: details[k] for k in ("device", "host", "storage") if k in details}


@pytest.mark.parametrize("policy", ["write_through", "write_through_selective", "write_back"])
def test_with_a_gpu_pool_a_prompt_pushed_off_the_gpu_comes_back_from_host_memory_as_sglangs_does(standin, policy):
    """--max-total-tokens 40 and page 4: a GPU pool of 10 pages, a host pool of twice that (SGLang's ratio when unset).
    Prompts of 5 pages: the second request of A is all GPU; after two fillers (10 pages, newer) A has left the GPU and
    comes back from host memory: under write_through (copied at its first insert) and write_back (copied as it leaves
    the GPU), not under write_through_selective after one request (copied only at a second hit)."""
    port, _ = standin("--served-model-name", "m", "--page-size", "4", "--max-total-tokens", "40", "--enable-metrics",
                      "--hicache-write-policy", policy)
    a, b, c = (" ".join(f"{name}{i}" for i in range(20)) for name in "abc")
    info = json.loads(get(f"http://127.0.0.1:{port}/server_info")[1])
    assert (info["max_total_num_tokens"], info["hicache_ratio"]) == (40, 2.0)
    assert cached_by_source(port, a) == {}  # new: prefilled
    if policy == "write_through_selective":
        assert cached_by_source(port, b) == {} and cached_by_source(port, c) == {}
        assert cached_by_source(port, a) == {}, "A, seen once, was never copied to host: recomputed"
        assert cached_by_source(port, a) == {"device": 20, "host": 0, "storage": 0}  # its second hit: now copied
    else:
        assert cached_by_source(port, a) == {"device": 20, "host": 0, "storage": 0}
    assert cached_by_source(port, b) in ({}, {"device": 20, "host": 0, "storage": 0})
    assert cached_by_source(port, " ".join(f"x{i}" for i in range(20))) == {}
    assert cached_by_source(port, " ".join(f"y{i}" for i in range(20))) == {}  # the GPU holds x and y now
    assert cached_by_source(port, a) == {"device": 0, "host": 20, "storage": 0}
    text = get(f"http://127.0.0.1:{port}/metrics")[1]
    assert 'sglang:cached_tokens_total{cache_source="host"} 20' in text
    assert re.search(r'sglang:hicache_host_total_tokens\{[^}]*tp_rank="0"[^}]*\} 80', text), text
    urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/flush_cache", method="POST"), timeout=10).close()
    assert cached_by_source(port, a) == {}  # /flush_cache empties the GPU cache and the host pool


def test_a_host_pool_too_small_for_the_filler_loses_the_prompt_first(standin):
    """--hicache-ratio 1: a host pool as large as the GPU's. Under write_through every filler page is copied to host at
    its insert; once A has left the GPU it is the oldest host-only page, so the host pool drops it to make room."""
    port, _ = standin("--served-model-name", "m", "--page-size", "4", "--max-total-tokens", "40", "--hicache-ratio", "1")
    a = " ".join(f"a{i}" for i in range(20))
    assert cached_by_source(port, a) == {}
    for filler in "xy":
        assert cached_by_source(port, " ".join(f"{filler}{i}" for i in range(20))) == {}
    assert cached_by_source(port, a) == {}
