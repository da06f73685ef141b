"""Inputs that must not pass quietly (issue 24, item 6): documentation placeholders, a router and a server on one
port of one machine, and what `init` says and writes."""

from __future__ import annotations

import pathlib

import yaml
from helpers import deployment
from support import ROOT, cli, cli_json

from hicachectl import rules
from hicachectl.rules import fleet, variables


def _inventory(tmp, hosts: dict, group_vars: dict, routers: dict | None = None):
    tmp.mkdir(parents=True)
    children = {"hicache_servers": {"hosts": hosts}}
    if routers:
        children["hicache_routers"] = {"hosts": routers}
    (tmp / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": children}}))
    (tmp / "group_vars").mkdir()
    (tmp / "group_vars/all.yml").write_text(yaml.safe_dump(group_vars))
    return tmp


def _local_vars() -> dict:
    return yaml.safe_load((ROOT / "inventories/local/group_vars/all.yml").read_text())


def test_documentation_addresses_and_names_are_recognised():
    for doc in ("192.0.2.1", "198.51.100.7", "203.0.113.250", "2001:db8::1", "[2001:db8::5]", "vast-vip.example.com",
                "filer.example", "x.invalid", "example.org."):
        assert variables.documentation_address(doc), doc
    for real in ("gpu1.lab.test", "10.0.0.1", "192.0.3.1", "2001:db9::1", "vast.corp.net", "examples.com", "localhost", "127.0.0.1"):
        assert not variables.documentation_address(real), real
    assert variables.placeholders("192.0.2.1-192.0.2.16") == ["192.0.2.1", "192.0.2.16"]
    assert variables.placeholders("10.0.0.1-10.0.0.16") == []


def test_the_vast_profile_says_which_values_are_placeholders_and_validate_refuses_them():
    report = cli_json("validate", "-i", "vast", check_rc=1)
    named = {(f["variable"], f["level"]) for f in report["findings"] if f["rule"] == "placeholder"}
    assert named == {("hicache_storage_server", "error"), ("hicache_storage_remoteports", "error")}
    assert not report["ok"]


def test_commands_that_reach_hosts_refuse_placeholders_before_any_contact_and_render_shows_the_profile():
    plan = cli("plan", "-i", "vast")
    assert plan.returncode == 1 and "[placeholder]" in plan.stderr and "hicache_storage_server" in plan.stderr, plan.stdout + plan.stderr
    assert "no host was contacted" in plan.stderr, plan.stdout + plan.stderr
    render = cli("render", "-i", "vast", "--host", "b200-02", check_rc=0)  # a profile is read as it is, offline
    assert "vast-vip.example.com" in render.stdout


def test_a_real_storage_address_has_no_placeholder_warning():
    d_findings = rules.check_host("gpu-1", {**_vast_vars(), "hicache_storage_server": "10.20.0.1",
                                            "hicache_storage_remoteports": "10.20.0.1-10.20.0.16"})[1]
    assert not [f for f in d_findings if f.rule == "placeholder"]


def _vast_vars() -> dict:
    return yaml.safe_load((ROOT / "inventories/vast/group_vars/all.yml").read_text())


def test_validate_refuses_a_host_at_a_documentation_address(tmp_path):
    inventory = _inventory(tmp_path / "inv", {"gpu-a": {"ansible_host": "192.0.2.10"}, "gpu-b": {"ansible_host": "10.0.0.2"}},
                           {**_local_vars(), "hicache_host": "0.0.0.0"})
    proc = cli("validate", "-i", str(inventory))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = next(x for x in proc.stderr.splitlines() if "[documentation-address]" in x)
    assert "gpu-a" in line and "ansible_host" in line and "192.0.2.10" in line and "Fix:" in line and "gpu-b" not in line


def test_a_router_and_a_server_on_one_port_of_one_machine_are_refused():
    d = deployment("local", port=30080)
    connections = {"gpu-a": {"ansible_host": "10.0.0.1"}, "router-01": {"ansible_host": "10.0.0.1"}}
    found = fleet.check_routed({"gpu-a": d}, {"router-01": {}}, connections)
    clash = [f for f in found if f.rule == "router-server-port"]
    assert [(f.level, f.host, f.variable) for f in clash] == [(rules.ERROR, "router-01", "hicache_router_port")]
    assert "gpu-a" in clash[0].message and "30080" in clash[0].message
    # the prometheus port too, and nothing on another machine or another port
    assert [f.variable for f in fleet.check_routed({"gpu-a": deployment("local", port=29000)}, {"router-01": {}}, connections)
            if f.rule == "router-server-port"] == ["hicache_router_prometheus_port"]
    apart = {**connections, "router-01": {"ansible_host": "10.0.0.9"}}
    assert not [f for f in fleet.check_routed({"gpu-a": d}, {"router-01": {}}, apart) if f.rule == "router-server-port"]
    assert not [f for f in fleet.check_routed({"gpu-a": d}, {"router-01": {"hicache_router_port": 30081}}, connections)
                if f.rule == "router-server-port"]
    # one address, two SSH ports: two machines behind it (test hosts, VMs, a NAT), as check_fleet counts them (#34)
    behind_one_address = {"gpu-a": {"ansible_host": "127.0.0.1", "ansible_port": 2201}, "router-01": {"ansible_host": "127.0.0.1", "ansible_port": 2202}}
    assert not [f for f in fleet.check_routed({"gpu-a": d}, {"router-01": {}}, behind_one_address) if f.rule == "router-server-port"]
    same_port = {**behind_one_address, "router-01": {"ansible_host": "127.0.0.1", "ansible_port": 2201}}
    assert [f.host for f in fleet.check_routed({"gpu-a": d}, {"router-01": {}}, same_port) if f.rule == "router-server-port"] == ["router-01"]


def test_validate_refuses_a_router_on_a_servers_machine_and_port(tmp_path):
    """The rule above, through the CLI's one guard: the inventory's own router variables and connections."""
    inventory = _inventory(tmp_path / "inv", {"gpu-a": {"ansible_host": "10.0.0.1"}},
                           {**_local_vars(), "hicache_host": "0.0.0.0", "hicache_port": 30080},
                           routers={"router-01": {"ansible_host": "10.0.0.1"}})
    proc = cli("validate", "-i", str(inventory))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = next(x for x in proc.stderr.splitlines() if "[router-server-port]" in x)
    assert "router-01" in line and "hicache_router_port" in line and "gpu-a" in line


def test_init_names_routers_and_addresses_and_what_to_fill_in(tmp_path):
    out = tmp_path / "prod"
    proc = cli("init", "--profile", "vast", "--hosts", "gpu-1=10.1.0.1,gpu-2", "--routers", "rt-1=10.1.0.9", "--out", str(out), check_rc=0)
    fill = [line for line in proc.stdout.splitlines() if line.startswith("fill in:")]
    assert [line.split()[2] for line in fill] == ["hicache_storage_server", "hicache_storage_remoteports"], proc.stdout
    hosts = yaml.safe_load((out / "hosts.yml").read_text())["all"]["children"]
    assert hosts["hicache_servers"]["hosts"] == {"gpu-1": {"ansible_host": "10.1.0.1"}, "gpu-2": None}
    assert hosts["hicache_routers"]["hosts"] == {"rt-1": {"ansible_host": "10.1.0.9"}}
    assert (out / "hosts.yml").read_text().startswith("---\n# Made by `hicachectl init --profile vast`.")
    refused = cli_json("validate", "-i", str(out), check_rc=1)  # what init said to fill in is what validate refuses
    assert sorted({f["variable"] for f in refused["findings"] if f["level"] == "error"}) == sorted(line.split()[2] for line in fill)
    group_vars = out / "group_vars/all.yml"
    group_vars.write_text(group_vars.read_text().replace("vast-vip.example.com", "vast-vip.corp.net").replace("192.0.2.", "10.20.0."))
    report = cli_json("validate", "-i", str(out))
    assert report["ok"] and report["hosts"] == ["gpu-1", "gpu-2"]
    # No warning about the profile's own content: whether the documents' io_uring is blocked by Docker's seccomp
    # depends on the host's engine (25.0 and later), which preflight judges with its version, not validate.
    assert not [f for f in report["findings"] if f["level"] == "warning"], report["findings"]
    # a new inventory reproduces no document: its servers get their own L3 namespace, and no warning about it
    assert yaml.safe_load((out / "group_vars/all.yml").read_text())["hicache_l3_namespace"] == "auto"
    assert not [f for f in report["findings"] if f["rule"] == "l3-namespace-off"]
    assert yaml.safe_load((ROOT / "inventories/vast/group_vars/all.yml").read_text())["hicache_l3_namespace"] == "off"  # the profile keeps it
    both = cli("init", "--profile", "vast", "--hosts", "a", "--routers", "a", "--out", str(tmp_path / "x"))
    assert both.returncode == 2 and "a server or a router" in both.stderr


def test_a_fresh_init_has_no_warning_about_its_own_profile(tmp_path):
    """#34: local had two (served-name-stable, file-backend-unbounded), netapp and adp one. init adds a served name
    that does not move with the weights and, for an unbounded file tier, a budget its collector keeps; the shipped
    profiles keep reproducing their documents (vast's is test_init_names_routers_...'s)."""
    fills = {"netapp-lif.example.com": "netapp-lif.corp.net", "192.0.2.": "10.20.0."}
    for profile in ("local", "netapp", "adp"):
        out = tmp_path / profile
        cli("init", "--profile", profile, "--hosts", "gpu-1=10.1.0.1", "--out", str(out), check_rc=0)
        group_vars = out / "group_vars/all.yml"
        text = group_vars.read_text()
        for placeholder, own in fills.items():
            text = text.replace(placeholder, own)
        group_vars.write_text(text)
        report = cli_json("validate", "-i", str(out))
        assert report["ok"] and not [f for f in report["findings"] if f["level"] == "warning"], (profile, report["findings"])
        added = yaml.safe_load(text)
        assert added["hicache_served_model_name"] and ":" not in added["hicache_served_model_name"]
        profile_vars = yaml.safe_load((ROOT / "inventories" / profile / "group_vars/all.yml").read_text())
        assert "hicache_served_model_name" not in profile_vars  # the profile itself still reproduces its document
    assert yaml.safe_load((tmp_path / "local/group_vars/all.yml").read_text())["hicache_l3_budget_gb"] > 0


def test_init_takes_user_address_and_port_for_each_host(tmp_path):
    """#34: test hosts and NAT'd machines are reached at an SSH port of their own, often as another user."""
    out = tmp_path / "bed"
    cli("init", "--profile", "local", "--hosts", "gpu-1=root@127.0.0.1:2201,gpu-2=127.0.0.2:2202,gpu-3=ops@[fd00::3]:2203,gpu-4=fd00::4",
        "--routers", "rt-1=root@127.0.0.1:2209", "--out", str(out), check_rc=0)
    hosts = yaml.safe_load((out / "hosts.yml").read_text())["all"]["children"]
    assert hosts["hicache_servers"]["hosts"] == {
        "gpu-1": {"ansible_host": "127.0.0.1", "ansible_user": "root", "ansible_port": 2201},
        "gpu-2": {"ansible_host": "127.0.0.2", "ansible_port": 2202},
        "gpu-3": {"ansible_host": "fd00::3", "ansible_user": "ops", "ansible_port": 2203},
        "gpu-4": {"ansible_host": "fd00::4"}}
    assert hosts["hicache_routers"]["hosts"] == {"rt-1": {"ansible_host": "127.0.0.1", "ansible_user": "root", "ansible_port": 2209}}
    found = cli_json("validate", "-i", str(out), check_rc=None)["findings"]  # (the local profile's loopback server is no router's worker)
    assert not [f for f in found if f["rule"] in ("router-server-port", "duplicate-host")], found  # behind 127.0.0.1: other machines
    for bad in ("gpu-1=root@127.0.0.1:0", "gpu-1=127.0.0.1:ssh", "gpu-1=@127.0.0.1", "gpu-1=[fd00::1]x"):
        refused = cli("init", "--profile", "local", "--hosts", bad, "--out", str(tmp_path / "no"))
        assert refused.returncode == 2 and "gpu-1=" in refused.stderr and not (tmp_path / "no").exists(), (bad, refused.stderr)


def test_init_refuses_what_no_inventory_should_hold_and_names_every_fill_in(tmp_path):
    """An operator audit (#34) found init writing inventories from a space in an address, a name given twice, a name
    without a host, a group's name as a host's, and a router inventory validate refused with no "fill in" saying why."""
    cases = {"gpu-01=a b": "'a b' is neither an IP address nor a DNS name", "gpu-01=10.0.0.1,gpu-01=10.0.0.2": "gpu-01 is named twice",
             "=10.0.0.1": "a host needs a name", "hicache_routers=10.0.0.1": "is a group's name", "all": "is a group's name",
             "gpu-01=us er@10.0.0.1": "'us er' is not a user name", "gpu-01=10.0.0.1.": "is neither an IP address nor a DNS name"}
    for hosts, said in cases.items():
        refused = cli("init", "--profile", "vast", "--hosts", hosts, "--out", str(tmp_path / "no"))
        assert refused.returncode == 2 and said in refused.stderr and not (tmp_path / "no").exists(), (hosts, refused.stderr)
    # With routers, a profile whose servers listen on loopback (local, adp) is one to fill in, and validate says the same.
    for profile in ("local", "adp"):
        out = tmp_path / profile
        made = cli("init", "--profile", profile, "--hosts", "gpu-01=10.20.0.1,gpu-02=10.20.0.2", "--routers", "rt-1=10.20.0.9",
                   "--out", str(out), check_rc=0)
        assert f"fill in: hicache_host in {out}/group_vars/all.yml" in made.stdout and "the routers (rt-1) cannot reach it" in made.stdout
        errors = {f["rule"] for f in cli_json("validate", "-i", str(out), check_rc=1)["findings"] if f["level"] == "error"}
        assert errors == {"router-reach"}, (profile, errors)
    # validate refuses an ansible_host no machine can be reached at, naming host and variable
    out = tmp_path / "hand-made"
    cli("init", "--profile", "local", "--hosts", "gpu-01=10.20.0.1", "--out", str(out), check_rc=0)
    hosts = yaml.safe_load((out / "hosts.yml").read_text())
    hosts["all"]["children"]["hicache_servers"]["hosts"]["gpu-01"]["ansible_host"] = "10.20.0.1:2222"
    (out / "hosts.yml").write_text(yaml.safe_dump(hosts))
    found = [(f["host"], f["variable"], f["rule"]) for f in cli_json("validate", "-i", str(out), check_rc=1)["findings"] if f["level"] == "error"]
    assert found == [("gpu-01", "ansible_host", "host-address")], found
    # and says it alone: no library's deprecation warning on stderr (Ansible's SSH agent imports DSA from cryptography)
    shown = cli("validate", "-i", str(out), check_rc=1)
    assert "[host-address]" in shown.stderr and "DeprecationWarning" not in shown.stderr, shown.stderr


def test_init_and_monitoring_say_what_they_wrote_as_json(tmp_path):
    """#34's operator audit: init and monitoring were the two commands without --json (a script that makes
    inventories, or feeds a Prometheus, parsed their prose). The same facts as their text, machine-readable."""
    out = tmp_path / "inv"
    made = cli_json("init", "--profile", "vast", "--hosts", "gpu-01=10.20.0.1", "--routers", "rt-1=10.20.0.9", "--out", str(out), "--json")
    assert made["inventory"] == str(out) and str(out / "hosts.yml") in made["written"], made
    assert {f["variable"] for f in made["fill_in"]} == {"hicache_storage_server", "hicache_storage_remoteports"}, made["fill_in"]
    assert all(f["file"] == str(out / "group_vars/all.yml") and "documentation placeholder" in f["why"] for f in made["fill_in"])
    text = cli("init", "--profile", "vast", "--hosts", "gpu-01=10.20.0.1", "--out", str(tmp_path / "text"), check_rc=0).stdout
    assert text.count("fill in: ") == len(made["fill_in"]) and "next: edit" in text  # the text says the same
    shown = cli_json("monitoring", "-i", str(out), "--out", str(tmp_path / "mon"), "--json")
    # its server and its router, each a scrape target
    assert shown["targets"] == 2 and set(shown["written"]) == {str(p) for p in (tmp_path / "mon").rglob("*") if p.is_file()}, shown
    assert pathlib.Path(shown["dashboard"]).is_file()
