"""The VM test bed: a storage VM playing the VAST/NetApp cluster and a client VM playing a GPU host, both Debian's own
kernel under QEMU (tests/infra/vm.py), joined by two point-to-point storage links with Soft-RoCE (rdma_rxe) on each end.

What is real here: the kernel's NFS client and server, NFS over RDMA (xprtrdma/svcrdma over rxe), module loading,
udev (nfsrahead's rule), systemd boots and reboots, sysctl.d, fstab and its mount units. What is a stand-in, and named
as such in the guests: `testbed-rxe.service` gives each storage port an RDMA device, as a ConnectX port's mlx5_ib would.
Addresses are 198.18.0.0/15 (RFC 2544's benchmarking range), on links that exist only between these two VMs.
"""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import socket
import subprocess
import sys
import textwrap

import yaml

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "tests" / "infra"))
import vm as vmlib  # noqa: E402

ANSIBLE_PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
EXPORT = "/srv/l3"
LINKS = (("198.18.1.1", "198.18.1.2"), ("198.18.2.1", "198.18.2.2"))  # (storage, client) per link


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rxe_unit(interfaces: list[str]) -> str:
    # The unit waits for the ports itself rather than through their device units: a device job fails after systemd's
    # default 90 s, and a TCG guest on a loaded machine can take longer than that to coldplug its NICs (seen here with
    # the machine's cores busy: the job timed out and the boot went on without RDMA devices; a CI run's fstab mount
    # failed after a reboot with "Protocol error", what xprtrdma reports when no RDMA device answers for the address).
    # `$$` is a literal `$` for the shell: systemd expands `$name` in ExecStart= itself.
    ports = " ".join(interfaces)
    add = (f"for port in {ports}; do "
           "for i in $$(seq 900); do [ -e /sys/class/net/$$port ] && break; sleep 1; done; "
           "rdma link show rxe_$$port >/dev/null 2>&1 || rdma link add rxe_$$port type rxe netdev $$port || exit 1; done")
    return textwrap.dedent(f"""\
        # Test bed stand-in for ConnectX hardware: a Soft-RoCE (rdma_rxe) device on each storage port, as mlx5_ib
        # gives a ConnectX port one at boot. Not part of hicache-deploy.
        [Unit]
        Description=Test bed: Soft-RoCE devices on the storage ports
        DefaultDependencies=no
        Wants=network-pre.target
        Before=network-pre.target remote-fs-pre.target nfs-server.service
        After=systemd-modules-load.service systemd-udevd.service

        [Service]
        Type=oneshot
        RemainAfterExit=yes
        TimeoutStartSec=1000
        ExecStart=/sbin/modprobe rdma_rxe
        ExecStart=/bin/sh -c '{add}'

        [Install]
        WantedBy=multi-user.target
        """)


class Bed:
    def __init__(self, workdir: pathlib.Path):
        self.workdir = workdir
        self.key = vmlib.keypair(workdir)
        ports = [(_free_udp_port(), _free_udp_port()) for _ in LINKS]
        self.storage = vmlib.VM("hicache-l3", workdir, self.key, _free_tcp_port(),
                                [vmlib.Link(f"52:54:00:10:00:0{i + 1}", a, b) for i, (a, b) in enumerate(ports)])
        self.client = vmlib.VM("hicache-gpu1", workdir, self.key, _free_tcp_port(),
                               [vmlib.Link(f"52:54:00:20:00:0{i + 1}", b, a) for i, (a, b) in enumerate(ports)])
        self.vms = [self.storage, self.client]

    def up(self) -> Bed:
        image = vmlib.image()
        for vm in self.vms:
            vm.create(image).start()
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda vm: vm.wait_ssh(), self.vms))
        self.storage_ports = [self.storage.interface(link.mac) for link in self.storage.links]
        self.client_ports = [self.client.interface(link.mac) for link in self.client.links]
        for vm, ports, side in ((self.storage, self.storage_ports, 0), (self.client, self.client_ports, 1)):
            for port, link in zip(ports, LINKS, strict=True):
                vm.write(f"/etc/systemd/network/20-{port}.network",
                         f"# Test bed: a storage link.\n[Match]\nName={port}\n\n[Network]\nAddress={link[side]}/24\nLinkLocalAddressing=no\n")
            vm.write("/etc/systemd/system/testbed-rxe.service", _rxe_unit(ports))
            vm.ssh("systemctl daemon-reload && systemctl enable --now testbed-rxe.service && networkctl reload", check=True)
        self.storage.write("/etc/exports", f"{EXPORT} 198.18.0.0/15(rw,sync,no_root_squash,no_subtree_check,insecure)\n")
        self.storage.write("/etc/nfs.conf.d/testbed-rdma.conf", "[nfsd]\nrdma=y\nrdma-port=20049\nvers3=y\nvers4.1=y\n")
        self.storage.ssh(f"mkdir -p {EXPORT} && systemctl enable --now nfs-server.service", check=True)
        for vm in self.vms:
            vm.ssh("for i in $(seq 60); do networkctl status >/dev/null; "
                   "[ $(ip -4 -o addr show | grep -c 'inet 198.18.') -ge 2 ] && exit 0; sleep 1; done; exit 1", check=True)
        return self

    def down(self) -> None:
        vmlib.cleanup(self.workdir, self.vms)

    # -- Ansible against the client ---------------------------------------------------------------------------------
    def inventory(self, name: str, variables: dict) -> pathlib.Path:
        return vm_inventory(self.workdir / f"{name}.yml", self.client, self.key, variables)

    def play(self, inventory: pathlib.Path, tasks: list[dict], check: bool = False, verbose: bool = False) -> subprocess.CompletedProcess:
        """ansible-playbook on the client VM; `verbose` (-v) shows each task's result, the roles' notes among them."""
        return run_play(self.workdir / "play.yml", inventory, tasks, check=check, verbose=verbose)


def vm_inventory(path: pathlib.Path, vm, key: pathlib.Path, variables: dict) -> pathlib.Path:
    """An inventory of one VM, reached over its SSH forward on 127.0.0.1, with `variables` for all."""
    host = {"ansible_host": "127.0.0.1", "ansible_port": vm.ssh_port, "ansible_user": "root",
            "ansible_ssh_private_key_file": str(key), "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
            # Ansible's ConnectTimeout (10 s by default) for a guest a loaded machine starves (tests/infra/vm.py CONNECT_TIMEOUT)
            "ansible_ssh_timeout": vmlib.CONNECT_TIMEOUT}
    path.write_text(yaml.safe_dump({"all": {"hosts": {vm.name: host}, "vars": variables}}))
    return path


def run_play(playbook: pathlib.Path, inventory: pathlib.Path, tasks: list[dict], check: bool = False, verbose: bool = False,
             timeout: float = 1200) -> subprocess.CompletedProcess:
    """`tasks` as one play on the inventory's hosts, written to `playbook`, run by the real ansible-playbook."""
    playbook.write_text(yaml.safe_dump([{"name": "Test bed play", "hosts": "all", "gather_facts": False, "tasks": tasks}], sort_keys=False))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0",
           "ANSIBLE_HOST_KEY_CHECKING": "False", "ANSIBLE_STDOUT_CALLBACK": "default", "ANSIBLE_CALLBACK_RESULT_FORMAT": "yaml",
           "ANSIBLE_FACT_CACHING": "memory"}  # (an empty ANSIBLE_CALLBACKS_ENABLED breaks ansible-core 2.19)
    return subprocess.run([ANSIBLE_PLAYBOOK, "-i", str(inventory), str(playbook), *(["--check", "--diff"] if check else []), *(["-v"] if verbose else [])],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
