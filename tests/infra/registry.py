"""A real container registry (Debian's docker-registry) on 127.0.0.1, with a tiny image pushed to it."""

from __future__ import annotations

import pathlib
import socket
import subprocess
import tarfile
import time
import urllib.request


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Registry:
    def __init__(self, workdir: pathlib.Path):
        self.workdir = workdir
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.config = workdir / "config.yml"
        self.process: subprocess.Popen | None = None
        workdir.mkdir(parents=True, exist_ok=True)
        self.config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {workdir / 'data'}\n"
                               f"http:\n  addr: {self.address}\nlog:\n  level: error\n")

    def start(self) -> Registry:
        self.process = subprocess.Popen(["docker-registry", "serve", str(self.config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://{self.address}/v2/", timeout=1)
                return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("docker-registry did not start")

    def stop(self) -> None:
        if self.process:
            self.process.terminate()
            self.process.wait(timeout=30)
            self.process = None

    def push_tiny_image(self, name: str) -> str:
        """Build a one-file image with podman, push it here, drop the local copy; returns its digest."""
        rootfs = self.workdir / "rootfs.tar"
        payload = self.workdir / "hello.txt"
        payload.write_text(f"hicache-deploy registry test {name}\n")
        with tarfile.open(rootfs, "w") as tar:
            tar.add(payload, arcname="hello.txt")
        reference = f"{self.address}/{name}"
        subprocess.run(["podman", "import", "-q", str(rootfs), reference], check=True, stdout=subprocess.DEVNULL)
        digest_file = self.workdir / "digest"
        subprocess.run(["podman", "push", "-q", "--tls-verify=false", "--digestfile", str(digest_file), reference], check=True)
        subprocess.run(["podman", "rmi", "-f", reference], check=True, stdout=subprocess.DEVNULL)
        return digest_file.read_text().strip()
