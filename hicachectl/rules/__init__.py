"""Cross-field validation of one host's variables, before any host is touched.

Two passes: `check_variables` looks at the raw inventory values (unknown names, types, choices,
pasted non-breaking spaces); when that pass finds no error, `check_deployment` checks the rules
SGLang, NIXL, the storage and the host impose on the combination. Each finding names the host,
the variable, the rule and the fix.

Where each family lives:
  findings.py   Finding, the collector the rules write to, the `rule` registry, `check_deployment`, `group_findings`
  output.py     fleet-sized output: `compact_hosts` (host names folded into numbered runs)
  variables.py  pass 1: types, choices, domains, pasted and control characters, required variables
  sglang.py     pass 2, SGLang's command line: image, model, version, served name, GPUs, chunked prefill,
                host pool, io backend x layout, extra args and managed flags, service, extra config
  nixl.py       pass 2, the NIXL backend: plugin sections and parameters, io_uring in Docker
  tiers.py      pass 2, the tiers as a whole: dynamic (ADP) backend, L3 namespace, host pool and workload sizing
  storage.py    pass 2, the L3 mount: VAST and NetApp, remoteports, nconnect
  fleet.py      across hosts: one machine twice, shared L3 tiers, servers behind routers
  config/secrets.py  pass 2's last rule: secret keys and env-file values
"""

from __future__ import annotations

# Pass 2 runs its rules in the order they are registered, and reports their findings in that order. Each module
# registers its own as it is first imported, so these come before any other import of the package and stay in
# this order (SGLang's, NIXL's, the tiers', the storage's); the secrets' rule is registered last, below.
# isort: off
from hicachectl.rules import sglang  # noqa: F401
from hicachectl.rules import nixl  # noqa: F401
from hicachectl.rules import tiers  # noqa: F401
from hicachectl.rules import storage  # noqa: F401
# isort: on

import re
from collections.abc import Mapping
from typing import Any

from hicachectl.config import schema, secrets
from hicachectl.config.deployment import PREFIX, build
from hicachectl.rules.findings import ERROR, WARNING, Finding, check_deployment, group_findings, has_errors, rule
from hicachectl.rules.fleet import check_fleet, check_routed, check_routers, check_server_or_router, check_shared_tiers
from hicachectl.rules.output import compact_hosts
from hicachectl.rules.storage import remote_port_count
from hicachectl.rules.variables import _check_host_name, check_variables
from hicachectl.rules.variables import _strings as _strings  # tests/test_injection.py walks values as pass 1 does

rule(secrets.check)  # after every rule of this package

__all__ = ["ERROR", "WARNING", "Finding", "build", "check_deployment", "check_fleet", "check_host", "check_routed", "check_routers", "check_server_or_router", "check_shared_tiers",
           "check_variables", "compact_hosts", "group_findings", "has_errors", "remote_port_count", "rule"]

_VARIABLE = re.compile(PREFIX + r"[a-z0-9_]+")  # the variable a finding's path starts with (hicache_x.key[0])


# check_host stays here, reading `build` and `check_deployment` from this module when it runs:
# tests/test_role_variables.py replaces both on `hicachectl.rules` to record what each role reads.
def check_host(host: str, raw: Mapping[str, Any], role: str | None = None) -> tuple[Any, list[Finding]]:
    """Both passes for one host: (deployment or None when the variables are unusable, findings).

    With `role`, what one role of the collection needs when it runs alone (a user's playbook): a variable only
    other roles read need not be set, and only findings on the role's own variables count; every value that is
    set is still checked against its type and domain."""
    scope = None if role is None else {v.name for v in schema.role_variables(role)}
    findings = _check_host_name(host) + check_variables(host, raw, scope)
    if has_errors(findings):
        return None, findings
    deployment = build(host, raw)
    findings += check_deployment(deployment)
    if scope is not None:
        findings = [f for f in findings if (named := _VARIABLE.match(f.variable)) is None or named.group(0) in scope]
    return deployment, findings
