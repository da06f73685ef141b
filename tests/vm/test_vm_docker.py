"""The container path on a real Docker engine (issue #21: host_limits, container_runtime + sglang_server with
hicache_container_runtime: docker; issue #22: Limits), in one VM with Debian's kernel and Debian's docker.io 20.10.

What is real: the kernel, systemd, pam_limits in an SSH login, dockerd, containerd and its shims, runc, Docker's
default seccomp profile, and the rendered serve.sh / run.sh running `docker run` exactly as the documents write it
(`--gpus all`, `--ulimit`, `-v`, `-e`, `--env-file`, `--entrypoint bash`). What is a stand-in, and named as such:
- the image: bookworm minbase + python3 (tests/infra/docker_image.sh), `docker import`ed in the VM (no registry is
  reachable from it), with SGLang's stand-in (tests/standin/sglang_standin.py) in its stdlib-only mode: no L3 backend
  (hicache_storage_backend unset), so neither torch nor the SGLang wheel is needed;
- the NVIDIA toolkit's hook: tests/vm/docker_guest/nvidia-container-runtime-hook, so that dockerd registers its
  nvidia device driver (moby daemon/nvidia_linux.go looks the hook up on PATH) and `--gpus all` runs unchanged; it
  records its calls and gives no GPU. nvidia-ctk is absent, so container_runtime reports that gap (strict off there).
The tests run in order on one VM (module scope).
"""

from __future__ import annotations

import json
import pathlib
import re
import socket
import subprocess
import sys
import textwrap

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "tests" / "infra"))
import vm as vmlib  # noqa: E402
from bed import run_play, vm_inventory  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.vm, pytest.mark.timeout(3600)]  # a boot, an image import and a converge on a loaded TCG guest

IMAGE = "hicache-standin"
STANDIN_DIR = "/opt/standin"
CONTAINER = "sglang-hicache"
UNIT = "sglang-hicache.service"
CFG = "/opt/sglang-hicache/cfg"
CACHE_DIR = "/var/lib/hicache-l3"
HOOK = "nvidia-container-runtime-hook"
HOOK_LOG = "/run/hicache-testbed-gpu-hook.log"
HEALTHY = vmlib.http_ok()  # exits 0 when the server answers /health with 200
SERVER_VARS = {
    "hicache_container_runtime": "docker",
    "hicache_image": f"{IMAGE}:v1",
    "hicache_sglang_version": "0.5.23",
    "hicache_model_path": "hicache-standin-model",
    "hicache_launcher": ["python3", f"{STANDIN_DIR}/sglang_standin.py"],
    "hicache_storage_type": "local",
    "hicache_cache_dir": CACHE_DIR,
    "hicache_container_env": {"STANDIN_LOAD_SECONDS": "1", "HF_TOKEN": "hf_testbed_not_a_token"},
    "hicache_secret_keys": ["HF_TOKEN"],
    "hicache_health_timeout": 90,
    "hicache_strict": True,
}


def role(name: str, **extra) -> dict:
    return {"name": f"The {name} role", "ansible.builtin.include_role": {"name": f"hicache.deploy.{name}", **extra}}


class DockerHost:
    def __init__(self, workdir: pathlib.Path):
        self.workdir = workdir
        self.key = vmlib.keypair(workdir)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.vm = vmlib.VM("hicache-docker", workdir, self.key, port, memory_mb=1280)

    def up(self) -> DockerHost:
        rootfs = subprocess.run([str(ROOT / "tests/infra/docker_image.sh")], check=True, capture_output=True, text=True).stdout.split()[-1]
        self.vm.create(vmlib.image()).start().wait_ssh()
        # The toolkit's hook stand-in on dockerd's PATH before dockerd first starts (it looks the hook up once, at start).
        self.vm.write(f"/usr/local/bin/{HOOK}", (HERE / "docker_guest" / HOOK).read_text(), mode="0755")
        with open(rootfs, "rb") as tar:
            subprocess.run([*self.vm.ssh_argv(), "cat > /root/standin-rootfs.tar"], stdin=tar, check=True, timeout=600)
        return self

    def down(self) -> None:
        vmlib.cleanup(self.workdir, [self.vm])

    def ssh(self, command: str, check: bool = True, timeout: float = 300, login: bool = False) -> str:
        proc = self.vm.ssh(command, timeout=timeout, login=login)
        if check and proc.returncode != 0:
            raise AssertionError(f"`{command}` exited {proc.returncode}: {proc.stderr.strip()} {proc.stdout.strip()}")
        return proc.stdout

    def build_image(self) -> None:
        """The stand-in image's local tag v1. Upgrades, rollbacks and config changes are the container fleet's tests
        (tests/fleet/test_fleet_service.py, test_fleet_upgrade.py): this bed keeps what only Docker shows."""
        for name in ("sglang_standin.py", "sglang_pages.py"):
            self.vm.write(f"/root/image/{name}", (ROOT / "tests/standin" / name).read_text())
        # A TCG guest digests the 170 MB layer slowly, and more slowly still beside CI's other streams (it took more than
        # 300 s there once): the waits below are for a loaded machine, not a measure.
        self.ssh(f"docker image inspect {IMAGE}:base >/dev/null 2>&1 || docker import /root/standin-rootfs.tar {IMAGE}:base", timeout=1500)
        self.vm.write("/root/image/Dockerfile", f"FROM {IMAGE}:base\nLABEL org.hicache.testbed.tag=v1\nCOPY sglang_standin.py sglang_pages.py {STANDIN_DIR}/\n")
        self.ssh(f"cd /root/image && DOCKER_BUILDKIT=0 docker build -q -t {IMAGE}:v1 .", timeout=1200)

    def play(self, variables: dict, tasks: list[dict], name: str = "play", verbose: bool = False) -> subprocess.CompletedProcess:
        inventory = vm_inventory(self.workdir / f"{name}.yml", self.vm, self.key, variables)
        return run_play(self.workdir / f"{name}.play.yml", inventory, tasks, verbose=verbose, timeout=1500)

    # -- what the host reports -------------------------------------------------------------------------------------
    def inspect(self, name: str = CONTAINER) -> dict:
        return json.loads(self.ssh(f"docker inspect {name}"))[0]

    def memlock(self, pid: int | str) -> tuple[str, str]:
        """(soft, hard) "Max locked memory" from the kernel's /proc/<pid>/limits."""
        line = next(x for x in self.ssh(f"cat /proc/{pid}/limits").splitlines() if x.startswith("Max locked memory"))
        soft, hard = line.split()[3:5]
        return soft, hard

    def main_pid(self, unit: str) -> str:
        return self.ssh(f"systemctl show -p MainPID --value {unit}").strip()

    def healthy(self) -> bool:
        return self.vm.ssh(vmlib.http_ok()).returncode == 0

    def deployed(self) -> dict:
        return json.loads(self.ssh(f"cat {CFG}/deployed.json"))


def recap(run) -> dict[str, int]:
    match = re.search(r"ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", run.stdout)
    assert match, run.stdout[-3000:] + run.stderr[-2000:]
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, match.groups()), strict=True))


def converge(host, variables, name="server"):
    run = host.play(variables, [role("sglang_server")], name)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    return recap(run)


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    host = DockerHost(tmp_path_factory.mktemp("docker-vm"))
    try:
        yield host.up()
    finally:
        host.down()


# -- the runtime and its limits ----------------------------------------------------------------------------------------
def test_host_limits_and_container_runtime_bring_docker_up_with_memlock_where_containers_inherit_it(host):
    """Docker is installed but disabled in the image (as after `apt install` with policy-rc.d): host_limits writes the
    drop-ins, container_runtime starts containerd and Docker, which start with the limit."""
    limits = host.play({**SERVER_VARS}, [role("host_limits")], "limits")
    assert limits.returncode == 0, limits.stdout[-6000:]
    # No NVIDIA toolkit (nvidia-ctk) here: a gap, tolerated in this play only, named in the output.
    runtime = host.play({**SERVER_VARS, "hicache_strict": False}, [role("container_runtime")], "runtime")
    assert runtime.returncode == 0, runtime.stdout[-6000:]
    assert "nvidia-ctk" in runtime.stdout + runtime.stderr
    for unit in ("containerd.service", "docker.service"):
        assert host.ssh(f"systemctl is-enabled {unit}").strip() == "enabled"
        assert host.ssh(f"systemctl show -p LimitMEMLOCK --value {unit}").strip() == "infinity"
        assert host.memlock(host.main_pid(unit)) == ("unlimited", "unlimited"), unit
    # dockerd talks to the system containerd (Debian's docker.service: --containerd=/run/containerd/containerd.sock),
    # so a container's shim is containerd.service's, not dockerd's.
    assert "--containerd=/run/containerd/containerd.sock" in host.ssh(f"tr '\\0' ' ' < /proc/{host.main_pid('docker.service')}/cmdline")
    host.build_image()
    # The role's own check (verify) reads the running processes and passes.
    verify = host.play({**SERVER_VARS}, [role("host_limits", tasks_from="verify")], "limits-verify")
    assert verify.returncode == 0 and recap(verify)["failed"] == 0, verify.stdout[-4000:]


def test_a_new_login_session_has_memlock_unlimited(host):
    """pam_limits in sshd's session reads /etc/security/limits.d (root has its own lines: '*' does not cover root)."""
    assert host.ssh("ulimit -l; ulimit -Hl", login=True).split() == ["unlimited", "unlimited"]


def test_containers_inherit_memlock_from_containerd_not_dockerd(host):
    """Why the drop-in goes on containerd.service (#22, Limits): a container started without --ulimit memlock gets the
    limit of containerd's shim. With only docker.service's drop-in (the role before this change) it gets systemd's
    default, and the role's check names containerd; a converge with the restart allowed puts it right."""
    no_ulimit = f"docker run --rm --entrypoint cat {IMAGE}:v1 /proc/self/limits | grep '^Max locked memory'"
    assert host.ssh(no_ulimit).split()[3:5] == ["unlimited", "unlimited"]
    # Today's role: the drop-in on docker.service only; containerd restarted without it (containers survive this).
    host.ssh("rm /etc/systemd/system/containerd.service.d/90-hicache-memlock.conf && systemctl daemon-reload && systemctl restart containerd")
    default = host.memlock(host.main_pid("containerd.service"))
    assert default != ("unlimited", "unlimited")
    assert host.memlock(host.main_pid("docker.service")) == ("unlimited", "unlimited")
    assert host.ssh(no_ulimit).split()[3:5] == list(default)  # containerd's limit, although dockerd's is unlimited
    # The role's check reads the running process, so it fails the strict host and says how to fix it.
    verify = host.play({**SERVER_VARS}, [role("host_limits", tasks_from="verify")], "limits-verify")
    assert verify.returncode != 0 and "containerd.service: LimitMEMLOCK=" in verify.stdout, verify.stdout[-4000:]
    # Drop-in back, containerd not restarted (hicache_limits_restart_runtime false): the running process is named. A
    # server without its own --ulimit memlock would inherit containerd's: the strict host fails.
    own_memlock_off = {**SERVER_VARS, "hicache_container_ulimits": {"stack": 67108864}}
    again = host.play(own_memlock_off, [role("host_limits")], "limits")
    assert again.returncode != 0, again.stdout[-4000:]
    stale = r"containerd\.service \(pid \d+\) runs with memlock \d+/\d+ \(soft/hard\), wanted unlimited"
    assert re.search(stale, " ".join(again.stdout.split())), again.stdout[-4000:]
    # The documents' run line sets --ulimit memlock=-1, so the server has its limit whatever containerd runs with: said in
    # a note, not a failure (before, every fresh Docker host was degraded, or failed when strict, on its first converge).
    noted = host.play({**SERVER_VARS}, [role("host_limits")], "limits", verbose=True)
    assert noted.returncode == 0, noted.stdout[-4000:]
    assert re.search(stale + r".*the server sets its own with --ulimit memlock", " ".join(noted.stdout.split())), noted.stdout[-4000:]
    # Restart allowed: containerd restarts with the limit, the check passes.
    fixed = host.play({**SERVER_VARS, "hicache_limits_restart_runtime": True}, [role("host_limits")], "limits")
    assert fixed.returncode == 0, fixed.stdout[-4000:]
    assert host.memlock(host.main_pid("containerd.service")) == ("unlimited", "unlimited")
    assert host.ssh(no_ulimit).split()[3:5] == ["unlimited", "unlimited"]


# -- the server ----------------------------------------------------------------------------------------------------------
def test_the_server_runs_the_documents_docker_run_and_becomes_healthy(host):
    converge(host, SERVER_VARS)
    assert host.healthy()
    info = host.inspect()
    assert info["Config"]["Image"] == f"{IMAGE}:v1" and info["Config"]["Entrypoint"] == ["bash"]
    assert info["Config"]["Cmd"] == ["/cfg/start.sh"]
    assert info["HostConfig"]["NetworkMode"] == "host" and info["HostConfig"]["IpcMode"] == "host"
    ulimits = {u["Name"]: (u["Soft"], u["Hard"]) for u in info["HostConfig"]["Ulimits"]}
    assert ulimits == {"memlock": (-1, -1), "stack": (67108864, 67108864)}
    mounts = {m["Destination"]: (m["Source"], m["RW"]) for m in info["Mounts"]}
    assert mounts == {CACHE_DIR: (CACHE_DIR, True), "/cfg": (CFG, False)}
    env = set(info["Config"]["Env"])
    assert {"STANDIN_LOAD_SECONDS=1", "HF_TOKEN=hf_testbed_not_a_token"} <= env  # -e, --env-file
    # --gpus all reached Docker's nvidia device driver, which ran the (stand-in) toolkit hook as a prestart hook and put
    # NVIDIA_VISIBLE_DEVICES=all into the OCI spec's process env (moby daemon/nvidia_linux.go setNvidiaGPUs: the
    # spec's, not the container config's Env that docker inspect shows): the server's own environ has it.
    assert info["HostConfig"]["DeviceRequests"][0]["Count"] == -1
    assert " prestart " in host.ssh(f"cat {HOOK_LOG}")
    pid = info["State"]["Pid"]
    assert "NVIDIA_VISIBLE_DEVICES=all" in host.ssh(f"tr '\\0' '\\n' < /proc/{pid}/environ").splitlines()
    # The server's own process, as the kernel reports it: memlock unlimited.
    assert "sglang_standin.py" in host.ssh(f"tr '\\0' ' ' < /proc/{pid}/cmdline")
    assert host.memlock(pid) == ("unlimited", "unlimited")
    # The secret is in cfg/secrets.env (0600), never in the unit or the scripts.
    assert host.ssh(f"stat -c %a {CFG}/secrets.env").strip() == "600"
    assert "hf_testbed_not_a_token" not in host.ssh(f"cat {CFG}/serve.sh {CFG}/run.sh /etc/systemd/system/{UNIT}")


def test_run_sh_runs_as_the_documents_write_it(host):
    """run.sh is the documents' detached `docker run -d` (serve.sh is the same line in the foreground for systemd)."""
    host.ssh(f"systemctl stop {UNIT}")
    try:
        host.ssh(f"bash {CFG}/run.sh")
        host.ssh(f"for i in $(seq 60); do {HEALTHY} && exit 0; sleep 1; done; exit 1")
        info = host.inspect()
        assert info["HostConfig"]["AutoRemove"] is False and info["Config"]["Image"] == f"{IMAGE}:v1"
        assert host.memlock(info["State"]["Pid"]) == ("unlimited", "unlimited")
    finally:
        host.ssh(f"docker rm -f {CONTAINER} >/dev/null; systemctl start {UNIT}")
    host.ssh(f"for i in $(seq 90); do {HEALTHY} && exit 0; sleep 1; done; exit 1")


def test_a_second_converge_changes_nothing_and_restarts_nothing(host):
    before = host.inspect()["Id"]
    assert converge(host, SERVER_VARS)["changed"] == 0
    assert host.inspect()["Id"] == before


def test_the_server_comes_back_after_a_reboot_with_its_limits(host):
    """Docker enabled by container_runtime, the server's unit by sglang_server: both back after a real reboot."""
    host.vm.reboot()
    host.ssh(f"for i in $(seq 180); do {HEALTHY} && exit 0; sleep 1; done; exit 1", timeout=400)
    assert host.memlock(host.inspect()["State"]["Pid"]) == ("unlimited", "unlimited")
    assert host.memlock(host.main_pid("containerd.service")) == ("unlimited", "unlimited")
    assert host.ssh("ulimit -l").strip() == "unlimited"


# -- NIXL's io_uring under Docker's default seccomp profile ----------------------------------------------------------------
IO_URING_PROBE = textwrap.dedent("""\
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(120)  # struct io_uring_params (include/uapi/linux/io_uring.h), zeroed
    fd = libc.syscall(425, 8, params)  # __NR_io_uring_setup on x86_64, 8 entries: what liburing's io_uring_queue_init does
    print("fd" if fd >= 0 else os.strerror(ctypes.get_errno()))
    """)


def test_docker_default_seccomp_and_io_uring(host):
    """io_uring_setup from a container under Docker's default seccomp profile (docs/docker-vm.md): allowed from moby
    #39415 (so in Debian's 20.10), refused again from Docker 25.0 (moby #46762, "block io_uring_* syscalls in default
    profile"), where NIXL's POSIX plugin needs hicache_container_seccomp or the role's posix_aio fallback."""
    host.vm.write("/root/io_uring_probe.py", IO_URING_PROBE)
    version = host.ssh("docker version --format '{{.Server.Version}}'").strip()
    in_default = host.ssh(f"docker run --rm -v /root/io_uring_probe.py:/probe.py:ro --entrypoint python3 {IMAGE}:v1 /probe.py").strip()
    unconfined = host.ssh(f"docker run --rm --security-opt seccomp=unconfined -v /root/io_uring_probe.py:/probe.py:ro "
                          f"--entrypoint python3 {IMAGE}:v1 /probe.py").strip()
    on_host = host.ssh("python3 /root/io_uring_probe.py").strip()
    print(f"docker {version}: default seccomp -> {in_default}; seccomp=unconfined -> {unconfined}; host -> {on_host}")
    assert on_host == "fd" and unconfined == "fd"  # the kernel has io_uring
    assert in_default == ("fd" if int(version.split(".")[0]) < 25 else "Operation not permitted"), (version, in_default)
