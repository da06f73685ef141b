"""What the nic_tuning role asks of each host: the desired state its host program applies. No I/O."""

from __future__ import annotations

import json

CONFIG_FILE = "/etc/hicache/nic-tuning.json"
PROGRAM = "/usr/local/sbin/hicache-nic-tuning"
UNIT = "hicache-nic-tuning.service"


def desired(d) -> dict:
    pfc = [1 if p in d.nic_pfc_priorities else 0 for p in range(8)] if d.nic_pfc_priorities else None
    return {
        "interfaces": [str(i) for i in d.nic_interfaces],  # [] = every ConnectX port
        "mtu": d.nic_mtu,
        "rings": d.nic_rings,
        "channels": d.nic_channels,
        "qos_trust": d.nic_qos_trust,
        "pfc": pfc,
        "ecn_priorities": list(d.nic_ecn_priorities),
        "irq_affinity": d.nic_irq_affinity,
        "max_read_request": d.nic_max_read_request,
        "cpu_governor": d.nic_cpu_governor,
    }


def config_text(d) -> str:
    return json.dumps(desired(d), indent=2, sort_keys=True) + "\n"


def unit_text() -> str:
    return f"""# Managed by hicache-deploy: re-applies the NIC tuning at every boot (the settings are runtime-only).
[Unit]
Description=hicache-deploy ConnectX tuning for storage traffic
After=network-pre.target systemd-udev-settle.service
Before=network-online.target docker.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={PROGRAM} --apply {CONFIG_FILE}

[Install]
WantedBy=multi-user.target
"""
