from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tomllib

import seeds
from helpers import deployment, load_plugin, rendered
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import NASTY, SERVED_NAME
from support import ROOT, cli, cli_json

from hicachectl.config import namespace
from hicachectl.formats import tomlwriter
from hicachectl.plans import host_files, host_limits, launch, model, nic_tuning, router, storage


@settings(max_examples=60, deadline=None)
@given(served=SERVED_NAME, model=NASTY, model_id=NASTY)
def test_start_sh_delivers_every_value_byte_for_byte(served, model, model_id):
    # Without hicache_model_dir, the model path is free text (with it, a mount target: an absolute path without ':').
    d = deployment("adp", served_model_name=served, model_path=model, model_dir=None,
                   extra_config={**deployment("adp").extra_config, "model_id": model_id})
    got = seeds.launched(seeds.run_recorded(rendered(d)["start.sh"]))["argv"]
    assert got == launch.server_args(d)
    assert f"--served-model-name={served}" in got or got[got.index("--served-model-name") + 1] == served
    assert json.loads(got[got.index("--hicache-storage-backend-extra-config") + 1])["model_id"] == model_id


@settings(max_examples=30, deadline=None)
@given(env_value=NASTY, cache=st.from_regex(r"/mnt/[A-Za-z0-9_+-][A-Za-z0-9._+-]{0,29}", fullmatch=True))  # unit-safe-path: no . or .. component
def test_run_sh_delivers_env_and_mounts_byte_for_byte(env_value, cache):
    d = deployment("vast", container_env={"SAFETENSORS_FAST_GPU": env_value}, cache_dir=cache)
    records = seeds.run_recorded(rendered(d)["run.sh"])
    docker = [r["argv"] for r in records if r["prog"] == "docker"]
    assert docker == [launch.container_argv(d)[1:]]
    assert f"SAFETENSORS_FAST_GPU={env_value}" in docker[0]
    assert ["-p", cache] in [r["argv"] for r in records if r["prog"] == "mkdir"]


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(min_size=1), inner, max_size=3), max_leaves=10))
def test_toml_writer_round_trips_or_refuses(value):
    data = {"plugin": {"posix": {"x": value}}}
    try:
        text = tomlwriter.dumps(data)
    except tomlwriter.TomlError:
        return  # None, or a list holding tables: refused with a message, never written wrong
    assert tomllib.loads(text) == data


def test_render_writes_each_hosts_files(tmp_path):
    cli("render", "--inventory", "netapp", "--out", str(tmp_path), check_rc=0)
    host = tmp_path / "gpu-01"
    assert sorted(p.name for p in host.iterdir()) == ["installed.json", "nixl_backend_config.toml", "run.sh", "serve.sh", "sglang-hicache.service", "start.sh"]
    rootfs = tmp_path / "gpu-01.rootfs"  # every other file the host receives, at its path
    assert (rootfs / "etc/fstab").read_text().startswith("# BEGIN hicache-deploy L3 tier\n")
    assert os.access(rootfs / "usr/local/sbin/hicache-nic-tuning", os.X_OK)
    assert os.access(host / "start.sh", os.X_OK) and not os.access(host / "nixl_backend_config.toml", os.X_OK)
    assert tomllib.loads((host / "nixl_backend_config.toml").read_text()) == {"plugin": {"gds_mt": {"thread_count": 32, "active": True}}}
    subprocess.run(["bash", "-n", str(host / "start.sh")], check=True)
    subprocess.run(["bash", "-n", str(host / "run.sh")], check=True)
    subprocess.run(["bash", "-n", str(host / "serve.sh")], check=True)


def test_render_json_and_host_filter():
    report = cli_json("render", "--inventory", "vast", "--host", "b200-02")
    assert list(report["hosts"]) == ["b200-02"]
    host = report["hosts"]["b200-02"]
    assert host["argv"][:3] == ["python3", "-m", "sglang.launch_server"] and "start.sh" in host["files"]


def test_render_refuses_an_invalid_inventory(tmp_path):
    from test_validate import VALID, make_inventory

    inventory = make_inventory(tmp_path, {**VALID, "hicache_page_size": 0})
    proc = cli("render", "--inventory", str(inventory))
    assert proc.returncode == 1 and "nothing rendered" in proc.stderr and "hicache_page_size" in proc.stderr


def test_init_scaffolds_a_valid_inventory(tmp_path):
    out = tmp_path / "prod"
    cli("init", "--profile", "vast", "--hosts", "gpu-1,gpu-2,gpu-3", "--out", str(out), check_rc=0)
    # the profile's storage addresses are documentation placeholders: refused until filled in
    refused = cli_json("validate", "--inventory", str(out), check_rc=1)
    assert not refused["ok"] and {f["variable"] for f in refused["findings"] if f["level"] == "error"} == {"hicache_storage_server", "hicache_storage_remoteports"}
    group_vars = out / "group_vars/all.yml"
    group_vars.write_text(group_vars.read_text().replace("vast-vip.example.com", "vast-vip.corp.net").replace("192.0.2.", "10.20.0."))
    report = cli_json("validate", "--inventory", str(out))
    assert report["ok"] and report["hosts"] == ["gpu-1", "gpu-2", "gpu-3"]
    again = cli("init", "--profile", "vast", "--hosts", "gpu-1", "--out", str(out))
    assert again.returncode == 2 and "not empty" in again.stderr
    assert cli("init", "--profile", "nope", "--hosts", "a", "--out", str(tmp_path / "x")).returncode == 2


def test_init_local_keeps_the_local_connection(tmp_path):
    cli("init", "--profile", "local", "--hosts", "localhost", "--out", str(tmp_path / "l"), check_rc=0)
    assert "ansible_connection: local" in (tmp_path / "l/hosts.yml").read_text()


def test_cli_start_imports_no_ansible():
    code = "import sys, hicachectl.cli.main; print(sorted(m for m in sys.modules if m.split('.')[0] in ('ansible', 'ansible_runner', 'jinja2')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"
    assert cli("--help").returncode == 0


def _with_router(tmp_path, profile_vars: dict):
    """Two servers (127.0.0.1, 127.0.0.2) and router-01 (127.0.0.3) in group hicache_routers."""
    import yaml

    (tmp_path / "group_vars").mkdir(parents=True)
    servers = {"gpu-a": {"ansible_host": "127.0.0.1", "hicache_port": 30001}, "gpu-b": {"ansible_host": "127.0.0.2"}}
    hosts = {"all": {"children": {"hicache_servers": {"hosts": servers},
                                  "hicache_routers": {"hosts": {"router-01": {"ansible_host": "127.0.0.3"}}}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(hosts))
    (tmp_path / "group_vars/all.yml").write_text(yaml.safe_dump(profile_vars))
    return tmp_path


def _profile_vars(name: str) -> dict:
    import yaml

    return yaml.safe_load((ROOT / "inventories" / name / "group_vars" / "all.yml").read_text())


def test_render_shows_every_file_of_a_server_host():
    report = cli_json("render", "--inventory", "vast", "--host", "b200-02")
    files = {f["path"]: f for f in report["hosts"]["b200-02"]["host_files"]}
    cfg = "/root/vastdata/cfg"
    assert {"/usr/local/sbin/hicache-nic-tuning", "/etc/hicache/nic-tuning.json", "/etc/systemd/system/hicache-nic-tuning.service",
            "/etc/fstab", "/etc/nfs.conf.d/hicache-readahead.conf", "/etc/sysctl.d/90-hicache-storage.conf",
            "/etc/security/limits.d/90-hicache-memlock.conf", "/etc/systemd/system/docker.service.d/90-hicache-memlock.conf",
            "/etc/systemd/system/sglang-hicache.service",
            *(f"{cfg}/{n}" for n in ("start.sh", "run.sh", "serve.sh", "sglang-hicache.service", "installed.json"))} <= set(files)
    assert "rp_filter = 0\n" in files["/etc/sysctl.d/90-hicache-storage.conf"]["content"]
    fstab = files["/etc/fstab"]["content"].splitlines()
    assert fstab[0] == "# BEGIN hicache-deploy L3 tier" and fstab[-1] == "# END hicache-deploy L3 tier" and " nfs vers=3,proto=rdma" in fstab[1]
    # as the role's lookup('ansible.builtin.file') reads it (trailing whitespace stripped), then its task's newline
    assert files["/usr/local/sbin/hicache-nic-tuning"]["content"] == (ROOT / "roles/nic_tuning/files/hicache-nic-tuning").read_text().rstrip() + "\n"
    assert files["/usr/local/sbin/hicache-nic-tuning"]["mode"] == "0755" and files[f"{cfg}/start.sh"]["role"] == "sglang_server"


def test_render_of_a_local_tier_has_no_nfs_files():
    report = cli_json("render", "--inventory", "local")
    (host,) = report["hosts"].values()
    paths = {f["path"] for f in host["host_files"]}
    assert "/etc/nfs.conf.d/hicache-readahead.conf" not in paths and "/etc/security/limits.d/90-hicache-memlock.conf" in paths


def test_render_text_names_the_nic_program_by_digest_not_its_lines():
    text = cli("render", "--inventory", "vast", "--host", "b200-02", check_rc=0).stdout
    program = (ROOT / "roles/nic_tuning/files/hicache-nic-tuning").read_text()
    assert "==> b200-02:/etc/fstab (storage" in text and "==> b200-02:/etc/modprobe.d/hicache-sunrpc.conf" in text
    assert "the collection's NIC program" in text and program.splitlines()[5] not in text


def test_render_a_router_host_shows_its_workers_and_unit(tmp_path):
    inventory = _with_router(tmp_path / "inv", {**_profile_vars("local"), "hicache_host": "0.0.0.0"})
    proc = cli("render", "-i", str(inventory), "--host", "router-01", check_rc=0)
    assert "==> router-01:/opt/sglang-router/workers.env (router" in proc.stdout, proc.stdout + proc.stderr
    report = cli_json("render", "-i", str(inventory), "--host", "router-01")
    router = report["hosts"]["router-01"]
    files = {f["path"]: f["content"] for f in router["host_files"]}
    assert router["role"] == "router" and set(files) == {"/opt/sglang-router/workers.env", "/etc/systemd/system/sglang-router.service"}
    # the router's workers are every server of the inventory, though --host selected the router alone
    assert files["/opt/sglang-router/workers.env"].splitlines()[-1] == \
        "HICACHE_ROUTER_WORKER_URLS=http://127.0.0.1:30001 http://127.0.0.2:30000"
    from hicachectl.plans import router as routing

    # the role's own template (roles/router/templates/sglang-router.service.j2), filled with the role's plan
    unit = files["/etc/systemd/system/sglang-router.service"]
    assert f"\nExecStart={routing.exec_start(routing.check_router_host('router-01', {})[0])}\n" in unit
    assert "\nEnvironmentFile=/opt/sglang-router/workers.env\n" in unit and "{{" not in unit
    everyone = cli_json("render", "-i", str(inventory))
    assert sorted(everyone["hosts"]) == ["gpu-a", "gpu-b", "router-01"]


def _role_write_paths(facts: dict) -> set[str]:
    """The destination of every file-writing task of the roles (hicache.deploy.hicache_files' files, blockinfile,
    copy/template with a dest), templated with the roles' plans as they hold them."""
    import jinja2
    import yaml
    from jinja2.nativetypes import NativeEnvironment

    env = jinja2.Environment(undefined=jinja2.ChainableUndefined)
    native = NativeEnvironment(undefined=jinja2.ChainableUndefined)  # "{{ plan.files }}": the list itself
    found = set()
    for path in sorted((ROOT / "roles").glob("*/tasks/*.yml")):
        stack = list(yaml.safe_load(path.read_text()) or [])
        while stack:
            task = stack.pop()
            if not isinstance(task, dict):
                continue
            for key in ("block", "rescue", "always"):
                stack.extend(task.get(key) or [])
            for module, args in task.items():
                if not isinstance(args, dict):
                    continue
                dests = []
                if module == "hicache.deploy.hicache_files" and args.get("files"):
                    listed = args["files"] if isinstance(args["files"], list) else native.from_string(args["files"]).render(**facts)
                    dests = [f["path"] for f in listed or []]
                elif module == "ansible.builtin.blockinfile":
                    dests = [args["path"]]
                elif module in ("ansible.builtin.copy", "ansible.builtin.template") and not args.get("remote_src") and "dest" in args:
                    dests = [args["dest"]]
                for dest in dests:
                    found.add((path.relative_to(ROOT).as_posix(), env.from_string(dest).render(**facts)))
    return found


def test_render_lists_every_file_the_roles_write(tmp_path):
    """Each path a role's task writes, templated with that role's own plan, is a file render shows. (Those written only
    as copies of rendered files: the rollback copy, deployed.json, the wheelhouse, the uring marker, are not config.)"""
    from hicachectl.plans import router, sglang_server
    from hicachectl.plans.plan import as_fact

    inventory = _with_router(tmp_path / "inv", _profile_vars("vast"))
    report = cli_json("render", "-i", str(inventory))
    shown = {h: {f["path"] for f in entry["host_files"]} for h, entry in report["hosts"].items()}
    d = deployment("vast")
    rd = router.check_router_host("router-01", {})[0]
    facts = {"__hicache_nic": as_fact(nic_tuning.nic_plan(d)), "__hicache_storage": as_fact(storage.storage_plan(d, {})),
             "__hicache_limits": as_fact(host_limits.limits_plan(d)), "__hicache_server_rendered": as_fact(sglang_server.server_plan(d)),
             "__hicache_server_fallback": as_fact(sglang_server.server_plan(d, uring_fallback=True)),
             "__hicache_router": router.plan(rd, {}, [])}
    not_config = {"roles/sglang_server/tasks/service.yml": {"/etc/hicache/nixl-uring-unavailable"},
                  "roles/router/tasks/main.yml": {"None/"},  # the wheelhouse copy (none here: no hicache_router_wheelhouse)
                  "roles/model/tasks/weights.yml": {"/token"}}  # the hub token, for the download only, in a temporary directory
    written = {dest for task_file, dest in _role_write_paths(facts) if dest not in not_config.get(task_file, set())}
    assert "/etc/fstab" in written and "/etc/nfs.conf.d/hicache-readahead.conf" in written  # the templated lists were read
    # the config directory's files are written in a loop over the plan's files (dest: <cfg_dir>/{{ item.name }})
    looped = {w for w in written if w.startswith(f"{d.cfg_dir}/") and w.endswith("/")}
    assert looped == {f"{d.cfg_dir}/"}, looped
    everything = set().union(*shown.values())
    assert {f"{d.cfg_dir}/{f.name}" for f in sglang_server.files(d)} <= everything
    missing = written - looped - everything
    assert len(written) >= 12 and not missing, missing


def test_render_names_what_the_roles_leave_beyond_their_files():
    """#34: render --json lists deployed.json and cfg.previous/ of a server, the router's virtualenv and copied
    wheelhouse: what the roles leave whose content is only known on the host."""
    d = deployment("vast")
    kept = {k.path: k for k in host_files.server_host_files(d).kept}
    assert {f"{d.cfg_dir}/deployed.json", f"{d.cfg_dir}.previous/"} <= set(kept)
    assert all(kept[p].role == "sglang_server" for p in (f"{d.cfg_dir}/deployed.json", f"{d.cfg_dir}.previous/"))
    assert "rollback" in kept[f"{d.cfg_dir}.previous/"].what
    # and the state files the roles write only where the host calls for it: the ports the boot unit tunes, the ToS
    # stamp, irqbalance's give-back, NIXL's io_uring marker, and (where nfsrahead is absent) the read-ahead rule
    state = {"/var/lib/hicache/nic-ports.json", "/run/hicache/roce-tos.json", "/var/lib/hicache/irqbalance-stopped",
             "/etc/hicache/nixl-uring-unavailable", "/etc/udev/rules.d/90-hicache-l3-readahead.rules", "/usr/local/libexec/hicache-l3-readahead"}
    # and what the toolkit had the NVIDIA Container Toolkit write for the other runtime, left (the vast profile: Docker)
    assert set(kept) == {f"{d.cfg_dir}/deployed.json", f"{d.cfg_dir}.previous/", "/etc/cdi/nvidia.yaml"} | state, set(kept)
    assert "nfsrahead" in kept["/etc/udev/rules.d/90-hicache-l3-readahead.rules"].what
    # a plan without host facts neither writes nor removes the read-ahead rule: whether nfsrahead is there is unknown
    removed = {path for _, path in host_files.server_host_files(d).removed}
    assert not removed & state, removed & state
    local = {k.path for k in host_files.server_host_files(deployment("local")).kept}
    assert "/etc/udev/rules.d/90-hicache-l3-readahead.rules" not in local  # no NFS tier: no read-ahead rule
    # the server's L3 directory, where it has a namespace of its own (the vast documents' run has none: the tier itself)
    assert f"{namespace.host_dir(deployment('local'))}/" in local and namespace.host_dir(d) == d.cache_dir
    rd = router.check_router_host("router-01", {"hicache_router_wheelhouse": "/srv/wheels"})[0]
    routed = {k.path: k.what for k in host_files.router_host_files(rd, {}).kept}
    assert set(routed) == {f"{rd.router_dir.rstrip('/')}/", f"{rd.router_dir.rstrip('/')}/wheels/"}
    assert "virtualenv" in routed[f"{rd.router_dir.rstrip('/')}/"] and "/srv/wheels/" in routed[f"{rd.router_dir.rstrip('/')}/wheels/"]


def test_render_names_the_model_weights_and_what_the_model_role_and_a_left_runtime_leave():
    """#34's operator audit: render --json did not list the weights the model role downloads, its stamp and in-progress
    marker and a shared directory's lock, nor what nvidia-ctk wrote for a runtime the host no longer uses."""
    d = deployment("vast", model_source="hub", model_repo="Qwen/Qwen3-8B", model_dir="/mnt/models/qwen3", model_share="tier")
    kept = {k.path: k for k in host_files.server_host_files(d).kept}
    for name in ("", model.STAMP, model.MARKER, model.DOWNLOAD_LOCK, model.DOWNLOAD_LOCK + ".guard"):
        assert f"/mnt/models/qwen3/{name}" in kept and kept[f"/mnt/models/qwen3/{name}"].role == "model", (name, sorted(kept))
    assert "Qwen/Qwen3-8B" in kept["/mnt/models/qwen3/"].what
    unshared = {k.path for k in host_files.server_host_files(deployment("vast", model_source="hub", model_repo="Qwen/Qwen3-8B",
                                                                                   model_dir="/mnt/models/qwen3")).kept}
    assert f"/mnt/models/qwen3/{model.DOWNLOAD_LOCK}" not in unshared and f"/mnt/models/qwen3/{model.STAMP}" in unshared
    checked = {k.path for k in host_files.server_host_files(deployment("vast", model_source="path", model_dir="/mnt/models/qwen3")).kept}
    assert "/mnt/models/qwen3/" in checked and f"/mnt/models/qwen3/{model.STAMP}" not in checked  # weights put there by hand
    # the names the host-side module uses (it runs without hicachectl)
    stamp = load_plugin("plugins/modules/hicache_model_stamp.py")
    assert (stamp.STAMP, stamp.MARKER, stamp.DOWNLOAD_LOCK) == (model.STAMP, model.MARKER, model.DOWNLOAD_LOCK)
    # a host that left Docker for no container: Docker's daemon.json as nvidia-ctk left it is named, not removed
    bare = host_files.server_host_files(deployment("vast", container_runtime="none", cache_container_dir=None, model_dir=None))
    assert {"/etc/docker/daemon.json", "/etc/cdi/nvidia.yaml"} <= {k.path for k in bare.kept}
    assert "/etc/docker/daemon.json" not in {p for _, p in bare.removed}


def test_render_never_shows_the_routers_index_credential_in_what_it_lists(tmp_path):
    """hicache_router_index_url is secret (it may carry credentials); the router's virtualenv, listed among what the
    roles leave, is installed from it: shown as ******** in the text and in --json."""
    credential = "s3cr3t-index-token"
    inventory = _with_router(tmp_path / "inv", {**_profile_vars("local"), "hicache_host": "0.0.0.0",
                                                "hicache_router_index_url": f"https://ci:{credential}@pypi.corp.example/simple"})
    text = cli("render", "--inventory", str(inventory), "--host", "router-01", check_rc=0).stdout
    assert "the router's virtualenv" in text and credential not in text, text
    shown = cli_json("render", "--inventory", str(inventory), "--host", "router-01")["hosts"]["router-01"]
    assert shown["kept"] and credential not in json.dumps(shown)


def test_render_names_the_files_the_nvidia_toolkit_writes_with_the_roles_own_commands():
    """container_runtime has nvidia-ctk write daemon.json (Docker) or the CDI spec (Podman): render names each with the
    command, which must be the role's task's own, and every nvidia-ctk command of the roles is named."""

    task_text = "\n".join(p.read_text() for p in sorted((ROOT / "roles").glob("*/tasks/*.yml")))
    commands = set(re.findall(r"command: (nvidia-ctk [^\n#]+?)\s*(?:#.*)?$", task_text, re.M))
    assert len(commands) == 2, commands
    named = {}
    for runtime in ("docker", "podman"):
        named[runtime] = host_files.server_host_files(deployment("vast", container_runtime=runtime)).tool_files
    named["none"] = host_files.server_host_files(dataclasses.replace(deployment("vast"), container_runtime="none")).tool_files
    assert [f.path for f in named["docker"]] == ["/etc/docker/daemon.json"] and [f.path for f in named["podman"]] == ["/etc/cdi/nvidia.yaml"]
    assert named["none"] == []
    assert {f.command for fs in named.values() for f in fs} == commands
