from __future__ import annotations

import functools
import pathlib

import yaml

from hicachectl import rules
from hicachectl.config import inventory
from hicachectl.plans import sglang_server


@functools.cache
def _host_vars(name: str) -> tuple[str, dict]:
    inv = inventory.load(name)
    host, variables = next(iter(inv.hosts.items()))
    return host, variables


def profile_vars(name: str) -> dict:
    """A shipped profile's group variables, as written (inventories/<name>/group_vars/all.yml)."""
    import pathlib

    import yaml

    return yaml.safe_load((pathlib.Path(__file__).resolve().parents[1] / "inventories" / name / "group_vars" / "all.yml").read_text())


def filled_in(group_vars: dict) -> dict:
    """A shipped profile's variables with its documentation placeholders filled in, as an operator must before
    validate or any command that reaches hosts accepts them (render reads the profile as it is)."""
    fills = {"vast-vip.example.com": "vast-vip.corp.net", "netapp-lif.example.com": "netapp-lif.corp.net", "192.0.2.": "10.20.0."}
    out = {}
    for name, value in group_vars.items():
        if isinstance(value, str):
            for placeholder, own in fills.items():
                value = value.replace(placeholder, own)
        out[name] = value
    return out


def deployment(name: str, **overrides):
    """The first host of a shipped inventory, with variables overridden; must be valid."""
    host, variables = _host_vars(name)
    merged = {**variables, **{f"hicache_{k}": v for k, v in overrides.items()}}
    d, findings = rules.check_host(host, merged)
    assert d is not None and not rules.has_errors(findings), [f.format() for f in findings]
    return d


def rendered(d) -> dict[str, str]:
    return {f.name: f.content for f in sglang_server.files(d)}


SEED_EXACT = {"enable_metrics": False, "enable_cache_report": False}


# Host facts as hicache_host_facts reports them: a host with everything the vast profile needs, and a bare one.
FULL = {
    "os": {"id": "ubuntu", "version_id": "22.04", "pretty": "Ubuntu 22.04.4 LTS"}, "kernel": "5.15.0-105-generic", "python": "3.10.12",
    "tools": {"mount.nfs": "/usr/sbin/mount.nfs", "docker": "/usr/bin/docker", "nvidia-ctk": "/usr/bin/nvidia-ctk"},
    "kernel_modules": {"nfs": {"loaded": True, "available": True}, "rpcrdma": {"loaded": True, "available": True}},
    "filesystems": ["ext4", "nfs", "nfs4"],
    "interfaces": [{"name": "ens1f0np0", "driver": "mlx5_core"}, {"name": "ens2f0np0", "driver": "mlx5_core"}],
    "rdma_devices": ["mlx5_0", "mlx5_1"], "vastnfs_version": "4.0.30",
    "gpus": {"count": 8, "names": [f"GPU {i}: NVIDIA B200" for i in range(8)], "error": None},
    "runtime_engines": {"docker": {"answers": True, "detail": "27.3.1"}},
    "mem_total_gb": 2100.0, "disk": {"path": "/root", "free_gb": 500.0}, "block_ids": {"UUID=1234-abcd": "/dev/nvme1n1"},
}
# This machine's kind: no GPU, no RDMA, no NFS client, no container runtime.
BARE = {"os": {"id": "debian", "version_id": "12"}, "kernel": "6.1.0", "python": "3.11.2", "tools": {}, "kernel_modules": {},
        "filesystems": ["ext4", "tmpfs"], "interfaces": [{"name": "eth0", "driver": "virtio_net"}], "rdma_devices": [],
        "gpus": {"count": 0, "names": [], "error": None}, "runtime_engines": {}, "mem_total_gb": 8.0,
        "disk": {"path": "/", "free_gb": 50.0}, "block_ids": {}}
NFS_ITEMS = ("connectx", "rdma", "nfs_client", "rpcrdma")


# /metrics samples with the label sets SGLang gives its storage metrics (tests/unit/ops/test_metrics.py says where).
def storage(name, value, backend="file", tp=0, dp=0, pp=0, pp_size=1, cp=0, cp_size=1, **extra):
    labels = {"storage_backend": backend, "tp_rank": tp, "dp_rank": dp, "pp_rank": pp, "pp_size": pp_size,
              "attn_cp_rank": cp, "attn_cp_size": cp_size, **extra}
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "} " + f"{float(value)}\n"


def server(name, value, tp_size=1, pp_size=1, cp_size=1, dp_size=1, per_dp=None):
    """What one server exports: every TP x PP x attention-CP rank of every DP rank logs its DP rank's tokens."""
    return "".join(storage(name, (per_dp or [value] * dp_size)[dp], tp=tp, dp=dp, pp=pp, pp_size=pp_size, cp=cp, cp_size=cp_size)
                   for dp in range(dp_size) for pp in range(pp_size) for cp in range(cp_size) for tp in range(tp_size))


# The io_uring fallback of roles/sglang_server/tasks/service.yml: the pattern it matches in the server's log.
SERVICE = pathlib.Path(__file__).resolve().parent.parent / "roles" / "sglang_server" / "tasks" / "service.yml"


def _find(node, key):
    if isinstance(node, dict):
        if key in node:
            return node[key]
        node = list(node.values())
    if isinstance(node, list):
        for item in node:
            found = _find(item, key)
            if found is not None:
                return found
    return None


def fallback_pattern() -> str:
    pattern = _find(yaml.safe_load(SERVICE.read_text()), "__hicache_server_uring_failure")
    assert isinstance(pattern, str), "service.yml names its fallback pattern __hicache_server_uring_failure"
    return pattern


# proc(5): /proc/<pid>/limits, laid out as the kernel prints it (fs/proc/base.c proc_pid_limits, "%-25s %-20s %-20s
# %-10s" rows under a header of the same widths), with the given memlock.
def proc_limits(memlock_soft: str = "8388608", memlock_hard: str = "8388608") -> str:
    rows = [("Limit", "Soft Limit", "Hard Limit", "Units"), ("Max cpu time", "unlimited", "unlimited", "seconds"),
            ("Max stack size", "8388608", "unlimited", "bytes"), ("Max open files", "1048576", "1048576", "files"),
            ("Max locked memory", memlock_soft, memlock_hard, "bytes"), ("Max nice priority", "0", "0", "")]
    return "".join(f"{name:<25} {soft:<20} {hard:<20} {units:<10}\n" for name, soft, hard, units in rows)


def load_plugin(relative: str):
    """A file of the collection (plugins/modules/x.py, plugins/filter/x.py) as a Python module, as Ansible loads it."""
    import importlib.util

    from support import ROOT

    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
