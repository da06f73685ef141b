"""Shared L3 proven across servers (`hicachectl verify --l3` with hicache_l3_share). Three SSH test hosts get one
directory of this machine bind-mounted at /mnt/kvcache: one export shared by every host, as a VAST or NFS tier is.
Each runs SGLang's stand-in as a systemd service (start.sh execs it); its pages are written by SGLang's own HiCacheFile
(served model name, page size, tokens and TP rank/size keyed; not the KV dtype), so what the namespace keeps apart is real here.

The tests run in order on one fleet; each changes one host (or all) with `hicachectl deploy`."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from fleet import HEALTH_TIMEOUT, STANDIN, Fleet
from support import cli_json

from hicachectl.config import namespace
from hicachectl.config.inventory import load
from hicachectl.rules import check_host

pytestmark = pytest.mark.slow

SHARED_VARS = {
    "hicache_container_runtime": "none",
    "hicache_launcher": ["python3", STANDIN],
    "hicache_served_model_name": "gpt-oss-20b",
    "hicache_storage_backend": "file",
    "hicache_cache_dir": "/mnt/kvcache",
    "hicache_storage_type": "local",
    "hicache_strict": False,  # as the local profile: no GPU here, the host is degraded, never ok
    "hicache_l3_share": "shared-test",
    "hicache_page_size": 16,
    "hicache_write_policy": "write_through",
    "hicache_health_timeout": HEALTH_TIMEOUT,
}


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    export = tmp_path_factory.mktemp("export")
    fleet = Fleet(tmp_path_factory.mktemp("fleet"), 3, prefix="hicache-l3share", volumes=(f"{export}:/mnt/kvcache",)).up()
    try:
        fleet.install_standin()
        fleet.export = export
        fleet.sorted = sorted(fleet.hosts)
        yield fleet
    finally:
        fleet.down()


def inventory(fleet, name, per_host=None, **group):
    """The fleet's inventory with SHARED_VARS (and `group`) for all, `per_host` {host: vars} in host_vars/."""
    path = fleet.inventory(extra_vars={**SHARED_VARS, **group}, name=name)
    for host, variables in (per_host or {}).items():
        (path / "host_vars" / f"{host}.yml").write_text(yaml.safe_dump(variables))
    return path


def deploy(path, limit=None):
    report = cli_json("deploy", "--inventory", str(path), *(["--limit", limit] if limit else []))
    assert report["ok"], report


def verify_l3(path, rc):
    report = cli_json("verify", "--inventory", str(path), "--l3", check_rc=rc)
    assert report["l3"] is True
    return report["hosts"]


def check(host_report, name):
    found = [c for c in host_report["checks"] if c["check"] == name]
    assert len(found) == 1, host_report
    return found[0]


def ask(fleet, host, prompt):
    """One chat completion on the host's own server: (cached tokens, tokens loaded from storage by it)."""
    code = ("import json,urllib.request as u;"
            "m=lambda:[l for l in u.urlopen('http://127.0.0.1:30000/metrics').read().decode().splitlines() if l.startswith('sglang:cached_tokens_total')];"
            "b=m();"
            f"r=u.Request('http://127.0.0.1:30000/v1/chat/completions',data=json.dumps({{'model':'gpt-oss-20b','messages':[{{'role':'user','content':{prompt!r}}}]}}).encode(),headers={{'Content-Type':'application/json'}});"
            "c=json.load(u.urlopen(r))['usage']['prompt_tokens_details']['cached_tokens'];"
            "print(json.dumps([c,float(m()[0].split()[-1])-float(b[0].split()[-1])]))")
    proc = fleet.ssh(host, f"python3 -c {json.dumps(code)}")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def deployment(path, host):
    d, _ = check_host(host, load(str(path)).hosts[host])
    return d


def test_every_server_hits_the_pages_its_neighbour_wrote(shared):
    path = inventory(shared, "shared")
    deploy(path)
    hosts = verify_l3(path, rc=0)  # batches of one host (hicache_serial unset): each writer is running
    ring = {h: shared.sorted[i - 1] for i, h in enumerate(shared.sorted)}
    for host, writer in ring.items():
        assert hosts[host]["ok"], hosts[host]
        assert check(hosts[host], "L3 write")["detail"].endswith(f"written to L3 by {writer}")
        hit = check(hosts[host], "L3 hit across servers")
        assert hit["status"] == "pass" and hit["detail"].endswith(f"written by {writer}"), hit
        assert int(hit["detail"].split()[0]) >= 4 * 16  # at least the proof's pages came from the neighbour's writes
    # one namespace for the three identical servers, on the one export
    name = namespace.of(deployment(path, shared.sorted[0]))
    assert [p.name for p in shared.export.iterdir()] == [name]
    assert len(list((shared.export / name).iterdir())) >= 3 * 4  # each host's proof prompt: at least 4 pages


@pytest.mark.parametrize("change,writer_phrase,reader_phrase", [
    ({"hicache_page_size": 32}, "page size 32 vs 16", "page size 16 vs 32"),
    ({"hicache_kv_cache_dtype": "fp8_e4m3"}, "KV dtype fp8_e4m3 vs auto", "KV dtype auto vs fp8_e4m3"),
    ({"hicache_l3_namespace": "other-namespace"}, "namespace other-namespace vs ", "vs other-namespace"),
], ids=["page-size", "kv-dtype", "namespace"])
def test_one_server_that_differs_fails_the_proof_naming_the_difference(shared, change, writer_phrase, reader_phrase):
    """Host 2 differs. Its writer (host 1) is the same as before: host 2 finds none of host 1's pages; host 3's writer is
    host 2: host 3 finds none either. Host 1 reads host 3's pages: it passes. All three in one batch (fills before restarts)."""
    first, odd, third = shared.sorted
    path = inventory(shared, "shared-" + next(iter(change)).removeprefix("hicache_"), per_host={odd: change}, hicache_serial=3)
    deploy(path, limit=odd)
    hosts = verify_l3(path, rc=1)
    assert hosts[first]["ok"] and check(hosts[first], "L3 hit across servers")["status"] == "pass", hosts[first]
    for host, phrase, writer in ((odd, reader_phrase, first), (third, writer_phrase, odd)):
        assert not hosts[host]["ok"]
        assert check(hosts[host], "L3 write")["status"] == "pass"  # the writer wrote, the reader found nothing
        hit = check(hosts[host], "L3 hit across servers")
        assert hit["status"] == "fail" and hit["detail"].startswith("0 cached tokens"), hit
        assert hit["cause"].startswith(f"{writer} and {host} differ: ") and phrase in hit["cause"], hit["cause"]
        assert "not really shared" not in hit["cause"]


def test_a_changed_kv_dtype_gets_a_new_namespace_and_no_hits_from_the_old_one(shared):
    first, odd, third = shared.sorted
    old = inventory(shared, "shared-old")
    deploy(old, limit=odd)  # the three servers alike again
    prompt = " ".join(f"old-{i}" for i in range(320))  # 20 pages: above SGLang's prefetch threshold (256 tokens)
    assert ask(shared, first, prompt) == [0, 0]
    assert ask(shared, third, prompt) == [320, 320]  # the control: same format, the old pages are hits on another server
    old_name = namespace.of(deployment(old, first))

    new = inventory(shared, "shared-new", hicache_kv_cache_dtype="fp8_e5m2")
    deploy(new)
    new_name = namespace.of(deployment(new, first))
    assert new_name != old_name
    assert ask(shared, third, prompt) == [0, 0]  # restarted by the deploy with the new dtype: the old pages are not read
    assert ask(shared, first, prompt) == [320, 320]  # what third just wrote, in the new namespace
    assert {old_name, new_name} <= {p.name for p in shared.export.iterdir()}
    assert len(list((shared.export / old_name).iterdir())) > 0  # the old pages are still there, only not read
    hosts = verify_l3(new, rc=0)  # and the new namespace is shared as the old one was
    assert all(check(hosts[h], "L3 hit across servers")["status"] == "pass" for h in shared.sorted), hosts


def test_a_tier_budget_keeps_every_namespace_within_its_share(shared):
    """Three servers, two models in two namespaces, a tier budget below what they write: the collector runs on the
    tier's first server only, keeps each namespace within its share by removing whole pages (never a .tmp), `l3`
    shows the budget and fills, `verify --l3` still passes, and a second collector started by hand on another host
    waits on the tier's lock. No server was ever sent SGLang's L3 clear."""
    import fcntl
    import os
    import shutil
    import time

    from hicachectl.plans import l3_collector

    first, second, third = list(shared.hosts)
    if not any(shared.export.rglob("*.bin")):  # run alone: the earlier tests wrote none yet
        plain = inventory(shared, "shared")
        deploy(plain)
        verify_l3(plain, rc=0)
    page_bytes = max(p.stat().st_size for p in shared.export.rglob("*.bin"))
    # A clean tier: the earlier tests' pages would count as other data. Their directories stay: a running server
    # made its own at its start (HiCacheFile.__init__) and writes nowhere else.
    for page in [p for p in shared.export.rglob("*") if p.is_file()]:
        page.unlink()
    # The second model on TP 2: each of its pages is two files (SGLang's key with _<rank>_2), evicted together. No
    # free-space floor: this machine's disk decides it, and the shares are what is judged here.
    path = inventory(shared, "shared-budget", per_host={third: {"hicache_model_path": "/models/qwen3-8b", "hicache_l3_namespace_share_pct": 30,
                                                                "hicache_tp_size": 2, "hicache_extra_config": {"prefetch_threshold": 16}}},
                     hicache_l3_budget_gb=page_bytes * 10 / 1e9, hicache_l3_free_floor_pct=0)
    deploy(path)
    enabled = {h: shared.ssh(h, "systemctl is-enabled hicache-l3-collector.timer").stdout.strip() for h in shared.hosts}
    assert enabled[first] == "enabled" and {enabled[second], enabled[third]} <= {"not-found", ""}, enabled
    try:
        hosts = verify_l3(path, rc=0)  # writes pages into both namespaces
    except AssertionError:  # what the servers and the collector said, for whoever reads the failure
        for h in shared.hosts:
            print(h, shared.ssh(h, "journalctl -o cat --no-pager -n 60 -u 'sglang*' -u hicache-l3-collector.service").stdout)
        print(sorted(str(p.relative_to(shared.export)) for p in shared.export.rglob("*"))[:80])
        raise
    assert all(h["ok"] for h in hosts.values()), hosts
    model_a, model_b = (namespace.of(deployment(path, h)) for h in (first, third))
    assert model_a != model_b
    written = {ns: sum(p.stat().st_size for p in (shared.export / ns).rglob("*.bin")) for ns in (model_a, model_b)}
    assert sum(written.values()) > page_bytes * 10, written  # the tier is over its budget

    def by_page(ns):  # SGLang's file backend: <64-hex key>_<model>[_<rank>_<size>].bin, a file per TP rank of a page
        files = {}
        for p in (shared.export / ns).rglob("*.bin"):
            files.setdefault(p.name[:64], []).append(p)
        return files

    ranks = {ns: {len(files) for files in by_page(ns).values()} for ns in (model_a, model_b)}
    assert ranks == {model_a: {1}, model_b: {2}}, ranks  # TP 1 and TP 2 as SGLang writes them
    largest = {ns: max(sum(p.stat().st_size for p in files) for files in by_page(ns).values()) for ns in (model_a, model_b)}
    # A prompt of one page on the second model, made its most recent page below: the collector keeps it, and its server
    # reads it back from L3 once its own caches are empty (its prefetch threshold one page: SGLang loads a one-page hit).
    kept_prompt = " ".join(f"kept-{i}" for i in range(16))
    earlier = set((shared.export / model_b).rglob("*.bin"))
    assert ask(shared, third, kept_prompt) == [0, 0]
    for _ in range(20):
        kept = set((shared.export / model_b).rglob("*.bin")) - earlier
        if len(kept) == 2:
            break
        time.sleep(0.5)
    assert len(kept) == 2 and len({p.name[:64] for p in kept}) == 1, kept  # one page, a file per TP rank
    tmp = shared.export / model_a / ".0a1b2c3d4e5f.tmp"  # HiCacheFile's write in progress
    tmp.write_bytes(b"\0" * page_bytes)
    past = time.time() - 3600  # an hour on: past the collector's grace for pages just written
    for p in shared.export.rglob("*"):
        os.utime(p, (past, past))
    for p in kept:
        os.utime(p, (past + 600, past + 600))

    # a second collector, started by hand on another host, waits while the tier's lock is held
    kit = shared.export / ".collector-by-hand"
    kit.mkdir()
    shutil.copy(l3_collector.PROGRAM_SOURCE, kit / "collect")
    (kit / "c.json").write_text(shared.ssh(first, f"cat {l3_collector.CONFIG_FILE}").stdout)
    holder = os.open(shared.export / ".hicache-l3-collector.lock", os.O_RDWR | os.O_CREAT)
    fcntl.lockf(holder, fcntl.LOCK_EX)
    os.pwrite(holder, b"the test's first collector\n", 0)
    try:
        shared.ssh(second, "nohup timeout 120 python3 /mnt/kvcache/.collector-by-hand/collect --config /mnt/kvcache/.collector-by-hand/c.json --dry-run "
                           "> /tmp/by-hand.out 2>&1 &")
        for _ in range(30):  # python's start on a loaded machine
            said = shared.ssh(second, "cat /tmp/by-hand.out").stdout
            if said:
                break
            time.sleep(1)
        assert "waiting for the lock of tier shared-test" in said, said
        assert shared.ssh(second, "pgrep -f collector-by-hand").returncode == 0  # still waiting
    finally:
        os.close(holder)
    for _ in range(30):
        if shared.ssh(second, "pgrep -f collector-by-hand").returncode != 0:
            break
        time.sleep(1)
    assert "would evict" in shared.ssh(second, "cat /tmp/by-hand.out").stdout
    shutil.rmtree(kit)

    run = shared.ssh(first, f"systemctl start {l3_collector.SERVICE} && journalctl -u {l3_collector.SERVICE} -o cat --no-pager")
    assert run.returncode == 0 and "evicted" in run.stdout, run
    held = {ns: sum(p.stat().st_size for p in (shared.export / ns).rglob("*.bin")) for ns in (model_a, model_b)}
    budget = int(page_bytes * 10)
    assert held[model_b] <= budget * 30 // 100 and held[model_a] <= budget - budget * 30 // 100, (held, budget)
    assert sum(held.values()) <= budget and tmp.exists()
    # and no page more than needed: one more page of either namespace would break its share or the tier's budget, which
    # counts what is on the tier beside the namespaces' pages too (the .tmp above: never removed), as the collector says
    other = int(re.findall(r"; (\d+) bytes not in the namespaces it keeps\)", run.stdout)[-1])
    assert other >= tmp.stat().st_size, run.stdout
    total = sum(held.values()) + other
    assert total <= budget, (held, other, budget)
    for ns, share in ((model_b, budget * 30 // 100), (model_a, budget - budget * 30 // 100)):
        assert written[ns] > share, (ns, written[ns], share)  # each was over its share: the collector had to evict in each
        assert held[ns] + largest[ns] > share or total + largest[ns] > budget, (ns, held, other, share, largest[ns], budget)
    assert all(len(files) == 2 for files in by_page(model_b).values()) and by_page(model_b), by_page(model_b)  # whole pages kept
    assert all(p.exists() for p in kept), kept  # the most recent page of its namespace
    flushed = shared.ssh(third, "python3 -c \"import urllib.request as u;print(u.urlopen(u.Request('http://127.0.0.1:30000/flush_cache',"
                                "method='POST')).status)\"")
    assert flushed.stdout.strip() == "200", flushed  # GPU and host pools emptied; L3 kept
    assert ask(shared, third, kept_prompt) == [16, 16]  # every token of the kept page, read back from L3
    report = cli_json("l3", "--inventory", str(path), "--json")
    tier = report["tiers"][0]
    assert tier["budget"]["collector"] == first and tier["budget"]["fill"] <= 1.0, tier["budget"]
    assert tier["budget"]["namespaces"][model_b]["share_pct"] == 30 and tier["fs"]["size"] > 0
    assert all(h["ok"] for h in verify_l3(path, rc=0).values())  # the kept pages (and new ones) still prove L3
    for h in shared.hosts:
        journal = shared.ssh(h, "journalctl -o cat --no-pager | grep -c 'L3 CLEAR REQUESTED' || true").stdout.strip()
        assert journal == "0", f"{h} was sent SGLang's L3 clear"

    # The budget dropped in a run that also restarts the collector's own server (another --max-running-requests): the
    # collector goes in that same run. A restart made the run forget every file the host facts had read, the
    # collector's config among them, so the collector stayed until the next deploy (helper audit of #34's work).
    unbudgeted = inventory(shared, "shared-unbudgeted", per_host={third: {"hicache_model_path": "/models/qwen3-8b"},
                                                                  first: {"hicache_max_running_requests": 3}})
    before = shared.ssh(first, "systemctl show --property=MainPID --value sglang-hicache.service").stdout.strip()
    deploy(unbudgeted, limit=first)
    assert shared.ssh(first, "systemctl show --property=MainPID --value sglang-hicache.service").stdout.strip() != before  # restarted
    assert shared.ssh(first, "systemctl is-enabled hicache-l3-collector.timer").stdout.strip() in ("not-found", "")
    assert shared.ssh(first, f"test -e {l3_collector.CONFIG_FILE}").returncode == 1
