"""The built wheel works outside the checkout: built from a clean copy of the tree, installed into a fresh venv
in a temporary directory, and run from there as a user would (init, validate, render, plan on this machine).

About a minute: the build (setuptools from the index), the install (the dependencies through pip's usual
sources and cache), and one plan (ansible-playbook in check mode on localhost, every path under a temporary
base dir that must not appear)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile

import pytest
import yaml
from support import ROOT

pytestmark = pytest.mark.slow

DATA = ("ansible.cfg", "galaxy.yml", "meta", "templates", "playbooks", "roles", "plugins", "inventories")  # hicachectl/_data/ in the wheel
_TOP_IGNORED = {".git", ".venv", "build", "dist", "out", ".cache", ".ansible"}
_IGNORED = {"__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis"}


def _ignore(directory: str, names: list[str]) -> set[str]:
    top = pathlib.Path(directory).resolve() == ROOT
    return {n for n in names if n in _IGNORED or n.endswith((".pyc", ".egg-info")) or (top and n in _TOP_IGNORED)}


def _run(args: list, timings: dict, label: str, **kwargs) -> subprocess.CompletedProcess:
    start = time.monotonic()
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=900, **kwargs)
    timings[label] = round(time.monotonic() - start, 1)
    assert proc.returncode == 0, f"{label}: rc={proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    return proc


def _outside(environ: dict[str, str]) -> dict[str, str]:
    """This process's environment without anything that points into the checkout or its venv."""
    env = {k: v for k, v in environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith("ANSIBLE_")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", os.defpath).split(os.pathsep) if p and not p.startswith(str(ROOT)))
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel, built from a copy of this tree and installed into a fresh venv outside the checkout."""
    timings: dict[str, float] = {}
    tmp = tmp_path_factory.mktemp("wheel")
    assert not tmp.resolve().is_relative_to(ROOT)
    source, dist, venv = tmp / "src", tmp / "dist", tmp / "venv"
    shutil.copytree(ROOT, source, ignore=_ignore, symlinks=True)  # stale build/ files never reach the wheel
    env = _outside(os.environ)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", dist, source], timings, "pip wheel", cwd=tmp, env=env)
    wheel = next(dist.glob("hicache_deploy-*.whl"))
    _run([sys.executable, "-m", "venv", venv], timings, "venv", cwd=tmp, env=env)
    _run([venv / "bin/python", "-m", "pip", "install", "--quiet", wheel], timings, "pip install", cwd=tmp, env=env)
    yield {"tmp": tmp, "source": source, "wheel": wheel, "venv": venv, "timings": timings,
           "env": env | {"PATH": os.pathsep.join([str(venv / "bin"), env["PATH"]])}}
    print(f"\ntest_wheel timings (s): {json.dumps(timings)}")


def test_the_wheel_carries_every_data_file(installed):
    source = installed["source"]
    wanted = set()
    for name in ("hicachectl", *DATA):  # every file of the package (a new subpackage too), and of its data
        top = source / name
        files = [top] if top.is_file() else [p for p in top.rglob("*") if p.is_file()]
        wanted |= {(str(p.relative_to(source)) if name == "hicachectl" else f"hicachectl/_data/{p.relative_to(source)}") for p in files}
    with zipfile.ZipFile(installed["wheel"]) as wheel:
        shipped = {n for n in wheel.namelist() if n.startswith("hicachectl/")}
        modes = {i.filename: i.external_attr >> 16 for i in wheel.infolist()}
    assert shipped == wanted, f"missing: {sorted(wanted - shipped)}; unexpected: {sorted(shipped - wanted)}"
    assert modes["hicachectl/_data/roles/nic_tuning/files/hicache-nic-tuning"] & 0o111  # executable, as in git


def test_the_installed_cli_uses_only_the_installed_package(installed, tmp_path):
    venv, env = installed["venv"], installed["env"] | {"HOME": str(tmp_path)}
    site = venv.resolve()
    probe = ("import json; from hicachectl.config import inventory, paths; from hicachectl.plans import sglang_server as render; "
             "from hicachectl.cli import runner; "
             "print(json.dumps({'module': paths.__file__, 'from_checkout': paths.FROM_CHECKOUT, 'root': str(paths.ROOT), "
             "'paths': [str(p) for p in (paths.ANSIBLE_CFG, paths.TEMPLATES, paths.PLAYBOOKS, paths.ROLES, paths.CALLBACK_PLUGINS, "
             "inventory.INVENTORIES, render.TEMPLATES, runner.PLAYBOOKS, runner.ANSIBLE_CFG)], "
             "'collections': str(paths.collections_dir())}))")
    found = json.loads(_run([venv / "bin/python", "-c", probe], installed["timings"], "probe", cwd=tmp_path, env=env).stdout)
    assert found["from_checkout"] is False
    for path in [found["module"], found["root"], *found["paths"]]:
        assert pathlib.Path(path).resolve().is_relative_to(site), path
        assert pathlib.Path(path).exists(), path
    # ansible.cfg's relative paths resolve against its own directory: inside the venv too.
    dump = _run([venv / "bin/ansible-config", "dump", "--only-changed", "--format", "json"], installed["timings"], "ansible-config",
                cwd=tmp_path, env=env | {"ANSIBLE_CONFIG": found["paths"][0]}).stdout
    settings = {entry["name"]: entry["value"] for entry in json.loads(dump) if "name" in entry}
    for key in ("DEFAULT_CALLBACK_PLUGIN_PATH", "DEFAULT_HOST_LIST"):
        assert settings[key] and all(pathlib.Path(p).is_relative_to(found["root"]) and pathlib.Path(p).exists() for p in settings[key]), (key, settings[key])
    # The roles and plugins are the collection hicache.deploy: the package's data, linked from the user's cache
    # (site-packages may be read-only), which hicachectl puts first on ANSIBLE_COLLECTIONS_PATH.
    link = pathlib.Path(found["collections"]) / "ansible_collections/hicache/deploy"
    assert pathlib.Path(found["collections"]).is_relative_to(tmp_path) and link.resolve() == pathlib.Path(found["root"]).resolve()
    doc = _run([venv / "bin/ansible-doc", "-t", "role", "hicache.deploy.storage"], installed["timings"], "ansible-doc", cwd=tmp_path,
               env=env | {"ANSIBLE_CONFIG": found["paths"][0], "ANSIBLE_COLLECTIONS_PATH": found["collections"]}).stdout
    assert "hicache_storage_fstype" in doc and "default: xfs" in doc, doc


def test_init_validate_render_plan_from_a_fresh_directory(installed, tmp_path):
    """The issue's acceptance: the installed CLI, run from an empty directory outside the checkout."""
    timings = installed["timings"]
    work, home, base = tmp_path / "ops", tmp_path / "home", tmp_path / "hicache"
    work.mkdir()
    home.mkdir()
    env = installed["env"] | {"HOME": str(home)}  # Ansible's ~/.ansible and the fact cache stay in the test's tmp

    def cli(*args: str) -> subprocess.CompletedProcess:
        proc = _run([installed["venv"] / "bin/hicachectl", *args], timings, " ".join(args[:1]), cwd=work, env=env)
        assert str(ROOT) not in proc.stdout + proc.stderr, f"the checkout appears in {args}:\n{proc.stdout}\n{proc.stderr}"
        return proc

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert cli("--version").stdout.strip() == f"hicachectl {version}"
    cli("init", "--profile", "local", "--hosts", "localhost", "--out", "inventories/prod")
    # Every path the roles would write goes under a temporary base dir, so that "nothing changed" can be seen.
    group_vars = work / "inventories/prod/group_vars/all.yml"
    settings = yaml.safe_load(group_vars.read_text()) | {"hicache_base_dir": str(base), "hicache_cache_dir": f"{base}/l3"}
    group_vars.write_text(yaml.safe_dump(settings))
    assert "valid" in cli("validate", "-i", "prod").stdout
    assert "--hicache-storage-backend file" in cli("render", "-i", "prod").stdout
    plan = cli("plan", "-i", "prod")
    assert "localhost: would change: Install start.sh, run.sh, serve.sh and the backend config [start.sh]" in plan.stdout, plan.stdout
    assert not base.exists()


def _collection_install_lines() -> list[str]:
    """The collection install of docs/collection.md, line by line, exactly as written there."""
    text = (ROOT / "docs/collection.md").read_text()
    block = text.split("<!-- collection-install:start -->", 1)[1].split("<!-- collection-install:end -->", 1)[0]
    lines = block.strip().removeprefix("```bash").removesuffix("```").strip().splitlines()
    assert lines and all(line.strip() for line in lines), lines
    return lines


def test_the_documented_collection_install_works_from_the_checkout(installed, tmp_path):
    """docs/collection.md's lines, run verbatim in a checkout that holds its own collection link (as every checkout
    does once hicachectl or tests/run has run): the collection lands in ~/.ansible/collections, and ansible-doc in
    an ops folder, which sees no ansible.cfg of ours, shows the role. (Without --force ansible-galaxy finds the
    checkout's link through the checkout's ansible.cfg, says "Nothing to do" and installs nothing.)"""
    checkout, home = tmp_path / "checkout", tmp_path / "home"
    shutil.copytree(installed["source"], checkout, symlinks=True)
    link = checkout / ".ansible/collections/ansible_collections/hicache/deploy"
    link.parent.mkdir(parents=True)
    link.symlink_to(checkout, target_is_directory=True)
    (home / "ops").mkdir(parents=True)
    env = installed["env"] | {"HOME": str(home)}
    script = "set -euo pipefail\n" + "\n".join(_collection_install_lines()) + "\n"
    proc = _run(["bash", "-c", script], installed["timings"], "collection install (docs)", cwd=checkout, env=env)
    installed_root = home / ".ansible/collections/ansible_collections/hicache/deploy"
    assert (installed_root / "MANIFEST.json").is_file() and not installed_root.is_symlink(), proc.stdout + proc.stderr
    assert "Nothing to do" not in proc.stdout + proc.stderr
    assert "ROLE: hicache.deploy.storage" in proc.stdout.replace("\x1b[1m", "").replace("\x1b[0m", "") and "hicache_storage_fstype" in proc.stdout
    assert str(installed_root) in proc.stdout  # the installed copy, not the checkout
