"""`render` holds to what the roles write (issue 24, item 4): on fresh SSH test hosts, every file `plan` (check mode
with diff) would write on a server or a router is a file `render -i NAME --json` listed for that host, offline, with
the same content where the plan shows it."""

from __future__ import annotations

import pytest
from fleet import Fleet
from support import cli_json

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    fleet = Fleet(tmp_path_factory.mktemp("render"), 3, prefix="hicache-render").up()
    yield fleet
    fleet.down()


ANSIBLE_TMP = "/.ansible/tmp/"


def _planned_files(host_record: dict) -> dict[str, str | None]:
    """The files a host's plan would write: each diff of a file's content (not a directory's state), by path, with
    the content the plan would leave (None for a block of a file: blockinfile shows the whole file). For a new file
    ansible.builtin.copy and template name only their temporary source (ansible/plugins/action/__init__.py
    _get_diff_data sets before_header only when the destination exists): such a file is known by its content."""
    found: dict[str, str | None] = {}
    for change in host_record["changes"]:
        for diff in change.get("diff") or []:
            path = str(diff.get("before_header") or diff.get("after_header") or "")  # template: after_header is its temp source
            if not path.startswith("/") or isinstance(diff.get("after"), dict):
                continue  # a directory's or a file's state (mode, presence), not its content
            path = path.split(" (", 1)[0]  # blockinfile's "/etc/fstab (content)"
            found[path] = diff.get("after") if isinstance(diff.get("after"), str) and path != "/etc/fstab" else None
    return found


def test_plan_writes_no_file_render_did_not_list(bed):
    router = list(bed.hosts)[-1]
    # runtime none: these hosts have no container runtime; the server's files are the same roles' files
    # each server at its own address: the test hosts all answer SSH on 127.0.0.1, one port each (rules/fleet.py worker-url-shared)
    inventory = bed.inventory(extra_vars={"hicache_host": "0.0.0.0", "hicache_container_runtime": "none"}, routers=(router,),
                              host_vars={h: {"hicache_worker_url": f"http://{bed.address(h)}:30000"} for h in bed.hosts if h != router})
    rendered = cli_json("render", "-i", str(inventory))
    listed = {host: {f["path"]: f["content"] for f in entry["host_files"]} for host, entry in rendered["hosts"].items()}
    assert set(listed) == set(bed.hosts)
    plan = cli_json("plan", "-i", str(inventory), check_rc=None)  # what a host lacks may fail it; its changes count still
    seen, resolved = 0, {}
    for host, record in plan["hosts"].items():
        planned = _planned_files(record)
        assert planned, (host, record["changes"])  # a fresh host: every file is new
        by_content = {content: path for path, content in listed[host].items()}
        for temporary in [p for p in planned if ANSIBLE_TMP in p]:
            content = planned.pop(temporary)
            assert content in by_content, f"{host}: plan writes a file render did not list:\n{content}"
            planned[by_content[content]] = content
        resolved[host] = planned
        missing = sorted(set(planned) - set(listed[host]))
        assert not missing, f"{host}: plan writes {missing}, which render did not list"
        for path, content in planned.items():
            if content is not None and path in listed[host] and "********" not in content:
                assert content == listed[host][path], f"{host}:{path} differs between plan and render"
                seen += 1
    assert seen >= 6  # contents compared, not only names
    assert {"/opt/sglang-router/workers.env", "/etc/systemd/system/sglang-router.service"} <= set(resolved[router])
