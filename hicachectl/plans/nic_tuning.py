"""The nic_tuning role's plan: the desired state its host program (roles/nic_tuning/files/hicache-nic-tuning) applies,
its unit and udev rule, and the verdict on the program's report (what fails, what is a gap, what is not checked). No I/O."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from hicachectl.config.deployment import Deployment
from hicachectl.plans import storage, storage_live

CONFIG_FILE = "/etc/hicache/nic-tuning.json"
PROGRAM = "/usr/local/sbin/hicache-nic-tuning"
UNIT = "hicache-nic-tuning.service"


# The ports the deploy found, recorded by its apply: the boot unit tunes these and no other (no route is trusted at boot).
SELECTION_FILE = "/var/lib/hicache/nic-ports.json"
# When the program set each RDMA port's default ToS, with the storage server's mounts' statistics then (the L3 tier's):
# under /run, as the value lives in the kernel and a reboot clears both (storage_live.roce_tos_in_effect judges it).
TOS_STAMP_FILE = "/run/hicache/roce-tos.json"
UDEV_RULE = "/etc/udev/rules.d/90-hicache-nic-tuning.rules"
# Written when the program stopped irqbalance for IRQ pinning, so that turning the pinning off gives irqbalance back.
IRQBALANCE_MARKER = "/var/lib/hicache/irqbalance-stopped"
TOOL_TIMEOUT = 10  # seconds per tool the program runs; the unit's TimeoutStartSec bounds the whole run
START_TIMEOUT = 120


def storage_ports(d: Deployment) -> list[str]:
    """hicache_storage_localports as the mount uses them: VAST's multipath option, with remoteports only (storage.mount)."""
    multipath = storage.is_nfs(d) and d.storage_type == "vast" and d.storage_remoteports
    return [str(p) for p in d.storage_localports] if multipath else []


def storage_server(d: Deployment) -> str | None:
    return str(d.storage_server) if storage.is_nfs(d) and d.storage_server else None


def selection(d: Deployment) -> str:
    """Which ports the host program tunes and why, as render and plan say it (the program finds the ports themselves)."""
    if d.nic_interfaces:
        return "the ports hicache_nic_interfaces names: " + ", ".join(map(str, d.nic_interfaces))
    if storage_ports(d):
        return ("the storage ports hicache_storage_localports names (or that hold its addresses): " + ", ".join(storage_ports(d))
                + "; a VLAN or bond stands for the ports below it; never IPoIB ports")
    if storage_server(d):
        return (f"the ConnectX ports that route to hicache_storage_server {storage_server(d)} (ip route get) at the deploy, recorded "
                "for the boot run (which tunes those and no other); a VLAN or bond stands for the ports below it; never IPoIB or "
                "front-end ports")
    return "none: no port named (hicache_nic_interfaces) and no NFS storage server to route to"


# The settings a null (or an empty list of priorities) leaves as the host has them (schema: "None leaves it", "[] leaves
# PFC"), by the desired state's key: the host program neither writes nor reads them, and its report names each as left
# as it is (`left`), never as a failure.
LEFT_BY_NULL = {"rings": "hicache_nic_rings", "channels": "hicache_nic_channels", "qos_trust": "hicache_nic_qos_trust",
                "pfc": "hicache_nic_pfc_priorities", "ecn_priorities": "hicache_nic_ecn_priorities",
                "roce_tos": "hicache_nic_roce_dscp", "max_read_request": "hicache_nic_max_read_request",
                "cpu_governor": "hicache_nic_cpu_governor"}


def left_alone(d: Deployment) -> dict[str, str]:
    """The settings of LEFT_BY_NULL whose variable is null (or an empty list) here (desired-state key: variable): left as
    the host has them."""
    def unset(value) -> bool:
        return value is None or (isinstance(value, (list, tuple)) and not value)
    return {key: name for key, name in LEFT_BY_NULL.items() if unset(getattr(d, name[len("hicache_"):]))}


def desired(d: Deployment) -> dict:
    pfc = [1 if p in d.nic_pfc_priorities else 0 for p in range(8)] if d.nic_pfc_priorities else None
    return {
        "interfaces": [str(i) for i in d.nic_interfaces],  # [] = the storage ports (storage_ports, else storage_server's route)
        "storage_ports": storage_ports(d),
        "storage_server": storage_server(d),
        "selection": selection(d),
        "selection_file": SELECTION_FILE,
        # the ToS stamps, against the storage server's mounts (the L3 tier's): roce_tos_effect in the program's report
        "tos_stamp_file": TOS_STAMP_FILE,
        "tool_timeout": TOOL_TIMEOUT,
        "mtu": d.nic_mtu,
        "rings": d.nic_rings,
        "channels": d.nic_channels,
        "qos_trust": d.nic_qos_trust,
        "pfc": pfc,
        "ecn_priorities": list(d.nic_ecn_priorities),
        "ecn_required": bool(d.nic_ecn_required),
        # ToS = DSCP << 2 (the two low bits are ECN's, set by the NIC): configfs-rdma_cm's default_roce_tos
        "roce_tos": d.nic_roce_dscp << 2 if d.nic_roce_dscp is not None else None,
        "irq_affinity": d.nic_irq_affinity,
        "irqbalance_marker": IRQBALANCE_MARKER,
        "max_read_request": d.nic_max_read_request,
        "cpu_governor": d.nic_cpu_governor,
        "left": left_alone(d),  # null: neither set nor checked; the program's report names each (`left`)
    }


def config_text(d: Deployment) -> str:
    return json.dumps(desired(d), indent=2, sort_keys=True) + "\n"


def unit_text() -> str:
    """Before the network is set up (systemd.special(7): network-pre.target is passive, so the unit pulls it in with
    Wants=), after the driver stack (openibd.service of MLNX_OFED/DOCA where present: After= on an absent unit is
    void), with a bounded start: a hung tool fails this unit, never the boot, the network, the mount or the server.
    After configfs: the RDMA-CM default ToS is a configfs attribute (kernel Documentation/ABI/testing/configfs-rdma_cm:
    "Attributes are visible only when configfs is mounted"). systemd mounts it with sys-kernel-config.mount
    (DefaultDependencies=no, Before=sysinit.target, pulled in by sysinit.target: systemd units/meson.build), which this
    unit, having DefaultDependencies=no itself, is not ordered after unless it says so; Wants= pulls it in where
    sysinit.target's wants were trimmed. Where that unit is masked or skipped (ConditionPathExists=/sys/kernel/config,
    ConditionCapability=CAP_SYS_RAWIO), the program mounts configfs itself, as mlnx-tools' sbin/cma_roce_tos does
    (mlnx-tools ships no unit of its own)."""
    return f"""# Managed by hicache-deploy: re-applies the NIC tuning at every boot (the settings are runtime-only).
[Unit]
Description=hicache-deploy ConnectX tuning for storage traffic
DefaultDependencies=no
After=local-fs.target sys-kernel-config.mount systemd-modules-load.service systemd-udev-trigger.service openibd.service
Wants=network-pre.target
Wants=sys-kernel-config.mount
Before=network-pre.target shutdown.target
Conflicts=shutdown.target

[Service]
Type=oneshot
RemainAfterExit=yes
TimeoutStartSec={START_TIMEOUT}
ExecStart={PROGRAM} --apply {CONFIG_FILE}

[Install]
WantedBy=multi-user.target
"""


def udev_rule_text() -> str:
    """Apply the tuning again when what it sets is lost after the boot run:
    - an RDMA device that appears later (a driver reload, openibd restart, or mlx5 RoCE LAG forming when a bond takes
      both ports of one NIC: mlx5_bond_<n> replaces mlx5_<n>) starts with RDMA-CM's default ToS 0 (the value lives in
      the kernel's cma_device);
    - a bond or VLAN appears after the boot run (the network stack makes it after network-pre.target), and enslaving a
      port sets its MTU to the bond's, 1500 unless set (drivers/net/bonding/bond_main.c, bond_enslave); the program then
      sets the bond's own MTU, which bond_change_mtu passes to every port of it. A net device's uevent carries its
      device type as DEVTYPE (drivers/base/core.c, dev_uevent): "bond" (bond_main.c, bond_type) or "vlan"
      (net/8021q/vlan_dev.c, vlan_type). `|` separates alternatives (udev(7))."""
    run = f'RUN+="/bin/systemctl --no-block restart {UNIT}"'
    return ("# Managed by hicache-deploy: re-apply the NIC tuning when an RDMA device appears (its RDMA-CM default ToS starts at 0),\n"
            "# and when a bond or VLAN appears (enslaving sets each port's MTU to the bond's, 1500 unless set).\n"
            f'ACTION=="add", SUBSYSTEM=="infiniband", {run}\n'
            f'ACTION=="add", SUBSYSTEM=="net", ENV{{DEVTYPE}}=="bond|vlan", {run}\n')


@dataclasses.dataclass(frozen=True, kw_only=True)
class NicPlan:
    desired: dict[str, Any]  # what hicache-nic-tuning applies (--apply-json)
    config_file: str
    config_text: str
    program: str
    unit: str
    unit_text: str
    udev_rule_file: str  # re-applies the tuning when an RDMA device, a bond or a VLAN appears (udev_rule_text)
    udev_rule_text: str
    selection: str  # which ports the program tunes and why (it finds them on the host; its report names each)
    strict: bool
    asked: bool  # the inventory asks for NIC tuning (an NFS tier, or named interfaces)
    verdict: dict[str, Any] | None = None  # with the program's report: failures, gaps, what still differs


def nic_plan(d: Deployment, report: dict[str, Any] | None = None) -> NicPlan:
    """The plan; with `report` also the verdict on it. `report` is the program's --check-json report, or the whole
    result of the task that ran it (rc, stdout, stderr: program_report reads it)."""
    asked = storage.is_nfs(d) or bool(d.nic_interfaces)
    verdict = None
    if report is not None:
        read, failure = program_report(report) if "rc" in report else (report, None)
        verdict = nic_verdict(read, asked, bool(d.nic_ecn_required)) if failure is None else {"failures": [failure], "gaps": [], "changes": []}
    return NicPlan(desired=desired(d), config_file=CONFIG_FILE, config_text=config_text(d), program=PROGRAM, unit=UNIT, unit_text=unit_text(),
                   udev_rule_file=UDEV_RULE, udev_rule_text=udev_rule_text(), selection=selection(d), strict=bool(d.strict), asked=asked,
                   verdict=verdict)


def work_pending(read: dict[str, Any] | None, wanted: dict[str, Any]) -> bool:
    """Whether the role must read the ports itself and apply what differs, the host facts' read of them (hicache_host_facts'
    nic_read: the installed program, when it is the collection's, run as the role runs it) not settling them: no such
    read (the program not installed, another version of it, facts read outside site.yml), a read of another desired
    state than `wanted` (the role's plan: the facts read with other variables), a failed one, or one that found
    something to change."""
    if read is None:
        return True
    try:
        if json.loads(str(read.get("desired"))) != wanted:
            return True
    except ValueError:
        return True
    report, failure = program_report(read)
    return failure is not None or bool(report.get("changes"))


def program_report(run: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """(the report, None) from a run of `hicache-nic-tuning --check-json` (a command task's result: rc, stdout, stderr),
    or ({}, why) when the program failed or wrote no report: a failure of the host, whatever hicache_strict says (the
    program could not even read the ports)."""
    stdout = str(run.get("stdout") or "").strip()
    report = None
    if run.get("rc") == 0 and stdout.startswith("{"):
        try:
            report = json.loads(stdout)
        except ValueError:
            report = None
    if isinstance(report, dict):
        return report, None
    stderr = str(run.get("stderr") or "").strip()
    return {}, f"hicache-nic-tuning failed on this host (rc {run.get('rc')}): {stderr[-500:]}"


def parse_ethtool_rings(text: str) -> dict[str, dict[str, int]]:
    """`ethtool -g IF` -> {'max': {'RX': 8192, ...}, 'current': {...}}; 'n/a' values are left out."""
    out: dict[str, dict[str, int]] = {"max": {}, "current": {}}
    section = None
    for line in text.splitlines():
        if line.startswith("Pre-set maximums"):
            section = "max"
        elif line.startswith("Current hardware settings"):
            section = "current"
        elif section and ":" in line:
            key, _, value = line.partition(":")
            value = value.strip()
            if value.isdigit():
                out[section][key.strip()] = int(value)
    return out


def nic_verdict(report: dict, asked: bool, ecn_required: bool = False) -> dict[str, list[str]]:
    """Judge hicache-nic-tuning's JSON report (--check-json): what fails the host and what is a gap.

    `asked`: the inventory needs ConnectX ports (an NFS tier) or names ports (hicache_nic_interfaces).
    What the program tried and could not do (`failed`) is a failure: the host could and did not. What the host lacks
    (`unavailable`: a tool, a module, a named port, a storage name that does not resolve yet, or no ConnectX port at
    all) is a gap, on any host, whatever its port kind: a failure under hicache_strict, else the host is degraded, never
    ok. Only a host without ConnectX ports of which nothing is asked has nothing to tune, and no gap.
    `not_offered`: what the port's driver stack has no interface for (per-priority ECN, and trust/PFC where neither
    mlnx_qos nor iproute2's dcb is installed, with the distribution's mlx5; with dcb the program sets them through DCB
    netlink): a named gap that leaves the host degraded whatever hicache_strict says (`driver_gaps`); ECN's is a
    failure where the inventory requires it (hicache_nic_ecn_required).
    `changes`: what still differs from the inventory (a failure once the role has applied it).
    `ports`: each port selected or left alone, with why (what render's selection found on this host).
    `left`: each setting a null in the inventory leaves as it is ("None leaves it"): neither set nor read, not checked.
    `not_in_effect`: the RDMA-CM default ToS is set, but the L3 mount's transports connected before it and carry the old
    one (storage_live.roce_tos_in_effect): a gap that leaves the host degraded whatever hicache_strict says (the fix is a
    remount or a restart, which this role does not do under a running server); `not_checked`: where that cannot be told.
    """
    reasons = [f"{u['what']}: {u['reason']}" for u in report.get("unavailable", [])]
    failures = [f"{f['what']}: {f['reason']}" for f in report.get("failed", [])]
    changes = [c["what"] + (f" ({c['note']})" if c.get("note") else "") for c in report.get("changes", [])]
    driver = []
    for gap in report.get("not_offered", []):
        (failures if ecn_required and gap.get("setting") == "ecn" else driver).append(f"{gap['what']}: {gap['reason']}")
    ports = ([f"{s['port']}: tuned, {s['reason']}" for s in report.get("selected", [])]
             + [f"{s['port']}: not tuned, {s['reason']}" for s in report.get("skipped", [])])
    # driver_gaps and ports only where there are some: a verdict without them reads as before (checks.yml defaults them)
    left = [f"{item['what']}: {item['reason']}" for item in report.get("left", [])]
    not_in_effect, not_checked = storage_live.roce_tos_in_effect(report.get("roce_tos_effect"))
    extra = {k: v for k, v in (("driver_gaps", driver), ("ports", ports), ("left", left), ("not_in_effect", not_in_effect),
                               ("not_checked", not_checked)) if v}
    if not asked and not report.get("interfaces") and not report.get("connectx"):
        return {"failures": failures, "gaps": [], "changes": changes, **extra}
    return {"failures": failures, "gaps": reasons, "changes": changes, **extra}
