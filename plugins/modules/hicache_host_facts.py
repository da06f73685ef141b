#!/usr/bin/python
# Copyright: hicache-deploy developers
# SPDX-License-Identifier: Apache-2.0
"""Read (never change) what a GPU host has: OS, kernel, GPUs, NICs, RDMA, NFS client, tools, memory, disk.

The judgement of these facts against an inventory lives on the controller (hicachectl/plans/preflight.py);
this module only looks, so it is safe in check mode and on any host.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: hicache_host_facts
short_description: Read what a GPU host has for hicache-deploy
description:
  - Reads the OS, kernel, Python, tools, kernel modules, filesystems, network interfaces, RDMA devices, the VAST NFS bundle,
    GPUs, container engines, memory, free disk, the sunrpc slot table, systemd and the block devices behind C(UUID=)/C(LABEL=) names.
  - Changes nothing on the host, so it runs the same in check mode.
  - The judgement of these facts against an inventory is done on the controller (hicachectl's preflight), not here.
options:
  disk_path:
    description: Report free space of the filesystem holding this path (its nearest existing parent).
    type: str
    default: /
  reads:
    description:
      - What to read besides the usual, as the filter C(hicache.deploy.hicache_host_reads) asks for it (one request, so
        that the plan behind it is made once per task).
    type: dict
    default: {}
    suboptions:
      files:
        description: Files whose text to report in RV(hicache_host.files) (null for a file that does not exist), e.g. the server's deployed.json.
        type: list
        elements: str
        default: []
      units:
        description: systemd units whose C(LoadState), C(LimitMEMLOCK) and running limits to report in RV(hicache_host.units) (where systemd runs).
        type: list
        elements: str
        default: []
      backups_of:
        description:
          - Files whose backups (C(FILE.PID.YYYY-MM-DD@HH:MM:SS~), as Ansible's backup option names them) to report in
            RV(hicache_host.backups), each with whether its first lines hold O(reads.backup_marker). No backup's text leaves the
            host (an operator's own file may hold anything).
        type: list
        elements: str
        default: []
      backup_marker:
        description: The text whose presence in a backup's first three lines RV(hicache_host.backups) reports.
        type: str
        default: ""
      nic_read:
        description:
          - Run the NIC tuning program installed at O(reads.nic_read.program) with C(--check-json) O(reads.nic_read.desired), read-only, as
            the nic_tuning role runs it, and report its result in RV(hicache_host.nic_read); only where the file's SHA-256 is
            O(reads.nic_read.sha256) (the collection's program), else RV(hicache_host.nic_read) is null.
        type: dict
        suboptions:
          program:
            description: The program's path.
            type: str
            required: true
          sha256:
            description: The SHA-256 the program must have.
            type: str
            required: true
          desired:
            description: The desired state, JSON.
            type: str
            required: true
notes:
  - Supports check mode.
author: hicache-deploy developers (@hicache-deploy)
"""

EXAMPLES = r"""
- name: Read what the host has
  hicache.deploy.hicache_host_facts:
    disk_path: /var/lib/hicache
  register: host_facts

- name: Read what the host has, with the text of the server's deployed.json and docker.service's memlock
  hicache.deploy.hicache_host_facts:
    reads:
      files: [/opt/sglang-hicache/cfg/deployed.json]
      units: [docker.service]
  register: host_facts

- name: Show the GPUs
  ansible.builtin.debug:
    msg: "{{ host_facts.hicache_host.gpus.count }} GPUs: {{ host_facts.hicache_host.gpus.names }}"
"""

RETURN = r"""
hicache_host:
  description: The facts.
  returned: always
  type: dict
  contains:
    os:
      description: C(ID), C(VERSION_ID) and C(PRETTY_NAME) of /etc/os-release as C(id), C(version_id) and C(pretty).
      type: dict
      sample: {id: ubuntu, version_id: "22.04", pretty: Ubuntu 22.04.4 LTS}
    kernel:
      description: The running kernel's release.
      type: str
      sample: 5.15.0-105-generic
    python:
      description: The version of the Python the module ran with.
      type: str
      sample: 3.10.12
    tools:
      description: Each tool hicache-deploy may use (nvidia-smi, ethtool, mount.nfs, docker, podman, ...) with its path, or null when absent.
      type: dict
      sample: {nvidia-smi: /usr/bin/nvidia-smi, podman: null}
    kernel_modules:
      description: For each kernel module hicache-deploy may need, whether it is C(loaded) and whether it is C(available) to the running kernel.
      type: dict
      sample: {nfs: {loaded: true, available: true}, rpcrdma: {loaded: false, available: true}}
    filesystems:
      description: The filesystem types the kernel knows (/proc/filesystems).
      type: list
      elements: str
    interfaces:
      description: The network interfaces with driver, PCI vendor and address, MTU, NUMA node, local CPUs, state, speed and IP C(addresses).
      type: list
      elements: dict
    rdma_devices:
      description: The RDMA devices (/sys/class/infiniband).
      type: list
      elements: str
    vastnfs_version:
      description: The VAST NFS bundle version of the loaded sunrpc module, or null.
      type: str
    vastnfs_installed:
      description: >-
        Whether the sunrpc module modprobe would load is VAST's (modinfo lists its nfs_bundle_version parameter),
        before it is loaded; null without modinfo.
      type: bool
    gpus:
      description: C(count) and C(names) of the GPUs C(nvidia-smi -L) lists, and its C(error) (null when it answered).
      type: dict
    runtime_engines:
      description: For docker and podman, null when the client is absent, else whether its engine C(answers) and a C(detail).
      type: dict
    mem_total_gb:
      description: Total memory in GB.
      type: float
    disk:
      description: The existing C(path) checked for O(disk_path) and its C(free_gb).
      type: dict
    sunrpc_sysctl:
      description: The sunrpc C(tcp_slot_table_entries), or null.
      type: str
    rdma_slot_table_entries:
      description: xprtrdma's C(sunrpc.rdma_slot_table_entries), or null while rpcrdma is not loaded.
      type: str
    rp_filter:
      description: Reverse-path filtering of each interface and of C(all) and C(default) (/proc/sys/net/ipv4/conf/*/rp_filter).
      type: dict
    nfsrahead_udev_rule:
      description: The udev rule file that runs nfsrahead when an NFS mount appears, or null.
      type: str
    udevd_running:
      description: Whether udevd runs (/run/udev/control), without which no udev rule runs.
      type: bool
    systemd:
      description: Whether systemd runs the host.
      type: bool
    files:
      description: The text of each file of O(reads.files), or null when it does not exist.
      type: dict
    units:
      description:
        - For each unit of O(reads.units), its C(LoadState), C(LimitMEMLOCK) and C(MainPID) as systemctl shows them, and, while
          it runs, C(limits), the text of its C(/proc/<MainPID>/limits) (what its children inherit now).
      type: dict
      sample: {docker.service: {LoadState: loaded, LimitMEMLOCK: infinity, MainPID: "812", limits: "Limit  Soft Limit ..."}}
    backups:
      description: Each backup of a file of O(reads.backups_of) found beside it, and whether its first lines hold O(reads.backup_marker).
      type: dict
      sample: {"/opt/sglang-hicache/cfg/start.sh.4242.2026-12-01@10:00:00~": true}
    fstab_hicache_block:
      description: Whether /etc/fstab holds the block the storage role writes (C(# BEGIN hicache-deploy L3 tier)).
      type: bool
    nixl_uring_failed:
      description: Whether NIXL failed to create its io_uring backend on this host before (/etc/hicache/nixl-uring-unavailable).
      type: bool
    mountinfo:
      description: The text of /proc/self/mountinfo when the facts were read (the storage role compares its mount with it).
      type: str
    nic_read:
      description:
        - C(rc), C(stdout) and C(stderr) of the NIC tuning program's read (O(reads.nic_read)) and the C(desired) state it
          read with, or null when not run.
      type: dict
    block_ids:
      description: C(UUID=...), C(LABEL=...), C(PARTUUID=...) and C(PARTLABEL=...) names with the device each resolves to.
      type: dict
      sample: {"UUID=1234-abcd": /dev/nvme1n1}
"""

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys

from ansible.module_utils.basic import AnsibleModule

TOOLS = ("nvidia-smi", "ethtool", "mlnx_qos", "setpci", "lspci", "mount.nfs", "nfsrahead", "docker", "podman",
         "nvidia-ctk", "nvidia-container-runtime", "ip", "sysctl", "hf")
TOOL_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/libexec")
# Written by the sglang_server role when NIXL could not create its io_uring backend here (it falls back to posix_aio).
URING_MARKER = "/etc/hicache/nixl-uring-unavailable"
FSTAB_BLOCK = "# BEGIN hicache-deploy L3 tier"  # the storage role's blockinfile marker
KERNEL_MODULES = ("nfs", "nfsv3", "nfsv4", "rpcrdma", "sunrpc", "mlx5_core", "mlx5_ib", "nvidia")


def read(path, default=None):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return default


def read_exact(path):
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return None


def which(tool):
    found = shutil.which(tool)
    if found:
        return found
    for directory in TOOL_DIRS:
        candidate = os.path.join(directory, tool)
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def os_release():
    out = {}
    for line in (read("/etc/os-release", "") or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key] = value.strip().strip('"')
    return {"id": out.get("ID"), "version_id": out.get("VERSION_ID"), "pretty": out.get("PRETTY_NAME")}


def kernel_modules(release):
    """Loaded (/sys/module) or installable (listed in modules.dep) for the running kernel."""
    loaded = set(os.listdir("/sys/module")) if os.path.isdir("/sys/module") else set()
    available = set()
    dep = read(f"/lib/modules/{release}/modules.dep", "") or ""
    for line in dep.splitlines():
        name = os.path.basename(line.split(":", 1)[0]).split(".ko", 1)[0].replace("-", "_")
        available.add(name)
    builtin = read(f"/lib/modules/{release}/modules.builtin", "") or ""
    for line in builtin.splitlines():
        available.add(os.path.basename(line).split(".ko", 1)[0].replace("-", "_"))
    return {m: {"loaded": m in loaded, "available": m in loaded or m in available} for m in KERNEL_MODULES}


def interfaces():
    out = []
    addresses = interface_addresses()
    base = "/sys/class/net"
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        device = os.path.join(base, name, "device")
        driver = os.path.basename(os.path.realpath(os.path.join(device, "driver"))) if os.path.exists(os.path.join(device, "driver")) else None
        out.append({
            "name": name,
            "driver": driver,
            "pci_vendor": read(os.path.join(device, "vendor")),
            "pci_address": os.path.basename(os.path.realpath(device)) if os.path.exists(device) else None,
            "mtu": int(read(os.path.join(base, name, "mtu"), "0") or 0),
            "numa_node": read(os.path.join(device, "numa_node")),
            "local_cpulist": read(os.path.join(device, "local_cpulist")),
            "operstate": read(os.path.join(base, name, "operstate")),
            "speed_mbps": read(os.path.join(base, name, "speed")),
            "addresses": addresses.get(name, []),
        })
    return out


def interface_addresses():
    """{interface: [address, ...]} from `ip -j address` (iproute2), {} where it cannot run."""
    ip = which("ip")
    if not ip:
        return {}
    try:
        proc = subprocess.run([ip, "-j", "address", "show"], capture_output=True, text=True, timeout=10, check=False)  # a failure is reported as no addresses
        links = json.loads(proc.stdout or "[]") if proc.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return {}
    return {link.get("ifname"): [a.get("local") for a in link.get("addr_info") or [] if a.get("local")] for link in links}


def rp_filter():
    """Reverse-path filtering per interface, and `all` and `default` (/proc/sys/net/ipv4/conf/*/rp_filter)."""
    base = "/proc/sys/net/ipv4/conf"
    return {name: read(os.path.join(base, name, "rp_filter")) for name in sorted(os.listdir(base))} if os.path.isdir(base) else {}


UDEV_RULE_DIRS = ("/etc/udev/rules.d", "/run/udev/rules.d", "/usr/lib/udev/rules.d", "/lib/udev/rules.d")


def nfsrahead_udev_rule():
    """The udev rule file that runs nfsrahead for a new NFS bdi (nfs-utils ships 99-nfs.rules), or None."""
    for directory in UDEV_RULE_DIRS:
        for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
            if name.endswith(".rules") and "nfsrahead" in (read(os.path.join(directory, name), "") or ""):
                return os.path.join(directory, name)
    return None


def vastnfs_installed(module):
    """Whether the sunrpc module that modprobe would load is VAST's (vastnfs' bundle/net/sunrpc/sunrpc_syms.c declares the
    module_param_string nfs_bundle_version, which modinfo lists as a parmtype), before anything loaded it."""
    modinfo = module.get_bin_path("modinfo")
    if not modinfo:
        return None
    rc, out, dummy = module.run_command([modinfo, "-F", "parmtype", "sunrpc"])
    if rc != 0:
        return False
    return any(line.startswith("nfs_bundle_version:") for line in out.splitlines())


def gpus(nvidia_smi):
    if not nvidia_smi:
        return {"count": 0, "names": [], "error": None}
    try:
        proc = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=30, check=False)  # a failure is reported, not raised
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"count": 0, "names": [], "error": str(exc)}
    names = [line for line in proc.stdout.splitlines() if line.startswith("GPU ")]
    return {"count": len(names), "names": names, "error": None if proc.returncode == 0 else proc.stderr.strip()[:300]}


ENGINE_PROBES = {"docker": ["version", "--format", "{{.Server.Version}}"], "podman": ["info", "--format", "{{.Version.Version}}"]}


def engine(client, probe):
    """Whether a runtime's engine answers: a Docker client without its daemon runs no container."""
    if not client:
        return None
    try:
        proc = subprocess.run([client, *probe], capture_output=True, text=True, timeout=20, check=False)  # a failure is reported, not raised
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"answers": False, "detail": str(exc)[:300]}
    text = (proc.stdout if proc.returncode == 0 else proc.stderr).strip()
    return {"answers": proc.returncode == 0, "detail": text.splitlines()[-1][:300] if text else ""}


BLOCK_ID_DIRS = {"UUID": "/dev/disk/by-uuid", "LABEL": "/dev/disk/by-label", "PARTUUID": "/dev/disk/by-partuuid",
                 "PARTLABEL": "/dev/disk/by-partlabel"}


def block_ids(dirs=None):
    """{'UUID=1234-abcd': '/dev/nvme1n1', 'LABEL=kv': ...} from udev's /dev/disk/by-* links, so a mount
    source written as UUID=/LABEL= can be compared with the device /proc/self/mountinfo names.
    udev writes unsafe characters of a label as \\xNN."""
    out = {}
    for kind, directory in (dirs or BLOCK_ID_DIRS).items():
        for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
            value = re.sub(r"\\x([0-9a-fA-F]{2})", lambda m: chr(int(m.group(1), 16)), name)
            out[f"{kind}={value}"] = os.path.realpath(os.path.join(directory, name))
    return out


def meminfo_gb():
    for line in (read("/proc/meminfo", "") or "").splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) * 1024 / 1e9, 1)
    return None


def free_gb(path):
    while path and not os.path.exists(path):
        path = os.path.dirname(path.rstrip("/")) or "/"
    usage = shutil.disk_usage(path or "/")
    return {"path": path, "free_gb": round(usage.free / 1e9, 1)}


BACKUP_SUFFIX = re.compile(r"\.\d+\.\d{4}-\d{2}-\d{2}@\d{2}:\d{2}:\d{2}~$")  # ansible.module_utils.basic backup_local's


def backups(paths, marker):
    """{backup: whether its first three lines (4 KiB at most) hold `marker`} for each backup Ansible's backup option
    left beside a file of `paths`. Only that answer leaves the host, never a backup's text."""
    found = {}
    for path in paths:
        folder, name = os.path.split(path)
        try:
            entries = os.listdir(folder)
        except OSError:
            continue
        for entry in entries:
            if entry.startswith(name + ".") and BACKUP_SUFFIX.fullmatch(entry[len(name):]):
                try:
                    with open(os.path.join(folder, entry), errors="replace") as handle:
                        head = "".join(handle.readline(4096) for dummy in range(3))
                    found[os.path.join(folder, entry)] = bool(marker) and marker in head
                except OSError:
                    continue
    return found


def unit_properties(module, units, systemd):
    """LoadState, LimitMEMLOCK and MainPID of each unit (systemctl show) and, while it runs, the text of its process's
    /proc/<pid>/limits (judged on the controller: hicachectl/plans/host_limits.py parse_limits); {} without systemd."""
    systemctl = module.get_bin_path("systemctl") if systemd else None
    found = {}
    for unit in units if systemctl else ():
        rc, out, dummy = module.run_command([systemctl, "show", "-p", "LoadState,LimitMEMLOCK,MainPID", unit])
        found[unit] = dict(line.split("=", 1) for line in out.splitlines() if "=" in line) if rc == 0 else {}
        pid = found[unit].get("MainPID", "0")
        if pid.isdigit() and int(pid) > 0:
            try:
                with open(f"/proc/{pid}/limits", encoding="utf-8") as limits:
                    found[unit]["limits"] = limits.read()
            except OSError:  # the process ended between the two reads
                pass
    return found


def nic_read(module, request):
    """The NIC tuning program's read-only report (--check-json) as the role's own read gets it (rc, stdout, stderr), run
    from its installed file where that is the program asked for (its SHA-256); None otherwise (the role reads itself)."""
    if not request:
        return None
    try:
        with open(request["program"], "rb") as program:
            if hashlib.sha256(program.read()).hexdigest() != request["sha256"]:
                return None
    except OSError:
        return None
    # python3 as the role's own read and the boot unit run it (the module's interpreter may be another one, set in the
    # inventory); -I: nothing from the working directory, the program's directory or PYTHON* variables is imported as root
    python = module.get_bin_path("python3")
    if not python:
        return None
    rc, out, err = module.run_command([python, "-I", request["program"], "--check-json", request["desired"]])
    return {"rc": rc, "stdout": out, "stderr": err, "desired": request["desired"]}


def main():
    reads = {"files": {"type": "list", "elements": "str", "default": []},
             "units": {"type": "list", "elements": "str", "default": []},
             "backups_of": {"type": "list", "elements": "str", "default": []},
             "backup_marker": {"type": "str", "default": ""},
             "nic_read": {"type": "dict", "options": {"program": {"type": "str", "required": True},
                                                      "sha256": {"type": "str", "required": True},
                                                      "desired": {"type": "str", "required": True}}}}
    module = AnsibleModule(argument_spec={"disk_path": {"type": "str", "default": "/"},
                                          "reads": {"type": "dict", "default": {}, "options": reads}},
                           supports_check_mode=True)
    reads = module.params["reads"]
    systemd = os.path.isdir("/run/systemd/system")
    release = platform.release()
    tools = {tool: which(tool) for tool in TOOLS}
    facts = {
        "os": os_release(),
        "kernel": release,
        "python": ".".join(map(str, sys.version_info[:3])),
        "tools": tools,
        "kernel_modules": kernel_modules(release),
        "filesystems": sorted({line.split()[-1] for line in (read("/proc/filesystems", "") or "").splitlines() if line.strip()}),
        "interfaces": interfaces(),
        "rdma_devices": sorted(os.listdir("/sys/class/infiniband")) if os.path.isdir("/sys/class/infiniband") else [],
        "vastnfs_version": read("/sys/module/sunrpc/parameters/nfs_bundle_version"),
        "vastnfs_installed": vastnfs_installed(module),
        "gpus": gpus(tools["nvidia-smi"]),
        "runtime_engines": {name: engine(tools[name], probe) for name, probe in ENGINE_PROBES.items()},
        "mem_total_gb": meminfo_gb(),
        "disk": free_gb(module.params["disk_path"]),
        "sunrpc_sysctl": read("/proc/sys/sunrpc/tcp_slot_table_entries"),
        "rdma_slot_table_entries": read("/proc/sys/sunrpc/rdma_slot_table_entries"),
        "rp_filter": rp_filter(),
        "nfsrahead_udev_rule": nfsrahead_udev_rule(),
        "udevd_running": os.path.exists("/run/udev/control"),
        "systemd": systemd,
        "files": {path: read_exact(path) for path in reads["files"]},
        "units": unit_properties(module, reads["units"], systemd),
        "backups": backups(reads["backups_of"], reads["backup_marker"]),
        "mountinfo": read("/proc/self/mountinfo", ""),
        "nixl_uring_failed": os.path.exists(URING_MARKER),
        # Whether /etc/fstab holds the storage role's block; never fstab itself (it may hold a CIFS password=).
        "fstab_hicache_block": FSTAB_BLOCK in (read("/etc/fstab", "") or ""),
        "block_ids": block_ids(),
        "nic_read": nic_read(module, reads["nic_read"]),
    }
    module.exit_json(changed=False, hicache_host=facts)


if __name__ == "__main__":
    main()
