"""Every rendered command line goes through SGLang's own parser, for the version its image pins.

The parser runs in a cached CPU-only venv (tests/infra/sglang_env.sh). SGLang 0.5.20 cannot be
imported without CUDA (it imports torchvision at import time), so images that pin 0.5.20 are
checked with 0.5.21, whose HiCache flags and rules match (reference §1-§3).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest
import seeds
from helpers import SEED_EXACT, deployment, rendered
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import NASTY, SERVED_NAME

from hicachectl import rules
from hicachectl.config import inventory
from hicachectl.plans import launch, sglang_server

pytestmark = pytest.mark.conformance

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PARSER_FOR_IMAGE = {"0.5.20": "0.5.21"}
CACHE = pathlib.Path(os.environ.get("HICACHE_CACHE", pathlib.Path.home() / ".cache/hicache-deploy"))
SHIPPED = ("vast", "netapp", "adp", "local")


def parser_version(image_version: str) -> str:
    return PARSER_FOR_IMAGE.get(image_version, image_version)


@pytest.fixture(scope="session")
def sglang_parse(tmp_path_factory):
    """parse(version, requests): SGLang's own parser of that version, one long-lived process per version
    (sglang_parse.py --serve), since importing SGLang takes far longer than a parse."""
    parsers: dict[str, tuple[subprocess.Popen, pathlib.Path]] = {}

    def parser(version: str) -> tuple[subprocess.Popen, pathlib.Path]:
        if version not in parsers:
            subprocess.run([str(ROOT / "tests/infra/sglang_env.sh"), version], check=True,
                           env={**os.environ, "HICACHE_CACHE": str(CACHE)})
            log = tmp_path_factory.mktemp("sglang-parse") / f"{version}.stderr"
            proc = subprocess.Popen([str(CACHE / "sglang-base/bin/python"), str(HERE / "sglang_parse.py"), "--serve"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log.open("w"), text=True,
                                    env={**os.environ, "PYTHONPATH": str(CACHE / f"sglang-{version}")})
            parsers[version] = (proc, log)
        return parsers[version]

    def parse(version: str, requests: list[dict]) -> list[dict]:
        proc, log = parser(version)
        proc.stdin.write(json.dumps(requests) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert line, f"SGLang {version}'s parser ended: {log.read_text()[-3000:]}"
        report = json.loads(line)
        assert report["sglang_version"] == version
        return report["results"]

    yield parse
    for proc, _ in parsers.values():
        proc.stdin.close()
        proc.wait(timeout=60)


def request_for(d) -> dict:
    files = {f"{launch.CONTAINER_CFG_DIR}/{f.name}": f.content for f in sglang_server.files(d) if f.name not in ("start.sh", "run.sh")}
    return {"argv": launch.server_args(d), "files": files, "env": launch.container_env(d)}


def assert_accepted(result: dict, what: str) -> None:
    assert "error" not in result, f"{what}: {result['error']}"
    assert result["inexact_flags"] == [], f"{what}: flags not spelled exactly: {result['inexact_flags']}"
    assert result["rewrites"] == {}, f"{what}: SGLang would silently rewrite {result['rewrites']}"
    assert result["ok"]


@pytest.mark.parametrize("name", SHIPPED)
def test_every_host_of_every_shipped_inventory_passes(sglang_parse, name):
    inv = inventory.load(name)
    deployments = [rules.check_host(h, v)[0] for h, v in inv.hosts.items()]
    by_version: dict[str, list] = {}
    for d in deployments:
        by_version.setdefault(parser_version(d.sglang_version), []).append(d)
    for version, group in by_version.items():
        for d, result in zip(group, sglang_parse(version, [request_for(d) for d in group]), strict=True):
            assert_accepted(result, f"{name}/{d.inventory_host} with SGLang {version}")
            args = result["args"]
            assert args["enable_hierarchical_cache"] is True
            assert args["hicache_storage_backend"] == d.storage_backend
            assert args["model_path"] == d.model_path
            if d.page_size:
                assert args["page_size"] == d.page_size
            if d.size_gb:
                assert args["hicache_size"] == d.size_gb


def test_nixl_receives_what_the_inventory_means(sglang_parse):
    vast, netapp = deployment("vast"), deployment("netapp")
    vast_result, netapp_result = sglang_parse("0.5.21", [request_for(vast), request_for(netapp)])
    assert vast_result["nixl"]["plugin"] == "POSIX" and vast_result["nixl"]["use_direct_io"] is True
    assert vast_result["nixl"]["l3_cleaner"]["enabled"] is False
    # The seed's JSON boolean reaches NIXL as the text 'True' (why validate warns about it).
    assert vast_result["nixl"]["initparams"] == {"use_uring": "True"}
    assert netapp_result["nixl"]["plugin"] == "GDS_MT"
    assert netapp_result["nixl"]["initparams"]["thread_count"] == "32"


def _seed_requests(shared):
    vast = seeds.launched(seeds.run_recorded(seeds.vast_start_sh(shared)))
    vast_docker = [r["argv"] for r in seeds.run_recorded(seeds.vast_run_sh(shared)) if r["prog"] == "docker"][0]
    vast_container_env = dict(vast_docker[i + 1].split("=", 1) for i, w in enumerate(vast_docker) if w == "-e")
    netapp = seeds.launched(seeds.run_recorded(seeds.netapp_command(shared)))
    adp_d = deployment("adp", **SEED_EXACT)
    adp = seeds.launched(seeds.run_recorded(seeds.adp_command(shared, adp_d.model_path)))
    local = seeds.launched(seeds.run_recorded(seeds.local_file_tier(shared)))
    env_keys = lambda env: {k: v for k, v in env.items() if k.startswith(("SGLANG_", "PYTHONHASHSEED"))}  # noqa: E731
    return [
        ("vast", {"argv": vast["argv"], "env": env_keys(vast_container_env)}, deployment("vast", **SEED_EXACT)),
        ("netapp", {"argv": netapp["argv"], "env": env_keys(netapp["env"]), "files": {"nixl_backend_config.toml": seeds.netapp_toml(shared)}},
         deployment("netapp", **SEED_EXACT)),
        ("adp", {"argv": adp["argv"]}, adp_d),
        ("local", {"argv": local["argv"], "env": env_keys(local["env"])}, deployment("local", **SEED_EXACT)),
    ]


def test_seed_and_rendered_command_lines_parse_to_the_same_server_args(sglang_parse, shared):
    """Namespace equality through the real parser: abbreviations (`--tp`) and spelling resolved by SGLang."""
    for name, seed_request, d in _seed_requests(shared):
        version = parser_version(d.sglang_version)
        seed_result, my_result = sglang_parse(version, [seed_request, request_for(d)])
        assert "error" not in seed_result, f"{name} seed: {seed_result.get('error')}"
        assert_accepted(my_result, name)
        ignore = {"hicache_storage_backend_extra_config"}
        seed_args = {k: v for k, v in seed_result["args"].items() if k not in ignore}
        my_args = {k: v for k, v in my_result["args"].items() if k not in ignore}
        assert my_args == seed_args, {k: (seed_args.get(k), my_args.get(k)) for k in set(seed_args) | set(my_args) if seed_args.get(k) != my_args.get(k)}
        assert my_result.get("extra_config") == seed_result.get("extra_config"), name
        assert my_result.get("nixl") == seed_result.get("nixl"), name


@settings(max_examples=3, deadline=None)
@given(values=st.lists(st.tuples(SERVED_NAME, NASTY), min_size=25, max_size=25))
def test_values_reach_sglangs_parsed_arguments_byte_for_byte(sglang_parse, values):
    """Through real bash (the rendered start.sh) and then SGLang's real parser."""
    requests, expected = [], []
    for served, model in values:
        d = deployment("local", served_model_name=served, model_path=model)
        argv = seeds.launched(seeds.run_recorded(rendered(d)["start.sh"]))["argv"]
        requests.append({"argv": argv})
        expected.append((served, model))
    for (served, model), result in zip(expected, sglang_parse("0.5.21", requests), strict=True):
        assert_accepted(result, repr((served, model)))
        assert (result["args"]["served_model_name"], result["args"]["model_path"]) == (served, model)


def test_the_check_catches_what_it_must(sglang_parse):
    """A check that cannot fail proves nothing: abbreviations, silent rewrites and SGLang's refusals show."""
    abbreviated, rewritten, colon, chunk = sglang_parse("0.5.21", [
        {"argv": ["--model-path", "m", "--tp", "2", "--enable-hierarchical-cache"]},
        {"argv": ["--model-path", "m", "--enable-hierarchical-cache", "--hicache-mem-layout", "page_first", "--hicache-io-backend", "direct"]},
        {"argv": ["--model-path", "m", "--served-model-name", "a:b"]},
        {"argv": ["--model-path", "m", "--page-size", "64", "--chunked-prefill-size", "100"]},
    ])
    assert abbreviated["inexact_flags"] == ["--tp"] and not abbreviated["ok"]
    assert rewritten["rewrites"]["hicache_mem_layout"]["resolved"] == "page_first_direct" and not rewritten["ok"]
    assert "colon" in colon["error"]
    assert "divisible by page_size" in chunk["error"]


def test_the_admin_key_reaches_sglang_through_its_config_file_and_no_command_line(sglang_parse):
    """hicache_admin_api_key: in server_secrets.yaml (0600), read by SGLang's own --config merge; start.sh and argv
    carry only the file's path."""
    key = "adm-Key_with.$pecial:chars!"
    for version in ("0.5.21", "0.5.23"):
        d = deployment("local", admin_api_key=key, sglang_version=version)
        request = request_for(d)
        assert key not in json.dumps(request["argv"]) and key not in rendered(d)["start.sh"]
        assert request["argv"][-2:] == ["--config", f"{launch.server_cfg_dir(d)}/server_secrets.yaml"]
        secret_file = next(f for f in sglang_server.files(d) if f.name == "server_secrets.yaml")
        assert secret_file.secret and secret_file.mode == "0600" and key not in secret_file.shown
        (result,) = sglang_parse(version, [request])
        assert_accepted(result, f"admin key with SGLang {version}")
        assert result["args"]["admin_api_key"] == key

