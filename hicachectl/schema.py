"""The catalogue of every public inventory variable: name, type, default, allowed values, meaning.

This is the one place a variable is declared. The deployment model reads defaults from here,
the rules check types and choices from here, and the roles' `meta/argument_specs.yml` are
generated from here (`python -m hicachectl.schema --write`; a test fails when they drift).
"""

from __future__ import annotations

import dataclasses
from typing import Any

# SGLang versions whose HiCache flags this catalogue was checked against (see reference §2).
SGLANG_VERSIONS = ("0.5.20", "0.5.21", "0.5.22", "0.5.23")

NO_DEFAULT = object()


@dataclasses.dataclass(frozen=True)
class Var:
    name: str
    type: str  # str, int, float, bool, list, dict
    default: Any
    doc: str
    choices: tuple | None = None
    role: str = "sglang_server"
    min_sglang: str | None = None  # first SGLang version that knows the flag or value
    flag: str | None = None  # the SGLang flag this variable renders, if any

    @property
    def required(self) -> bool:
        return self.default is NO_DEFAULT


def _v(*args, **kwargs) -> Var:
    return Var(*args, **kwargs)


VARIABLES: tuple[Var, ...] = (
    # --- where things live on the host -------------------------------------------------------
    _v("hicache_base_dir", "str", "/opt/sglang-hicache", "Working directory on the host; holds cfg/ by default."),
    _v("hicache_cfg_dir", "str", None, "Host directory for start.sh and backend config (default: <base_dir>/cfg). Mounted read-only at /cfg."),
    _v("hicache_model_dir", "str", None, "Host directory with the model weights, mounted read-only at hicache_model_path. None: no mount (hub id)."),
    _v("hicache_cache_dir", "str", None, "Host directory of the L3 tier (the storage mount point). Required for the file and nixl backends."),
    _v("hicache_cache_container_dir", "str", None, "Where the L3 directory appears inside the container (default: same path as on the host)."),
    # --- the container ------------------------------------------------------------------------
    _v("hicache_image", "str", NO_DEFAULT, "SGLang container image, pinned by tag or digest."),
    _v("hicache_sglang_version", "str", None, "SGLang version inside the image; read from the image tag (vX.Y.Z) when unset.", choices=SGLANG_VERSIONS),
    _v("hicache_container_name", "str", "sglang-hicache", "Name of the server container."),
    _v("hicache_image_mirror", "str", None, "Registry (host[:port]) to pull the image from instead of the one in its name; the image is tagged with its own name.", role="sglang_image"),
    _v("hicache_image_digest", "str", None, "sha256:... the image must have; pulled by digest, anything else is refused.", role="sglang_image"),
    _v("hicache_image_pull_retries", "int", 5, "Pull attempts before giving up (a registry can be briefly down).", role="sglang_image"),
    _v("hicache_image_pull_delay", "int", 10, "Seconds between pull attempts.", role="sglang_image"),
    _v("hicache_image_tls_verify", "bool", True, "Verify the registry's TLS certificate (podman's --tls-verify).", role="sglang_image"),
    _v("hicache_container_runtime", "str", "docker", "Container CLI on the host; none runs start.sh on the host itself (as the NetApp document does).",
       choices=("docker", "podman", "none")),
    _v("hicache_container_gpus", "str", "all", "Value of --gpus for the container."),
    _v("hicache_container_ulimits", "dict", {"memlock": -1, "stack": 67108864}, "--ulimit values (memlock -1 = unlimited; stack in bytes)."),
    _v("hicache_container_env", "dict", {}, "Extra environment for the container (e.g. SAFETENSORS_FAST_GPU: '1'); the backend's own variables are added for you."),
    _v("hicache_container_seccomp", "str", None, "--security-opt seccomp=...: a profile path, or unconfined; None keeps the runtime's default (Docker's blocks io_uring).", role="container_runtime"),
    _v("hicache_container_extra_args", "list", [], "Extra arguments for `docker run`, placed before the image."),
    _v("hicache_launcher", "list", ["python3", "-m", "sglang.launch_server"], "Command that start.sh execs, before the SGLang flags."),
    # --- the service -------------------------------------------------------------------------------
    _v("hicache_service_name", "str", "sglang-hicache", "systemd unit that runs the server (serve.sh)."),
    _v("hicache_serial", "int", 0, "Hosts per batch when a change rolls out (0: all at once); hicachectl passes it to the play.", role="site"),
    _v("hicache_max_fail_percentage", "int", 100, "A batch with more failed hosts than this stops the rollout (upgrade uses 0).", role="site"),
    _v("hicache_health_timeout", "int", 1800, "Seconds to wait for /health after a (re)start; big models load for 10+ minutes."),
    # --- SGLang: model and serving -------------------------------------------------------------
    _v("hicache_model_source", "str", None, "Where hicache_model_dir gets its weights: path (already there, checked) or hub (downloaded once); None: the server resolves hicache_model_path.",
       choices=("path", "hub"), role="model"),
    _v("hicache_model_repo", "str", None, "Hub repository to download (hicache_model_source: hub), e.g. nvidia/Llama-4-Maverick-17B-128E-Instruct-FP8.", role="model"),
    _v("hicache_model_revision", "str", None, "Hub revision of hicache_model_repo (branch, tag or commit; `hf download --revision`); None: the hub's default branch. A change downloads again.", role="model"),
    _v("hicache_model_hub_token", "str", None, "Hub token for gated models; keep it in Ansible Vault. Passed to the download only through its environment, never logged.", role="model"),
    _v("hicache_model_files", "dict", {}, "Files of the model (relative path: sha256) checked after download or on the shared path.", role="model"),
    _v("hicache_model_path", "str", NO_DEFAULT, "--model-path as the server sees it (a path in the container or a hub id).", flag="--model-path"),
    _v("hicache_served_model_name", "str", None, "--served-model-name; part of every L3 key, so keep it stable and without ':'.", flag="--served-model-name"),
    _v("hicache_host", "str", None, "--host (SGLang default 127.0.0.1).", flag="--host"),
    _v("hicache_port", "int", None, "--port (SGLang default 30000).", flag="--port"),
    _v("hicache_tp_size", "int", None, "--tp-size (tensor parallel ranks).", flag="--tp-size"),
    _v("hicache_pp_size", "int", None, "--pp-size (pipeline parallel).", flag="--pp-size"),
    _v("hicache_dp_size", "int", None, "--dp-size (data parallel).", flag="--dp-size"),
    _v("hicache_attn_cp_size", "int", None, "--attn-cp-size (attention context parallel).", flag="--attn-cp-size"),
    _v("hicache_enable_dp_attention", "bool", False, "--enable-dp-attention.", flag="--enable-dp-attention"),
    _v("hicache_mem_fraction_static", "float", None, "--mem-fraction-static.", flag="--mem-fraction-static"),
    _v("hicache_context_length", "int", None, "--context-length.", flag="--context-length"),
    _v("hicache_max_running_requests", "int", None, "--max-running-requests.", flag="--max-running-requests"),
    _v("hicache_page_size", "int", None, "--page-size in tokens; part of every L3 key.", flag="--page-size"),
    _v("hicache_chunked_prefill_size", "int", None, "--chunked-prefill-size; a multiple of the page size, or -1.", flag="--chunked-prefill-size"),
    # --- SGLang: HiCache ------------------------------------------------------------------------
    _v("hicache_size_gb", "int", None, "--hicache-size: host pool in GB per TP rank (overrides the ratio).", flag="--hicache-size"),
    _v("hicache_ratio", "float", None, "--hicache-ratio: host pool relative to the GPU pool.", flag="--hicache-ratio"),
    _v("hicache_host_memory_fraction", "float", None, "--hicache-host-memory-fraction, in (0, 1].", flag="--hicache-host-memory-fraction", min_sglang="0.5.21"),
    _v("hicache_host_memory_mode", "str", None, "--hicache-host-memory-mode.", choices=("cache", "buffer_only"), flag="--hicache-host-memory-mode"),
    _v("hicache_write_policy", "str", None, "--hicache-write-policy.", choices=("write_back", "write_through", "write_through_selective"), flag="--hicache-write-policy"),
    _v("hicache_io_backend", "str", None, "--hicache-io-backend.", choices=("direct", "kernel"), flag="--hicache-io-backend"),
    _v("hicache_mem_layout", "str", None, "--hicache-mem-layout.", choices=("layer_first", "page_first", "page_first_direct", "page_first_kv_split", "page_head"), flag="--hicache-mem-layout"),
    _v("hicache_storage_backend", "str", None, "--hicache-storage-backend (the L3 tier); None keeps HiCache at L2 only.", choices=("file", "nixl", "dynamic"), flag="--hicache-storage-backend"),
    _v("hicache_prefetch_policy", "str", None, "--hicache-storage-prefetch-policy.", choices=("best_effort", "wait_complete", "timeout"), flag="--hicache-storage-prefetch-policy"),
    _v("hicache_extra_config", "dict", {}, "--hicache-storage-backend-extra-config as a mapping: SGLang's keys, the backend's keys (NIXL plugin sections, dynamic backend module).",
       flag="--hicache-storage-backend-extra-config"),
    _v("hicache_extra_config_file", "str", None, "Write the extra config to this file name in cfg/ (.json, .toml, .yaml) and pass it as @/cfg/<name>; None passes inline JSON."),
    _v("hicache_nixl_plugin", "str", None, "SGLANG_HICACHE_NIXL_BACKEND_PLUGIN; used by SGLang only when hicache_extra_config has no 'plugin' section.", choices=("auto", "POSIX", "GDS_MT", "GDS", "3FS", "OBJ")),
    _v("hicache_skip_server_warmup", "bool", False, "--skip-server-warmup.", flag="--skip-server-warmup"),
    _v("hicache_enable_metrics", "bool", True, "--enable-metrics: needed to see L3 hits (verify, bench)."),
    _v("hicache_enable_cache_report", "bool", True, "--enable-cache-report: cached_tokens in every response (verify, bench)."),
    _v("hicache_extra_args", "list", [], "Further SGLang flags, appended as given (checked against the real parser by the conformance tests)."),
    # --- host facts the rules use -----------------------------------------------------------------
    _v("hicache_host_ram_gb", "int", None, "Host RAM in GB when known before deployment; the rules check the host pool against it.", role="preflight"),
    _v("hicache_host_ram_headroom_gb", "int", 64, "RAM kept free for the OS, the runtime and SGLang's own process beside the host pool.", role="preflight"),
    # --- sizing: the working set validate checks the host pool and the L3 tier against -------------------
    _v("hicache_model_config", "str", None, "The model's config.json (or its directory) on the controller; with it, validate checks the host pool and L3 capacity (see `hicachectl size`).", role="preflight"),
    _v("hicache_workload_context_tokens", "int", None, "Tokens per request the tiers must hold (default: hicache_context_length, else 131072).", role="preflight"),
    _v("hicache_workload_concurrency", "int", None, "Requests in flight the host pool must hold (default: hicache_max_running_requests, else 1).", role="preflight"),
    _v("hicache_workload_prefixes", "int", None, "Distinct prefixes the L3 tier must keep; checked against hicache_storage_capacity_gb.", role="preflight"),
    _v("hicache_storage_capacity_gb", "int", None, "Space of the L3 tier for this server's pages, in GB (1e9 bytes).", role="preflight"),
    _v("hicache_strict", "bool", True, "Fail when hardware, tools or a mount the inventory relies on are missing. false (a test bed): each gap is reported, the host shown degraded.", role="preflight"),
    _v("hicache_preflight_min_free_gb", "int", 10, "Free space the filesystem of hicache_base_dir must have.", role="preflight"),
    # --- the L3 storage mount ------------------------------------------------------------------
    _v("hicache_storage_type", "str", "local", "What holds the L3 directory.", choices=("vast", "netapp", "local"), role="storage"),
    _v("hicache_storage_server", "str", None, "NFS server (VAST VIP or DNS name, NetApp LIF).", role="storage"),
    _v("hicache_storage_export", "str", None, "NFS export path.", role="storage"),
    _v("hicache_storage_nconnect", "int", None, "nconnect connections per mount (VAST); refused for NetApp pNFS.", role="storage"),
    _v("hicache_storage_remoteports", "str", None, "VAST multipath remote ports: an IP range 'a-b', '~'-joined list, or 'dns'.", role="storage"),
    _v("hicache_storage_localports", "list", [], "VAST multipath local ports (IPs or interface names); needs rp_filter=0, which the storage role sets.", role="storage"),
    _v("hicache_storage_link_gbps", "int", None, "Line rate of one storage NIC port, for the nconnect sanity check.", role="storage"),
    _v("hicache_storage_rsize", "int", None, "rsize/wsize in bytes (NetApp over RDMA: at most 65536).", role="storage"),
    _v("hicache_storage_options", "list", [], "Further mount options, appended as given.", role="storage"),
    _v("hicache_storage_device", "str", None, "Local tier: a block device (or UUID=...) to mount at hicache_cache_dir; None uses the directory as it is.", role="storage"),
    _v("hicache_storage_fstype", "str", "xfs", "Local tier: filesystem of hicache_storage_device.", role="storage"),
    _v("hicache_storage_mount_timeout", "int", 60, "Seconds systemd waits for the mount at boot (x-systemd.mount-timeout); with nofail a storage outage never blocks boot.", role="storage"),
    _v("hicache_storage_read_ahead_kb", "int", 8192, "NFS read-ahead in KiB, persistent through nfsrahead (/etc/nfs.conf.d) and applied to the live mount.", role="storage"),
    _v("hicache_storage_sunrpc_slots", "int", 128, "sunrpc TCP slot table entries (module options and live sysctl).", role="storage"),
    _v("hicache_cache_owner", "str", "root", "Owner of hicache_cache_dir.", role="storage"),
    _v("hicache_cache_group", "str", "root", "Group of hicache_cache_dir.", role="storage"),
    _v("hicache_cache_mode", "str", "0755", "Mode of hicache_cache_dir.", role="storage"),
    # --- ConnectX-7 tuning for storage traffic ---------------------------------------------------------
    _v("hicache_nic_interfaces", "list", [], "Interfaces to tune; [] selects every ConnectX port (driver mlx5_core, PCI vendor 0x15b3).", role="nic_tuning"),
    _v("hicache_nic_mtu", "int", 9000, "MTU (jumbo frames end to end for NFS over RDMA).", role="nic_tuning"),
    _v("hicache_nic_rings", "int", 8192, "RX and TX ring size (ethtool -G), capped at the NIC's maximum.", role="nic_tuning"),
    _v("hicache_nic_channels", "int", None, "Combined channels (ethtool -L); None leaves them.", role="nic_tuning"),
    _v("hicache_nic_qos_trust", "str", "dscp", "RoCE QoS trust state (mlnx_qos --trust); None leaves it.", choices=("dscp", "pcp"), role="nic_tuning"),
    _v("hicache_nic_pfc_priorities", "list", [3], "Priorities with PFC on (mlnx_qos --pfc); [] leaves PFC.", role="nic_tuning"),
    _v("hicache_nic_ecn_priorities", "list", [3], "Priorities with RoCE ECN on (notification and reaction point).", role="nic_tuning"),
    _v("hicache_nic_irq_affinity", "bool", True, "Pin the NIC's IRQs to the CPUs of its NUMA node.", role="nic_tuning"),
    _v("hicache_nic_max_read_request", "int", None, "PCIe MaxReadReq in bytes (128-4096, a power of two); None leaves it.", role="nic_tuning"),
    _v("hicache_nic_cpu_governor", "str", "performance", "CPU frequency governor; None leaves it.", role="nic_tuning"),
    # --- host limits -------------------------------------------------------------------------------
    _v("hicache_limits_memlock", "str", "unlimited", "memlock for login sessions (limits.d) and the runtime service (LimitMEMLOCK); 'unlimited' or KiB.", role="host_limits"),
    _v("hicache_limits_runtime_service", "str", None, "systemd service of the container runtime that gets LimitMEMLOCK (default: docker.service with docker, none with podman).", role="host_limits"),
    _v("hicache_limits_restart_runtime", "bool", False, "Restart the runtime service when its limit changes; off by default because it stops running containers.", role="host_limits"),
    _v("hicache_host_sysctls", "dict", {}, "Further sysctls, persisted in /etc/sysctl.d/90-hicache.conf and applied.", role="host_limits"),
)

BY_NAME: dict[str, Var] = {v.name: v for v in VARIABLES}


def default_of(name: str) -> Any:
    """A fresh copy of a variable's default, so callers may mutate it."""
    import copy

    return copy.deepcopy(BY_NAME[name].default)


_ANSIBLE_TYPES = {"str": "str", "int": "int", "float": "float", "bool": "bool", "list": "list", "dict": "dict"}


def argument_specs(role: str) -> dict:
    """The `meta/argument_specs.yml` content for a role, from this catalogue."""
    options = {}
    for var in VARIABLES:
        if var.role != role:
            continue
        spec: dict[str, Any] = {"description": var.doc, "type": _ANSIBLE_TYPES[var.type]}
        if var.choices:
            spec["choices"] = list(var.choices)
        if var.required:
            spec["required"] = True
        if var.type == "list":
            spec["elements"] = "raw"
        options[var.name] = spec
    return {"argument_specs": {"main": {"short_description": f"hicache-deploy {role} role", "options": options}}}


README_START, README_END = "<!-- variables:start -->", "<!-- variables:end -->"


def variables_table() -> str:
    """The README's variable table (generated; see _main)."""
    def cell(value: Any) -> str:
        if value is NO_DEFAULT:
            return "**required**"
        return "" if value is None else f"`{value}`".replace("|", "\\|")

    rows = ["| variable | type | default | meaning |", "|---|---|---|---|"]
    for var in VARIABLES:
        choices = f" One of: {', '.join(map(str, var.choices))}." if var.choices else ""
        rows.append(f"| `{var.name}` | {var.type} | {cell(var.default)} | {var.doc}{choices} |".replace("\n", " "))
    return "\n".join(rows)


def _indented_dumper():
    import yaml

    class Dumper(yaml.SafeDumper):
        def increase_indent(self, flow=False, indentless=False):  # lists indented, as yamllint wants
            return super().increase_indent(flow, False)

    return Dumper


def _main() -> int:  # pragma: no cover - exercised by the drift test through subprocess
    import argparse
    import pathlib

    import yaml

    parser = argparse.ArgumentParser(description="Write roles/*/meta/argument_specs.yml from the catalogue.")
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--roles-dir", default=str(pathlib.Path(__file__).resolve().parent.parent / "roles"))
    args = parser.parse_args()
    _IndentedDumper = _indented_dumper()
    drift = 0
    roles_dir = pathlib.Path(args.roles_dir)
    for role in sorted({v.role for v in VARIABLES}):
        if not (roles_dir / role / "tasks").is_dir():
            continue  # the role has not landed yet
        path = roles_dir / role / "meta" / "argument_specs.yml"
        text = "---\n# Generated by `python -m hicachectl.schema --write`; edit hicachectl/schema.py instead.\n"
        text += yaml.dump(argument_specs(role), Dumper=_IndentedDumper, sort_keys=False, width=100)
        if not path.exists() or path.read_text() != text:
            drift += 1
            if args.write:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
            print(("wrote " if args.write else "stale ") + str(path))
    readme = roles_dir.parent / "README.md"
    text = readme.read_text()
    head, rest = text.split(README_START, 1)
    tail = rest.split(README_END, 1)[1]
    wanted = f"{head}{README_START}\n{variables_table()}\n{README_END}{tail}"
    if text != wanted:
        drift += 1
        if args.write:
            readme.write_text(wanted)
        print(("wrote " if args.write else "stale ") + str(readme))
    return 0 if (args.write or not drift) else 1


if __name__ == "__main__":
    raise SystemExit(_main())
