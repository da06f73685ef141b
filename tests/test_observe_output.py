"""What doctor and validate say to people (issue 24, item 5): a reported value instead of `info`, and host counts
that name the routers."""

from __future__ import annotations

import yaml
from support import ROOT, cli, cli_json

from hicachectl.cli import observe as cli_observe


def _check(item, status, detail="", blocking=False):
    return {"item": item, "status": status, "detail": detail, "required": blocking, "blocking": blocking}


def test_doctor_shows_a_reported_value_not_info():
    report = {"checks": [_check("kernel", "info", "6.1.0-28-amd64"), _check("gpus", "ok", "1x L4"),
                         _check("host_ram", "info", "2048 GB RAM (host pool sized by ratio) and a very long tail of words")],
              "required_missing": [], "warnings": [], "strict": True}
    table = cli_observe.doctor_verdict({"a": report}, {})["lines"][0]
    rows = {line.split()[0]: line for line in table.splitlines()[2:]}
    assert rows["kernel"].split()[1] == "6.1.0-28-amd64" and "info" not in table
    assert rows["gpus"].split(None, 1)[1] == "ok: 1x L4"  # a check that passed shows what was found (#34)
    assert rows["host_ram"].endswith("...") and len(rows["host_ram"].split(None, 1)[1]) == cli_observe.DOCTOR_CELL


def test_validate_counts_servers_and_routers(tmp_path):
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    hosts = {"all": {"children": {"hicache_servers": {"hosts": {"gpu-a": {"ansible_host": "10.0.0.1"}, "gpu-b": {"ansible_host": "10.0.0.2"}}},
                                  "hicache_routers": {"hosts": {"router-01": {"ansible_host": "10.0.0.9"}}}}}}
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    variables = yaml.safe_load((ROOT / "inventories/local/group_vars/all.yml").read_text()) | {"hicache_host": "0.0.0.0"}
    (inv / "group_vars/all.yml").write_text(yaml.safe_dump(variables))
    proc = cli("validate", "-i", str(inv), check_rc=0)
    assert f"inventory {inv}: 2 server(s) and 1 router(s), 0 error(s)" in proc.stdout, proc.stdout
    report = cli_json("validate", "-i", str(inv))
    assert report["hosts"] == ["gpu-a", "gpu-b"] and report["routers"] == ["router-01"]
