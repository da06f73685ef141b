"""The SGLang stand-in itself: it must behave the way the lifecycle, verify and bench tests rely on."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from support import ROOT

STANDIN = ROOT / "tests/standin/sglang_standin.py"


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


def test_l3_hits_survive_a_restart_and_depend_on_name_and_page_size(standin):
    args = ("--served-model-name", "m", "--page-size", "4", "--hicache-storage-backend", "file", "--enable-metrics", "--enable-cache-report")
    prompt = " ".join(f"w{i}" for i in range(40))
    port, proc = standin(*args)
    assert chat(port, prompt)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert "sglang:backuped_tokens_total" in get(f"http://127.0.0.1:{port}/metrics")[1]
    proc.kill()
    port, _ = standin(*args)
    assert chat(port, prompt)["usage"]["prompt_tokens_details"]["cached_tokens"] == 40
    assert 'sglang:cached_tokens_total{cache_source="storage"} 40' in get(f"http://127.0.0.1:{port}/metrics")[1]
    other_page, _ = standin("--served-model-name", "m", "--page-size", "8", "--hicache-storage-backend", "file", "--enable-cache-report")
    assert chat(other_page, prompt)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


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


def test_server_info_reports_kv_dtype_and_tp_size_which_its_keys_omit_like_the_file_backend(standin):
    """Two servers on one directory (a shared export): the second reads the first's pages; its KV dtype and TP
    size are reported but are not part of the keys (sglang#33268), while the page size is."""
    base = ("--served-model-name", "m", "--page-size", "4", "--hicache-storage-backend", "file", "--enable-cache-report")
    prompt = " ".join(f"s{i}" for i in range(40))
    writer, _ = standin(*base)
    info = json.loads(get(f"http://127.0.0.1:{writer}/server_info")[1])
    assert (info["kv_cache_dtype"], info["tp_size"], info["pp_size"], info["page_size"]) == ("auto", 1, 1, 4)
    assert chat(writer, prompt)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    other, _ = standin(*base, "--kv-cache-dtype", "fp8_e4m3", "--tp-size", "2")
    info = json.loads(get(f"http://127.0.0.1:{other}/server_info")[1])
    assert (info["kv_cache_dtype"], info["tp_size"]) == ("fp8_e4m3", 2)
    assert chat(other, prompt)["usage"]["prompt_tokens_details"]["cached_tokens"] == 40  # stale format, read as its own
