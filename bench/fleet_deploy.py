"""Fleet deploy timing; run through bench/fleet_deploy, which prepares the environment."""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "infra"))
from fleet import Fleet  # noqa: E402

# Plain Ansible, except what the project cannot run without (its roles and filter) and what fresh
# test hosts need (unknown host keys on new ports).
DEFAULTS_CFG = f"""[defaults]
roles_path = {ROOT}/roles
filter_plugins = {ROOT}/plugins/filter
action_plugins = {ROOT}/plugins/action
library = {ROOT}/plugins/modules
lookup_plugins = {ROOT}/plugins/lookup
host_key_checking = False
"""


def deploy(inventory: pathlib.Path, hosts: list[str], config: pathlib.Path, control_dir: str) -> float:
    env = {**os.environ, "ANSIBLE_CONFIG": str(config), "ANSIBLE_SSH_CONTROL_PATH_DIR": control_dir,
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    start = time.perf_counter()
    proc = subprocess.run(["ansible-playbook", "-i", str(inventory), "--limit", ",".join(hosts), "playbooks/site.yml"],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"deploy failed ({config.name}, {len(hosts)} hosts):\n{proc.stdout[-3000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1,4,8")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        work = pathlib.Path(tmp)
        defaults_cfg = work / "defaults.cfg"
        defaults_cfg.write_text(DEFAULTS_CFG)
        configs = {"project": ROOT / "ansible.cfg", "defaults": defaults_cfg}
        fleet = Fleet(work / "fleet", max(sizes), prefix="hicache-bench")
        print(f"starting {max(sizes)} test hosts ...", file=sys.stderr)
        fleet.up()
        try:
            inventory = fleet.inventory()
            names = list(fleet.hosts)
            rows, times = [], {}
            for size in sizes:
                for label, config in configs.items():
                    for name in names[:size]:  # a first run starts from a host without our files
                        fleet.ssh(name, "rm -rf /opt/sglang-hicache")
                    control = tempfile.mkdtemp(dir=tmp)  # no SSH master shared between configurations
                    first = deploy(inventory, names[:size], config, control)
                    rerun = deploy(inventory, names[:size], config, control)
                    times[size, label] = (first, rerun)
                    rows.append((size, label, first, rerun))
                    print(f"  {size} host(s), {label}: first {first:.1f} s, re-run {rerun:.1f} s", file=sys.stderr)
        finally:
            fleet.down()
    print(f"{'hosts':>5}  {'ansible.cfg':<11}  {'first run':>9}  {'no-op re-run':>12}")
    for size, label, first, rerun in rows:
        print(f"{size:>5}  {label:<11}  {first:>8.1f}s  {rerun:>11.1f}s")
    big, small = max(sizes), min(sizes)
    print("\nratios (same run):")
    print(f"  no-op re-run, {big} hosts / {small} host, project cfg: {times[big, 'project'][1] / times[small, 'project'][1]:.2f}")
    print(f"  defaults / project, first run, {big} hosts:        {times[big, 'defaults'][0] / times[big, 'project'][0]:.2f}")
    print(f"  defaults / project, no-op re-run, {big} hosts:     {times[big, 'defaults'][1] / times[big, 'project'][1]:.2f}")


if __name__ == "__main__":
    main()
