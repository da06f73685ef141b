# Copyright: hicache-deploy developers
# SPDX-License-Identifier: Apache-2.0
"""Documentation of the hicache_note action plugin (plugins/action/hicache_note.py), which runs on the controller.

This file carries only DOCUMENTATION, EXAMPLES and RETURN: ansible-doc reads an action's documentation from the
module of the same name, and nothing of it is sent to a host.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: hicache_note
short_description: Tell the operator something that happened on a host
description:
  - Records a note about something that happened on a host and changed nothing by itself (a fallback taken, a restart
    that is still needed). hicachectl prints these notes under the host's results.
  - The task always reports ok without a change.
  - Runs on the controller as an action plugin; it changes nothing on the host.
options:
  note:
    description: The note.
    type: str
    default: ""
  warn:
    description: Also issue the note as a warning, so that plain ansible-playbook shows it (it does not show RV(msg)).
    type: bool
    default: false
notes:
  - Runs the same in check mode.
author: hicache-deploy developers (@hicache-deploy)
"""

EXAMPLES = r"""
- name: Say that the server still runs its old config
  hicache.deploy.hicache_note:
    note: the server runs its old config until it restarts (pending restart)
    warn: true
"""

RETURN = r"""
msg:
  description: The note.
  returned: always
  type: str
hicache_note:
  description: The note, under the name hicachectl collects it by.
  returned: always
  type: str
  sample: NIXL could not create its io_uring backend; the server now runs the POSIX plugin with posix_aio
"""
