"""The sglang_image role against a real registry (Debian's docker-registry on 127.0.0.1), pulling with
this machine's podman: pull, no-op re-run, a registry briefly down, a digest pin kept and refused, and a
Docker Hub name (`hicache-tiny:v0.5.21`, i.e. docker.io/library/...) pinned by digest, pulled once, through
`hicache_image_mirror` and through a docker.io mirror in registries.conf (Podman then reports
`docker.io/library/hicache-tiny@sha256:...`, the spelling tests/unit/plans/test_sglang_image.py compares with Docker's)."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import threading

import pytest
import yaml
from registry import Registry
from support import ROOT

pytestmark = pytest.mark.slow
ANSIBLE_PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    reg = Registry(tmp_path_factory.mktemp("registry")).start()
    reg.digest = reg.push_tiny_image("hicache-test/tiny:v0.5.21")
    yield reg
    reg.stop()
    subprocess.run(["podman", "rmi", "-f", f"{reg.address}/hicache-test/tiny:v0.5.21"], capture_output=True)


def role_command(tmp_path: pathlib.Path, registry, env: dict | None = None, play: str = "roles: [hicache.deploy.sglang_image]",
                 **variables) -> dict:
    """subprocess arguments that run the role on this machine with the inventory's variables and `variables`."""
    image = f"{registry.address}/hicache-test/tiny:v0.5.21"
    inventory = {"all": {"hosts": {"localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}},
                         "vars": {"hicache_image": image, "hicache_model_path": "/models/m", "hicache_container_runtime": "podman",
                                  "hicache_image_tls_verify": False, "hicache_image_pull_retries": 6, "hicache_image_pull_delay": 2,
                                  **{f"hicache_{k}": v for k, v in variables.items()}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "play.yml").write_text(f"- hosts: all\n  gather_facts: false\n  {play}\n")
    return {"args": [ANSIBLE_PLAYBOOK, "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml")], "cwd": ROOT,
            "env": {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), **(env or {})}, "text": True}


def run_role(tmp_path: pathlib.Path, registry, env: dict | None = None, play: str = "roles: [hicache.deploy.sglang_image]",
             **variables) -> subprocess.CompletedProcess:
    return subprocess.run(**role_command(tmp_path, registry, env, play, **variables), capture_output=True, timeout=600)


def changed(proc) -> int:
    return int(re.search(r"localhost\s*:.*changed=(\d+)", proc.stdout).group(1))


def image_exists(registry) -> bool:
    return subprocess.run(["podman", "image", "exists", f"{registry.address}/hicache-test/tiny:v0.5.21"]).returncode == 0


def test_pull_then_nothing_to_do(tmp_path, registry):
    subprocess.run(["podman", "rmi", "-f", f"{registry.address}/hicache-test/tiny:v0.5.21"], capture_output=True)
    first = run_role(tmp_path, registry)
    assert first.returncode == 0 and changed(first) == 1 and image_exists(registry), first.stdout[-2000:]
    again = run_role(tmp_path, registry)
    assert again.returncode == 0 and changed(again) == 0


def test_a_pull_makes_preflight_read_the_host_again(tmp_path, registry):
    """site.yml lets preflight keep the facts its pull play read; a pull changed the disk, so it must not (preflight
    reports only here: this machine lacks what the image needs to run)."""
    play = ("tasks:\n    - {ansible.builtin.import_role: {name: hicache.deploy.sglang_image}}\n"
            # a role entered past its own read (site.yml's model role) still has what the host has after the pull
            "    - {name: The facts are stale yet whole, ansible.builtin.assert: {that: [hicache_facts.units is defined, hicache_facts.systemd is defined]}}\n"
            # as site.yml's deploy play enters preflight: read again when stale, then judge
            "    - {ansible.builtin.import_role: {name: hicache.deploy.preflight, tasks_from: refresh}}\n"
            "    - {ansible.builtin.import_role: {name: hicache.deploy.preflight, tasks_from: judge}, vars: {hicache_preflight_report_only: true}}")
    read = re.compile(r"^TASK \[hicache\.deploy\.preflight : Read what this host has\] \**\nok: ", re.M)  # the module ran
    subprocess.run(["podman", "rmi", "-f", f"{registry.address}/hicache-test/tiny:v0.5.21"], capture_output=True)
    pulled = run_role(tmp_path, registry, play=play)
    assert pulled.returncode == 0 and changed(pulled) == 1, pulled.stdout[-3000:]
    assert len(read.findall(pulled.stdout)) == 2, pulled.stdout  # the image role's read, then preflight's again
    kept = run_role(tmp_path, registry, play=play)
    assert kept.returncode == 0 and changed(kept) == 0, kept.stdout[-3000:]
    assert len(read.findall(kept.stdout)) == 1, kept.stdout  # nothing pulled: preflight judges the facts already read


def test_a_registry_briefly_down_is_retried(tmp_path, registry):
    """The registry comes back only once the role has failed a pull and said it retries (not after a fixed delay,
    which a loaded machine outlasts before Ansible even starts the pull)."""
    subprocess.run(["podman", "rmi", "-f", f"{registry.address}/hicache-test/tiny:v0.5.21"], capture_output=True)
    registry.stop()
    lines, back = [], None
    with subprocess.Popen(**role_command(tmp_path, registry, image_pull_retries=30), stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as run:
        timer = threading.Timer(600, run.kill)
        timer.start()
        for line in run.stdout:
            lines.append(line)
            if back is None and "FAILED - RETRYING" in line:
                back = threading.Thread(target=registry.start)
                back.start()
        run.wait()
        timer.cancel()
    if back is None:
        registry.start()
    else:
        back.join()
    out = "".join(lines)
    assert back is not None and run.returncode == 0 and image_exists(registry), out[-3000:]


def test_the_pinned_digest_is_pulled_and_a_wrong_one_refused_keeping_the_image(tmp_path, registry):
    pinned = run_role(tmp_path, registry, image_digest=registry.digest)
    assert pinned.returncode == 0, pinned.stdout[-2000:]
    assert run_role(tmp_path, registry, image_digest=registry.digest).stdout.count("changed=0") == 1
    wrong = run_role(tmp_path, registry, image_digest="sha256:" + "0" * 64, image_pull_retries=1)
    assert wrong.returncode != 0
    assert "could not pull" in wrong.stdout and "the image already on the host, if any, is kept" in wrong.stdout
    assert image_exists(registry)


HUB_NAME = "hicache-tiny:v0.5.21"  # a Docker Hub name: docker.io/library/hicache-tiny


@pytest.fixture(scope="module")
def hub_digest(registry):
    """The tiny image under the path a Docker Hub mirror serves for HUB_NAME (library/...)."""
    return registry.push_tiny_image("library/" + HUB_NAME)


def podman_image(reference: str, env: dict | None = None) -> dict | None:
    proc = subprocess.run(["podman", "image", "inspect", reference], capture_output=True, text=True, env={**os.environ, **(env or {})})
    return json.loads(proc.stdout)[0] if proc.returncode == 0 else None


def remove_image(reference: str, env: dict | None = None) -> None:
    while (found := podman_image(reference, env)) is not None:  # every name it has (localhost/..., docker.io/library/...)
        subprocess.run(["podman", "rmi", "-f", found["Id"]], capture_output=True, env={**os.environ, **(env or {})})


def test_a_docker_hub_name_pinned_by_digest_through_the_mirror_is_pulled_once(tmp_path, registry, hub_digest):
    remove_image(HUB_NAME)
    try:
        first = run_role(tmp_path, registry, image=HUB_NAME, image_mirror=registry.address, image_digest=hub_digest)
        assert first.returncode == 0 and changed(first) == 2, first.stdout[-2000:]  # pull from the mirror's library/ path, tag
        found = podman_image(HUB_NAME)
        assert found and f"{registry.address}/library/hicache-tiny@{hub_digest}" in found["RepoDigests"], found
        again = run_role(tmp_path, registry, image=HUB_NAME, image_mirror=registry.address, image_digest=hub_digest)
        assert again.returncode == 0 and changed(again) == 0, again.stdout[-2000:]
    finally:
        remove_image(HUB_NAME)


def test_a_docker_hub_name_pinned_by_digest_is_pulled_once_as_podman_spells_it(tmp_path, registry, hub_digest):
    conf = tmp_path / "registries.conf"  # docker.io served by the local registry, as a site-wide mirror would
    conf.write_text('unqualified-search-registries = ["docker.io"]\nshort-name-mode = "permissive"\n'
                    f'[[registry]]\nprefix = "docker.io"\nlocation = "docker.io"\n[[registry.mirror]]\nlocation = "{registry.address}"\ninsecure = true\n')
    env = {"CONTAINERS_REGISTRIES_CONF": str(conf)}
    remove_image(HUB_NAME, env)
    try:
        first = run_role(tmp_path, registry, env=env, image=HUB_NAME, image_digest=hub_digest)
        assert first.returncode == 0 and changed(first) == 2, first.stdout[-2000:]
        found = podman_image(HUB_NAME, env)
        assert found and f"docker.io/library/hicache-tiny@{hub_digest}" in found["RepoDigests"], found  # never `hicache-tiny@...`
        again = run_role(tmp_path, registry, env=env, image=HUB_NAME, image_digest=hub_digest)
        assert again.returncode == 0 and changed(again) == 0, again.stdout[-2000:]
    finally:
        remove_image(HUB_NAME, env)
