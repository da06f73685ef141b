"""The server's unit and the L3 mount: after a storage outage at boot the server must come back by itself.

A `Requires=` on a `nofail` mount that failed at boot leaves the unit "dependency failed", which `Restart=` never
retries (systemd.unit(5), Requires=; systemd.service(5), Restart=). The unit orders itself after the mount, tries the
mount again before each start and refuses to serve without it; the restart loop has no start limit."""

from __future__ import annotations

import configparser
import shutil
import subprocess

import pytest
from helpers import deployment

from hicachectl.plans import sglang_server


def unit_lines(d) -> list[str]:
    return sglang_server.unit(d).content.splitlines()


@pytest.mark.parametrize("profile", ["vast", "netapp"])
def test_an_nfs_tier_is_retried_before_each_start_not_required(profile):
    d = deployment(profile)
    lines = unit_lines(d)
    point = d.cache_dir
    assert not any(line.startswith(("RequiresMountsFor=", "Requires=", "BindsTo=")) for line in lines), lines
    assert f"After={sglang_server.mount_unit_name(point)}" in lines
    assert "StartLimitIntervalSec=0" in lines and "Restart=on-failure" in lines
    assert f"ExecStartPre=/bin/mountpoint -q {point}" in lines
    # $$ is systemd's literal dollar (systemd.service(5), Command lines): the shell sees "$1", the mount point.
    assert any(line.startswith("ExecStartPre=/bin/sh -c 'mountpoint -q \"$$1\" || timeout 60 mount \"$$1\" || true' sh ") for line in lines)
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read_string(sglang_server.unit(d).content)  # still one [Unit] and one [Service] section


def test_a_plain_directory_keeps_its_mount_requirement():
    d = deployment("local")
    assert sglang_server.mount_unit_name("/") == "-.mount"
    assert not any(line.startswith("ExecStartPre=/bin/mountpoint") for line in unit_lines(d))


@pytest.mark.skipif(shutil.which("systemd-escape") is None, reason="systemd-escape is not installed")
@pytest.mark.parametrize("path", ["/mnt/kvcache-2ports", "/mnt/l3 x", "/srv/.hidden/a-b", "/mnt/ü/x_y.z", "/mnt/l3/"])
def test_mount_unit_names_are_systemds_own(path):
    expected = subprocess.run(["systemd-escape", "--path", "--suffix=mount", path], capture_output=True, text=True, check=True).stdout.strip()
    assert sglang_server.mount_unit_name(path) == expected
