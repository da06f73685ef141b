"""Read an Ansible inventory with Ansible's own loader and return each host's variables.

Ansible is imported inside the functions: `hicachectl --help` must not pay for it.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

from hicachectl.model import PREFIX

PROJECT_ROOT = pathlib.Path(__file__).resolve().parent.parent
INVENTORIES = PROJECT_ROOT / "inventories"


class InventoryError(Exception):
    pass


@dataclasses.dataclass
class Inventory:
    name: str
    path: pathlib.Path
    hosts: dict[str, dict[str, Any]]  # host -> its hicache_* variables, templated


def resolve_path(name_or_path: str) -> pathlib.Path:
    """`prod` means inventories/prod; anything that exists as given is taken as a path."""
    given = pathlib.Path(name_or_path)
    if given.exists():
        return given.resolve()
    shipped = INVENTORIES / name_or_path
    if shipped.exists():
        return shipped
    known = ", ".join(sorted(p.name for p in INVENTORIES.iterdir() if p.is_dir())) if INVENTORIES.is_dir() else ""
    raise InventoryError(f"no inventory {name_or_path!r}: not a path, and not one of inventories/ ({known}).")


def plain(value: Any) -> Any:
    """Ansible's tagged str/int/dict subclasses -> plain Python values."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    for kind in (str, int, float):
        if isinstance(value, kind):
            return kind(value)
    return value


def load(name_or_path: str, limit: str | None = None) -> Inventory:
    path = resolve_path(name_or_path)
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    try:
        manager = InventoryManager(loader=loader, sources=[str(path)])
        variables = VariableManager(loader=loader, inventory=manager)
        hosts = manager.get_hosts(pattern=limit or "all")
    except AnsibleError as exc:
        raise InventoryError(f"{path}: {exc}") from exc
    if not hosts:
        raise InventoryError(f"{path}: no hosts{' match ' + repr(limit) if limit else ''}.")
    out: dict[str, dict[str, Any]] = {}
    for host in hosts:
        host_vars = variables.get_vars(host=host, include_hostvars=False)
        templar = Templar(loader=loader, variables=host_vars)
        try:
            out[host.name] = {k: plain(templar.template(v)) for k, v in host_vars.items() if k.startswith(PREFIX)}
        except AnsibleError as exc:
            raise InventoryError(f"{path}: host {host.name}: {exc}") from exc
    return Inventory(name=name_or_path, path=path, hosts=out)


CONNECTION_VARS = ("ansible_connection", "ansible_host", "ansible_port", "ansible_user", "ansible_ssh_private_key_file")


def connection(name_or_path: str, host: str) -> dict[str, Any]:
    """How Ansible reaches `host` (connection type, address, port, user, key), templated."""
    path = resolve_path(name_or_path)
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    manager = InventoryManager(loader=loader, sources=[str(path)])
    found = manager.get_host(host)
    if found is None:
        raise InventoryError(f"{path}: no host {host!r}.")
    host_vars = VariableManager(loader=loader, inventory=manager).get_vars(host=found, include_hostvars=False)
    templar = Templar(loader=loader, variables=host_vars)
    return {k: plain(templar.template(host_vars[k])) for k in CONNECTION_VARS if k in host_vars}
