"""The catalogue of every public inventory variable: name, type, default, allowed values, meaning.

This is the one place a variable is declared. The deployment model reads defaults from here,
the rules check types and choices from here, and the roles' `meta/argument_specs.yml` are
generated from here (`python -m hicachectl.config.schema --write`; a test fails when they drift).
"""

from __future__ import annotations

import csv
import dataclasses
import ipaddress
import math
import posixpath
import re
import unicodedata
from collections.abc import Callable
from typing import Any

# SGLang versions whose HiCache flags this catalogue was checked against (see reference §2).
SGLANG_VERSIONS = ("0.5.20", "0.5.21", "0.5.22", "0.5.23")

NO_DEFAULT = object()


@dataclasses.dataclass(frozen=True)
class Domain:
    """The values a variable may take beyond its type; `rules.check_variables` enforces it, the README shows it.

    A number is held to `low`/`high` (open ends with `low_open`/`high_open`), a string to `pattern` (a full
    match) or `choices`, and `check` (a predicate) when a pattern cannot say it. A list holds `items` (each
    element of the types `item_types`, at least `min_items`), a mapping `keys` and `items` (its values).
    `example` lies inside the domain: the fix of every finding suggests it.
    """

    text: str
    example: Any
    rule: str = "domain"
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    pattern: str | None = None
    choices: tuple | None = None
    check: Callable[[Any], bool] | None = None
    items: Domain | None = None
    keys: Domain | None = None
    item_types: tuple[str, ...] | None = None
    min_items: int = 0

    def problem(self, value: Any) -> str | None:
        """Why a single value (not a list or mapping) is outside the domain; None when it is inside."""
        if isinstance(value, bool):
            return None
        if isinstance(value, (int, float)):
            if isinstance(value, float) and not math.isfinite(value):
                return "is not a finite number"
            if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
                return "is below the range"
            if self.high is not None and (value > self.high or (self.high_open and value == self.high)):
                return "is above the range"
            if self.choices is not None and value not in self.choices:
                return "is not one of the values allowed"
            return None
        if isinstance(value, str):
            if self.pattern is not None and not re.fullmatch(self.pattern, value, re.ASCII):
                return "does not have the form required"
            if self.choices is not None and value not in self.choices:
                return "is not one of the values allowed"
            if self.check is not None and not self.check(value):
                return "does not have the form required"
        return None


# Characters refused in every string that reaches a host, whatever the variable: C0/C1 controls (newline, CR,
# tab, NUL, ESC...), Unicode line and paragraph separators, and invisible format characters (bidi overrides,
# zero-width). Each of them either ends a line of a line-oriented file (unit, env file, fstab, sysctl.d,
# modprobe.d, nfs.conf, limits.conf, a script) or hides what the value really is. No variable holds multi-line text.
REFUSED_CATEGORIES = ("Cc", "Cf", "Zl", "Zp")


def refused_characters(text: str) -> list[tuple[int, str]]:
    """(position, character) of every refused character of `text` (see REFUSED_CATEGORIES)."""
    return [(i, c) for i, c in enumerate(text) if unicodedata.category(c) in REFUSED_CATEGORIES]


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


_HOSTNAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?", re.ASCII)


def is_address(text: str) -> bool:
    """An IP address or a DNS host name."""
    return _is_ip(text) or bool(_HOSTNAME.fullmatch(text))


def is_nfs_server(text: str) -> bool:
    """What may stand before ':' in an NFS source: a host name, an IPv4 address, an IPv6 address in brackets."""
    if text.startswith("[") and text.endswith("]"):
        return ":" in text and _is_ip(text[1:-1])
    return ":" not in text and is_address(text)


_INTERFACE = re.compile(r"(?!\.\.?$)[A-Za-z0-9_.@+-]{1,15}", re.ASCII)  # the kernel's dev_valid_name, in ASCII


def is_interface_or_ip(text: str) -> bool:
    return _is_ip(text) or bool(_INTERFACE.fullmatch(text))


# The Docker/OCI image reference grammar (distribution/reference): [registry[:port]/]path[:tag][@digest].
_DOMAIN_COMPONENT = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
REGISTRY = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9A-Fa-f:]+\])(?::[0-9]{{1,5}})?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE = (rf"(?:{REGISTRY}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
                   r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?")
DIGEST = r"sha256:[0-9a-f]{64}"


def docker_gpus(spec: str) -> int | None:
    """GPUs `docker run --gpus SPEC` gives the container (None: all of the host's), as Docker's GpuOpts.Set
    reads it: CSV fields `all`/`N`/`count=`/`device=`/`capabilities=`/`driver=`/`options=`, a device list with
    commas quoted as one CSV field ('"device=0,1"'); no count and no device means 1. ValueError when Docker refuses it."""
    fields = next(csv.reader([spec]), [])
    if not fields:
        raise ValueError("is empty")
    seen: set[str] = set()
    count: int | None = 1
    devices: list[str] | None = None
    counted = False
    for field in fields:
        key, has_value, value = field.partition("=")
        if not has_value:
            key, value = "count", field
        if key in seen:
            raise ValueError(f"names {key} twice (an unquoted device list with commas is read as a count)")
        seen.add(key)
        if key == "count":
            counted = True
            if value == "all":
                count = None
            elif value.isdigit() and int(value) > 0:
                count = int(value)
            else:
                raise ValueError(f"has count {value!r}, which is neither all nor a positive number")
        elif key == "device":
            devices = [v for v in value.split(",") if v]
            if not devices:
                raise ValueError("names no device")
        elif key not in ("capabilities", "driver", "options"):
            raise ValueError(f"has the key {key!r}, which Docker does not know")
    if counted and devices is not None:
        raise ValueError("sets both a count and devices, which Docker refuses")
    return len(devices) if devices is not None else count


def podman_gpus(spec: str) -> int | None:
    """GPUs `podman run --gpus SPEC` gives (each comma-separated entry becomes the CDI device nvidia.com/gpu=ENTRY)."""
    entries = spec.split(",")
    if any(not re.fullmatch(r"[A-Za-z0-9-]+", e, re.ASCII) for e in entries):
        raise ValueError("is not all or a comma-separated list of GPU indices or UUIDs")
    return None if "all" in entries else len(entries)


POSITIVE = Domain("an integer of at least 1", 1, "range", low=1)
NON_NEGATIVE = Domain("an integer of at least 0", 0, "range", low=0)
PORT = Domain("a TCP port, 1-65535", 30000, "range", low=1, high=65535)
PERCENT = Domain("a percentage, 0-100", 100, "range", low=0, high=100)
UNIT_PATH = ("an absolute path of letters, digits and / . _ + - only (it is written into the systemd unit{}), "
             "not / nor a directory the system owns (/etc, /usr, /var, /opt and the others at the top; anything in /proc, /sys, "
             "/boot, /run, /bin, /sbin, /lib*, /dev but /dev/shm, /usr but /usr/local/NAME; /etc/ssh, /etc/systemd, /root/.ssh, "
             "/var/lib/docker and the like)")
_UNIT_PATH = r"/[A-Za-z0-9/._+-]*"
# The directories the toolkit makes, fills, mounts over or copies whole (cfg/ into cfg.previous/): never the system's.
SYSTEM_DIRECTORIES = frozenset({"/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/media", "/mnt",
                                "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var", "/var/lib",
                                "/var/log", "/var/cache", "/var/tmp", "/var/run", "/var/spool", "/var/mail", "/var/opt", "/var/local",
                                "/usr/local", "/etc/hicache", "/etc/default", "/etc/security", "/etc/sysctl.d", "/etc/modprobe.d",
                                "/etc/udev", "/etc/apt", "/etc/docker", "/etc/containers", "/etc/nvidia-container-runtime"})
# ... and everything under these (the kernel's, the boot's, the packages', the login's, the runtimes' own trees).
SYSTEM_TREES = ("/proc", "/sys", "/boot", "/run", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ssh", "/etc/systemd",
                "/etc/pam.d", "/etc/sudoers.d", "/root/.ssh", "/var/lib/dpkg", "/var/lib/apt", "/var/lib/docker",
                "/var/lib/containerd", "/var/lib/containers", "/var/lib/systemd", "/usr/local/bin", "/usr/local/sbin",
                "/usr/local/lib", "/usr/local/include", "/usr/local/share", "/usr/local/etc")


# The L3 mount point: its fstab line and mount unit (mnt-kvcache.mount, After=) name it as the kernel does.
MOUNT_POINT = UNIT_PATH.format(" and /etc/fstab") + ", written plainly (no . or .. or // in it, no / at its end)"


def clean_path(path: str) -> str:
    """An absolute path as the kernel resolves its . and .. and repeated slashes (posixpath keeps a leading //)."""
    return "/" + posixpath.normpath(path).lstrip("/") if path.startswith("/") else path


def own_directory(path: str) -> bool:
    """A directory of the toolkit's own, not one the system needs (wherever its . and .. lead)."""
    where = clean_path(path)

    def inside(tree: str) -> bool:
        return where == tree or where.startswith(tree + "/")

    if where in SYSTEM_DIRECTORIES or any(inside(tree) for tree in SYSTEM_TREES):
        return False
    if inside("/dev"):  # a tmpfs tier in /dev/shm/NAME, nothing else of /dev
        return where.startswith("/dev/shm/")
    if inside("/usr"):  # /usr is the packages': only /usr/local/NAME/... is a site's own
        return where.startswith("/usr/local/")
    return True


def own_mount_point(path: str) -> bool:
    """The L3 mount point: a directory of the toolkit's own, written as the kernel and systemd name it."""
    return own_directory(path) and clean_path(path) == path


MOUNT_PATH = Domain("an absolute path without ':' (it is mounted with -v DIR:PATH)", "/models/weights", "mount-path", pattern=r"/[^:]*")
ONE_LINE = r"\S(?:.*\S)?"  # not empty, no leading or trailing blanks (control characters are refused everywhere)
NON_EMPTY = Domain("a non-empty value without leading or trailing spaces", "value", "non-empty", pattern=ONE_LINE)
WORD = Domain("a non-empty word", "word", "non-empty", pattern=r"(?s).+")
ULIMITS = ("core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile", "nproc", "rss", "rtprio",
           "rttime", "sigpending", "stack")
UNIT_STEM = r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,246}"  # systemd unit name characters, without its \\x escapes and ':'
# Units a server's or router's unit file in /etc/systemd/system would replace (it shadows /lib/systemd/system): the
# toolkit's own, the container runtimes', and the system services a GPU host runs.
OTHER_UNITS = frozenset({"hicache-nic-tuning", "hicache-l3-collector", "getty", "docker", "containerd", "podman", "ssh", "sshd", "dbus", "cron",
                         "crond", "rpcbind", "networking", "NetworkManager", "irqbalance", "chrony", "chronyd", "rsyslog", "auditd",
                         "polkit", "multipathd", "iscsid", "openibd", "rdma", "rdma-load-modules", "kubelet", "nvidia-persistenced",
                         "nvidia-fabricmanager", "nvidia-dcgm", "prometheus", "prometheus-node-exporter"})
OTHER_UNIT_PREFIXES = ("systemd-", "nfs-", "rpc-", "nvidia-")


def unit_of_its_own(stem: str) -> bool:
    return stem not in OTHER_UNITS and not stem.startswith(OTHER_UNIT_PREFIXES)


UNIT_NAME = "a systemd unit name without .service: letters, digits and _ . -, not starting with -, and not the name of another unit ({})"


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
    domain: Domain | None = None  # the values it may take beyond its type (None: its type, or choices, says it all)
    secret: bool = False  # never shown: masked in every output, argument_specs' no_log (see hicachectl/config/secrets.py)
    # null is a value of its own, apart from "not set": it leaves the host's setting as it is, while the default
    # (not None) applies only when the variable is not set. See `takes_none` and `value_in`.
    nullable: bool = False

    @property
    def required(self) -> bool:
        return self.default is NO_DEFAULT

    @property
    def takes_none(self) -> bool:
        """null is a value the inventory may give: "unset" where the default is None, "leave it" where `nullable`."""
        return self.default is None or self.nullable


def _v(*args, **kwargs) -> Var:
    return Var(*args, **kwargs)


VARIABLES: tuple[Var, ...] = (
    # --- where things live on the host -------------------------------------------------------
    _v("hicache_base_dir", "str", "/opt/sglang-hicache", "Working directory on the host; holds cfg/ by default.",
       domain=Domain(UNIT_PATH.format(" as the parent of the config directory"), "/opt/sglang-hicache", "unit-safe-path", pattern=_UNIT_PATH, check=own_directory)),
    _v("hicache_cfg_dir", "str", None, "Host directory for start.sh and backend config (default: <base_dir>/cfg). Mounted read-only at /cfg.",
       domain=Domain(UNIT_PATH.format(""), "/opt/sglang-hicache/cfg", "unit-safe-path", pattern=_UNIT_PATH, check=own_directory)),
    _v("hicache_model_dir", "str", None, "Host directory with the model weights, mounted read-only at hicache_model_path (with "
       "hicache_container_runtime none: hicache_model_path itself, where the server reads them). None: no mount (hub id).", domain=MOUNT_PATH),
    _v("hicache_cache_dir", "str", None, "Host directory of the L3 tier (the storage mount point). Required for the file and nixl backends.",
       domain=Domain(MOUNT_POINT, "/mnt/kvcache", "unit-safe-path", pattern=_UNIT_PATH, check=own_mount_point)),
    _v("hicache_cache_container_dir", "str", None, "Where the L3 directory appears inside the container (default: same path as on the host).", domain=dataclasses.replace(MOUNT_PATH, example="/mnt/kvcache")),
    # --- the container ------------------------------------------------------------------------
    _v("hicache_image", "str", NO_DEFAULT, "SGLang container image, pinned by tag or digest.",
       domain=Domain("an image reference: [registry[:port]/]name[:tag][@sha256:digest], the name in lowercase", "lmsysorg/sglang:v0.5.20-cu130", "image-reference", pattern=IMAGE_REFERENCE)),
    _v("hicache_sglang_version", "str", None, "SGLang version inside the image; read from the image tag (vX.Y.Z) when unset.", choices=SGLANG_VERSIONS),
    _v("hicache_container_name", "str", "sglang-hicache", "Name of the server container.",
       domain=Domain("a Docker container name: a letter or digit, then letters, digits and _ . -", "sglang-hicache", "container-name", pattern=r"[A-Za-z0-9][A-Za-z0-9_.-]*")),
    _v("hicache_image_mirror", "str", None, "Registry (host[:port]) to pull the image from instead of the one in its name; the image is tagged with its own name.", role="sglang_image",
       domain=Domain("a registry host[:port]", "registry.example.com:5000", "image-mirror", pattern=REGISTRY)),
    _v("hicache_image_digest", "str", None, "sha256:... the image must have; pulled by digest, anything else is refused.", role="sglang_image",
       domain=Domain("sha256: and 64 lowercase hex digits", "sha256:" + "0" * 64, "image-digest", pattern=DIGEST)),
    _v("hicache_image_pull_retries", "int", 5, "Pull attempts before giving up (a registry can be briefly down).", role="sglang_image", domain=Domain("an integer from 1 to 100", 5, "range", low=1, high=100)),
    _v("hicache_image_pull_delay", "int", 10, "Seconds between pull attempts.", role="sglang_image", domain=Domain("seconds, 0-3600", 10, "range", low=0, high=3600)),
    _v("hicache_image_tls_verify", "bool", True, "Verify the registry's TLS certificate (podman's --tls-verify).", role="sglang_image"),
    _v("hicache_container_runtime", "str", "docker", "Container CLI on the host; none runs start.sh on the host itself (as the NetApp document does).",
       choices=("docker", "podman", "none")),
    _v("hicache_container_gpus", "str", "all", "Value of --gpus for the container.",
       domain=Domain('Docker: all, a count, or "device=0,1" (the double quotes are part of the value when it lists several); Podman: all or 0,1', "all", "container-gpus", pattern=r'[A-Za-z0-9=,"._:-]+')),
    _v("hicache_container_ulimits", "dict", {"memlock": -1, "stack": 67108864}, "--ulimit values (memlock -1 = unlimited; stack in bytes).",
       domain=Domain("ulimit names mapped to integers (-1: unlimited)", {"memlock": -1}, "ulimit",
              keys=Domain("a ulimit name", "memlock", "ulimit", choices=ULIMITS), items=Domain("an integer of at least -1 (-1: unlimited)", -1, "ulimit", low=-1), item_types=("int",))),
    _v("hicache_container_env", "dict", {}, "Extra environment for the container (e.g. SAFETENSORS_FAST_GPU: '1'); the backend's own variables are added for you.",
       domain=Domain("environment variable names mapped to values on one line", {"SAFETENSORS_FAST_GPU": "1"}, "env-name",
              keys=Domain("an environment variable name: letters, digits and _, not starting with a digit", "SAFETENSORS_FAST_GPU", "env-name", pattern=r"[A-Za-z_][A-Za-z0-9_]*"),
              item_types=("str", "int", "float", "bool"))),
    _v("hicache_container_seccomp", "str", None, "--security-opt seccomp=...: a profile path, or unconfined; None keeps the runtime's default (Docker's blocks io_uring).", role="container_runtime",
       domain=Domain("unconfined, or the absolute path of a seccomp profile on the host", "unconfined", "seccomp", pattern=r"unconfined|/[^\s,]+")),
    _v("hicache_container_extra_args", "list", [], "Extra arguments for `docker run`, placed before the image.",
       domain=Domain("words (strings or numbers)", ["--shm-size", "32g"], "type", item_types=("str", "int", "float"))),
    _v("hicache_secret_keys", "list", [], "Keys of hicache_container_env and of hicache_extra_config (at any depth) whose values are secrets, e.g. "
       "[HF_TOKEN, secret_key]. Secret env reaches the server only through cfg/secrets.env (mode 0600, `--env-file`; read by serve.sh with runtime "
       "none), an extra config holding a secret is written to a 0600 file (hicache_extra_config_file, default extra_config.json), never start.sh "
       "or argv; every output shows them as ********. hicache_model_hub_token is always secret. validate warns about keys that look secret "
       "(TOKEN, SECRET, PASSWORD, KEY, CREDENTIAL) and are not listed.", domain=Domain("key names", ["HF_TOKEN"], "non-empty", items=NON_EMPTY, item_types=("str",))),
    _v("hicache_launcher", "list", ["python3", "-m", "sglang.launch_server"], "Command that start.sh execs, before the SGLang flags.",
       domain=Domain("at least one non-empty word", ["python3", "-m", "sglang.launch_server"], "non-empty", items=WORD, item_types=("str",), min_items=1)),
    # --- the service -------------------------------------------------------------------------------
    _v("hicache_service_name", "str", "sglang-hicache", "systemd unit that runs the server (serve.sh).",
       domain=Domain(UNIT_NAME.format("docker, ssh, systemd-*, hicache-nic-tuning ..."), "sglang-hicache", "unit-name", pattern=UNIT_STEM,
                     check=unit_of_its_own)),
    _v("hicache_serial", "int", 0, "Hosts per batch when a change rolls out (0: all at once); hicachectl passes it to the play. upgrade, restart "
       "and rollback take 1 when it is 0, and so does deploy with routers (the others serve meanwhile).", role="site", domain=NON_NEGATIVE),
    _v("hicache_max_fail_percentage", "int", 100, "A batch with more failed hosts than this stops the rollout (upgrade uses 0).", role="site", domain=PERCENT),
    _v("hicache_health_timeout", "int", 1800, "Seconds to wait for /health after a (re)start; big models load for 10+ minutes.", domain=Domain("seconds, at least 1", 1800, "range", low=1)),
    # --- SGLang: model and serving -------------------------------------------------------------
    _v("hicache_model_source", "str", None, "Where hicache_model_dir gets its weights: path (already there, checked) or hub (downloaded once); None: the server resolves hicache_model_path.",
       choices=("path", "hub"), role="model"),
    _v("hicache_model_repo", "str", None, "Hub repository to download (hicache_model_source: hub), e.g. nvidia/Llama-4-Maverick-17B-128E-Instruct-FP8.", role="model",
       domain=Domain("a hub repository id: [namespace/]name of letters, digits and - _ .", "Qwen/Qwen3-8B", "model-repo", pattern=r"(?:[A-Za-z0-9][A-Za-z0-9_.-]*/)?[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")),
    _v("hicache_model_revision", "str", None, "Hub revision of hicache_model_repo (branch, tag or commit; `hf download --revision`); None: the hub's default branch. A change downloads again.", role="model",
       domain=Domain("a branch, tag or commit: letters, digits and . _ / -, not starting with -", "main", "model-revision", pattern=r"[A-Za-z0-9_.][A-Za-z0-9._/-]*")),
    _v("hicache_model_hub_token", "str", None, "Hub token for gated models; keep it in Ansible Vault. Passed to the download only through its environment, never logged.", role="model", secret=True,
       domain=Domain("printable ASCII without spaces", "hf_example", "token-characters", pattern=r"[\x21-\x7e]+")),
    _v("hicache_model_files", "dict", {}, "Files of the model (relative path: sha256) checked after download or on the shared path.", role="model",
       domain=Domain("relative file paths mapped to sha256 digests", {"config.json": "0" * 64}, "model-file",
              keys=Domain("a relative path inside the model directory (no leading /, no ..)", "config.json", "model-file", pattern=r"(?!/)(?!(?:.*/)?\.\.(?:/|$)).+"),
              items=Domain("a sha256 hex digest (64 lowercase hex digits)", "0" * 64, "model-file-digest", pattern=r"[0-9a-f]{64}"), item_types=("str",))),
    _v("hicache_model_share", "str", None, "Name of the shared mount hicache_model_dir is on (one export mounted on every host that gives the same name, e.g. the L3 tier): "
       "of the hosts of a run with the same name and directory, one downloads (the first by name; `plan` names it) under a lock in that directory, "
       "the others wait for its stamp. None: each host downloads into its own hicache_model_dir.", role="model",
       domain=Domain("a name of letters, digits and . _ -", "models-nfs", "model-share", pattern=r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")),
    _v("hicache_model_share_wait", "int", 7200, "Seconds a host of a shared hicache_model_dir (hicache_model_share) waits for the host that downloads there.", role="model",
       domain=Domain("seconds, 10-86400", 7200, "range", low=10, high=86400)),
    _v("hicache_model_path", "str", NO_DEFAULT, "--model-path as the server sees it (a path in the container or a hub id).", flag="--model-path",
       domain=dataclasses.replace(NON_EMPTY, text="a non-empty path or hub id without leading or trailing spaces", example="/models/weights")),
    _v("hicache_served_model_name", "str", None, "--served-model-name; part of every L3 key, so keep it stable and without ':'.", flag="--served-model-name",
       domain=dataclasses.replace(NON_EMPTY, text="a non-empty name without leading or trailing spaces", example="my-model")),
    _v("hicache_host", "str", None, "--host (SGLang default 127.0.0.1).", flag="--host", domain=Domain("an IP address or a host name", "0.0.0.0", "address", check=is_address)),
    _v("hicache_port", "int", None, "--port (SGLang default 30000).", flag="--port", domain=PORT),
    _v("hicache_tp_size", "int", None, "--tp-size (tensor parallel ranks).", flag="--tp-size", domain=POSITIVE),
    _v("hicache_pp_size", "int", None, "--pp-size (pipeline parallel).", flag="--pp-size", domain=POSITIVE),
    _v("hicache_dp_size", "int", None, "--dp-size (data parallel).", flag="--dp-size", domain=POSITIVE),
    _v("hicache_attn_cp_size", "int", None, "--attn-cp-size (attention context parallel).", flag="--attn-cp-size", domain=POSITIVE),
    _v("hicache_enable_dp_attention", "bool", False, "--enable-dp-attention.", flag="--enable-dp-attention"),
    _v("hicache_mem_fraction_static", "float", None, "--mem-fraction-static.", flag="--mem-fraction-static", domain=Domain("a number in (0, 1)", 0.85, "range", low=0, high=1, low_open=True, high_open=True)),
    _v("hicache_context_length", "int", None, "--context-length.", flag="--context-length", domain=POSITIVE),
    _v("hicache_max_running_requests", "int", None, "--max-running-requests.", flag="--max-running-requests", domain=POSITIVE),
    _v("hicache_page_size", "int", None, "--page-size in tokens; part of every L3 key.", flag="--page-size", domain=POSITIVE),
    _v("hicache_chunked_prefill_size", "int", None, "--chunked-prefill-size; a multiple of the page size, or -1.", flag="--chunked-prefill-size",
       domain=Domain("-1 (no chunking) or a positive multiple of the page size", -1, "range", low=-1)),
    # --- SGLang: HiCache ------------------------------------------------------------------------
    _v("hicache_size_gb", "int", None, "--hicache-size: host pool in GB per TP rank (overrides the ratio).", flag="--hicache-size", domain=POSITIVE),
    _v("hicache_ratio", "float", None, "--hicache-ratio: host pool relative to the GPU pool.", flag="--hicache-ratio", domain=Domain("a positive number", 2, "range", low=0, low_open=True)),
    _v("hicache_host_memory_fraction", "float", None, "--hicache-host-memory-fraction, in (0, 1].", flag="--hicache-host-memory-fraction", min_sglang="0.5.21",
       domain=Domain("a number in (0, 1]", 0.8, "range", low=0, high=1, low_open=True)),
    _v("hicache_host_memory_mode", "str", None, "--hicache-host-memory-mode.", choices=("cache", "buffer_only"), flag="--hicache-host-memory-mode"),
    _v("hicache_write_policy", "str", None, "--hicache-write-policy.", choices=("write_back", "write_through", "write_through_selective"), flag="--hicache-write-policy"),
    _v("hicache_io_backend", "str", None, "--hicache-io-backend.", choices=("direct", "kernel"), flag="--hicache-io-backend"),
    _v("hicache_mem_layout", "str", None, "--hicache-mem-layout.", choices=("layer_first", "page_first", "page_first_direct", "page_first_kv_split", "page_head"), flag="--hicache-mem-layout"),
    _v("hicache_storage_backend", "str", None, "--hicache-storage-backend (the L3 tier); None keeps HiCache at L2 only.", choices=("file", "nixl", "dynamic"), flag="--hicache-storage-backend"),
    _v("hicache_kv_cache_dtype", "str", None, "--kv-cache-dtype (SGLang default auto: the model's dtype). It changes the page format, so it is part of the L3 namespace.",
       choices=("auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16"), flag="--kv-cache-dtype"),
    _v("hicache_prefetch_policy", "str", None, "--hicache-storage-prefetch-policy.", choices=("best_effort", "wait_complete", "timeout"), flag="--hicache-storage-prefetch-policy"),
    _v("hicache_extra_config", "dict", {}, "--hicache-storage-backend-extra-config as a mapping: SGLang's keys, the backend's keys (NIXL plugin sections, dynamic backend module).",
       flag="--hicache-storage-backend-extra-config", domain=Domain("SGLang's and the backend's keys; every string on one line", {}, "extra-config-type")),
    _v("hicache_extra_config_file", "str", None, "Write the extra config to this file name in cfg/ (.json, .toml, .yaml) and pass it as @/cfg/<name>; None passes inline JSON.",
       domain=Domain("a file name of letters, digits and . _ -", "extra_config.json", "extra-config-file", pattern=r"[A-Za-z0-9][A-Za-z0-9._-]*")),
    _v("hicache_nixl_plugin", "str", None, "SGLANG_HICACHE_NIXL_BACKEND_PLUGIN; used by SGLang only when hicache_extra_config has no 'plugin' section.", choices=("auto", "POSIX", "GDS_MT", "GDS", "3FS", "OBJ")),
    _v("hicache_l3_namespace", "str", "auto", "The L3 namespace: a directory under hicache_cache_dir (the dynamic backend's key_namespace) that holds this server's pages. "
       "auto derives it from everything that changes the page format (model and revision, KV dtype, page size, TP/PP/attention-CP layout, memory layout, "
       "backend), so a changed config never reads stale pages and identical servers share; off uses hicache_cache_dir itself (as the VAST, NetApp and ADP documents do); "
       "any other value is used as it is. `hicachectl validate` explains it.",
       domain=Domain("auto, off, or a name of letters, digits and . _ - (at most 64)", "auto", "l3-namespace", pattern=r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")),
    _v("hicache_l3_share", "str", None, "Name of the L3 tier this host shares with the other hosts that give the same name (one export mounted on all of them); "
       "`verify --l3` then proves that a page one of them wrote is a hit on another. None: this host's L3 is its own.",
       domain=Domain("a name of letters, digits and . _ -", "vast-prod", "l3-share", pattern=r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")),
    _v("hicache_l3_budget_gb", "float", None, "Capacity budget of this server's L3 tier in GB (1e9 bytes), the same on every server of the tier: one of them "
       "(the first in the inventory) runs a collector that evicts the least recently used pages across the tier's namespaces and models to keep them "
       "within it (docs/operations.md). None: no collector; the tier is bounded by SGLang's own eviction, if any.",
       domain=Domain("a number of GB above 0", 500, "range", low=0, low_open=True)),
    _v("hicache_l3_free_floor_pct", "int", 10, "With hicache_l3_budget_gb: the collector also evicts while the tier's filesystem has less than this "
       "percentage free (other data shares it).", domain=Domain("a percentage, 0-90", 10, "range", low=0, high=90)),
    _v("hicache_l3_namespace_share_pct", "int", None, "With hicache_l3_budget_gb: the percentage of the budget this server's namespace may hold. "
       "None: the namespaces without a share split equally what the given shares leave.", domain=Domain("a percentage, 1-100", 50, "range", low=1, high=100)),
    _v("hicache_l3_collect_interval_min", "int", 10, "With hicache_l3_budget_gb: minutes between two runs of the tier's collector.", domain=POSITIVE),
    _v("hicache_skip_server_warmup", "bool", False, "--skip-server-warmup.", flag="--skip-server-warmup"),
    _v("hicache_enable_metrics", "bool", True, "--enable-metrics: needed to see L3 hits (verify, bench)."),
    _v("hicache_enable_cache_report", "bool", True, "--enable-cache-report: cached_tokens in every response (verify, bench)."),
    _v("hicache_admin_api_key", "str", None, "SGLang's --admin-api-key: the key of its admin endpoints (/hicache/storage-backend: what is attached, "
       "attach, detach), which verify and status then send. Keep it in Ansible Vault: it reaches SGLang only in cfg/server_secrets.yaml (mode 0600, "
       "read by SGLang's --config), never start.sh or argv. None: the server has no admin key, and SGLang refuses a runtime detach.",
       flag="--admin-api-key", secret=True,
       # At least 16 characters: the config hash in the world-readable installed.json covers the secret file too.
       domain=Domain("printable ASCII without spaces, at least 16 characters, not starting with -", "admin-example-key-0123",
                     "admin-key", pattern=r"[\x21-\x2c\x2e-\x7e][\x21-\x7e]{15,}")),
    _v("hicache_extra_args", "list", [], "Further SGLang flags, appended as given (checked against the real parser by the conformance tests).",
       domain=Domain("words (strings or numbers)", ["--log-level", "info"], "type", item_types=("str", "int", "float"))),
    # --- the router (hosts of the hicache_routers group) ---------------------------------------------
    _v("hicache_worker_url", "str", None, "URL at which the routers reach this server (default: http://<ansible_host or the inventory name>:<hicache_port>).", role="router",
       domain=Domain("http(s)://host[:port] without a path", "http://10.0.0.11:30000", "worker-url", pattern=r"https?://(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::[0-9]{1,5})?")),
    _v("hicache_router_package", "str", "smg", "The router's PyPI package, whose binary of the same name the unit runs: smg (the SGLang Model Gateway, "
       "where the router's development moved; SGLang 0.5.23's README points to it) or sglang-router (frozen at 0.3.2). Both serve the /workers API.", role="router",
       choices=("smg", "sglang-router")),
    _v("hicache_router_version", "str", None, "Version of hicache_router_package the router runs, pinned; None: the one this release was checked with "
       "(smg 1.13.0, sglang-router 0.3.2).", role="router",
       domain=Domain("a release version such as 1.13.0", "1.13.0", "version", pattern=r"[0-9]+(?:\.[0-9]+){1,3}(?:(?:a|b|rc|\.post|\.dev)[0-9]+)?")),
    _v("hicache_router_dir", "str", "/opt/sglang-router", "Directory of the router's own virtualenv on the router host.", role="router",
       domain=Domain(UNIT_PATH.format(""), "/opt/sglang-router", "unit-safe-path", pattern=_UNIT_PATH, check=own_directory)),
    _v("hicache_router_service_name", "str", "sglang-router", "systemd unit that runs the router.", role="router",
       domain=Domain(UNIT_NAME.format("docker, ssh, systemd-*, hicache-nic-tuning ..."), "sglang-router", "unit-name", pattern=UNIT_STEM,
                     check=unit_of_its_own)),
    _v("hicache_router_host", "str", "0.0.0.0", "Address the router listens on (--host).", role="router", domain=Domain("an IP address or a host name", "0.0.0.0", "address", check=is_address)),
    _v("hicache_router_port", "int", 30080, "Port of the router's OpenAI-compatible API and worker API (--port).", role="router", domain=PORT),
    _v("hicache_router_prometheus_port", "int", 29000, "Port of the router's Prometheus metrics (--prometheus-port).", role="router", domain=PORT),
    _v("hicache_router_policy", "str", "cache_aware", "Routing policy (--policy); cache_aware sends a prompt to the worker holding the longest shared prefix.", role="router",
       choices=("cache_aware", "round_robin", "random", "power_of_two")),
    _v("hicache_router_index_url", "str", None, "pip index (a mirror) to install the router from; None: pip's configured index. Secret: it may carry credentials.", role="router", secret=True,
       domain=Domain("an http(s) URL without spaces", "https://pypi.example.com/simple", "url", pattern=r"https?://[^\s]+")),
    _v("hicache_router_wheelhouse", "str", None, "Directory on the controller with the router's wheels and its dependencies' (`pip download smg==VERSION`); "
       "copied to the host and installed offline. None: from the index.", role="router",
       domain=dataclasses.replace(NON_EMPTY, text="a non-empty path", example="wheels/sglang-router")),
    _v("hicache_router_drain_timeout", "int", 300, "Seconds a rolling change waits for a server taken out of the routers to finish its requests before it restarts.", role="router",
       domain=Domain("seconds, at least 1", 300, "range", low=1)),
    _v("hicache_router_extra_args", "list", [], "Further `<hicache_router_package> launch` flags, appended as given.", role="router",
       domain=Domain("words (strings or numbers)", ["--log-level", "info"], "type", item_types=("str", "int", "float"))),
    # --- host facts the rules use -----------------------------------------------------------------
    _v("hicache_host_ram_gb", "int", None, "Host RAM in GB when known before deployment; the rules check the host pool against it.", role="preflight", domain=POSITIVE),
    _v("hicache_host_ram_headroom_gb", "int", 64, "RAM kept free for the OS, the runtime and SGLang's own process beside the host pool.", role="preflight", domain=NON_NEGATIVE),
    # --- sizing: the working set validate checks the host pool and the L3 tier against -------------------
    _v("hicache_model_config", "str", None, "The model's config.json (or its directory) on the controller; with it, validate checks the host pool and L3 capacity (see `hicachectl size`).", role="preflight",
       domain=dataclasses.replace(NON_EMPTY, text="a non-empty path", example="config.json")),
    _v("hicache_workload_context_tokens", "int", None, "Tokens per request the tiers must hold (default: hicache_context_length, else 131072).", role="preflight", domain=POSITIVE),
    _v("hicache_workload_concurrency", "int", None, "Requests in flight the host pool must hold (default: hicache_max_running_requests, else 1).", role="preflight", domain=POSITIVE),
    _v("hicache_workload_prefixes", "int", None, "Distinct prefixes the L3 tier must keep; checked against hicache_storage_capacity_gb.", role="preflight", domain=POSITIVE),
    _v("hicache_storage_capacity_gb", "int", None, "Space of the L3 tier for this server's pages, in GB (1e9 bytes).", role="preflight", domain=POSITIVE),
    _v("hicache_preflight_report_only", "bool", False, "Judge and report only: a missing item is neither a failure nor a gap (the doctor playbook sets it).", role="preflight"),
    _v("hicache_strict", "bool", True, "Fail when hardware, tools or a mount the inventory relies on are missing. false (a test bed): each gap is reported, the host shown degraded.", role="preflight"),
    _v("hicache_preflight_min_free_gb", "int", 10, "Free space the filesystem of hicache_base_dir must have.", role="preflight", domain=NON_NEGATIVE),
    # --- the L3 storage mount ------------------------------------------------------------------
    _v("hicache_storage_type", "str", "local", "What holds the L3 directory.", choices=("vast", "netapp", "local"), role="storage"),
    _v("hicache_storage_server", "str", None, "NFS server (VAST VIP or DNS name, NetApp LIF).", role="storage",
       domain=Domain("a host name, an IPv4 address, or an IPv6 address in [brackets]", "vip.storage.example.com", "address", check=is_nfs_server)),
    _v("hicache_storage_export", "str", None, "NFS export path.", role="storage",
       domain=Domain("an absolute path without spaces or backslashes (it is a field of /etc/fstab)", "/kvcache", "fstab-field", pattern=r"/[^\s\\]*")),
    _v("hicache_storage_nconnect", "int", None, "nconnect per mount: VAST at most 64 (above 16 needs vastnfs); NetApp pNFS at most 16, not with trunking (max_connect=).", role="storage", domain=POSITIVE),
    _v("hicache_storage_remoteports", "str", None, "VAST multipath remote ports: an IP range 'a-b', '~'-joined list, or 'dns'.", role="storage",
       domain=Domain("dns, or IP ranges a-b joined by ~", "dns", "remoteports-syntax", pattern=r"dns|[0-9A-Fa-f.:~-]+")),
    _v("hicache_storage_localports", "list", [], "VAST multipath local ports (IPs or interface names); needs rp_filter=0, which the storage role sets.", role="storage",
       domain=Domain("IP addresses or interface names", ["192.0.2.1"], "localports",
              items=Domain("an IP address or an interface name (up to 15 letters, digits and _ . @ + -)", "192.0.2.1", "localports", check=is_interface_or_ip), item_types=("str",))),
    _v("hicache_storage_link_gbps", "int", None, "Line rate of one storage NIC port, for the nconnect sanity check.", role="storage", domain=POSITIVE),
    _v("hicache_storage_rsize", "int", None, "rsize/wsize in bytes (NetApp over RDMA: at most 65536).", role="storage", domain=Domain("bytes, 1024-1048576", 1048576, "range", low=1024, high=1048576)),
    _v("hicache_storage_options", "list", [], "Further mount options, appended as given.", role="storage",
       domain=Domain("mount options", ["noatime"], "mount-option", items=Domain("a mount option without spaces, commas, # or backslashes", "noatime", "mount-option", pattern=r"[^\s,#\\]+"), item_types=("str",))),
    _v("hicache_storage_device", "str", None, "Local tier: a block device (or UUID=...) to mount at hicache_cache_dir; None uses the directory as it is.", role="storage",
       domain=Domain("a device path, UUID=/LABEL=/PARTUUID=/PARTLABEL=, or the source name of a filesystem without a device (tmpfs), "
                     "without spaces (a field of /etc/fstab)", "/dev/nvme1n1", "fstab-field",
              pattern=r'/[^\s\\]+|(?:UUID|LABEL|PARTUUID|PARTLABEL)=(?:"[^\s"\\]+"|[^\s"\\]+)|[A-Za-z0-9][A-Za-z0-9._+-]*')),
    _v("hicache_storage_fstype", "str", "xfs", "Local tier: filesystem of hicache_storage_device.", role="storage",
       domain=Domain("a filesystem type: lowercase letters, digits and . _ + -", "xfs", "fstab-field", pattern=r"[a-z0-9][a-z0-9._+-]*")),
    _v("hicache_storage_mount_timeout", "int", 60, "Seconds systemd waits for the mount at boot (x-systemd.mount-timeout); with nofail a storage outage never blocks boot.", role="storage",
       domain=Domain("seconds, at least 1", 60, "range", low=1)),
    _v("hicache_storage_read_ahead_kb", "int", 8192, "NFS read-ahead in KiB, applied to the live mount and persistent through nfsrahead (nfs-utils 2.6.2 or newer; /etc/nfs.conf.d), "
       "whose setting is host-wide: every NFS mount of the host of the same NFS version gets it, not only the L3 tier's. "
       "Where nfs-utils has no nfsrahead (Ubuntu 22.04's 2.6.1), the toolkit's own udev rule sets it for the L3 mount alone.", role="storage",
       domain=Domain("KiB, 0 or more", 8192, "range", low=0)),
    _v("hicache_storage_sunrpc_slots", "int", 128,
       "RPC slots per NFS-over-RDMA transport (sunrpc.rdma_slot_table_entries, live and in sysctl.d, with rpcrdma loaded at boot); "
       "None leaves the kernel's 128. TCP slot tables are never touched.", role="storage", nullable=True,
       domain=Domain("an integer from 4 to 16384 (xprtrdma's RPCRDMA_MIN/MAX_SLOT_TABLE)", 128, "range", low=4, high=16384)),
    _v("hicache_cache_owner", "str", "root", "Owner of hicache_cache_dir.", role="storage", domain=Domain("a user name or a numeric id", "root", "user-name", pattern=r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?|[0-9]+")),
    _v("hicache_cache_group", "str", "root", "Group of hicache_cache_dir.", role="storage", domain=Domain("a group name or a numeric id", "root", "user-name", pattern=r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?|[0-9]+")),
    _v("hicache_cache_mode", "str", "0755", "Mode of hicache_cache_dir.", role="storage", domain=Domain("an octal mode in quotes, e.g. '0755'", "0755", "file-mode", pattern=r"0?[0-7]{3}|[0-7]{4}")),
    # --- ConnectX-7 tuning for storage traffic ---------------------------------------------------------
    _v("hicache_nic_interfaces", "list", [], "Interfaces to tune; [] selects the storage ports: those hicache_storage_localports names "
       "(or that hold its addresses), else the ConnectX ports that route to hicache_storage_server; never IPoIB ports; "
       "a VLAN or bond stands for the ports below it.", role="nic_tuning",
       domain=Domain("interface names", ["ens1f0np0"], "interface-name",
              items=Domain("an interface name: up to 15 letters, digits and _ . @ + -", "ens1f0np0", "interface-name", pattern=_INTERFACE.pattern), item_types=("str",))),
    _v("hicache_nic_mtu", "int", 9000, "MTU (jumbo frames end to end for NFS over RDMA).", role="nic_tuning", domain=Domain("an MTU ConnectX ports take, 576-9978", 9000, "range", low=576, high=9978)),
    _v("hicache_nic_rings", "int", None, "RX and TX ring size (ethtool -G), capped at the NIC's maximum; None (the default) leaves them: "
       "NFS over RDMA does not use the Ethernet rings, and changing them reopens the port's queues.", role="nic_tuning",
       domain=Domain("an integer from 1 to 65536", 8192, "range", low=1, high=65536)),
    _v("hicache_nic_channels", "int", None, "Combined channels (ethtool -L); None leaves them.", role="nic_tuning", domain=POSITIVE),
    _v("hicache_nic_qos_trust", "str", "dscp", "RoCE QoS trust state (mlnx_qos --trust, or DSCP APP entries through iproute2's dcb where mlnx_qos is absent); "
       "None leaves it.", choices=("dscp", "pcp"), role="nic_tuning", nullable=True),
    _v("hicache_nic_pfc_priorities", "list", [3], "Priorities with PFC on (mlnx_qos --pfc, or dcb pfc where mlnx_qos is absent); [] leaves PFC.", role="nic_tuning",
       domain=Domain("priorities 0-7", [3], "range", items=Domain("a priority 0-7", 3, "range", low=0, high=7), item_types=("int",))),
    _v("hicache_nic_ecn_priorities", "list", [], "Priorities with RoCE ECN (DCQCN) switched on, notification and reaction point, "
       "through MLNX_OFED/DOCA's /sys/class/net/<if>/ecn (the distribution's mlx5 has no such switch); [] (the default) leaves "
       "ECN as the firmware has it (NVIDIA's DCQCN parameters: on for every priority unless ROCE_CC_PRIO_MASK says otherwise), "
       "not checked.", role="nic_tuning",
       domain=Domain("priorities 0-7", [3], "range", items=Domain("a priority 0-7", 3, "range", low=0, high=7), item_types=("int",))),
    _v("hicache_nic_ecn_required", "bool", False, "With hicache_nic_ecn_priorities: fail a port whose driver has no per-priority "
       "ECN switch (the distribution's mlx5: /sys/class/net/<if>/ecn is MLNX_OFED/DOCA's); false: a named gap, the host degraded.",
       role="nic_tuning"),
    _v("hicache_nic_roce_dscp", "int", 26, "DSCP of NFS/RDMA traffic: RDMA-CM's default ToS (configfs rdma_cm/<dev>/ports/<n>/default_roce_tos) "
       "is set to DSCP << 2, as xprtrdma sets none; with trust dscp the default map sends DSCP d to priority d >> 3 (26 -> 3). "
       "None leaves it.", role="nic_tuning", nullable=True,
       domain=Domain("a DSCP 0-63", 26, "range", low=0, high=63)),
    _v("hicache_nic_irq_affinity", "bool", False, "Pin the NIC's IRQs to the CPUs of its NUMA node, with irqbalance stopped and disabled "
       "(it rewrites pinned affinities). false (the default) leaves irqbalance as found, and starts again one this toolkit stopped.",
       role="nic_tuning"),
    _v("hicache_nic_max_read_request", "int", None, "PCIe MaxReadReq in bytes (128-4096, a power of two); None leaves it.", role="nic_tuning", choices=(128, 256, 512, 1024, 2048, 4096)),
    _v("hicache_nic_cpu_governor", "str", "performance", "CPU frequency governor; None leaves it.", role="nic_tuning", nullable=True,
       choices=("performance", "powersave", "ondemand", "conservative", "schedutil", "userspace")),
    # --- host limits -------------------------------------------------------------------------------
    _v("hicache_limits_memlock", "str", "unlimited", "memlock for login sessions (limits.d) and the runtime service (LimitMEMLOCK); 'unlimited' or KiB.", role="host_limits",
       domain=Domain("unlimited, or a positive number of KiB in quotes", "unlimited", "memlock", pattern=r"unlimited|[1-9][0-9]*")),
    _v("hicache_limits_runtime_service", "str", None, ("systemd service of the container runtime that gets LimitMEMLOCK (default: docker.service with docker, none with podman); "
        "with docker, containerd.service gets it as well (the containers' shims are its children)."), role="host_limits",
       domain=Domain("a systemd service name ending in .service", "docker.service", "unit-name", pattern=r"[A-Za-z0-9_.@][A-Za-z0-9_.@-]*\.service")),
    _v("hicache_limits_restart_runtime", "bool", False, "Restart the runtime service when its limit changes; off by default because it stops running containers.", role="host_limits"),
    _v("hicache_host_sysctls", "dict", {}, "Further sysctls, persisted in /etc/sysctl.d/90-hicache.conf and applied.", role="host_limits",
       domain=Domain("sysctl names mapped to values", {"vm.max_map_count": 1048576}, "sysctl",
              keys=Domain("a sysctl name such as net.core.rmem_max (words of letters, digits and _ * - joined by . or /)", "net.core.rmem_max", "sysctl",
                          pattern=r"[A-Za-z0-9_*-]+(?:[./][A-Za-z0-9_*-]+)*"),
              items=dataclasses.replace(NON_EMPTY, rule="sysctl", text="a non-empty value", example="1"), item_types=("str", "int"))),
)

BY_NAME: dict[str, Var] = {v.name: v for v in VARIABLES}


def misspelled(name: str) -> str | None:
    """The catalogue variable a name that does not start with hicache_ was most likely meant to be (HICACHE_STRICT,
    hicache-strict, hicahce_strict), else None: such a name is read by no role, so its value would be lost silently.
    Cheap for the many names that are nothing like ours (every host's variables go through it)."""
    import difflib

    head = name[:len("hicache_")].lower().replace("-", "_")
    # A name starting with "_" is a helper of the user's own (_hicache_base_dir templated into hicache_base_dir), or
    # one of the roles' internal facts (__hicache_image): never a misspelling.
    if name.startswith(("hicache_", "_")) or difflib.SequenceMatcher(None, head, "hicache_").ratio() < 0.75:
        return None
    close = difflib.get_close_matches(name.lower().replace("-", "_"), BY_NAME, n=1, cutoff=0.85)
    return close[0] if close else None

# Facts the roles set for each other, for the CLI's playbooks and for a user's tasks: public, not variables.
FACTS = {
    "hicache_facts": ("What the host has (hicache_host_facts' report): read by the first role that needs it, reused by the others; read "
                      "again by preflight (in site.yml once a pull or a download has marked it stale), and in each batch of a rolling site.yml."),
    "hicache_preflight_report": "The preflight role's judgement of the host (checks, required_missing); hicachectl doctor reads it.",
    "hicache_status_report": "What the status playbook read on the host; hicachectl status reads it.",
    "hicache_verify_report": "The verify playbook's checks of the host's server; hicachectl verify reads it.",
    "hicache_refusal": "What deploy would refuse on the host (a downgrade not asked for), found by a dry run; `plan --detailed-exitcode` exits 1 for it.",
    "hicache_l3_report": "The L3 namespaces of the host's tier as the l3 playbook listed them (and what it removed), and what each server runs (its deployed.json: `running`); hicachectl l3 reads it.",
}

# The roles of the collection, in the order site.yml runs them ("site" above is the playbook's own).
ROLES = ("preflight", "nic_tuning", "storage", "host_limits", "container_runtime", "sglang_image", "model", "sglang_server", "router")
_STORAGE = tuple(v.name for v in VARIABLES if v.role == "storage")
# What a role's plan reads beyond the variables it owns (Var.role): each role lists, defaults and checks all
# the variables it reads, so it runs alone from a user's playbook with only those set.
# tests/test_role_variables.py records what each role's plan really reads and holds this to it.
ALSO_READS: dict[str, tuple[str, ...]] = {
    "preflight": ("hicache_base_dir", "hicache_cache_dir", "hicache_container_runtime", "hicache_size_gb", "hicache_tp_size",
                  "hicache_pp_size", "hicache_dp_size", "hicache_enable_dp_attention",
                  # whether NIXL's io_uring is asked, under which seccomp profile (uring_seccomp_check)
                  "hicache_container_seccomp", "hicache_extra_config", "hicache_storage_backend") + _STORAGE,
    "nic_tuning": ("hicache_storage_localports", "hicache_storage_remoteports", "hicache_storage_server", "hicache_storage_type", "hicache_strict"),
    "storage": ("hicache_cache_dir", "hicache_strict"),
    "host_limits": ("hicache_container_runtime", "hicache_container_ulimits", "hicache_strict"),
    "container_runtime": ("hicache_container_runtime", "hicache_limits_restart_runtime", "hicache_limits_runtime_service", "hicache_strict"),
    "sglang_image": ("hicache_container_runtime", "hicache_image", "hicache_strict"),
    "model": ("hicache_container_runtime", "hicache_model_dir", "hicache_strict"),
    "sglang_server": ("hicache_container_seccomp", "hicache_limits_runtime_service", "hicache_model_repo", "hicache_model_revision",
                      "hicache_router_drain_timeout", "hicache_storage_device", "hicache_storage_type", "hicache_strict", "hicache_worker_url"),
}


def role_variables(role: str) -> tuple[Var, ...]:
    """Every variable the role reads, in catalogue order."""
    also = set(ALSO_READS.get(role, ()))
    return tuple(v for v in VARIABLES if v.role == role or v.name in also)


def role_defaults(role: str) -> dict[str, Any]:
    """`defaults/main.yml` of a role: the catalogue's default of every variable it reads that has one. A required
    variable has none, and one whose default is None ("unset": derived or not used) stays undefined: an undefined
    variable is not in what the role's argument validation checks. A null the user gives overrides a default here
    (inventory over role defaults), which is how a `nullable` variable's null reaches the role's plan."""
    return {v.name: default_of(v.name) for v in role_variables(role) if not v.required and v.default is not None}


def default_of(name: str) -> Any:
    """A fresh copy of a variable's default, so callers may mutate it."""
    import copy

    return copy.deepcopy(BY_NAME[name].default)


def value_in(raw: Any, var: Var) -> Any:
    """The value `var` takes on a host whose inventory values are `raw`: the one given; null where null is a value
    of its own (`nullable`: it leaves the setting alone); else, not set or null, its default (None when required).
    In a role, `raw` holds the role's defaults too (the hicache_vars lookup), so a null there was set by the user."""
    value = raw.get(var.name)
    if value is not None or (var.nullable and var.name in raw):
        return value
    return None if var.required else default_of(var.name)


def domain_sentence(var: Var) -> str:
    """The domain as the README and argument_specs state it ('' when the type or the choices say it all)."""
    return f" Values: {var.domain.text}." if var.domain is not None else ""


_ANSIBLE_TYPES = {"str": "str", "int": "int", "float": "float", "bool": "bool", "list": "list", "dict": "dict"}


def argument_specs(role: str) -> dict:
    """The `meta/argument_specs.yml` content for a role, from this catalogue.

    Ansible's role argument validation (ansible/module_utils/common/parameters.py, ansible-core 2.19) takes a null
    without checking its type only when the option's spec has no default (_validate_argument_types: `value is None
    and not required and default is None`), and checks every value given, null too, against `choices`
    (_validate_argument_values). So a variable that takes null (Var.takes_none) lists None among its choices, and
    one whose null leaves the setting alone while its default is not None (Var.nullable) is of type raw, its type
    said in the description: the spec keeps its real default for ansible-doc and defaults/main.yml. The types are
    checked by the role's plan all the same (rules.check_variables)."""
    options = {}
    for var in role_variables(role):
        raw = var.nullable and var.default is not None
        spec: dict[str, Any] = {"description": var.doc + domain_sentence(var) + (f" Type: {var.type}, or null." if raw else ""),
                                "type": "raw" if raw else _ANSIBLE_TYPES[var.type]}
        if var.choices:
            spec["choices"] = list(var.choices) + ([None] if var.takes_none else [])
        if var.required:
            spec["required"] = True
        elif var.default is not None:
            spec["default"] = default_of(var.name)  # what defaults/main.yml sets, for ansible-doc
        if var.type == "list":
            spec["elements"] = "raw"
        if var.secret:
            spec["no_log"] = True
        options[var.name] = spec
    return {"argument_specs": {"main": {"short_description": f"hicache-deploy {role} role", "options": options}}}


README_START, README_END = "<!-- variables:start -->", "<!-- variables:end -->"
VARIABLES_DOC = "docs/variables.md"  # where the generated variable table lives, relative to the checkout


def variables_table() -> str:
    """The variable table of docs/variables.md (generated; see _main)."""
    def cell(value: Any) -> str:
        if value is NO_DEFAULT:
            return "**required**"
        return "" if value is None else f"`{value}`".replace("|", "\\|")

    rows = ["| variable | type | default | meaning |", "|---|---|---|---|"]
    for var in VARIABLES:
        choices = f" One of: {', '.join(map(str, var.choices))}." if var.choices else ""
        secret = " **Secret**: shown as ********." if var.secret else ""
        domain = domain_sentence(var).replace("|", "\\|")
        rows.append(f"| `{var.name}` | {var.type} | {cell(var.default)} | {var.doc}{choices}{domain}{secret} |".replace("\n", " "))
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

    parser = argparse.ArgumentParser(description="Write roles/*/meta/argument_specs.yml and roles/*/defaults/main.yml from the catalogue.")
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--roles-dir", default=None, help="default: the checkout's roles/ (a checkout-only tool)")
    args = parser.parse_args()
    if args.roles_dir is None:
        from hicachectl.config.paths import checkout  # here: the catalogue imports nothing of ours

        args.roles_dir = str(checkout() / "roles")
    _IndentedDumper = _indented_dumper()
    drift = 0
    roles_dir = pathlib.Path(args.roles_dir)
    header = "---\n# Generated by `python -m hicachectl.config.schema --write`; edit hicachectl/config/schema.py instead.\n"
    for role in ROLES:
        defaults = role_defaults(role)
        wanted_files = {
            roles_dir / role / "meta" / "argument_specs.yml": header + yaml.dump(argument_specs(role), Dumper=_IndentedDumper, sort_keys=False, width=100),
            roles_dir / role / "defaults" / "main.yml": header + (yaml.dump(defaults, Dumper=_IndentedDumper, sort_keys=False, width=100) if defaults else ""),
        }
        for path, text in wanted_files.items():
            if not path.exists() or path.read_text() != text:
                drift += 1
                if args.write:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(text)
                print(("wrote " if args.write else "stale ") + str(path))
    readme = roles_dir.parent / VARIABLES_DOC  # the variable table moved out of the README (issue 24)
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
