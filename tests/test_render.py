from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib

import seeds
from helpers import deployment, rendered
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import NASTY, SERVED_NAME
from support import ROOT, cli, cli_json

from hicachectl import launch, tomlwriter


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
@given(env_value=NASTY, cache=st.from_regex(r"/mnt/[A-Za-z0-9._+-]{1,30}", fullmatch=True))  # the unit-safe-path rule
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
    report = cli_json("validate", "--inventory", str(out))
    assert report["ok"] and report["hosts"] == ["gpu-1", "gpu-2", "gpu-3"]
    again = cli("init", "--profile", "vast", "--hosts", "gpu-1", "--out", str(out))
    assert again.returncode == 2 and "not empty" in again.stderr
    assert cli("init", "--profile", "nope", "--hosts", "a", "--out", str(tmp_path / "x")).returncode == 2


def test_init_local_keeps_the_local_connection(tmp_path):
    cli("init", "--profile", "local", "--hosts", "localhost", "--out", str(tmp_path / "l"), check_rc=0)
    assert "ansible_connection: local" in (tmp_path / "l/hosts.yml").read_text()


def test_cli_start_imports_no_ansible():
    code = "import sys, hicachectl.cli; print(sorted(m for m in sys.modules if m.split('.')[0] in ('ansible', 'ansible_runner', 'jinja2')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"
    assert cli("--help").returncode == 0
