"""VM test hosts: Debian's own kernel under QEMU (tests/infra/vm_image.sh builds the image), reached over real SSH.

What a container cannot show and these can: the kernel's NFS client and server, RDMA through Soft-RoCE (rdma_rxe),
module loading, udev, systemd boots and reboots, a Docker engine.

Network rules of the test bed (nothing here reaches beyond the VMs and loopback):
- management: QEMU's user network with `restrict=on` (the guest reaches nothing outside; no route out), SSH forwarded
  from 127.0.0.1 only;
- storage links: point-to-point virtio NICs whose frames QEMU carries as UDP datagrams between 127.0.0.1 ports
  (`-netdev socket,udp=...,localaddr=127.0.0.1:...`). A link whose peer is down simply drops frames, as a cable to a
  dead switch port would. No bridge, no tap device: the machine's own network is never touched.
Each VM has its own copy-on-write disk over the cached image, so reboots keep its state.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import pathlib
import shutil
import subprocess
import time

HERE = pathlib.Path(__file__).resolve().parent
MANAGEMENT_MAC = "52:54:00:00:00:01"
# ConnectTimeout also bounds the wait for sshd's banner. A TCG guest starved by a loaded machine takes longer than 5 s to
# answer: measured with 20 busy sessions beside one guest, every connection gave up at 5.1 s while a patient one got in
# after 90 s, and in a six-stream run two beds never got SSH in 420 s although their guests had booted to a login
# prompt (2026-12-02). A guest that is down answers at once (QEMU refuses or resets the forward), so waiting is cheap.
CONNECT_TIMEOUT = 120
SSH_OPTIONS = ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
               "-o", f"ConnectTimeout={CONNECT_TIMEOUT}", "-o", "LogLevel=ERROR"]
# systemd's defaults (90 s for a unit to start, a device to appear) assume a machine, not a TCG guest that a loaded
# 2-core machine gives a few per cent of one core: there sshd (Type=notify, 3 s of guest time idle) can miss its 90 s
# and be killed and restarted over and over while the console shows a login prompt. The guests' default start timeout
# is raised on the kernel command line (systemd-system.conf(5); `systemctl show -p DefaultTimeoutStartUSec` in a guest
# reads 15min; systemd 252 has no such switch for devices). Every timeout the toolkit sets itself
# (x-systemd.mount-timeout in fstab, the units' TimeoutStartSec) is explicit and unchanged by this.
GUEST_SYSTEMD_TIMEOUTS = "systemd.default_timeout_start_sec=900"
# How long a test waits for a guest's first SSH login after power on or a reboot: a boot costs 40-80 s of guest CPU
# (about 45 s wall idle), and a fully loaded machine gives a guest about a tenth of a core.
BOOT_TIMEOUT = 900
# The CPU a TCG guest emulates: x86-64-v2 (SSE4.2, POPCNT), not QEMU's `max`, whose guest spent more of this
# machine's CPU on the same work: on QEMU 7.2 here (2026-12-07), five Python start-ups, 200,000 sha256 and a 100 MB
# gzip took 12.2 CPU-s with `max`, 8.9 with this, 10.0 with `max` without AVX; a boot to SSH 35 and 29 CPU-s. The VM
# beds' guests were about a third of a full run's CPU (process accounting of the run before).
TCG_CPU = "qemu64,+ssse3,+sse4.1,+sse4.2,+popcnt"
# A TCG guest spends about 1.5 s of CPU on each new SSH connection (sshd's re-exec, key exchange, PAM) and about 0.15 s
# on a command over an open one (measured here with the guest's QEMU process's CPU time), and the tests run hundreds of
# commands: so each VM's commands share one connection (OpenSSH's multiplexing). ServerAlive ends a master whose guest
# went away without closing it (a reset, a kill) within 15 s, and reboot/power_off close it themselves first.
MULTIPLEX = ["-o", "ControlMaster=auto", "-o", "ControlPersist=600", "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]


def http_ok(port: int = 30000, path: str = "/health") -> str:
    """A guest shell command that exits 0 when http://127.0.0.1:PORT/PATH answers 200 (a loading server's 503 is not).
    bash builtins only: a python3 with urllib costs a TCG guest 0.69 s of CPU per probe, this about 0.05 (measured
    2026-12-03, 20 probes each), and the tests' health loops probe every second while the machine is loaded."""
    script = (f"exec 3<>/dev/tcp/127.0.0.1/{port} || exit 1; "
              f"printf \"GET {path} HTTP/1.0\\r\\nHost: 127.0.0.1\\r\\n\\r\\n\" >&3; "
              "read -r -t 5 status <&3; case \"$status\" in \"HTTP/1.\"?\" 200\"*) exit 0;; esac; exit 1")
    return f"bash -c '{script}' 2>/dev/null"


def image() -> pathlib.Path:
    """The cached image directory (built on first use: a few minutes)."""
    proc = subprocess.run([str(HERE / "vm_image.sh")], capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        raise RuntimeError(f"tests/infra/vm_image.sh exited {proc.returncode}:\n{tail}")
    return pathlib.Path(proc.stdout.split()[-1])


_ACCEL: str | None = None


def accelerator(img: pathlib.Path) -> str:
    """KVM only where a guest really runs on it: on this machine kind /dev/kvm opens but guests hang, so boot the kernel
    once with KVM and look for its first words on the serial console; TCG otherwise. HICACHE_VM_ACCEL overrides."""
    global _ACCEL
    if _ACCEL is None:
        _ACCEL = os.environ.get("HICACHE_VM_ACCEL") or _probe_kvm(img)
    return _ACCEL


def _probe_kvm(img: pathlib.Path) -> str:
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "tcg"
    try:
        # stdin from /dev/null: QEMU's stdio backend sets O_NONBLOCK on its stdin and, killed by the timeout, leaves
        # it so; inherited, that was pytest's own stdin, and every later ansible in the same pytest refused to run
        # ("Ansible requires blocking IO on stdin/stdout/stderr", seen when a stream ran other files after the VM bed).
        proc = subprocess.run(["qemu-system-x86_64", "-accel", "kvm", "-m", "256", "-display", "none", "-nodefaults",
                               "-no-reboot", "-serial", "stdio", "-kernel", str(img / "vmlinuz"),
                               "-append", "console=ttyS0 panic=-1 root=/dev/null"],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=15)
        return "kvm" if "Linux version" in proc.stdout else "tcg"
    except subprocess.TimeoutExpired as timeout:
        out = timeout.stdout.decode(errors="replace") if isinstance(timeout.stdout, bytes) else (timeout.stdout or "")
        return "kvm" if "Linux version" in out else "tcg"


@dataclasses.dataclass
class Link:
    """One end of a point-to-point storage link: this VM's NIC and the UDP ports QEMU carries its frames on."""
    mac: str
    local_port: int
    remote_port: int


class VM:
    def __init__(self, name: str, workdir: pathlib.Path, key: pathlib.Path, ssh_port: int, links: list[Link] | None = None,
                 memory_mb: int = 1280):
        self.name, self.workdir, self.key, self.ssh_port = name, workdir, key, ssh_port
        self.links = list(links or [])
        self.memory_mb = memory_mb
        self.disk = workdir / f"{name}.qcow2"
        self.console = workdir / f"{name}.console.log"
        self.proc: subprocess.Popen | None = None

    # -- life cycle ------------------------------------------------------------------------------------------------
    def create(self, img: pathlib.Path) -> VM:
        self.image = img
        self.workdir.mkdir(parents=True, exist_ok=True)
        if not self.disk.exists():
            subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(img / "root.qcow2"), str(self.disk)],
                           check=True)
        return self

    def command(self) -> list[str]:
        pubkey = base64.b64encode((self.key.with_suffix(".pub")).read_bytes().strip()).decode()
        accel = accelerator(self.image)
        argv = ["qemu-system-x86_64", "-name", self.name, "-accel", accel if accel == "kvm" else "tcg,thread=single",
                "-cpu", "max" if accel == "kvm" else TCG_CPU, "-smp", "1", "-m", str(self.memory_mb), "-nodefaults", "-display", "none",
                "-serial", f"file:{self.console}", "-kernel", str(self.image / "vmlinuz"), "-initrd", str(self.image / "initrd.img"),
                "-append", f"root=/dev/vda rw console=ttyS0 quiet loglevel=3 net.ifnames=1 {GUEST_SYSTEMD_TIMEOUTS} "
                           f"systemd.hostname={self.name} hicache.sshkey={pubkey}",
                "-drive", f"file={self.disk},if=virtio,format=qcow2,cache=unsafe",
                "-netdev", f"user,id=mgmt,restrict=on,hostfwd=tcp:127.0.0.1:{self.ssh_port}-:22",
                "-device", f"virtio-net-pci,netdev=mgmt,mac={MANAGEMENT_MAC},addr=0x3",
                "-object", "rng-random,id=rng,filename=/dev/urandom", "-device", "virtio-rng-pci,rng=rng"]
        for i, link in enumerate(self.links):
            argv += ["-netdev", f"socket,id=st{i},udp=127.0.0.1:{link.remote_port},localaddr=127.0.0.1:{link.local_port}",
                     "-device", f"virtio-net-pci,netdev=st{i},mac={link.mac},addr={hex(4 + i)}"]
        return argv

    def start(self) -> VM:
        """Power on (QEMU runs until the guest powers off; a guest reboot resets it and boots the same kernel again)."""
        with self.console.open("a") as log:
            log.write(f"\n==== power on {time.strftime('%H:%M:%S')}\n")
        # A session of its own, so the scheduler weighs this guest as one of the machine's peers: with autogroup
        # scheduling (this kernel's default) CPU is shared between sessions first, and every test host container
        # between them is one more peer (Podman's libpod_parent group), while pytest's own session holds every test
        # stream, its Ansible runs and, without this, the guests too. There a guest got a small slice of one share,
        # and a boot outran systemd's own 90 s device timeouts and the tests' 420 s (a CI run's reboot never came
        # back). A guest has timeouts of its own that a test cannot stretch; a test stream can wait.
        self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=open(self.workdir / f"{self.name}.qemu.log", "a"), start_new_session=True)
        return self

    def wait_ssh(self, timeout: float = BOOT_TIMEOUT) -> VM:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}: QEMU exited ({self.proc.returncode}); see {self.console}")
            try:
                if self.ssh("true", timeout=CONNECT_TIMEOUT + 30).returncode == 0:
                    return self
            except subprocess.TimeoutExpired:
                pass
            time.sleep(2)
        raise RuntimeError(f"{self.name}: no SSH on 127.0.0.1:{self.ssh_port} after {timeout:.0f} s; {self.diagnosis()}")

    def boot_id(self) -> str:
        return self.ssh("cat /proc/sys/kernel/random/boot_id", check=True).stdout.strip()

    def reboot(self, timeout: float = BOOT_TIMEOUT) -> VM:
        """A real reboot: systemd stops every unit, the kernel restarts; returns when SSH answers on the new boot."""
        before = self.boot_id()
        self.ssh("systemctl reboot", timeout=30)
        self.disconnect()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            time.sleep(3)
            try:
                proc = self.ssh("cat /proc/sys/kernel/random/boot_id", timeout=CONNECT_TIMEOUT + 30)
            except subprocess.TimeoutExpired:
                continue
            if proc.returncode == 0 and proc.stdout.strip() != before:
                return self
        raise RuntimeError(f"{self.name}: did not come back from a reboot in {timeout:.0f} s; {self.diagnosis()}")

    def power_off(self, timeout: float = 180) -> None:
        """A clean shutdown; QEMU exits with the guest."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self.ssh("systemctl poweroff", timeout=30)
        except subprocess.TimeoutExpired:
            pass
        self.disconnect()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.disconnect()

    def diagnosis(self) -> str:
        """What a failed wait needs to be understood: how much CPU the guest got (starved or stuck), how far SSH got
        (one verbose try), and the console."""
        try:
            fields = pathlib.Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu = f"{(int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK'):.0f} s of CPU so far"
        except (AttributeError, OSError, IndexError, ValueError):
            cpu = "CPU time unknown"
        try:
            probe = subprocess.run([*self.ssh_argv("-v", login=True), "true"], stdin=subprocess.DEVNULL,  # -v after -q wins
                                   capture_output=True, text=True, timeout=60)
            ssh_tail = "\n".join(probe.stderr.splitlines()[-6:])
        except subprocess.TimeoutExpired as expired:
            err = expired.stderr.decode(errors="replace") if isinstance(expired.stderr, bytes) else (expired.stderr or "")
            ssh_tail = "\n".join(err.splitlines()[-6:]) + "\n(still waiting after 60 s)"
        load = pathlib.Path("/proc/loadavg").read_text().split()[:3]
        return (f"QEMU pid {getattr(self.proc, 'pid', '?')}: {cpu}; machine load {' '.join(load)}\n"
                f"ssh -v (last lines):\n{ssh_tail}\nconsole:\n{self.console_tail()}")

    def console_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.console.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no console log)"

    # -- remote commands ---------------------------------------------------------------------------------------------
    def ssh_argv(self, *args: str, login: bool = False) -> list[str]:
        """ssh's command line for this VM up to the remote command: the shared connection, or a new login."""
        shared = ["-o", "ControlMaster=no", "-o", "ControlPath=none"] if login else \
            [*MULTIPLEX, "-o", f"ControlPath={self.workdir / (self.name + '.ssh')}"]
        return ["ssh", "-q", "-i", str(self.key), "-p", str(self.ssh_port), *SSH_OPTIONS, *shared, *args, "root@127.0.0.1"]

    def disconnect(self) -> None:
        """Close the shared SSH connection (the next command opens a new one): before the guest goes down, so no
        command waits on a connection to a guest that is gone."""
        subprocess.run(self.ssh_argv("-O", "exit"), stdin=subprocess.DEVNULL, capture_output=True, timeout=30)

    def ssh(self, command: str, check: bool = False, timeout: float = 300, login: bool = False) -> subprocess.CompletedProcess:
        """`command` over the shared connection; `login` opens a new SSH login instead (its own PAM session: what
        pam_limits gives a login now, which a connection opened earlier does not show)."""
        proc = subprocess.run([*self.ssh_argv(login=login), command], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{self.name}: `{command}` exited {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}")
        return proc

    def read(self, path: str) -> str:
        return self.ssh(f"cat {path}", check=True).stdout

    def write(self, path: str, content: str, mode: str = "0644") -> None:
        proc = subprocess.run([*self.ssh_argv(), f"install -D -m {mode} /dev/stdin {path}"], input=content, capture_output=True,
                              text=True, timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"{self.name}: cannot write {path}: {proc.stderr.strip()}")

    def interface(self, mac: str) -> str:
        """The kernel's name for the NIC with this MAC (predictable names depend on the PCI slot)."""
        out = self.ssh(f"for i in /sys/class/net/*; do [ \"$(cat $i/address)\" = {mac} ] && basename $i; done; true", check=True).stdout.split()
        if not out:
            raise RuntimeError(f"{self.name}: no interface with MAC {mac}")
        return out[0]


def keypair(workdir: pathlib.Path) -> pathlib.Path:
    key = workdir / "id_ed25519"
    if not key.exists():
        workdir.mkdir(parents=True, exist_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


def cleanup(workdir: pathlib.Path, vms: list[VM]) -> None:
    for vm in vms:
        vm.kill()
    shutil.rmtree(workdir, ignore_errors=True)
