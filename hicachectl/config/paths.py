"""Where hicachectl's own files are: the one module that knows.

The repository keeps templates/, playbooks/, roles/, plugins/, inventories/ and ansible.cfg at its root; a built
wheel carries the same tree as package data under hicachectl/_data/ (pyproject.toml maps it, nothing is copied
in git). ROOT is the checkout when hicachectl runs from one (an editable install, `python -m hicachectl` in the
repository), else that package data. Every other module takes its paths from here. ansible.cfg's relative paths
(roles_path, library, filter_plugins, ...) resolve against the directory of ansible.cfg, so they hold in both
layouts.

Generated-file checks (`python -m hicachectl.config.schema`, `python -m hicachectl.cli.readme`) work on a checkout only:
`checkout()`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import stat

_PACKAGE = pathlib.Path(__file__).resolve().parent.parent  # hicachectl/, this file being hicachectl/config/paths.py
_MARKERS = ("pyproject.toml", "ansible.cfg", "galaxy.yml", "playbooks", "templates")


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
COLLECTION = "hicache.deploy"  # ROOT is that collection: roles/, plugins/, playbooks/, meta/runtime.yml (galaxy.yml)


def collections_dir() -> pathlib.Path:
    """A collections path in which `hicache.deploy` is ROOT itself (a symlink, made here when missing), so the
    playbooks and roles run by FQCN without `ansible-galaxy collection install`. In a checkout it is
    .ansible/collections, which ansible.cfg names for a plain `ansible-playbook` and Molecule too; for an
    installed package, a directory of its own in the user's cache (site-packages may not be writable)."""
    if CHECKOUT is not None:
        base = CHECKOUT / ".ansible" / "collections"
    else:
        cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser()
        base = cache / "hicache-deploy" / "collections" / hashlib.sha256(str(ROOT).encode()).hexdigest()[:16]
    link = base / "ansible_collections" / "hicache" / "deploy"
    if not (link.is_symlink() and link.resolve() == ROOT.resolve()):
        if link.exists() and not link.is_symlink():
            raise RuntimeError(f"{link} is a directory, not the link to {ROOT} hicachectl makes there: remove it")
        link.parent.mkdir(parents=True, exist_ok=True)
        staged = link.with_name(f".deploy.{os.getpid()}")
        staged.unlink(missing_ok=True)
        staged.symlink_to(ROOT, target_is_directory=True)
        os.replace(staged, link)  # atomic: a concurrent run sees the old link or the new one
    return base


# --- the Ansible configuration hicachectl's playbooks run with (issue #24) ------------------------------------------
# Ansible's own lookup, first readable file wins (ansible-core lib/ansible/config/manager.py find_ini_config_file):
# ANSIBLE_CONFIG (a directory means its ansible.cfg), ./ansible.cfg unless the working directory is world-writable,
# ~/.ansible.cfg, /etc/ansible/ansible.cfg. Done here, in hicachectl's own working directory, because ansible-runner
# starts ansible-playbook in the playbooks' directory (ansible_runner/config/runner.py: cwd = project_dir), where
# Ansible would not find the user's ./ansible.cfg. Pure os calls: `--help` names the file without importing Ansible.

@dataclasses.dataclass(frozen=True)
class AnsibleConfigFile:
    path: pathlib.Path
    found_by: str  # how: "ANSIBLE_CONFIG", "./ansible.cfg", "~/.ansible.cfg", "/etc/ansible/ansible.cfg", or OWN

    @property
    def own(self) -> bool:
        return self.found_by == OWN_CONFIG

    def describe(self) -> str:
        return (f"{self.path} (hicachectl's own: no ANSIBLE_CONFIG, ./ansible.cfg, ~/.ansible.cfg or /etc/ansible/ansible.cfg)"
                if self.own else f"{self.path} (found as {self.found_by}, Ansible's own lookup)")


OWN_CONFIG = "hicachectl's own"


def _readable(path: str) -> bool:
    return os.path.exists(path) and os.access(path, os.R_OK)


def ansible_config(environ=None, cwd: str | None = None) -> AnsibleConfigFile:
    """The ansible.cfg Ansible itself would use here; hicachectl's own (ANSIBLE_CFG) when there is none."""
    environ = os.environ if environ is None else environ
    candidates = []
    if "ANSIBLE_CONFIG" in environ:
        # unfrackpath(follow=False): ~ and $VARS expanded, made absolute, symlinks kept
        from_env = os.path.abspath(os.path.expandvars(os.path.expanduser(environ["ANSIBLE_CONFIG"])))
        candidates.append((os.path.join(from_env, "ansible.cfg") if os.path.isdir(from_env) else from_env, "ANSIBLE_CONFIG"))
    try:
        cwd = cwd or os.getcwd()
        if not os.stat(cwd).st_mode & stat.S_IWOTH:  # Ansible ignores ./ansible.cfg in a world-writable directory
            candidates.append((os.path.join(cwd, "ansible.cfg"), "./ansible.cfg"))
    except OSError:
        pass
    home = environ.get("HOME") or os.path.expanduser("~")
    candidates += [(os.path.join(home, ".ansible.cfg"), "~/.ansible.cfg"), ("/etc/ansible/ansible.cfg", "/etc/ansible/ansible.cfg")]
    for path, found_by in candidates:
        if _readable(path):
            return AnsibleConfigFile(pathlib.Path(path), found_by)
    return AnsibleConfigFile(ANSIBLE_CFG, OWN_CONFIG)


if __name__ == "__main__":  # `python -m hicachectl.config.paths`: make the link (tests/run does before ansible-lint)
    print(collections_dir())


def checkout() -> pathlib.Path:
    """The repository's root, for the tools that check or rewrite its generated files."""
    if CHECKOUT is None:
        raise SystemExit(f"this tool works on a checkout of hicache-deploy; hicachectl runs from an installed package ({ROOT})")
    return CHECKOUT
