"""A fleet of test hosts (systemd containers reached over real SSH on 127.0.0.1) and its inventory."""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import shutil
import socket
import subprocess

import yaml

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TESTHOST = str(HERE / "testhost.sh")
# Where install_standin puts SGLang's stand-in (tests/standin) on a test host; a test's start.sh execs it there
# (hicache_launcher: [python3, STANDIN], hicache_container_runtime: none), as no test host has a GPU.
STANDIN = "/opt/standin/sglang_standin.py"
# The stand-in's L3 pages are SGLang's (tests/standin/sglang_pages.py): SGLang's wheel and its CPU environment, built once
# on this machine by sglang_env.sh, are bind-mounted read-only into every test host and used by the host's own
# python3.11 (Debian bookworm's: the same CPython ABI as the cp311 wheels).
SGLANG_VERSION = "0.5.23"
SGLANG_MOUNT = "/opt/sglang"
# hicache_health_timeout for a stand-in that should become healthy. Its start imports torch and SGLang's backends:
# seconds on an idle core, minutes when every CI stream starts servers at once on two cores (a first deploy of three
# hosts once waited past 120 s). A wait ends at the first 200, so a long bound costs only the runs that fail.
HEALTH_TIMEOUT = 300


def sglang_storage_env() -> tuple[pathlib.Path, pathlib.Path]:
    """(site-packages of the CPU venv, SGLang's --target directory), built if missing (sglang_env.sh --storage)."""
    cache = pathlib.Path(os.environ.get("HICACHE_CACHE", pathlib.Path.home() / ".cache/hicache-deploy"))
    subprocess.run([str(HERE / "sglang_env.sh"), "--storage", SGLANG_VERSION], check=True, stdout=subprocess.DEVNULL)
    site = next((cache / "sglang-base/lib").glob("python3.*/site-packages"))
    return site, cache / f"sglang-{SGLANG_VERSION}"


def sglang_path(site: pathlib.Path, sglang: pathlib.Path) -> str:
    """sys.path entries for the stand-in (sglang_pages.py's STANDIN_SGLANG_PATH / sglang_path file): SGLang first."""
    return f"{sglang}:{site}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Fleet:
    def __init__(self, workdir: pathlib.Path, count: int, prefix: str = "hicache-fleet", caps: tuple[str, ...] = (),
                 volumes: tuple[str, ...] = ()):
        self.workdir = workdir
        self.key = workdir / "id_ed25519"
        self.hosts = {f"{prefix}-{os.getpid()}-{i + 1}": free_port() for i in range(count)}
        self.caps = tuple(caps)  # extra capabilities of every host (testhost.sh's TESTHOST_CAPS), e.g. ("SYS_ADMIN",)
        self.volumes = tuple(volumes)  # "HOSTDIR:PATH" bind mounts into every host (TESTHOST_VOLUMES): a shared export

    def up(self) -> Fleet:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if not self.key.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key)], check=True)
        subprocess.run([str(HERE / "base_image.sh")], check=True, stdout=subprocess.DEVNULL)  # build once, not per host
        site, sglang = sglang_storage_env()
        volumes = (*self.volumes, f"{site}:{SGLANG_MOUNT}/site-packages:ro", f"{sglang}:{SGLANG_MOUNT}/sglang:ro")
        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            for done in [pool.submit(self._run, "up", name, str(port), str(self.key), caps=self.caps, volumes=volumes) for name, port in self.hosts.items()]:
                done.result()
        return self

    def stop(self, name: str) -> None:
        self._run("stop", name)

    def start(self, name: str) -> None:
        self._run("start", name)

    def down(self) -> None:
        self._run("down", *self.hosts)

    def inventory(self, profile: str = "local", extra_vars: dict | None = None, name: str = "inventory",
                  routers: tuple[str, ...] = (), host_vars: dict[str, dict] | None = None) -> pathlib.Path:
        """An inventory of these hosts with a shipped profile's variables (connection: SSH as root). The hosts named
        in `routers` form group hicache_routers (they run the router, not a server); `host_vars` are per host."""
        path = self.workdir / name
        if path.exists():
            shutil.rmtree(path)
        shutil.copytree(ROOT / "inventories" / profile / "group_vars", path / "group_vars")
        # The profile's placeholders filled in, as an operator must (hicachectl refuses documentation addresses where
        # it reaches hosts): a name under .test (RFC 2606, for tests) and a private range instead of 192.0.2.0/24.
        profile_vars = path / "group_vars" / "all.yml"
        profile_vars.write_text(profile_vars.read_text().replace(".example.com", ".lab.test").replace("192.0.2.", "10.255.2."))
        (path / "host_vars").mkdir()
        hosts = {name: {"ansible_host": "127.0.0.1", "ansible_port": port, **(host_vars or {}).get(name, {})} for name, port in self.hosts.items()}
        # Test hosts are recreated every run with new host keys on reused ports: the test bed opts out of host key
        # checking explicitly, here and nowhere else (ansible.cfg checks them; the bench tunnel follows these args).
        connection = {"ansible_user": "root", "ansible_ssh_private_key_file": str(self.key),
                      "ansible_python_interpreter": "/usr/bin/python3",
                      "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"}
        children = {"hicache_servers": {"hosts": {h: v for h, v in hosts.items() if h not in routers}}}
        if routers:
            children["hicache_routers"] = {"hosts": {h: v for h, v in hosts.items() if h in routers}}
        inventory = {"all": {"vars": connection, "children": children}}
        (path / "hosts.yml").write_text(yaml.safe_dump(inventory, sort_keys=False))
        if extra_vars:  # group_vars/all/ holds the profile's file and, last, the test's
            (path / "group_vars" / "all").mkdir()
            (path / "group_vars" / "all.yml").rename(path / "group_vars" / "all" / "00_profile.yml")
            (path / "group_vars" / "all" / "zz_test.yml").write_text(yaml.safe_dump(extra_vars))
        return path

    def install_standin(self, names=None) -> Fleet:
        """Copy SGLang's stand-in and its page store (tests/standin) to STANDIN's directory on the named hosts (every host
        by default), with the path of the SGLang environment mounted by up()."""
        where = os.path.dirname(STANDIN)
        files = {name: (ROOT / "tests/standin" / name).read_text() for name in ("sglang_standin.py", "sglang_pages.py")}
        files["sglang_path"] = sglang_path(pathlib.Path(SGLANG_MOUNT) / "site-packages", pathlib.Path(SGLANG_MOUNT) / "sglang") + "\n"
        for name in names or self.hosts:
            for file, code in files.items():
                proc = self.ssh(name, f"mkdir -p {where} && cat > {where}/{file} <<'STANDIN_EOF'\n{code}\nSTANDIN_EOF")
                if proc.returncode != 0:
                    raise RuntimeError(f"cannot install the stand-in on {name}: {proc.stderr.strip()}")
        return self

    def ssh(self, name: str, command: str) -> subprocess.CompletedProcess:
        # stdin from /dev/null: ssh sets O_NONBLOCK on the stdin it is given, a file description it shares with pytest
        # and every process pytest starts; an ansible started meanwhile then refuses to run ("Ansible requires blocking
        # IO on stdin/stdout/stderr": the secrets test's process sampler ssh'ed into the hosts while its deploy started,
        # CI 2026-12-04), as QEMU's stdio once did (tests/infra/vm.py).
        return subprocess.run(["ssh", "-q", "-i", str(self.key), "-p", str(self.hosts[name]), "-o", "BatchMode=yes",
                               "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "root@127.0.0.1", command],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)

    def address(self, name: str) -> str:
        """The host's address on the test bed's container network: how the other test hosts reach it."""
        out = subprocess.run(["podman", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}", name],
                             check=True, capture_output=True, text=True).stdout.split()
        if not out:
            raise RuntimeError(f"{name} has no address on a container network")
        return out[0]

    @staticmethod
    def _run(*args: str, caps: tuple[str, ...] = (), volumes: tuple[str, ...] = ()) -> None:
        extra = {"TESTHOST_CAPS": " ".join(caps), "TESTHOST_VOLUMES": " ".join(volumes)}
        env = {**os.environ, **{k: v for k, v in extra.items() if v}}
        subprocess.run([TESTHOST, *args], check=True, stdout=subprocess.DEVNULL, env=env)
