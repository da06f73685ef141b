"""Reach a server port on a host over SSH, as Ansible reaches the host (bench needs HTTP to servers
that listen on the host's loopback). A local port forwarded through one paramiko connection."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections.abc import Iterator
from typing import Any


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


@contextlib.contextmanager
def forward(conn: dict[str, Any], host: str, remote_port: int, remote_host: str = "127.0.0.1") -> Iterator[str]:
    """Yields the base URL that reaches http://remote_host:remote_port on `host`.

    Host keys follow the project's ansible.cfg (host_key_checking = False): accepted, never stored.
    """
    if conn.get("ansible_connection") == "local":
        yield f"http://{remote_host}:{remote_port}"
        return
    import paramiko

    ssh = paramiko.SSHClient()
    ssh.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    ssh.connect(conn.get("ansible_host", host), port=int(conn.get("ansible_port", 22)), username=conn.get("ansible_user"),
                key_filename=conn.get("ansible_ssh_private_key_file"), timeout=30)
    transport = ssh.get_transport()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                client, peer = listener.accept()
            except OSError:
                return
            channel = transport.open_channel("direct-tcpip", (remote_host, remote_port), peer)
            threading.Thread(target=_pipe, args=(channel, client), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()
        ssh.close()
