"""Fleet deploy timing; run through bench/fleet_deploy, which prepares the environment.

For 1 and 8 test hosts (systemd containers over real SSH), with the project's ansible.cfg, with Ansible's defaults
and (--mitogen) with the project's configuration on Mitogen's strategy: site.yml's first run and its no-op re-run,
and per host of the no-op: executed tasks, host round trips (ssh invocations), controller CPU-seconds. Then the
floor: plain Ansible taking as many steps per host as that no-op, each doing nothing (ping, set_fact, a skipped
debug), with each configuration, so each ratio can be read against what Ansible itself does on this machine. Each
no-op and each floor runs --repeat times (3), in turn (no-op, floor, no-op, ...) so both meet the machine in the
same state, each figure the median of those runs. Ratios are of figures measured in this one run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "infra"))
from fleet import Fleet  # noqa: E402

MITOGEN = "mitogen==0.3.54"  # supports ansible-core 2.19 (its ansible_mitogen/mixins.py handles >= 2.19)

# Plain Ansible, except what the project cannot run without (its collection, where hicachectl links it) and what
# fresh test hosts need (unknown host keys on new ports).
DEFAULTS_CFG = f"""[defaults]
collections_path = {ROOT}/.ansible/collections
host_key_checking = False
"""

# Counts every ssh the controller starts (a module run, a file transfer: one round trip each, pipelining or not).
SSH_COUNTER = """#!/bin/sh
echo x >> "$HICACHE_BENCH_SSH_LOG"
exec ssh "$@"
"""


def recap(stdout: str) -> dict[str, dict[str, int]]:
    return {m.group(1): {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
            for m in re.finditer(r"^(\S+)\s+:\s+(ok=.*)$", stdout, re.M)}


def callbacks(config: pathlib.Path) -> dict[str, str]:
    """The configuration's own callbacks plus the bench's counter (the environment replaces the file's lists)."""
    enabled = re.search(r"^callbacks_enabled\s*=\s*(.*)$", config.read_text(), re.M)
    names = [n.strip() for n in enabled.group(1).split(",")] if enabled else []
    return {"ANSIBLE_CALLBACKS_ENABLED": ",".join(names + ["bench_count"]),
            "ANSIBLE_CALLBACK_PLUGINS": os.pathsep.join([str(ROOT / "bench" / "plugins"), str(ROOT / "plugins" / "callback")])}


def floor_playbook(work: pathlib.Path, no_op: dict[str, float]) -> pathlib.Path:
    """Plain Ansible doing nothing in as many steps as site.yml's no-op took per host: `ping` for each host-side module
    run, `set_fact` for each other executed task, a skipped `debug` for each skipped task. Whatever a configuration
    does to it is what that configuration can do at best for site.yml's no-op on this machine."""
    modules = round(no_op["module_runs"])
    tasks = [{"name": f"module run {i + 1}", "ansible.builtin.ping": None} for i in range(modules)]
    tasks += [{"name": f"controller step {i + 1}", "ansible.builtin.set_fact": {"bench_floor": i}}
              for i in range(max(round(no_op["tasks"]) - modules, 0))]
    tasks += [{"name": f"skipped step {i + 1}", "ansible.builtin.debug": {"msg": "never"}, "when": False}
              for i in range(round(no_op["skipped"]))]
    path = work / "floor.yml"
    path.write_text(json.dumps([{"name": "The floor: as many steps as site.yml's no-op, each doing nothing", "hosts": "all",
                                 "gather_facts": False, "tasks": tasks}], indent=1))
    return path


def deploy(inventory: pathlib.Path, hosts: list[str], config: pathlib.Path, work: pathlib.Path,
           playbook: str = "playbooks/site.yml") -> dict[str, float]:
    ssh_log, count_file = work / "ssh.log", work / "count.json"
    ssh_log.unlink(missing_ok=True)
    count_file.unlink(missing_ok=True)
    env = {**os.environ, "ANSIBLE_CONFIG": str(config), "ANSIBLE_SSH_CONTROL_PATH_DIR": str(work / "cp"),
           "ANSIBLE_SSH_EXECUTABLE": str(work / "ssh"), "HICACHE_BENCH_SSH_LOG": str(ssh_log),
           "HICACHE_BENCH_COUNT_FILE": str(count_file), **callbacks(config),
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(["ansible-playbook", "-i", str(inventory), "--limit", ",".join(hosts), playbook],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"deploy failed ({config.name}, {len(hosts)} hosts):\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    counts = recap(proc.stdout)
    executed = sum(c["ok"] + c.get("failed", 0) for host, c in counts.items() if host in hosts)
    skipped = sum(c.get("skipped", 0) for host, c in counts.items() if host in hosts)
    ssh = len(ssh_log.read_text().splitlines()) if ssh_log.exists() else 0
    module_runs = sum(json.loads(count_file.read_text()).values()) if count_file.exists() else 0
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    n = len(hosts)
    return {"wall": elapsed, "tasks": executed / n, "skipped": skipped / n, "module_runs": module_runs / n, "ssh": ssh / n,
            "cpu": cpu / n}


def median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each figure's median over repeated runs of the same thing (one run of this 2-core machine varies by 10 % and more)."""
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def mitogen_cfg(work: pathlib.Path) -> pathlib.Path:
    """The project's ansible.cfg on Mitogen's linear strategy (Mitogen installed into the bench's own directory)."""
    target = work / "mitogen"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--target", str(target), MITOGEN], check=True)
    text = (ROOT / "ansible.cfg").read_text()
    # Relative paths of the project's file resolve against the file's directory: make them absolute for this copy.
    text = text.replace("collections_path = .ansible/collections", f"collections_path = {ROOT}/.ansible/collections")
    text = text.replace("callback_plugins = plugins/callback", f"callback_plugins = {ROOT}/plugins/callback")
    # Mitogen's own SSH reads host_key_checking rather than the inventory's ssh args: the test hosts are new every run.
    text = text.replace("host_key_checking = True", "host_key_checking = False")
    text = text.replace("[defaults]\n", f"[defaults]\nstrategy_plugins = {target}/ansible_mitogen/plugins/strategy\nstrategy = mitogen_linear\n", 1)
    config = work / "mitogen.cfg"
    config.write_text(text)
    os.environ["PYTHONPATH"] = str(target) + os.pathsep + os.environ.get("PYTHONPATH", "")
    return config


def fresh_ssh_masters(work: pathlib.Path) -> None:
    """No SSH master shared between configurations or with the run before."""
    shutil.rmtree(work / "cp")
    (work / "cp").mkdir()


def forks(config: pathlib.Path) -> int:
    found = re.search(r"^forks\s*=\s*(\d+)", config.read_text(), re.M)
    return int(found.group(1)) if found else 5  # Ansible's default


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1,8")
    parser.add_argument("--mitogen", action="store_true", help="Also measure Mitogen's strategy (pip-installed into a temporary directory).")
    parser.add_argument("--repeat", type=int, default=3, help="Runs of each no-op and each floor; each figure is their median.")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        work = pathlib.Path(tmp)
        (work / "cp").mkdir()
        (work / "ssh").write_text(SSH_COUNTER)
        (work / "ssh").chmod(0o755)
        defaults_cfg = work / "defaults.cfg"
        defaults_cfg.write_text(DEFAULTS_CFG)
        configs = {"project": ROOT / "ansible.cfg", "defaults": defaults_cfg}
        if args.mitogen:
            configs["mitogen"] = mitogen_cfg(work)
        fork_counts = {label: forks(config) for label, config in configs.items()}
        fleet = Fleet(work / "fleet", max(sizes), prefix="hicache-bench")
        print(f"starting {max(sizes)} test hosts ...", file=sys.stderr)
        fleet.up()
        try:
            inventory = fleet.inventory()
            names = list(fleet.hosts)
            rows, results, first_runs = [], {}, {}
            for size in sizes:
                for label, config in configs.items():
                    for name in names[:size]:  # a first run starts from a host without our files
                        fleet.ssh(name, "rm -rf /opt/sglang-hicache")
                    fresh_ssh_masters(work)
                    first_runs[size, label] = deploy(inventory, names[:size], config, work)
            # The floor, shaped after the project configuration's no-op on the most hosts (one no-op gives its counts,
            # which do not vary), run with every configuration. Each no-op and its floor are timed in turn, so that both
            # meet the machine in the same state (the test hosts settle for minutes after they start).
            floor = floor_playbook(work, deploy(inventory, names[:max(sizes)], configs["project"], work))
            floors = {}
            for size in sizes:
                for label, config in configs.items():
                    fresh_ssh_masters(work)
                    pairs = [(deploy(inventory, names[:size], config, work), deploy(inventory, names[:size], config, work, str(floor)))
                             for _ in range(args.repeat)]
                    rerun, floors[size, label] = median_run([p[0] for p in pairs]), median_run([p[1] for p in pairs])
                    results[size, label] = (first_runs[size, label], rerun)
                    rows.append((size, label, first_runs[size, label], rerun))
                    print(f"  {size} host(s), {label}: first {first_runs[size, label]['wall']:.1f} s, no-op {rerun['wall']:.1f} s, "
                          f"floor {floors[size, label]['wall']:.1f} s", file=sys.stderr)
        finally:
            fleet.down()
    print(f"per host of the no-op (each figure the median of {args.repeat} runs, as is each floor's): executed and skipped tasks,")
    print("host-side module runs, ssh processes started, controller CPU-s;")
    print("floor: plain Ansible doing nothing in as many steps (ping, set_fact, a skipped debug) as the project's no-op,")
    print("its wall time and its controller CPU-s per host")
    print(f"{'hosts':>5}  {'config':<8}  {'first run':>9}  {'no-op':>6}  {'tasks':>6}  {'skipped':>7}  {'modules':>7}  {'ssh':>5}  "
          f"{'CPU-s':>6}  {'floor':>6}  {'floor CPU-s':>11}")
    for size, label, first, rerun in rows:
        print(f"{size:>5}  {label:<8}  {first['wall']:>8.1f}s  {rerun['wall']:>5.1f}s  {rerun['tasks']:>6.1f}  {rerun['skipped']:>7.1f}  "
              f"{rerun['module_runs']:>7.1f}  {rerun['ssh']:>5.1f}  {rerun['cpu']:>6.2f}  {floors[size, label]['wall']:>5.1f}s  "
              f"{floors[size, label]['cpu']:>11.2f}")
    big, small = max(sizes), min(sizes)
    project = results[big, "project"][1], results[small, "project"][1]
    floor_big, floor_small = floors[big, "project"], floors[small, "project"]
    print("\nratios (this run; no-op = the re-run, nothing to change; in brackets the same ratio of the floor):")
    print(f"  no-op, {big} hosts / {small} host, project cfg:          {project[0]['wall'] / project[1]['wall']:.2f}  (target <= 2.5)"
          f"  [floor {floor_big['wall'] / floor_small['wall']:.2f}]")
    print(f"  no-op / floor, {small} host, project cfg:           {project[1]['wall'] / floor_small['wall']:.2f} wall, "
          f"{project[1]['cpu'] / floor_small['cpu']:.2f} controller CPU  (target <= 1.15)")
    print(f"  no-op, {big} hosts, project cfg:                     {project[0]['cpu']:.2f} controller CPU-s per host  (target <= 1.2)"
          f"  [floor {floor_big['cpu']:.2f}]")
    print(f"  first run / no-op, {small} host, project cfg:          {results[small, 'project'][0]['wall'] / project[1]['wall']:.2f}  (target <= 1.5)")
    print(f"  defaults / project, no-op, {big} hosts:                {results[big, 'defaults'][1]['wall'] / project[0]['wall']:.2f}  (target >= 2)"
          f"  [floor {floors[big, 'defaults']['wall'] / floor_big['wall']:.2f}]")
    print(f"  defaults / project, first run, {big} hosts:            {results[big, 'defaults'][0]['wall'] / results[big, 'project'][0]['wall']:.2f}")
    if args.mitogen:
        print(f"  project / mitogen, no-op, {big} hosts:                 {project[0]['wall'] / results[big, 'mitogen'][1]['wall']:.2f}")
    # 1,000 hosts: the controller does each host's work on its cores (CPU-bound), and no host finishes faster than one
    # host alone (latency-bound, forks hosts at a time): the larger of the two, from this run's figures.
    cores, n = os.cpu_count() or 1, 1000
    for label in configs:
        measured = results[big, label][1]
        cpu_bound = measured["cpu"] * n / cores
        latency_bound = results[small, label][1]["wall"] * math.ceil(n / fork_counts[label])
        print(f"  projected no-op of {n} hosts, {label}: {max(cpu_bound, latency_bound) / 60:.1f} min "
              f"(max of {measured['cpu']:.2f} CPU-s/host x {n} / {cores} cores, {results[small, label][1]['wall']:.1f} s x "
              f"ceil({n} / {fork_counts[label]} forks))")


if __name__ == "__main__":
    main()
