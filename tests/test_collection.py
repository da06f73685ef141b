"""The collection hicache.deploy as an Ansible user gets it: built with ansible-galaxy, installed into a temporary
collections path, documented by ansible-doc, passing ansible-test sanity, and used by FQCN from a playbook
outside the repository (no ansible.cfg of ours, no checkout on any Ansible path) that converges an SSH test host
and changes nothing on its second run.

The controller's Python is this venv's: ansible-core and the core package hicache-deploy, which the collection
requires (COLLECTION.md)."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
import yaml
from fleet import STANDIN, Fleet
from support import ROOT

from hicachectl.config import schema

pytestmark = pytest.mark.slow

BIN = pathlib.Path(sys.executable).parent


def _env(home: pathlib.Path, collections: pathlib.Path) -> dict[str, str]:
    """Nothing of the checkout: no ANSIBLE_* of ours, no ansible.cfg (cwd and HOME are temporary)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    return env | {"HOME": str(home), "ANSIBLE_COLLECTIONS_PATH": str(collections), "ANSIBLE_NOCOLOR": "1",
                  "PATH": os.pathsep.join([str(BIN), env.get("PATH", "")])}


def _run(args, cwd, env, timeout=900) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args[:3]}: rc={proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("collection")
    assert not tmp.resolve().is_relative_to(ROOT)
    home, collections, dist = tmp / "home", tmp / "collections", tmp / "dist"
    home.mkdir()
    env = _env(home, collections)
    _run([BIN / "ansible-galaxy", "collection", "build", "--output-path", dist, ROOT], tmp, env)
    tarball = next(dist.glob("hicache-deploy-*.tar.gz"))
    _run([BIN / "ansible-galaxy", "collection", "install", "-p", collections, tarball], tmp, env)
    root = collections / "ansible_collections/hicache/deploy"
    assert (root / "roles/storage/tasks/main.yml").is_file() and not root.is_symlink()
    return {"tmp": tmp, "env": env, "root": root}


def test_the_built_collection_holds_only_the_collection(installed):
    root = installed["root"]
    top = {p.name for p in root.iterdir()}
    assert {"roles", "plugins", "playbooks", "meta", "MANIFEST.json", "FILES.json"} <= top
    assert not top & {"hicachectl", "molecule", "inventories", "pyproject.toml", "ansible.cfg", ".git", ".venv", ".ansible"}, top
    shipped_tests = {str(p.relative_to(root)) for p in (root / "tests").rglob("*") if p.is_file()}
    assert shipped_tests == {f"tests/sanity/ignore-2.{minor}.txt" for minor in (19, 20, 21)}, shipped_tests  # ansible-test's only


@pytest.mark.parametrize("role", schema.ROLES)
def test_ansible_doc_shows_every_variable_a_role_reads_with_its_real_default(installed, role):
    fqcn = f"hicache.deploy.{role}"
    doc = json.loads(_run([BIN / "ansible-doc", "-t", "role", "--json", fqcn], installed["tmp"], installed["env"]).stdout)
    options = doc[fqcn]["entry_points"]["main"]["options"]
    for var in schema.role_variables(role):
        assert var.name in options, f"ansible-doc of {fqcn} leaves out {var.name}, which the role reads"
        if var.required:
            assert options[var.name].get("required") is True, (var.name, options[var.name])
        else:
            assert options[var.name].get("default") == var.default, (var.name, options[var.name], var.default)
    if role == "storage":  # the examples, as a reader sees them
        text = _run([BIN / "ansible-doc", "-t", "role", fqcn], installed["tmp"], installed["env"]).stdout
        assert "default: xfs" in text and "default: root" in text


def test_the_playbooks_run_by_fqcn(installed):
    """hicache.deploy.site and the others, as `ansible-playbook hicache.deploy.NAME` finds them in the collection."""
    names = sorted(p.stem for p in (ROOT / "playbooks").glob("*.yml"))
    assert "site" in names
    for name in names:
        _run([BIN / "ansible-playbook", "-i", "localhost,", f"hicache.deploy.{name}", "--syntax-check"], installed["tmp"], installed["env"])


@pytest.mark.parametrize("plugin, kind", [("hicache_lock", "module"), ("hicache_gap", "module"), ("hicache_vars", "lookup"),
                                          ("hicache_skips", "callback"), ("hicache_l3_namespaces", "module"),
                                          ("hicache_router_worker", "module"), ("hicache_files", "module"),
                                          ("hicache_preload", "callback")])
def test_ansible_doc_documents_the_plugins(installed, plugin, kind):
    doc = _run([BIN / "ansible-doc", "-t", kind, f"hicache.deploy.{plugin}"], installed["tmp"], installed["env"]).stdout
    assert plugin in doc


@pytest.mark.timeout(2400)  # ansible-test's own bound on the run is 1800 s, its venvs come first
def test_ansible_test_sanity_passes(installed):
    """ansible-test's own sanity tests, in venvs it makes (pylint, yamllint, validate-modules... from PyPI).

    ansible-test bootstraps pip in each venv with get-pip.py from ci-files.testing.ansible.com, which this
    machine cannot reach; it first looks in its cache, where tests/infra/ansible_test_get_pip.py (ensurepip, then
    the pinned pip from PyPI) stands in for that download."""
    cache = pathlib.Path(installed["env"]["HOME"]) / ".ansible/test/cache"
    cache.mkdir(parents=True, exist_ok=True)
    import ansible_test  # the pip version ansible-test pins names the cached file

    pins = (pathlib.Path(ansible_test.__file__).parent / "_internal/python_requirements.py").read_text()
    pip_version = re.search(r"pip='([0-9.]+)'", pins).group(1)
    (cache / f"get_pip_{pip_version.replace('.', '_')}.py").write_text((ROOT / "tests/infra/ansible_test_get_pip.py").read_text())
    proc = subprocess.run([BIN / "ansible-test", "sanity", "--venv", "--python", f"{sys.version_info.major}.{sys.version_info.minor}", "--color", "no"],
                          cwd=installed["root"], env=installed["env"], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-4000:]


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    fleet = Fleet(tmp_path_factory.mktemp("fleet"), 1, prefix="hicache-coll").up().install_standin()
    name = next(iter(fleet.hosts))
    yield fleet, name
    fleet.down()


PLAYBOOK = """\
# A user's playbook: two roles of the collection by FQCN, each given only the variables it reads.
- name: An L3 directory and an SGLang server (a stand-in for it, as the test host has no GPU)
  hosts: all
  gather_facts: false
  vars:
    hicache_strict: false
  tasks:
    - name: Prepare the L3 tier
      ansible.builtin.include_role:
        name: hicache.deploy.storage
      vars:
        hicache_storage_type: local
        hicache_cache_dir: /srv/kvcache
        hicache_cache_mode: "0750"

    - name: Run the server
      ansible.builtin.include_role:
        name: hicache.deploy.sglang_server
      vars:
        hicache_image: lmsysorg/sglang:v0.5.21
        hicache_model_path: /models/tiny
        hicache_served_model_name: tiny
        hicache_container_runtime: none
        hicache_launcher: [python3, %(standin)s]
        hicache_cache_dir: /srv/kvcache
        hicache_storage_backend: file
        hicache_health_timeout: 120
        hicache_container_env:
          STANDIN_LOAD_SECONDS: "2"
"""


def _recap(stdout: str) -> dict[str, int]:
    line = next(line for line in stdout.splitlines() if " : ok=" in line)
    return {k: int(v) for k, v in (part.split("=") for part in line.split(" : ", 1)[1].split())}


def test_a_playbook_outside_the_repository_converges_a_host_and_is_idempotent(installed, host):
    fleet, name = host
    work = installed["tmp"] / "user"
    work.mkdir(exist_ok=True)
    (work / "site.yml").write_text(PLAYBOOK % {"standin": STANDIN})
    port = fleet.hosts[name]
    inventory = {"all": {"hosts": {name: {"ansible_host": "127.0.0.1", "ansible_port": port, "ansible_user": "root",
                                          "ansible_ssh_private_key_file": str(fleet.key), "ansible_python_interpreter": "/usr/bin/python3",
                                          "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"}}}}
    (work / "hosts.yml").write_text(yaml.safe_dump(inventory))
    env = installed["env"]
    first = _run([BIN / "ansible-playbook", "-i", "hosts.yml", "site.yml"], work, env)
    assert str(ROOT / "roles") not in first.stdout and "hicache.deploy.storage : " in first.stdout
    assert _recap(first.stdout)["changed"] > 0 and _recap(first.stdout)["failed"] == 0
    assert fleet.ssh(name, "stat -c %a /srv/kvcache").stdout.strip() == "750"
    assert fleet.ssh(name, "systemctl is-active sglang-hicache.service").stdout.strip() == "active"
    health = fleet.ssh(name, "python3 -c \"import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:30000/v1/models').read().decode())\"")
    assert '"tiny"' in health.stdout
    second = _run([BIN / "ansible-playbook", "-i", "hosts.yml", "site.yml"], work, env)
    assert _recap(second.stdout)["changed"] == 0, second.stdout[-4000:]


def test_without_the_core_package_a_filter_fails_naming_it(installed, tmp_path):
    """The collection's requirement, checked with a clear error: Ansible run where hicachectl cannot be imported
    (sys.modules[name] = None makes every import of it fail, as in a Python without the package)."""
    hide = ("import sys; sys.modules['hicachectl'] = None; sys.argv[0] = 'ansible'; "
            "from ansible.cli.adhoc import main; sys.exit(main())")
    proc = subprocess.run([sys.executable, "-c", hide, "localhost", "-c", "local", "-i", "localhost,", "-m", "ansible.builtin.debug",
                           "-a", "msg={{ {'hicache_image': 'x:v0.5.21'} | hicache.deploy.hicache_settings('h') }}"],
                          cwd=tmp_path, env=installed["env"], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "needs the Python package hicache-deploy" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
