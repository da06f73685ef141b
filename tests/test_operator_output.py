"""Output for people (issue 24, items 5, 6 and 8): a run says each change once, a host the run never reached gets no
note about a lock, the host table wraps its reasons and folds a fleet's identical outcomes, a secret written in
plain text gets validate's warning (never its value), and bench works without matplotlib, saying what the chart
needs. Nothing here contacts a host: the runs are replayed through a stand-in for hicachectl.cli.runner.run_playbook,
the inventories point at 127.0.0.1:1."""

from __future__ import annotations

import copy
import http.server
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import threading
import tomllib

import pytest
import yaml
from support import ROOT, cli, cli_json
from typer.testing import CliRunner

from hicachectl.cli import change as cli_change
from hicachectl.cli import common as cli_common
from hicachectl.cli import main as hicli
from hicachectl.cli import runner
from hicachectl.cli.runner import Change, HostResult, Record, RunResult
from hicachectl.config import secrets
from hicachectl.config.inventory import Written
from hicachectl.formats import report
from hicachectl.ops import bench
from hicachectl.rules.variables import plain_text_secrets

ANSIBLE_VAULT = pathlib.Path(sys.executable).parent / "ansible-vault"
INSTALL = "Install start.sh, run.sh, serve.sh and the backend config"
LOOP = "Remove it from each router"
SSH_ERROR = "Failed to connect to the host via ssh: ssh: connect to host 10.0.0.3 port 22:\nConnection refused\r\n"


def local_copy(dest: pathlib.Path, hosts: list[str], routers: tuple[str, ...] = ()) -> pathlib.Path:
    """The shipped `local` inventory with SSH hosts at 127.0.0.x:1 (nothing listens there)."""
    shutil.copytree(ROOT / "inventories/local", dest)
    groups = {"hicache_servers": {"hosts": {
        h: {"ansible_host": f"127.0.0.{i + 1}", "ansible_port": 1, "ansible_user": "root"} for i, h in enumerate(hosts)}}}
    if routers:  # which reach the servers beyond loopback
        settings = dest / "group_vars/all.yml"
        settings.write_text(yaml.safe_dump(yaml.safe_load(settings.read_text()) | {"hicache_host": "0.0.0.0"}))
        groups["hicache_routers"] = {"hosts": {r: {"ansible_host": f"127.0.1.{i + 1}", "ansible_port": 1, "ansible_user": "root"}
                                               for i, r in enumerate(routers)}}
    (dest / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": groups}}))
    return dest


# --- a run replayed: what the runner reports, what the progress hears ----------------------------------------------

def diff(name: str) -> dict:
    return {"before_header": f"/opt/sglang-hicache/cfg/{name}", "after_header": f"/opt/sglang-hicache/cfg/{name}",
            "before": "old line\n", "after": "new line\n"}


def replayed_run():
    """gpu-a changed (two files in one step, a loop over two routers); gpu-b never reached; gpu-c took its lock, then
    failed with an SSH error of two lines and a long message."""
    hosts = {
        "gpu-a": HostResult("gpu-a", ok=9, changed=3, reached=True,
                            changes=[Change(INSTALL, "start.sh", [diff("start.sh")]), Change(INSTALL, "run.sh", [diff("run.sh")]),
                                     Change(LOOP, "router-1", []), Change(LOOP, "router-2", [])]),
        "gpu-b": HostResult("gpu-b"),
        "gpu-c": HostResult("gpu-c", ok=4, failed=1, reached=True,
                            failures=[Record("Pull the server image", SSH_ERROR + " and then " + "a long reason " * 30)]),
    }
    events = [("gpu-a", cli_change.LOCK_TASK, "ok"), ("gpu-c", cli_change.LOCK_TASK, "ok"),
              ("gpu-a", INSTALL, "changed"),
              ("gpu-a", LOOP, "changed"), ("gpu-a", LOOP, "changed"), ("gpu-a", LOOP, "changed"),  # each item, then the loop
              ("gpu-c", "Pull the server image", "failed")]
    return hosts, events


@pytest.fixture
def replay(monkeypatch, tmp_path):
    """Runs a command against a three-host inventory with the playbook runs replayed; returns (result, calls)."""
    return _replayer(monkeypatch, tmp_path)


@pytest.fixture
def replay_with_a_router(monkeypatch, tmp_path):
    """replay, with a router in the inventory."""
    return _replayer(monkeypatch, tmp_path, ("router-1",))


def _replayer(monkeypatch, tmp_path, routers=()):
    inventory = local_copy(tmp_path / "inv", ["gpu-a", "gpu-b", "gpu-c"], routers)
    calls = []

    def run_playbook(playbook, path, *, progress=None, hosts=(), limit=None, check=False, **_):
        calls.append({"playbook": playbook, "limit": limit, "check": check})
        if playbook == "unlock.yml":
            return RunResult(0, {h: HostResult(h, ok=1, reached=True) for h in hosts})
        results, events = replayed_run()
        for event in events:
            progress(*event)
        # as the runner does: every host it targets gets a result ("not run" if never reached)
        return RunResult(2, {h: HostResult(h) for h in hosts} | copy.deepcopy(results))

    monkeypatch.setattr(runner, "run_playbook", run_playbook)

    def run(*args):
        return CliRunner().invoke(hicli.app, [*args, "-i", str(inventory)], catch_exceptions=False), calls
    return run


def said(text: str, what: str) -> int:
    return sum(what in line for line in text.splitlines())


def test_a_deploy_says_each_change_once_as_it_happens(replay):
    result, _ = replay("deploy")
    assert result.exit_code == 1
    assert said(result.stderr, f"gpu-a: {INSTALL} ... changed") == 1  # the live line the fleet tests read
    assert said(result.stderr, f"gpu-a: {LOOP} ... changed") == 1  # three events of one loop: one line
    assert INSTALL not in result.stdout and LOOP not in result.stdout, result.stdout  # not again in the report
    assert "changed:" not in result.stdout


@pytest.mark.parametrize("args", [("deploy", "--check", "--diff"), ("plan", "--diff"), ("deploy", "--diff")])
def test_a_check_or_a_diff_lists_every_change_with_its_content_once(replay, args):
    result, _ = replay(*args)
    verb = "changed" if args == ("deploy", "--diff") else "would change"
    for item in ("start.sh", "run.sh"):
        assert said(result.stdout, f"gpu-a: {verb}: {INSTALL} [{item}]") == 1, result.stdout
        assert said(result.stdout, f"+++ /opt/sglang-hicache/cfg/{item}") == 1
    assert said(result.stdout, f"gpu-a: {verb}: {LOOP} [router-1]") == 1
    assert "... changed" not in result.stderr, result.stderr  # said once: in the report, with its content
    assert said(result.stdout, "+new line") == 2


@pytest.mark.parametrize("args", [("plan",)])
def test_a_plan_without_diff_says_each_change_in_one_line_with_its_size(replay, args):
    """#34: a first plan short enough to read; the content is --diff's (and --json's)."""
    result, _ = replay(*args)
    for item in ("start.sh", "run.sh"):
        line = next(x for x in result.stdout.splitlines() if x.startswith(f"gpu-a: would change: {INSTALL} [{item}]"))
        assert re.search(r"\((new, \d+ line\(s\)|\+\d+ -\d+ line\(s\))\)$", line), line
    assert said(result.stdout, "+++ /opt/sglang-hicache/cfg/") == 0 and said(result.stdout, "+new line") == 0


def test_a_host_the_run_never_reached_gets_no_note_about_a_lock(replay):
    result, calls = replay("deploy")
    assert [c["limit"] for c in calls if c["playbook"] == "unlock.yml"] == ["gpu-c"]  # the failed host, whose lock it took
    assert said(result.stdout, "gpu-c: note: released the deploy lock of run") == 1
    assert "gpu-b: note" not in result.stdout and "lock" not in next(line for line in result.stdout.splitlines() if line.startswith("gpu-b "))
    assert "the run never reached this host" in result.stdout


def test_deploy_and_verify_count_servers_and_routers_as_validate_does(replay_with_a_router):
    for command, said_first in (("validate", None), ("deploy", "running site.yml on"), ("verify", "verifying")):
        result, _ = replay_with_a_router(command)
        if said_first:
            assert f"{said_first} 3 server(s) and 1 router(s) of " in result.stderr, result.stdout[-500:] + result.stderr[-1500:]
        else:
            assert ": 3 server(s) and 1 router(s), " in result.stdout, result.stdout[-500:]


def test_a_plan_takes_no_lock_so_it_releases_none(replay):
    result, calls = replay("plan")
    assert [c["playbook"] for c in calls] == ["site.yml"] and calls[0]["check"]
    assert "released the deploy lock" not in result.stdout


def test_a_failure_is_said_whole_on_one_line_and_wrapped_in_the_table(replay):
    result, _ = replay("deploy")
    lines = result.stdout.splitlines()
    full = [line for line in lines if line.startswith("gpu-c: failed: Pull the server image: Failed to connect")]
    assert len(full) == 1 and "port 22: / Connection refused / and then a long reason" in full[0]  # greppable whole
    table = lines[lines.index("") + 1:]
    column = table[0].index("reason")
    assert all(len(line) <= cli_common.TABLE_WIDTH for line in table), table
    rows = [line for line in table[2:] if line[:column].strip()]
    assert [row.split()[0] for row in rows] == ["gpu-a", "gpu-b", "gpu-c"]  # one row per host, never split by the data
    after = table[2 + table[2:].index(rows[2]) + 1:]
    assert len(after) > 3 and all(line[:column].strip() == "" for line in after)  # continuation lines under the column
    assert all(line[column:column + 2] == "  " for line in after)  # a part's own continuation is indented


def test_the_lock_task_has_one_name_in_every_playbook_that_takes_the_lock():
    def tasks(node):
        if isinstance(node, dict):
            if "hicache.deploy.hicache_lock" in node and node["hicache.deploy.hicache_lock"].get("state") == "acquired":
                yield node
            for value in node.values():
                yield from tasks(value)
        elif isinstance(node, list):
            for value in node:
                yield from tasks(value)

    found = {path.name: [t["name"] for t in tasks(yaml.safe_load(path.read_text()))] for path in sorted((ROOT / "playbooks").glob("*.yml"))}
    taking = {name: names for name, names in found.items() if names}
    assert {"site.yml", "restart.yml", "rollback.yml"} <= set(taking), found
    assert all(n == cli_change.LOCK_TASK for names in taking.values() for n in names), taking


# --- the progress and the lock release on their own -------------------------------------------------------------

def test_progress_says_each_status_of_a_task_once_per_host(capsys):
    progress = cli_common.Progress()
    for event in [("a", "Loop", "changed"), ("b", "Loop", "changed"), ("a", "Loop", "ok"), ("a", "Loop", "changed"),
                  ("a", "Wait", "running"), ("a", "Wait", "done"), ("a", "Loop", "changed"), ("a", "Quiet", "ok")]:
        progress(*event)
    assert capsys.readouterr().err.splitlines() == ["  a: Loop ... changed", "  b: Loop ... changed", "  a: Wait ... running",
                                                    "  a: Wait ... done", "  a: Loop ... changed"]  # a later run of Loop: said again
    quiet = cli_common.Progress(changes=False)
    for event in [("a", "Copy", "changed"), ("a", "Copy", "failed"), ("a", "Wait", "running")]:
        quiet(*event)
    assert capsys.readouterr().err.splitlines() == ["  a: Copy ... failed", "  a: Wait ... running"]


class _Inventory:
    path = pathlib.Path("/nonexistent")


def test_release_only_where_this_run_took_the_lock(monkeypatch):
    limits = []

    def unlock(playbook, path, *, hosts=(), limit=None, **_):
        limits.append(limit)
        return RunResult(0, {h: HostResult(h, ok=1, reached=True) for h in hosts})

    monkeypatch.setattr(runner, "run_playbook", unlock)

    def outcome():
        return RunResult(2, {"failed": HostResult("failed", ok=2, failed=1, reached=True, failures=[Record("t", "x")]),
                             "never": HostResult("never"),  # no task of the run ran for it
                             "stopped": HostResult("stopped", ok=3),  # a stopped rollout: the pull play took its lock
                             "fine": HostResult("fine", ok=5, reached=True)})

    by_watch = outcome()
    cli_change.release_locks_after(by_watch, _Inventory, "run-1", locked={"failed", "stopped", "fine"})
    assert limits.pop() == "failed,stopped"
    assert [n.text for n in by_watch.hosts["stopped"].notes] == ["released the deploy lock of run run-1 (if it held one)"]
    assert by_watch.hosts["never"].notes == [] and by_watch.hosts["fine"].notes == []
    by_counts = outcome()  # without the watch (verify): the hosts a task ran for
    cli_change.release_locks_after(by_counts, _Inventory, "run-1")
    assert limits.pop() == "failed,stopped" and by_counts.hosts["never"].notes == []
    cut = outcome()
    cut.interrupted = "stopped by a signal to hicachectl"  # no final counts: every host is released
    cli_change.release_locks_after(cut, _Inventory, "run-1", locked=set())
    assert limits.pop() == "failed,fine,never,stopped"
    cli_change.release_locks_after(outcome(), _Inventory, "run-1", check=True, locked={"failed"})
    assert limits == []


# --- the table -------------------------------------------------------------------------------------------------

def test_a_fleet_with_one_outcome_is_one_row_and_a_small_one_a_row_per_host():
    def fleet(names):
        first = HostResult(names[0], ok=12, changed=2, reached=True)  # validate's run-once tasks count on the first host
        return [first] + [HostResult(n, ok=9, changed=2, reached=True, gaps=[Record("Tune", "no NIC")]) for n in names[1:]]

    rows = lambda text: [line.split()[0] for line in text.splitlines()[2:] if not line.startswith(" ")]  # noqa: E731
    many = [f"gpu-{i:02d}" for i in range(1, 13)]
    text = cli_common.run_table(fleet(many), check=False, verb="changed", hidden=[])
    assert rows(text) == ["gpu-01", "gpu-[02:12]"], text
    assert "gpu-[02:12]  degraded  9   2        0       Tune: no NIC" in text
    few = [f"gpu-{i:02d}" for i in range(1, cli_common.GROUP_ABOVE + 1)]
    assert rows(cli_common.run_table(fleet(few), check=False, verb="changed", hidden=[])) == few
    scattered = [f"{word}-box" for word in "ant bee cat dog eel fox gnu hen ibis jay kiwi".split()]  # no numbered run to fold
    assert rows(cli_common.run_table(fleet(scattered), check=False, verb="changed", hidden=[])) == scattered


def test_a_reason_wraps_by_its_records_not_by_the_semicolons_inside_one():
    text = report.table(["host", "reason"], [["gpu-a", ["Check memlock: no systemd; the limit cannot be read", "Tune: no NIC"]]], wrap=80)
    assert text.splitlines()[2:] == ["gpu-a  Check memlock: no systemd; the limit cannot be read;", "       Tune: no NIC"]
    assert report.table(["host", "reason"], [["gpu-a", ["x", "y"]]]).splitlines()[2] == "gpu-a  x; y"


# --- a secret in plain text (item 6) -------------------------------------------------------------------------------

PLAIN = "hf_plainTEXTtoken0123456789"
FROM_ENV = "hf_fromENVIRONMENT0123456789"
VAULTED = "hf_inlineVAULT0123456789"
IN_VAULT_FILE = "hf_inVAULTfile0123456789"
ENV_PLAIN = "envPLAINsecret0123456789"
INDEX = "https://ops:pipPASSWORD0123@pypi.example.net/simple"
VALUES = (PLAIN, FROM_ENV, VAULTED, IN_VAULT_FILE, ENV_PLAIN, "pipPASSWORD0123")


@pytest.fixture(scope="module")
def secrets_inventory(tmp_path_factory):
    """gpu-a: hub token in plain text in group_vars, a secret env value in plain text in its host_vars; gpu-b: inline
    `!vault`; gpu-c: from a file encrypted whole, through `{{ vault_hub_token }}`; gpu-d: from the environment; gpu-e:
    through `{{ plain_token }}`, written in plain text; router-01: a pip index URL with a password."""
    tmp = tmp_path_factory.mktemp("plain")
    password = tmp / "vault-pass"
    password.write_text("a vault password\n")
    inv = local_copy(tmp / "inv", ["gpu-a", "gpu-b", "gpu-c", "gpu-d", "gpu-e"])
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    hosts["all"]["children"]["hicache_routers"] = {"hosts": {"router-01": {"ansible_host": "127.0.0.9", "ansible_port": 1}}}
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    (inv / "group_vars/all").mkdir()
    main = yaml.safe_load((inv / "group_vars/all.yml").read_text()) | {"hicache_host": "0.0.0.0", "hicache_model_hub_token": PLAIN,
                                                                          "plain_token": PLAIN}
    (inv / "group_vars/all.yml").unlink()
    (inv / "group_vars/all/main.yml").write_text(yaml.safe_dump(main))
    vaulted = inv / "group_vars/all/vault.yml"
    vaulted.write_text(f"vault_hub_token: {IN_VAULT_FILE}\n")
    subprocess.run([str(ANSIBLE_VAULT), "encrypt", "--vault-password-file", str(password), str(vaulted)], capture_output=True, check=True)
    host_vars = inv / "host_vars"
    (host_vars / "gpu-a.yml").write_text(yaml.safe_dump({"hicache_secret_keys": ["HF_TOKEN"],
                                                         "hicache_container_env": {"HF_TOKEN": ENV_PLAIN, "OTHER": "1"}}))
    inline = subprocess.run([str(ANSIBLE_VAULT), "encrypt_string", "--vault-password-file", str(password), VAULTED,
                             "--name", "hicache_model_hub_token"], capture_output=True, text=True, check=True).stdout
    (host_vars / "gpu-b.yml").write_text(inline)
    (host_vars / "gpu-c.yml").write_text('hicache_model_hub_token: "{{ vault_hub_token }}"\n')
    (host_vars / "gpu-d.yml").write_text("hicache_model_hub_token: \"{{ lookup('env', 'HICACHE_TEST_HUB_TOKEN') }}\"\n")
    (host_vars / "gpu-e.yml").write_text('hicache_model_hub_token: "{{ plain_token }}"\n')
    (host_vars / "router-01.yml").write_text(yaml.safe_dump({"hicache_router_index_url": INDEX}))
    return inv, password


def test_validate_warns_about_each_secret_in_plain_text_and_never_shows_one(secrets_inventory):
    inv, password = secrets_inventory
    args = ("validate", "-i", str(inv), "--vault-password-file", str(password))
    env = {"HICACHE_TEST_HUB_TOKEN": FROM_ENV}
    text = cli(*args, env=env, check_rc=0)
    data = json.loads(cli(*args, "--json", env=env, check_rc=0).stdout)
    for value in VALUES:
        assert value not in text.stdout + text.stderr and value not in json.dumps(data)
    plain = {(f["host"], f["variable"]): f for f in data["findings"] if f["rule"] == "secret-in-plain-text"}
    assert set(plain) == {("gpu-a", "hicache_model_hub_token"), ("gpu-a", "hicache_container_env.HF_TOKEN"),
                          ("gpu-e", "hicache_model_hub_token"), ("router-01", "hicache_router_index_url")}, plain
    token = plain["gpu-a", "hicache_model_hub_token"]
    assert token["level"] == "warning" and f"{inv}/group_vars/all/main.yml line " in token["message"]
    assert token["fix"].startswith("put it in Ansible Vault: run `ansible-vault encrypt_string --prompt`, give the name hicache_model_hub_token")
    assert "hicache_model_hub_token: !vault |" in token["fix"]
    assert f"{inv}/host_vars/gpu-a.yml line " in plain["gpu-a", "hicache_container_env.HF_TOKEN"]["message"]
    assert "HF_TOKEN: !vault |" in plain["gpu-a", "hicache_container_env.HF_TOKEN"]["fix"]
    assert "from a variable written in plain text" in plain["gpu-e", "hicache_model_hub_token"]["message"]
    line = next(line for line in text.stderr.splitlines() if "[secret-in-plain-text]" in line and "host gpu-a, hicache_model_hub_token" in line)
    assert line.startswith("WARNING [secret-in-plain-text] inventory ") and "Fix: put it in Ansible Vault" in line


def test_the_paths_of_a_hosts_secrets():
    variables = {"hicache_secret_keys": ["HF_TOKEN", "secret_key"], "hicache_container_env": {"HF_TOKEN": "x", "OTHER": "1"},
                 "hicache_extra_config": {"backends": [{"secret_key": "y", "bucket": "b"}], "secret_key": {"id": "z"}}}
    assert secrets.secret_paths(variables) == {*secrets.secret_variables(), "hicache_container_env.HF_TOKEN",
                                               "hicache_extra_config.backends.0.secret_key", "hicache_extra_config.secret_key.id"}


def test_a_url_without_credentials_is_no_secret_to_hide():
    where = {"hicache_router_index_url": Written("/inv/host_vars/r.yml", 1)}
    assert plain_text_secrets("r", where, {"hicache_router_index_url": "https://pypi.mirror.internal/simple"}) == []
    [warned] = plain_text_secrets("r", where, {"hicache_router_index_url": "https://u:p@pypi.mirror.internal/simple"})
    assert warned.variable == "hicache_router_index_url" and "/inv/host_vars/r.yml line 1" in warned.message and "u:p" not in warned.message


# --- bench without matplotlib (item 8) -----------------------------------------------------------------------------

class _Server(http.server.BaseHTTPRequestHandler):
    """Just what bench asks an OpenAI-compatible server: a model, health, a flush, a streamed one-token answer."""

    def log_message(self, *_):
        pass

    def _send(self, status: int, body: bytes = b"", kind: str = "application/json"):
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            self._send(200, json.dumps({"data": [{"id": "tiny"}]}).encode())
        elif self.path == "/health":
            self._send(200)
        else:
            self._send(404)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/flush_cache":
            self._send(200)
            return
        chunks = [{"choices": [{"delta": {"content": "x"}}]}, {"choices": [], "usage": {"prompt_tokens": 10}}]
        self._send(200, b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n", "text/event-stream")


@pytest.fixture
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def bench_without_matplotlib(*args: str) -> subprocess.CompletedProcess:
    """`hicachectl bench` in a fresh Python where importing matplotlib fails as if it were not installed."""
    code = "import runpy, sys; sys.modules['matplotlib'] = None; sys.argv = ['hicachectl', *sys.argv[1:]]; runpy.run_module('hicachectl', run_name='__main__')"
    return subprocess.run([sys.executable, "-c", code, "bench", *args], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ})


def test_bench_without_matplotlib_measures_reports_and_names_the_extra(server, tmp_path):
    out = tmp_path / "result"
    run = bench_without_matplotlib("--url", server, "--concurrency", "1,2", "--input-len", "20", "--out", str(out))
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].split()[:2] == ["concurrency", "prompt"] and [line.split()[0] for line in lines[2:4]] == ["1", "2"]
    assert lines[-1] == f"wrote {out / 'bench.json'}"
    assert [row["concurrency"] for row in json.loads((out / "bench.json").read_text())["levels"]] == [1, 2]
    assert not (out / "bench.png").exists()
    [note] = [line for line in run.stderr.splitlines() if "bench]" in line]
    assert note == f"note: no bench.png: the chart needs matplotlib, which is not installed: {bench.CHART_EXTRA}"
    assert bench.CHART_EXTRA == "pip install 'hicache-deploy[bench]'"
    data = json.loads(bench_without_matplotlib("--url", server, "--concurrency", "1", "--input-len", "20", "--out", str(tmp_path / "j"),
                                               "--json").stdout)
    assert data["chart"] is None and data["levels"][0]["concurrency"] == 1


def test_bench_with_the_extra_draws_the_chart(server, tmp_path):
    out = tmp_path / "result"
    run = cli("bench", "--url", server, "--concurrency", "1", "--input-len", "20", "--out", str(out), check_rc=0)
    assert (out / "bench.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert run.stdout.splitlines()[-1] == f"wrote {out / 'bench.json'} and {out / 'bench.png'}" and "bench]" not in run.stderr
    assert cli_json("bench", "--url", server, "--concurrency", "1", "--input-len", "20", "--out", str(tmp_path / "j"))["chart"] == str(
        tmp_path / "j" / "bench.png")


def test_matplotlib_is_the_bench_extra_not_a_dependency():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith(("matplotlib", "numpy")) for d in project["dependencies"])
    assert any(d.startswith("matplotlib") for d in project["optional-dependencies"]["bench"])
    assert "'.[test,bench]'" in (ROOT / "tests/infra/install.sh").read_text()  # the suite's bench tests draw the chart



def test_a_first_plan_of_identical_hosts_is_one_hosts_long_though_each_file_names_its_host():
    """#34: hosts whose changes are the same but for their own name (every rendered file says whom it is for: the
    templates' first lines) are said once; a host with another content is a group of its own. With --diff the group
    shows its first host's content and says so. Names match as whole words only: `gpu-1` is not inside `gpu-10`."""
    from helpers import _host_vars

    from hicachectl import rules
    from hicachectl.plans import sglang_server

    _, variables = _host_vars("local")

    def planned(name, **overrides):
        d, findings = rules.check_host(name, {**variables, **overrides})
        assert d is not None and not rules.has_errors(findings)
        changes = [Change("Install the server's files", f.name, [{"before_header": f"{d.cfg_dir}/{f.name}", "after_header": f"{d.cfg_dir}/{f.name}",
                                                                  "before": "", "after": f.shown}])
                   for f in sglang_server.files(d)]
        assert any(name in c.diff[0]["after"] for c in changes)  # the files do name their host
        return HostResult(name, ok=5, changed=len(changes), reached=True, changes=changes)

    hosts = {n: planned(n) for n in ("gpu-01", "gpu-02", "gpu-10", "gpu-11")}
    hosts["gpu-12"] = planned("gpu-12", hicache_page_size=128)
    hosts["gpu-1"] = planned("gpu-1")  # a name inside others' names (gpu-10, gpu-11): matched as a whole word only
    groups = cli_common._same_changes(sorted(hosts.items()), hidden=[])
    assert [(names, shown) for names, _, shown in groups] == [("gpu-[01:02], gpu-1, gpu-[10:11]", "gpu-01"), ("gpu-12", "")], groups
    lines = list(cli_common._run_lines(RunResult(0, hosts), check=True, verb="would change", show_diff=False, hidden=[]))
    changed = [line for line in lines if ": would change: " in line]
    assert len(changed) == 2 * len(hosts["gpu-01"].changes) and all(line.startswith(("gpu-[01:02], gpu-1, gpu-[10:11]: ", "gpu-12: ")) for line in changed)
    shown = list(cli_common._run_lines(RunResult(0, hosts), check=True, verb="would change", show_diff=True, hidden=[]))
    assert "gpu-[01:02], gpu-1, gpu-[10:11]: gpu-01's changes shown; each host's differ only in its own name (and so the config's digest)" in shown
    assert not [line for line in shown if line.startswith("gpu-12: gpu-12's")]  # a group of one shows its own
    # the same name inside a longer word is not the host's name: those differ
    word = {n: HostResult(n, changed=1, reached=True, changes=[Change("t", None, [{"before": "", "after": f"rack {n}x"}])]) for n in ("a", "b")}
    assert len(cli_common._same_changes(sorted(word.items()), hidden=[])) == 2
    # a name at the start of a line is a whole word too (the texts are compared before they are JSON, where \n is "\\n")
    lines = {n: HostResult(n, changed=1, reached=True, changes=[Change("t", None, [{"before": "", "after": f"top\n{n}\n"}])]) for n in ("a", "b")}
    assert [names for names, _, _ in cli_common._same_changes(sorted(lines.items()), hidden=[])] == ["a, b"]
