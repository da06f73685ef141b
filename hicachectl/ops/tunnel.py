"""Reach a server port on a host over SSH, as Ansible reaches the host (bench needs HTTP to servers
that listen on the host's loopback). A local port forwarded through one paramiko connection.

Host keys are checked as Ansible's ssh checks them with the project's ansible.cfg: against the system's
and the user's known_hosts (or the UserKnownHostsFile the options name), with the StrictHostKeyChecking
the options give. The options are read as ssh reads Ansible's command line, first value winning: ansible.cfg's
ssh_args, then the host's ansible_ssh_common_args (else ansible.cfg's ssh_common_args), then
ansible_ssh_extra_args. `yes`, `ask` or unset: an unknown key is refused; `accept-new`: a new key is
accepted and recorded, a changed one refused; `no`/`off`: any key is accepted (a test bed's explicit opt-out).
"""

from __future__ import annotations

import configparser
import contextlib
import os
import pathlib
import select
import shlex
import socket
import threading
from collections.abc import Iterator, Mapping
from typing import Any

SYSTEM_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")


class HostKeyError(OSError):
    """The host's key is not known (or differs from the known one) and the options do not accept it."""


def _pipe(channel, client: socket.socket) -> None:
    with contextlib.closing(channel), contextlib.closing(client):
        while True:
            ready, _, _ = select.select([channel, client], [], [], 60)
            for source, sink in ((channel, client), (client, channel)):
                if source in ready:
                    data = source.recv(65536)
                    if not data:
                        return
                    sink.sendall(data)


def _cfg_ssh_options(cfg: pathlib.Path | None) -> tuple[str, str]:
    """(ssh_args, ssh_common_args) of an ansible.cfg's [ssh_connection]."""
    if cfg is None or not cfg.is_file():
        return "", ""
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(cfg)
    section = parser["ssh_connection"] if parser.has_section("ssh_connection") else {}
    return section.get("ssh_args", ""), section.get("ssh_common_args", "")


def ssh_options(conn: Mapping[str, Any], cfg: pathlib.Path | None = None) -> dict[str, str]:
    """The -o options ssh would use for this host under Ansible, lower-cased names, first value winning."""
    cfg_args, cfg_common = _cfg_ssh_options(cfg)
    common = conn.get("ansible_ssh_common_args")
    words: list[str] = []
    for text in (conn.get("ansible_ssh_args") or cfg_args, cfg_common if common is None else common, conn.get("ansible_ssh_extra_args") or ""):
        words += shlex.split(str(text or ""))
    options: dict[str, str] = {}
    for i, word in enumerate(words):
        if word == "-o" and i + 1 < len(words):
            option = words[i + 1]
        elif word.startswith("-o") and len(word) > 2:
            option = word[2:]
        else:
            continue
        name, sep, value = option.partition("=")
        if not sep:
            name, _, value = option.partition(" ")
        options.setdefault(name.strip().lower(), value.strip())
    return options


def host_key_policy(options: Mapping[str, str]) -> tuple[str, list[str], list[str]]:
    """(mode: reject | accept-new | accept, system known_hosts files, user known_hosts files)."""
    strict = options.get("stricthostkeychecking", "ask").lower()
    mode = {"no": "accept", "off": "accept", "accept-new": "accept-new"}.get(strict, "reject")
    user = options.get("userknownhostsfile")
    system = options.get("globalknownhostsfile")
    users = [os.path.expanduser(p) for p in shlex.split(user)] if user else [os.path.expanduser(p) for p in USER_KNOWN_HOSTS]
    systems = shlex.split(system) if system else list(SYSTEM_KNOWN_HOSTS)
    return mode, systems, users


def _policy(mode: str, record_to: str | None, known_files: list[str]):
    import paramiko

    class Policy(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client, hostname, key):
            if mode == "reject":
                raise HostKeyError(
                    f"the SSH host key of {hostname} ({key.get_name()} {key.fingerprint}) is not in known_hosts "
                    f"({', '.join(known_files) or 'none'}); add it (`ssh-keyscan -p PORT HOST >> ~/.ssh/known_hosts`, after checking "
                    "the fingerprint) or connect once with StrictHostKeyChecking=accept-new (see the README's 'Host keys').")
            if mode == "accept-new" and record_to and record_to != os.devnull:
                path = pathlib.Path(record_to)
                path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                with os.fdopen(fd, "a") as handle:
                    handle.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")

    return Policy()


def client(conn: Mapping[str, Any], host: str, cfg: pathlib.Path | None = None):
    """A paramiko client connected to `host` as Ansible would connect, its host key checked."""
    import paramiko

    if cfg is None:  # the ansible.cfg Ansible itself uses here (the user's, else hicachectl's): its ssh args hold
        from hicachectl.config.paths import ansible_config

        cfg = ansible_config().path
    mode, systems, users = host_key_policy(ssh_options(conn, cfg))
    ssh = paramiko.SSHClient()
    known = []
    if mode != "accept":  # `no`: the inventory opted out; what any file says does not matter
        for path in systems + users:
            if path != os.devnull and os.path.isfile(path):
                ssh.load_system_host_keys(path)  # read, never rewritten by paramiko
                known.append(path)
    ssh.set_missing_host_key_policy(_policy(mode, users[0] if users else None, known))
    address = conn.get("ansible_host", host)
    try:
        ssh.connect(address, port=int(conn.get("ansible_port", 22)), username=conn.get("ansible_user"),
                    key_filename=conn.get("ansible_ssh_private_key_file"), timeout=30)
    except paramiko.BadHostKeyException as exc:
        raise HostKeyError(f"the SSH host key of {address} differs from the one in known_hosts ({exc.key.get_name()} "
                           f"{exc.key.fingerprint}, expected {exc.expected_key.fingerprint}): possibly a man in the middle, or a "
                           "reinstalled host; check it, then remove the old line (`ssh-keygen -R HOST`).") from exc
    return ssh


@contextlib.contextmanager
def forward(conn: dict[str, Any], host: str, remote_port: int, remote_host: str = "127.0.0.1") -> Iterator[str]:
    """Yields the base URL that reaches http://remote_host:remote_port on `host`."""
    if conn.get("ansible_connection") == "local":
        yield f"http://{remote_host}:{remote_port}"
        return
    ssh = client(conn, host)
    transport = ssh.get_transport()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                client_socket, peer = listener.accept()
            except OSError:
                return
            channel = transport.open_channel("direct-tcpip", (remote_host, remote_port), peer)
            threading.Thread(target=_pipe, args=(channel, client_socket), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()
        ssh.close()
