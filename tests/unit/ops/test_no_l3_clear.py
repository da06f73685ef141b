"""The toolkit never sends SGLang's L3 clear (POST /hicache/storage-backend/clear, sglang 0.5.23
entrypoints/http_server.py clear_hicache_storage_backend): on a shared tier NIXL's clear deletes every deployment's
files (sglang#32693). verify and bench reset a server through a restart or /flush_cache, which keep L3. This reads
everything the toolkit ships (the package, roles, playbooks, plugins, templates) for the route or SGLang's name for
it, however the string is put together; the fleet tests' stand-in also logs it loudly if it ever arrives."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
SHIPPED = ("hicachectl", "roles", "playbooks", "plugins", "inventories", "templates", "meta")
# The route, its parts put together ("storage-backend" then "clear" nearby), and SGLang's own names of the call.
CLEAR = re.compile(r"storage[-_]backend.{0,40}clear|clear_hicache_storage|clear_storage_backend", re.IGNORECASE | re.DOTALL)


def shipped_files():
    for top in SHIPPED:
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:  # every text file, whatever its suffix
                yield path


def test_the_scan_reads_every_place_the_toolkit_ships_from():
    names = {str(path.relative_to(ROOT)) for path in shipped_files()}
    for expected in ("templates/start.sh.j2", "templates/run.sh.j2", "templates/sglang-hicache.service.j2", "meta/runtime.yml",
                     "roles/sglang_server/files/hicache-l3-collect", "playbooks/verify.yml", "hicachectl/ops/bench.py"):
        assert expected in names


def test_the_scan_finds_the_route_where_it_is():
    assert CLEAR.search('url = base + "/hicache/storage-backend" + "/clear"')
    assert CLEAR.search("requests.post(f'{url}/hicache/storage-backend/clear')")
    assert not CLEAR.search("POST /flush_cache keeps L3")


@pytest.mark.parametrize("path", list(shipped_files()), ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_shipped_sends_sglangs_l3_clear(path):
    text = path.read_text(errors="replace")
    found = CLEAR.search(text)
    assert not found, f"{path.relative_to(ROOT)} names SGLang's L3 clear: {found.group(0)!r}"
