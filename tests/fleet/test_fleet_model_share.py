"""One download per shared model directory (issue #24, item 7), counted on the test bed.

Three SSH hosts mount one host directory at /mnt/models (a shared export: tests/infra/fleet.py's volumes) and name
it hicache_model_share. The hub cannot be reached from here, so `hf` on each host is a stand-in (named as such below)
that does what `hf download REPO --local-dir DIR` leaves behind (the files) after a few seconds, and appends one line
per download to a count on the shared directory. `plan` says which host downloads; `deploy` downloads once (one line),
the other hosts wait for its stamp; a second deploy downloads nothing.
"""

from __future__ import annotations

import pytest
from fleet import Fleet
from support import cli, cli_json

pytestmark = pytest.mark.slow

REPO = "Qwen/Qwen2.5-0.5B-Instruct"
COUNT = "/mnt/models/hf-stand-in-downloads.log"  # on the shared directory: every host's downloads in one file

# The stand-in for huggingface_hub's `hf` CLI (its `download REPO [--revision R] --local-dir DIR` form only): slow
# enough that downloads of several hosts at once would overlap, and counted.
HF_STANDIN = r'''#!/usr/bin/python3
"""hf stand-in for the hicache-deploy test bed (no hub here): writes a tiny model into --local-dir, counted."""
import argparse, os, socket, sys, time
parser = argparse.ArgumentParser()
parser.add_argument("command")
parser.add_argument("repo")
parser.add_argument("--revision")
parser.add_argument("--local-dir", required=True)
args = parser.parse_args()
if args.repo.startswith("unreachable/"):  # as hf says when the hub cannot be reached
    sys.exit("huggingface_hub.errors.LocalEntryNotFoundError: cannot reach the Hub (stand-in)")
with open("/mnt/models/hf-stand-in-downloads.log", "a") as count:
    count.write(f"{socket.gethostname()} {args.repo} {time.time()}\n")
time.sleep(4)
os.makedirs(args.local_dir, exist_ok=True)
with open(os.path.join(args.local_dir, "config.json"), "w") as f:
    f.write('{"architectures": ["Qwen2ForCausalLM"]}\n')
with open(os.path.join(args.local_dir, "model.safetensors"), "wb") as f:
    f.write(b"\0" * 4096)
'''


@pytest.fixture(scope="module")
def shared_models(tmp_path_factory):
    work = tmp_path_factory.mktemp("model-share")
    export = work / "export"
    export.mkdir()
    fleet = Fleet(work, 3, prefix="hicache-mshare", volumes=(f"{export}:/mnt/models",)).up()
    try:
        for host in fleet.hosts:
            put = fleet.ssh(host, f"cat > /usr/local/bin/hf <<'HF_EOF'\n{HF_STANDIN}\nHF_EOF\nchmod 0755 /usr/local/bin/hf")
            assert put.returncode == 0, put.stderr
        yield fleet, export
    finally:
        fleet.down()


def test_hosts_sharing_a_model_directory_download_it_once(shared_models):
    fleet, export = shared_models
    hosts = sorted(fleet.hosts)
    inventory = fleet.inventory(extra_vars={"hicache_model_source": "hub", "hicache_model_repo": REPO, "hicache_model_dir": "/mnt/models/qwen",
                                            "hicache_model_path": "/models/qwen", "hicache_model_share": "test-export"}, name="shared")

    plan = cli("plan", "--inventory", str(inventory))
    assert plan.returncode == 0, plan.stdout + plan.stderr
    said = f"{hosts[0]} downloads {REPO} into /mnt/models/qwen for the 3 host(s) {hosts[0][:-2]}-[1:3] sharing it (test-export)"
    for host in hosts:
        assert f"{host}: note: {said}" in plan.stdout, plan.stdout
    assert not (export / "hf-stand-in-downloads.log").exists()  # a plan downloads nothing

    first = cli_json("deploy", "--inventory", str(inventory))
    assert first["ok"], first
    downloads = (export / "hf-stand-in-downloads.log").read_text().splitlines()
    assert len(downloads) == 1 and downloads[0].startswith(f"{hosts[0]} {REPO} "), downloads  # one download, by the host plan named
    assert (export / "qwen" / ".hicache-downloaded").is_file()
    for host in hosts[1:]:  # they waited for the stamp and did not download
        tasks = {c["task"] for c in first["hosts"][host]["changes"]}
        assert "Download the model" not in tasks, first["hosts"][host]

    again = cli_json("deploy", "--inventory", str(inventory))
    assert again["ok"] and len((export / "hf-stand-in-downloads.log").read_text().splitlines()) == 1


def test_when_the_host_that_downloads_fails_the_others_stop_at_once_naming_it(shared_models):
    fleet, _ = shared_models
    hosts = sorted(fleet.hosts)
    inventory = fleet.inventory(extra_vars={"hicache_model_source": "hub", "hicache_model_repo": "unreachable/model",
                                            "hicache_model_dir": "/mnt/models/unreachable", "hicache_model_path": "/models/unreachable",
                                            "hicache_model_share": "test-export", "hicache_model_share_wait": 3600}, name="unreachable")
    run = cli_json("deploy", "--inventory", str(inventory), check_rc=1)
    assert "hf download unreachable/model failed" in run["hosts"][hosts[0]]["reason"], run["hosts"][hosts[0]]
    for host in hosts[1:]:  # not an hour of waiting for a stamp no one writes
        assert f"{hosts[0]}, which downloads unreachable/model into /mnt/models/unreachable for the hosts sharing test-export, failed" \
            in run["hosts"][host]["reason"], run["hosts"][host]
