"""The bench client's own cost; run through bench/client_overhead.

The SGLang stand-in runs here with a prefill time of zero, so every TTFT it shows is overhead: the
client building, sending and parsing, the loopback, and the stand-in reading 120k words. That floor
(an upper bound on the client's share) and the client process's CPU time are compared with the
seeds' measured TTFTs (VAST: ~147 s cold, ~30 s warm at ISL~120k).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from hicachectl.formats import prompts  # noqa: E402
from hicachectl.ops import bench  # noqa: E402

SEED_WARM_TTFT_S, SEED_COLD_TTFT_S = 30.0, 147.0


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--input-len", type=int, default=120_000)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as l3:
        server = subprocess.Popen([sys.executable, str(ROOT / "tests/standin/sglang_standin.py"), "--model-path", "m", "--port", str(port),
                                   "--page-size", "8192", "--hicache-storage-backend", "file", "--enable-cache-report"],
                                  env={**os.environ, "STANDIN_PREFILL_US_PER_TOKEN": "0", "STANDIN_LOAD_US_PER_TOKEN": "0",
                                       "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": l3}, stdout=subprocess.DEVNULL)
        try:
            bench.wait_healthy(f"http://127.0.0.1:{port}", 30, sleep=lambda _: time.sleep(0.1))
            t0, c0 = time.perf_counter(), cpu_seconds()
            bodies = [json.dumps(prompts.chat_request("m", prompts.prompt(f"overhead-{i}", args.input_len), stream=True)).encode()
                      for i in range(args.concurrency)]
            generate_wall, generate_cpu = time.perf_counter() - t0, cpu_seconds() - c0
            c1 = cpu_seconds()
            requests = bench.send_all(f"http://127.0.0.1:{port}", bodies, 600, lambda: None)
            send_cpu = cpu_seconds() - c1
        finally:
            server.kill()
    floor = statistics.fmean(r.ttft for r in requests)
    per_request_cpu = send_cpu / len(requests)
    mib = sum(len(b) for b in bodies) / 2**20
    print(f"shape: {args.concurrency} prompts x {args.input_len} words ({mib:.0f} MiB of requests), output 1 token")
    print(f"prompt generation (before the clock starts): {generate_wall:.2f} s wall, {generate_cpu:.2f} s CPU")
    print(f"client CPU while sending and parsing: {send_cpu:.3f} s in all, {per_request_cpu * 1000:.1f} ms per request")
    print(f"TTFT floor against an instant server (client + loopback + stand-in): mean {floor:.3f} s, max {max(r.ttft for r in requests):.3f} s")
    # The client's threads share one interpreter, so no TTFT can be delayed by more than all of its CPU time.
    print(f"ratio: client CPU of the whole run / seed warm TTFT ({SEED_WARM_TTFT_S:.0f} s) = {send_cpu / SEED_WARM_TTFT_S:.3%} "
          f"(an upper bound on what the client adds to any one TTFT)")
    print(f"ratio: TTFT floor / seed warm TTFT = {floor / SEED_WARM_TTFT_S:.2%}; / seed cold TTFT ({SEED_COLD_TTFT_S:.0f} s) = "
          f"{floor / SEED_COLD_TTFT_S:.2%}; the stand-in, one Python process, reads every request")


if __name__ == "__main__":
    main()
