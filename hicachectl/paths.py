"""Where hicachectl's own files are: the one module that knows.

The repository keeps templates/, playbooks/, roles/, plugins/, inventories/ and ansible.cfg at its root; a built
wheel carries the same tree as package data under hicachectl/_data/ (pyproject.toml maps it, nothing is copied
in git). ROOT is the checkout when hicachectl runs from one (an editable install, `python -m hicachectl` in the
repository), else that package data. Every other module takes its paths from here. ansible.cfg's relative paths
(roles_path, library, filter_plugins, ...) resolve against the directory of ansible.cfg, so they hold in both
layouts.

Generated-file checks (`python -m hicachectl.schema`, `python -m hicachectl.readme`) work on a checkout only:
`checkout()`.
"""

from __future__ import annotations

import pathlib

_PACKAGE = pathlib.Path(__file__).resolve().parent
_MARKERS = ("pyproject.toml", "ansible.cfg", "playbooks", "templates")


def _from_checkout() -> pathlib.Path | None:
    root = _PACKAGE.parent
    return root if all((root / marker).exists() for marker in _MARKERS) else None


def _from_package() -> pathlib.Path:
    from importlib import resources

    # hicachectl is a namespace package: files() is a MultiplexedPath, its child the real directory.
    data = resources.files("hicachectl").joinpath("_data")
    if not isinstance(data, pathlib.Path):  # Ansible and Jinja need a real directory, as pip unpacks it
        data = _PACKAGE / "_data"
    if not (data / "ansible.cfg").is_file():
        raise RuntimeError(f"hicachectl's data files are missing ({data}): reinstall the package, or run it from its checkout")
    return data


CHECKOUT = _from_checkout()
FROM_CHECKOUT = CHECKOUT is not None
ROOT = CHECKOUT if CHECKOUT is not None else _from_package()

ANSIBLE_CFG = ROOT / "ansible.cfg"
TEMPLATES = ROOT / "templates"
PLAYBOOKS = ROOT / "playbooks"
ROLES = ROOT / "roles"
PLUGINS = ROOT / "plugins"
CALLBACK_PLUGINS = PLUGINS / "callback"
INVENTORIES = ROOT / "inventories"  # the shipped profiles


def checkout() -> pathlib.Path:
    """The repository's root, for the tools that check or rewrite its generated files."""
    if CHECKOUT is None:
        raise SystemExit(f"this tool works on a checkout of hicache-deploy; hicachectl runs from an installed package ({ROOT})")
    return CHECKOUT
