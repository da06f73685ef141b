# Copyright: hicache-deploy developers
# SPDX-License-Identifier: Apache-2.0
"""Documentation of the hicache_gap action plugin (plugins/action/hicache_gap.py), which runs on the controller.

This file carries only DOCUMENTATION, EXAMPLES and RETURN: ansible-doc reads an action's documentation from the
module of the same name, and nothing of it is sent to a host.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: hicache_gap
short_description: Say that a host cannot do something its inventory asks for, and why
description:
  - Reports a gap, something the inventory asks for that this host cannot do, with its reason.
  - With O(strict) (the inventory's C(hicache_strict), true by default) the task fails with the reason.
  - Otherwise the inventory tolerates the gap. The task reports ok without a change, the reason travels in RV(hicache_gaps)
    (hicachectl shows the host as degraded, never as ok) and as a warning (plain ansible-playbook shows it).
  - A gap is never a skip; skipped means "not asked for".
  - Runs on the controller as an action plugin; it changes nothing on the host.
options:
  reason:
    description: Why the host cannot do what is asked. An empty reason fails the task.
    type: str
    required: true
  strict:
    description: The inventory's C(hicache_strict). True fails the task; false reports the gap and goes on.
    type: bool
    required: true
  tolerated:
    description:
      - Whether the inventory may tolerate this at all. False means the host could have done it and did not, a failure
        whatever O(strict) says, so one task says both "cannot here" (a gap) and "failed" (not a gap), with no task pair.
    type: bool
    default: true
  why_tolerated:
    description:
      - Why the gap is tolerated, for a gap the role tolerates whatever C(hicache_strict) says (O(strict) false), e.g. a
        driver with no interface for the setting. Said in the warning and by hicachectl verify.
    type: str
    default: hicache_strict is false
  checked:
    description:
      - True when the host's state was read and does not meet the request (a tolerated failure, e.g. a ToS set but not in
        effect); false when the host cannot tell or cannot do it (a check not made). hicachectl verify shows the first as
        failed, the second as not checked; either leaves the host degraded.
    type: bool
    default: false
notes:
  - Runs the same in check mode.
author: hicache-deploy developers (@hicache-deploy)
"""

EXAMPLES = r"""
- name: Enable the NIC tuning at boot (this host has no systemd)
  hicache.deploy.hicache_gap:
    reason: systemd does not run this host, so the NIC tuning is not re-applied at boot
    strict: "{{ hicache_strict }}"
  when: ansible_facts.service_mgr != 'systemd'

- name: Check the L3 tier is mounted
  hicache.deploy.hicache_gap:
    reason: "nothing is mounted at /mnt/kvcache{{ '' if can_mount else ': this host cannot mount it' }}"
    strict: "{{ hicache_strict }}"
    tolerated: "{{ not can_mount }}"  # it could mount and did not: a failure, never a gap
  when: not mounted
"""

RETURN = r"""
msg:
  description: The reason.
  returned: always
  type: str
  sample: systemd does not run this host, so the NIC tuning is not re-applied at boot
hicache_gaps:
  description: The reason, as the one item of a list (hicachectl collects the gaps of a host from every task).
  returned: when O(reason) is not empty
  type: list
  elements: str
hicache_gap_outcome:
  description: How a tolerated gap reads (O(checked), O(why_tolerated)).
  returned: when the gap is tolerated
  type: dict
  sample: {"checked": false, "why_tolerated": "hicache_strict is false"}
"""
