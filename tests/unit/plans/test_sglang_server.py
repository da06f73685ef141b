"""sglang_server's plan of cfg/: the backups an earlier release left (#34: no backup clutter), judged from the host
facts, and the host facts' listing of them (hicache_host_facts' backups)."""

from __future__ import annotations

import os

from helpers import deployment, load_plugin

from hicachectl.config import namespace
from hicachectl.plans import sglang_server, storage
from hicachectl.plans.plan import as_fact


def test_only_the_backups_of_files_the_toolkit_wrote_are_stale_and_none_restarts_the_server():
    d = deployment("local")
    cfg, previous = d.cfg_dir.rstrip("/"), d.cfg_dir.rstrip("/") + ".previous"
    # as the host facts give them: each backup, and whether its first lines carry the header every rendered file has
    backups = {f"{cfg}/start.sh.4242.2026-11-30@10:00:00~": True, f"{cfg}/installed.json.9.2026-11-30@10:00:00~": False,
               f"{previous}/deployed.json.9.2026-11-30@10:00:01~": False, f"{previous}/run.sh.5.2026-11-29@08:00:00~": True,
               f"{cfg}/start.sh.77.2026-11-01@09:00:00~": False}
    stale = sglang_server.stale_backups(d, {"backups": backups})
    assert stale == sorted(p for p in backups if "77" not in p), stale
    plan = as_fact(sglang_server.server_plan(d, facts={"systemd": True, "tools": {}, "files": {}, "backups": backups}))
    assert set(stale) <= set(plan["absent_secret_files"])  # removed in the launch files' one step
    # what restarts the server is a file's label, never a removed backup's (hicache_files labels it by its name)
    assert not {os.path.basename(p) for p in stale} & set(plan["restart_items"])
    assert {"start.sh", "run.sh", "secrets.env"} <= set(plan["restart_items"]) and "config directory" not in plan["restart_items"]
    # the files whose backups the host facts list: the public ones in cfg/ and cfg.previous/, never a secret file
    listed = sglang_server.backed_up_files(d)
    assert f"{cfg}/start.sh" in listed and f"{previous}/installed.json" in listed and f"{cfg}/deployed.json" in listed
    assert not [p for p in listed if os.path.basename(p) in ("secrets.env", "server_secrets.yaml")]


def test_the_host_facts_list_ansibles_backups_and_say_only_whether_they_carry_the_header(tmp_path):
    """No backup's text leaves the host: an operator's own start.sh may hold a token (helper audit of #34's fix)."""
    secret = "hf_SECRETTOKEN_0123456789"
    (tmp_path / "start.sh").write_text("now\n")
    (tmp_path / "start.sh.4242.2026-11-30@10:00:00~").write_text("#!/usr/bin/env bash\n# Rendered by hicache-deploy for gpu-01\nx\n")
    (tmp_path / "start.sh.4243.2026-11-30@10:00:00~").write_text(f"#!/bin/sh\nexport HF_TOKEN={secret}\n")
    (tmp_path / "start.sh.4244.2026-11-30@10:00:00~").write_text("a\nb\nc\n# Rendered by hicache-deploy, on line 4\n")
    (tmp_path / "start.sh.bak").write_text("a copy by hand\n")
    (tmp_path / "start.sh.x.2026-11-30@10:00:00~").write_text("not a pid\n")
    (tmp_path / "other.sh.1.2026-11-30@10:00:00~").write_text("not asked for\n")
    found = load_plugin("plugins/modules/hicache_host_facts.py").backups([str(tmp_path / "start.sh"), str(tmp_path / "missing-dir/start.sh")], sglang_server.RENDERED_BY)
    assert found == {str(tmp_path / "start.sh.4242.2026-11-30@10:00:00~"): True, str(tmp_path / "start.sh.4243.2026-11-30@10:00:00~"): False,
                     str(tmp_path / "start.sh.4244.2026-11-30@10:00:00~"): False}
    assert secret not in repr(found)


def test_a_deploy_makes_the_servers_l3_directory_again_only_where_the_tier_is_there():
    """#34: a namespace directory removed under a running server (a prune, SGLang's clear) failed every write until the
    server's next start, and a no-op deploy left it so. It is now made in the launch files' step, without owner or mode
    (as serve.sh's mkdir -p), but never under a mount point whose mount is missing, nor without the host's facts."""
    samples = os.path.join(os.path.dirname(__file__), "..", "..", "samples", "vastnfs")
    with open(os.path.join(samples, "mountinfo-4.0.33.txt")) as handle:
        mounted = handle.read()
    facts = {"systemd": True, "tools": {}, "files": {}, "backups": {}}

    def directories(d, facts):
        plan = as_fact(sglang_server.server_plan(d, facts=facts))
        return plan["directories"] + plan["data_directories"]

    local = deployment("local")
    [cfg] = directories(local, None)  # no host read (render, plan without a host): the config directory alone
    assert cfg == {"path": local.cfg_dir, "owner": "root", "group": "root", "mode": "0755", "label": "config directory"}
    want = {"path": namespace.host_dir(local), "label": "L3 namespace directory"}
    assert want["path"].startswith(local.cache_dir.rstrip("/") + "/")
    assert directories(local, {**facts, "mountinfo": ""}) == [cfg, want]  # a local tier: the storage role made the tier
    assert directories(deployment("local", l3_namespace="off"), facts) == [cfg]  # the tier itself is the storage role's

    vast = deployment("vast", l3_namespace="auto")  # the documents' vast run has none; a shared tier's servers do
    assert storage.mount_point(vast) == "/mnt/kvcache-2ports"
    [_, ns] = directories(vast, {**facts, "mountinfo": mounted})
    assert ns == {"path": namespace.host_dir(vast), "label": "L3 namespace directory"}
    unmounted = "\n".join(line for line in mounted.splitlines() if " /mnt/kvcache-2ports " not in line)
    assert len(directories(vast, {**facts, "mountinfo": unmounted})) == 1  # never on the disk beneath the mount point
    assert "L3 namespace directory" not in as_fact(sglang_server.server_plan(vast, facts={**facts, "mountinfo": mounted}))["restart_items"]
    # the two records a restart makes stale in the host facts (restart.yml and the io_uring fallback forget them)
    assert as_fact(sglang_server.server_plan(vast, facts=facts))["records"] == [f"{vast.cfg_dir}/deployed.json", f"{vast.cfg_dir}/installed.json"]


def test_hicache_files_makes_a_data_directory_only_under_mounted_fstab_mounts_and_never_hangs(tmp_path):
    """The helper audit of the step above: a local tier on the operator's own mount (Weka, Lustre, NFS) has no
    mountinfo check in the plan, the plan's facts can be older than the mount, and a hard NFS mount whose server does
    not answer would hang the launch files' step. hicache_files decides on the host, at the time, in a child."""
    files = load_plugin("plugins/modules/hicache_files.py")
    fstab = ("# a comment /mnt/x\nUUID=1 / ext4 defaults 0 1\nsrv:/kv /mnt/kv\\040tier nfs rw 0 0\n/dev/sdb1 /data// xfs defaults 0 2\n"
             "/dev/sdc1 none swap sw 0 0\nsrv:/t /mnt/tab\\011x nfs rw 0 0\n")
    assert files.fstab_mount_points(fstab) == ["/", "/mnt/kv tier", "/data", "/mnt/tab\tx"]
    mounted = {"/", "/data"}
    assert files.unmounted_above("/mnt/kv tier/ns", fstab, mounted) == ["/mnt/kv tier"]
    assert files.unmounted_above("/data/l3/ns", fstab, mounted) == []
    assert files.unmounted_above("/data//l3/ns/", fstab, mounted) == []
    assert files.unmounted_above("/database/ns", fstab, set()) == []  # /data is no parent of it
    assert files.unmounted_above("/data/l3/ns", fstab, {"/"}) == ["/data"]
    assert files.unmounted_above("/data", fstab, {"/"}) == ["/data"]  # the directory itself an unmounted mount point
    assert files.mountinfo_points("36 35 98:0 / /mnt/kv\\040tier rw,noatime master:1 - nfs srv:/kv rw\n") == {"/mnt/kv tier"}

    table, info = tmp_path / "fstab", tmp_path / "mountinfo"
    table.write_text("UUID=1 / ext4 defaults 0 1\n")
    info.write_text("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n")
    tier = tmp_path / "tier"

    def look(name, check=False):
        return files.look_at_data_directory(str(tier / name), check, str(table), str(info))
    assert look("ns").startswith("not made: ") and not tier.exists()  # no parent: not made
    tier.mkdir()
    assert look("ns", check=True) == "made" and not (tier / "ns").exists()  # check mode
    (tier / "file").write_text("x")
    assert look("file", check=True) == look("file") == f"not made: {tier / 'file'} is there and is not a directory"
    old = os.umask(0o077)  # a hardened login session: the directory still gets what systemd's serve.sh would give it
    try:
        assert files.in_child(files.look_at_data_directory, 10, str(tier / "ns"), False, str(table), str(info)) == "made"
    finally:
        os.umask(old)
    assert oct((tier / "ns").stat().st_mode & 0o777) == "0o755"
    assert look("ns") == "there"
    table.write_text(f"srv:/kv {tier} nfs rw 0 0\n")  # the tier is an fstab mount that is not mounted here
    assert "is not mounted" in look("other") and not (tier / "other").exists()
    info.write_text(info.read_text() + f"40 22 0:50 / {tier} rw - nfs srv:/kv rw\n")  # mounted now
    assert look("other") == "made" and (tier / "other").is_dir()

    import time

    def hangs(path, *_):
        time.sleep(30)
        return "made"

    def breaks(path):
        raise ValueError("embedded null byte")

    def shouts(path):
        print("to the module's stdout")  # the child's 1 is /dev/null: nothing reaches Ansible's reading of the result
        raise KeyError(path)
    started = time.monotonic()
    answer = files.in_child(hangs, 1, "/mnt/kv/ns")
    assert answer == "not made: /mnt/kv/ns did not answer within 1 s (its storage unreachable?)" and time.monotonic() - started < 10
    assert files.in_child(breaks, 5, "/x") == "not made: embedded null byte"
    assert files.in_child(shouts, 5, "/x") == "not made: no answer"  # the parent goes on; the child never returns into it


def test_the_records_are_named_once_and_carried_as_the_host_facts_read_them():
    """deployed.json and installed.json by path in one place (record_paths): the role writes them there, the host facts
    read them there (hicache_host_reads), and the plan carries each as read, in slurp's shape, so the role needs no step
    of its own to keep them; None where the facts did not read one, which converge.yml then reads itself."""
    import base64

    filters = load_plugin("plugins/filter/hicache.py")
    for d in (deployment("vast"), deployment("local", cfg_dir="/srv/hicache/cfg/")):  # a trailing slash: one path still
        running, installed = sglang_server.record_paths(d)
        assert running.endswith("/deployed.json") and installed.endswith("/installed.json") and "//" not in running + installed
        variables = {k: v for k, v in d.as_vars().items() if v is not None}
        reads = filters.hicache_host_reads(variables, "h")["files"]
        assert running in reads and installed in reads
        text = '{"config_hash": "ab"}\n'
        plan = as_fact(sglang_server.server_plan(d, facts={"systemd": True, "files": {running: text, installed: None}}))
        assert (plan["running_record"], plan["installed_record"]) == (running, installed) and plan["records"] == [running, installed]
        assert base64.b64decode(plan["running"]["content"]).decode() == text and plan["installed"] == {}
        assert as_fact(sglang_server.server_plan(d, facts={"systemd": True, "files": {}}))["running"] is None
        assert as_fact(sglang_server.server_plan(d))["installed"] is None
        # status and the downgrade's judgement read the same path
        assert filters.hicache_files(variables, "h")["running_record"] == running
