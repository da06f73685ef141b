"""host_limits with Docker (issue #22, Limits): the memlock limit goes where a container's processes inherit it, and the
role's check reads the limit of the RUNNING runtime process, not only the unit's configured LimitMEMLOCK.

Why containerd.service: dockerd asks containerd to create each container; containerd starts containerd-shim-runc-v2,
which runs runc, which starts the container's init (containerd runtime/v2/shim; moby daemon/oci_linux.go puts only the
--ulimit values and daemon.json's default-ulimits in the OCI spec). tests/vm/test_vm_docker.py shows it on a real
Docker 20.10 in a VM; here the plan and the role's check are tested on this machine against real processes whose
/proc/<pid>/limits this test sets with prlimit (only lowering: this machine caps memlock at 8 MiB).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

import pytest
import yaml
from helpers import deployment, load_plugin, proc_limits
from support import ROOT

from hicachectl.plans import container_runtime, host_limits
from hicachectl.plans.plan import as_fact

ANSIBLE_PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")


def test_with_docker_the_memlock_drop_in_goes_on_containerd_as_well_as_docker():
    """Failed before: only docker.service got the drop-in, but the containers are children of containerd's shims."""
    plan = host_limits.limits_plan(deployment("vast", container_runtime="docker"))
    assert plan.services == ("docker.service", "containerd.service")
    dropins = {f["path"]: f["content"] for f in plan.files if f["path"].startswith("/etc/systemd/system/")}
    assert set(dropins) == {"/etc/systemd/system/docker.service.d/90-hicache-memlock.conf",
                            "/etc/systemd/system/containerd.service.d/90-hicache-memlock.conf"}
    assert all("LimitMEMLOCK=infinity\n" in text for text in dropins.values())
    assert {d["path"] for d in plan.directories} == {"/etc/systemd/system/docker.service.d", "/etc/systemd/system/containerd.service.d"}
    assert plan.proc_memlock == "unlimited" and plan.memlock == "infinity"


def test_podman_has_no_daemon_and_a_named_runtime_service_still_brings_containerd_with_docker():
    assert host_limits.limits_plan(deployment("vast", container_runtime="podman")).services == ()
    named = host_limits.limits_plan(deployment("vast", container_runtime="docker", limits_runtime_service="docker-ce.service"))
    assert named.services == ("docker-ce.service", "containerd.service")
    assert container_runtime.runtime_plan(deployment("vast", container_runtime="docker")).units == ("containerd.service", "docker.service")


def test_leaving_docker_removes_the_memlock_drop_ins_it_had_and_render_names_them():
    """#34: a host moved from Docker to Podman or to no container kept its docker.service and containerd.service
    drop-ins, which neither render nor the role named."""
    from hicachectl.plans import host_files

    dropins = (f"/etc/systemd/system/docker.service.d/{host_limits.DROPIN_NAME}", f"/etc/systemd/system/containerd.service.d/{host_limits.DROPIN_NAME}")
    assert host_limits.limits_plan(deployment("vast", container_runtime="docker")).absent == ()
    import dataclasses

    for d in (deployment("vast", container_runtime="podman"), dataclasses.replace(deployment("vast"), container_runtime="none")):
        plan = host_limits.limits_plan(d)
        assert plan.absent == dropins, d.container_runtime
        assert list(as_fact(plan)["absent"]) == list(dropins)  # what roles/host_limits/tasks/converge.yml hands hicache_files
        removed = host_files.server_host_files(d).removed
        assert [path for role, path in removed if role == "host_limits"] == list(dropins), d.container_runtime
    apply = yaml.safe_load((ROOT / "roles/host_limits/tasks/converge.yml").read_text())
    calls = [t["hicache.deploy.hicache_files"] for block in apply if "block" in block for t in block["block"] if "hicache.deploy.hicache_files" in t]
    assert calls and calls[0]["absent"] == "{{ __hicache_limits.absent }}"


def test_a_number_of_kib_is_bytes_in_proc_limits_and_in_systemd():
    d = deployment("vast", container_runtime="docker", limits_memlock="4096")
    assert host_limits.proc_memlock(d) == host_limits.systemd_memlock(d) == str(4096 * 1024)


def test_the_runtime_units_findings_are_judged_once_for_the_check_and_the_restart():
    """converge.yml restarts the `stale` units; checks.yml reports every finding: both read host_limits.runtime_unit_findings."""
    plan = as_fact(host_limits.limits_plan(deployment("vast", container_runtime="docker", limits_memlock="unlimited",
                                                      limits_restart_runtime=True)))
    def unit(load, pid, configured, soft="", hard=""):
        properties = {"LoadState": load, "MainPID": str(pid), "LimitMEMLOCK": configured}
        if soft:  # the unit runs: its process's /proc/<pid>/limits as the host facts hold it
            properties["limits"] = proc_limits(soft, hard)
        return properties

    units = {"docker.service": unit("loaded", 41, "infinity", "unlimited", "unlimited"),
             "containerd.service": unit("loaded", 42, "infinity", "8388608", "8388608"),
             "other.service": unit("not-found", 0, ""), "stopped.service": unit("loaded", 0, "infinity"),
             "wrong.service": unit("loaded", 0, "8388608"), "not-asked.service": unit("loaded", 0, "8388608")}
    plan["services"] = [u for u in units if u != "not-asked.service"]  # only the plan's units are judged
    found = {f["unit"]: f for f in host_limits.runtime_unit_findings(plan, units)}
    assert set(found) == {"containerd.service", "other.service", "wrong.service"}
    assert found["containerd.service"]["stale"] and not found["containerd.service"]["tolerated"]  # the role may restart it
    assert found["other.service"]["tolerated"] and not found["other.service"]["stale"]
    assert found["wrong.service"]["reason"] == "wrong.service: LimitMEMLOCK=8388608, wanted infinity"
    plan["restart"] = False
    plan["services"] = ["containerd.service"]
    assert host_limits.runtime_unit_findings(plan, units)[0]["tolerated"]  # a gap: it gets the limit at its next start
    assert host_limits.runtime_unit_findings(plan, units)[0]["note"]  # the vast profile's run line has --ulimit memlock=-1
    # a unit the host facts do not hold (no systemd answer for it) is not installed, as systemctl's not-found
    assert host_limits.runtime_unit_findings(plan, {})[0]["reason"].startswith("containerd.service is not installed")
    assert host_limits.limits_plan(deployment("vast", container_runtime="docker")).server_sets_memlock
    assert not host_limits.limits_plan(deployment("vast", container_runtime="docker", container_ulimits={"stack": 67108864})).server_sets_memlock
    assert not host_limits.limits_plan(deployment("vast", container_runtime="none", cache_container_dir=None, model_dir=None)).server_sets_memlock


# -- the role's check, against real processes ------------------------------------------------------------------------
# The host facts' units as hicache_host_facts reads them (test_the_host_facts_read_each_units_running_limits below):
# the MainPIDs are real processes started by the test with a known memlock, their /proc/<pid>/limits read here.
@pytest.fixture
def units(tmp_path):
    """Run the role's checks.yml on this machine with the given units; returns (returncode, output)."""
    started = []

    def process_with_memlock(bytes_: int) -> int:
        proc = subprocess.Popen(["prlimit", f"--memlock={bytes_}:{bytes_}", "sleep", "120"])
        started.append(proc)
        # prlimit execs sleep: wait until the limit is the process's (the host facts read it right away, in loaded())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            limits_text = pathlib.Path(f"/proc/{proc.pid}/limits").read_text()
            if pathlib.Path(f"/proc/{proc.pid}/exe").resolve().name == "sleep" and f" {bytes_} " in limits_text:
                return proc.pid
            time.sleep(0.01)
        raise AssertionError(f"prlimit did not give pid {proc.pid} memlock {bytes_} within 10 s")

    def run(unit_properties: dict, memlock_kib: str, restart: bool = False, ulimits: dict | None = None):
        # By default the server's container sets no memlock of its own, so it inherits the runtime units' limit.
        d = deployment("vast", container_runtime="docker", limits_memlock=memlock_kib, limits_restart_runtime=restart, strict=False,
                       container_ulimits=ulimits if ulimits is not None else {"stack": 67108864})
        play = [{"hosts": "localhost", "gather_facts": False,
                 "vars": {"ansible_python_interpreter": sys.executable, "hicache_facts": {"systemd": True, "units": unit_properties}, "__hicache_limits": as_fact(host_limits.limits_plan(d))},
                 "tasks": [{"ansible.builtin.import_tasks": str(ROOT / "roles/host_limits/tasks/checks.yml")}]}]
        (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
        env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
        proc = subprocess.run([ANSIBLE_PLAYBOOK, "-v", "-i", "localhost,", "-c", "local", str(tmp_path / "play.yml")],
                              capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
        return proc.returncode, proc.stdout + proc.stderr

    run.process_with_memlock = process_with_memlock
    yield run
    for proc in started:
        proc.kill()
        proc.wait()


def loaded(pid: int, memlock: str) -> dict:
    """A unit as the host facts hold it: with its running process's limits while it runs."""
    unit = {"LoadState": "loaded", "MainPID": str(pid), "LimitMEMLOCK": memlock}
    if pid:
        unit["limits"] = pathlib.Path(f"/proc/{pid}/limits").read_text()
    return unit


def test_the_host_facts_read_each_units_running_limits(units):
    """hicache_host_facts' unit_properties: what `systemctl show` says of each unit and, while it runs, its process's
    /proc/<pid>/limits, which the role's checks judge without reading the host again (read.yml's awk before)."""
    facts = load_plugin("plugins/modules/hicache_host_facts.py")
    running = units.process_with_memlock(8 * 1024 * 1024)
    shown = {"containerd.service": f"LoadState=loaded\nLimitMEMLOCK=infinity\nMainPID={running}\n",
             "docker.service": "LoadState=loaded\nLimitMEMLOCK=infinity\nMainPID=0\n", "gone.service": "LoadState=not-found\nMainPID=0\n"}

    class Module:  # AnsibleModule's two calls: systemctl's path, and `systemctl show -p ... UNIT`
        def get_bin_path(self, name):
            return "/bin/systemctl"

        def run_command(self, argv):
            assert argv[:3] == ["/bin/systemctl", "show", "-p"] and set(argv[3].split(",")) == {"LoadState", "LimitMEMLOCK", "MainPID"}, argv
            return 0, shown[argv[4]], ""

    read = facts.unit_properties(Module(), list(shown), systemd=True)
    assert read["containerd.service"]["limits"] == pathlib.Path(f"/proc/{running}/limits").read_text()
    assert "limits" not in read["docker.service"] and read["gone.service"] == {"LoadState": "not-found", "MainPID": "0"}
    assert facts.unit_properties(Module(), list(shown), systemd=False) == {}
    plan = as_fact(host_limits.limits_plan(deployment("vast", container_runtime="docker", limits_memlock="unlimited")))
    found = host_limits.runtime_unit_findings(plan, read)
    assert [f["unit"] for f in found] == ["containerd.service"], found
    assert f"containerd.service (pid {running}) runs with memlock 8388608/8388608 (soft/hard), wanted unlimited" in found[0]["reason"]


def test_the_check_names_a_running_containerd_that_does_not_have_the_limit_yet(units):
    """Failed before: the check read LimitMEMLOCK only (right since the drop-in), never the running process, so a
    containerd started before the drop-in (its shims and containers at 8 MiB) passed."""
    want = 4096 * 1024
    good, stale = units.process_with_memlock(want), units.process_with_memlock(8 * 1024 * 1024)
    rc, out = units({"docker.service": loaded(good, str(want)), "containerd.service": loaded(stale, str(want))}, "4096")
    assert rc == 0, out  # hicache_strict false: a gap, the host degraded
    assert f"containerd.service (pid {stale}) runs with memlock 8388608/8388608 (soft/hard), wanted {want}" in out, out
    assert "restart it, or set hicache_limits_restart_runtime: true" in out and "docker.service (pid" not in out, out


def test_a_stale_containerd_is_only_a_note_when_the_servers_own_ulimit_gives_it_memlock(units):
    """The documents' run line has --ulimit memlock=-1: the server's container then has RLIMIT_MEMLOCK in its own spec,
    and a containerd still running without the limit (restart not allowed) holds back only other containers. Before,
    every fresh Docker host was degraded for it on its first converge although its server had the limit."""
    want = 4096 * 1024
    good, stale = units.process_with_memlock(want), units.process_with_memlock(8 * 1024 * 1024)
    rc, out = units({"docker.service": loaded(good, str(want)), "containerd.service": loaded(stale, str(want))}, "4096",
                    ulimits={"memlock": -1, "stack": 67108864})
    assert rc == 0 and "degraded" not in out, out
    assert f"containerd.service (pid {stale}) runs with memlock 8388608/8388608" in out and "the server sets its own with --ulimit memlock" in out, out
    # the same without the server's own memlock: a gap, the host degraded
    rc, out = units({"docker.service": loaded(good, str(want)), "containerd.service": loaded(stale, str(want))}, "4096")
    assert rc == 0 and "degraded" in out and "the server sets its own" not in out, out


def test_after_the_role_restarted_the_runtime_a_running_limit_still_wrong_is_a_failure(units):
    stale = units.process_with_memlock(8 * 1024 * 1024)
    good = units.process_with_memlock(4096 * 1024)
    rc, out = units({"docker.service": loaded(good, str(4096 * 1024)), "containerd.service": loaded(stale, str(4096 * 1024))},
                    "4096", restart=True)
    assert rc != 0 and f"containerd.service (pid {stale}) runs with memlock 8388608/8388608" in out, out


def test_running_units_with_the_limit_pass_and_a_stopped_one_is_judged_by_its_configured_limit(units):
    want = 4096 * 1024
    good = units.process_with_memlock(want)
    rc, out = units({"docker.service": loaded(good, str(want)), "containerd.service": loaded(0, str(want))}, "4096")
    assert rc == 0 and "degraded" not in out and "runs with memlock" not in out, out
    rc, out = units({"docker.service": loaded(good, str(want)), "containerd.service": loaded(0, "8388608")}, "4096")
    assert rc != 0 and f"containerd.service: LimitMEMLOCK=8388608, wanted {want}" in out, out
