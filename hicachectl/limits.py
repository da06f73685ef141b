"""Host limits the seeds' stack needs: pinned host memory (memlock) for sessions, the runtime, sysctls. No I/O."""

from __future__ import annotations

LIMITS_FILE = "/etc/security/limits.d/90-hicache-memlock.conf"
SYSCTL_FILE = "/etc/sysctl.d/90-hicache.conf"
DROPIN_NAME = "90-hicache-memlock.conf"


def _field(value) -> str:
    """A value written into a line of limits.conf, a drop-in or sysctl.d: the rules refuse anything but one line of
    printable text first (the catalogue's domains); one that gets here anyway is a bug, never written."""
    text = str(value)
    if not text.strip() or any(ord(c) < 32 or ord(c) == 127 or c in "\x85\u2028\u2029" for c in text):
        raise ValueError(f"{text!r} cannot be written as one field of a line")
    return text


def limits_conf(d) -> str:
    value = _field(d.limits_memlock)
    if value != "unlimited" and not value.isdigit():
        raise ValueError(f"memlock {value!r} is neither unlimited nor a number of KiB")
    # pam_limits' wildcard does not apply to root, and the servers run as root.
    return ("# Managed by hicache-deploy: HiCache pins its host pool (cudaHostRegister).\n"
            + "".join(f"{who} {kind} memlock {value}\n" for who in ("*", "root") for kind in ("soft", "hard")))


def runtime_service(d) -> str | None:
    if d.limits_runtime_service:
        return d.limits_runtime_service
    return "docker.service" if d.container_runtime == "docker" else None  # podman has no daemon


def systemd_memlock(d) -> str:
    return "infinity" if d.limits_memlock == "unlimited" else str(int(d.limits_memlock) * 1024)


def runtime_dropin(d) -> str:
    return f"# Managed by hicache-deploy: containers inherit the runtime's memlock limit.\n[Service]\nLimitMEMLOCK={systemd_memlock(d)}\n"


def sysctl_conf(d) -> str | None:
    if not d.host_sysctls:
        return None
    return "# Managed by hicache-deploy.\n" + "".join(f"{_field(k)} = {_field(v)}\n" for k, v in d.host_sysctls.items())
