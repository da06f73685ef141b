"""Each shipped inventory reproduces its seed document, flag for flag (order aside).

Both sides run in real bash: the seed's own shell text and our rendered files, with the programs
they start replaced by recorders (see seeds.py). The only differences allowed are named here:
- `--enable-metrics` and `--enable-cache-report`, which we add by default so `verify` can see L3 hits
  (with hicache_enable_metrics/cache_report false the command lines are equal);
- NetApp: the seed passes `@nixl_backend_config.toml` relative to its working directory; we pass the
  same file at /cfg inside the container (contents compared separately);
- VAST run.sh: the seed passes SGLANG_HICACHE_SIZE_GB/PAGE_SIZE only for its start.sh to read back;
  our start.sh carries the values themselves (checked equal below);
- ADP: the seed abbreviates `--tp`; we write SGLang's exact `--tp-size`.
"""

from __future__ import annotations

import json
import pathlib
import tomllib

import seeds
from helpers import SEED_EXACT, deployment, rendered
from support import SHARED, missing_source_documents

from hicachectl.config import namespace


def test_a_missing_source_document_is_named_with_where_it_belongs(tmp_path):
    (tmp_path / "seeds").mkdir()
    (tmp_path / "seeds" / seeds.SEED_FILES["vast"]).write_text("x")
    said = missing_source_documents(tmp_path)
    assert said is not None and "../shared/seeds" in said and seeds.SEED_FILES["netapp"] in said and seeds.SEED_FILES["vast"] not in said


def test_this_checkout_has_the_source_documents(shared):
    assert missing_source_documents(SHARED) is None


def test_without_the_documents_the_comparisons_skip_saying_where_they_belong_or_fail_where_required(tmp_path):
    """A fresh clone without ../shared: the seed tests skip with one line naming ../shared/seeds; the full tier (CI) sets
    HICACHE_SOURCE_DOCUMENTS=required and fails instead (tests/run)."""
    import os
    import subprocess
    import sys

    lone = tmp_path / "clone"
    (lone / "tests").mkdir(parents=True)
    for name in ("support.py", "seeds.py"):
        (lone / "tests" / name).write_text((pathlib.Path(__file__).parent / name).read_text())
    (lone / "tests" / "test_needs_documents.py").write_text("from support import source_documents\n\ndef test_it():\n    source_documents()\n")
    env = {k: v for k, v in os.environ.items() if k != "HICACHE_SOURCE_DOCUMENTS"}
    run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "tests/test_needs_documents.py"]
    skipped = subprocess.run(run, cwd=lone, env=env, capture_output=True, text=True)
    assert skipped.returncode == 0 and "1 skipped" in skipped.stdout and "../shared/seeds" in skipped.stdout, skipped.stdout + skipped.stderr
    failed = subprocess.run(run, cwd=lone, env={**env, "HICACHE_SOURCE_DOCUMENTS": "required"}, capture_output=True, text=True)
    assert failed.returncode == 1 and "1 failed" in failed.stdout and "../shared/seeds" in failed.stdout, failed.stdout + failed.stderr


OBSERVABILITY = [("--enable-cache-report", None), ("--enable-metrics", None)]


def ours(d, env=None) -> dict:
    return seeds.launched(seeds.run_recorded(rendered(d)["start.sh"], env))


def test_vast_start_sh_equals_seed(shared):
    seed = seeds.launched(seeds.run_recorded(seeds.vast_start_sh(shared)))
    exact = ours(deployment("vast", **SEED_EXACT))
    assert seeds.flag_pairs(exact["argv"]) == seeds.flag_pairs(seed["argv"])
    default = ours(deployment("vast"))
    assert seeds.flag_pairs(default["argv"]) == sorted(seeds.flag_pairs(seed["argv"]) + OBSERVABILITY)


def test_vast_run_sh_equals_seed_in_substance(shared):
    seed = [r for r in seeds.run_recorded(seeds.vast_run_sh(shared)) if r["prog"] == "docker"]
    mine = [r for r in seeds.run_recorded(rendered(deployment("vast"))["run.sh"]) if r["prog"] == "docker"]
    assert len(seed) == len(mine) == 1
    seed_argv, my_argv = seed[0]["argv"], mine[0]["argv"]
    start_sh_parameters = {"SGLANG_HICACHE_SIZE_GB=200", "SGLANG_HICACHE_PAGE_SIZE=8192"}
    seed_pairs = _docker_pairs(seed_argv)
    assert {v for k, v in seed_pairs if k == "-e"} >= start_sh_parameters
    assert sorted(p for p in seed_pairs if not (p[0] == "-e" and p[1] in start_sh_parameters)) == sorted(_docker_pairs(my_argv))
    assert my_argv[-2:] == seed_argv[-2:] == ["lmsysorg/sglang:v0.5.20-cu130", "/cfg/start.sh"]
    # What the seed's start.sh reads back from those two variables, ours carries itself.
    argv = ours(deployment("vast"))["argv"]
    assert argv[argv.index("--hicache-size") + 1] == "200"
    assert argv[argv.index("--page-size") + 1] == argv[argv.index("--chunked-prefill-size") + 1] == "8192"


def _docker_pairs(argv):
    assert argv[0] == "run"
    pairs, i, takes_value = [], 1, {"--name", "--network", "--ipc", "--gpus", "--ulimit", "-v", "-e", "--entrypoint"}
    while argv[i].startswith("-"):
        if argv[i] in takes_value:
            pairs.append((argv[i], argv[i + 1]))
            i += 2
        else:
            pairs.append((argv[i], None))
            i += 1
    return sorted(pairs, key=lambda p: (p[0], p[1] or ""))


def test_netapp_command_and_toml_equal_seed(shared):
    seed = seeds.launched(seeds.run_recorded(seeds.netapp_command(shared)))
    d = deployment("netapp", **SEED_EXACT)
    mine = ours(d)
    config_flag = "--hicache-storage-backend-extra-config"
    seed_pairs = [(f, v) for f, v in seeds.flag_pairs(seed["argv"]) if f != config_flag]
    my_pairs = [(f, v) for f, v in seeds.flag_pairs(mine["argv"]) if f != config_flag]
    assert my_pairs == seed_pairs
    seed_config = dict(seeds.flag_pairs(seed["argv"]))[config_flag]
    my_config = dict(seeds.flag_pairs(mine["argv"]))[config_flag]
    assert (seed_config, my_config) == ("@nixl_backend_config.toml", "@/cfg/nixl_backend_config.toml")
    files = rendered(d)
    assert tomllib.loads(files["nixl_backend_config.toml"]) == tomllib.loads(seeds.netapp_toml(shared))
    # The seed's environment for the server is the container's environment here.
    run = [r for r in seeds.run_recorded(files["run.sh"]) if r["prog"] == "docker"][0]["argv"]
    container_env = {run[i + 1] for i, w in enumerate(run) if w == "-e"}
    assert container_env == {f"PYTHONHASHSEED={seed['env']['PYTHONHASHSEED']}",
                             f"SGLANG_HICACHE_NIXL_BACKEND_STORAGE_DIR={seed['env']['SGLANG_HICACHE_NIXL_BACKEND_STORAGE_DIR']}"}
    assert "/mnt/kvcache:/mnt/kvcache:rw" in run


def test_adp_command_equals_seed(shared):
    d = deployment("adp", **SEED_EXACT)
    seed = seeds.launched(seeds.run_recorded(seeds.adp_command(shared, d.model_path)))
    config_flag = "--hicache-storage-backend-extra-config"
    seed_pairs = dict(seeds.flag_pairs(seed["argv"], aliases={"--tp": "--tp-size"}))
    my_pairs = dict(seeds.flag_pairs(ours(d)["argv"]))
    assert json.loads(my_pairs.pop(config_flag)) == json.loads(seed_pairs.pop(config_flag))
    assert my_pairs == seed_pairs
    assert d.sglang_version == "0.5.21"


def test_local_inventory_is_the_tutorial_file_tier(shared):
    seed = seeds.launched(seeds.run_recorded(seeds.local_file_tier(shared)))
    d = deployment("local", **SEED_EXACT)
    assert seeds.flag_pairs(ours(d)["argv"]) == seeds.flag_pairs(seed["argv"])
    run = [r for r in seeds.run_recorded(rendered(d)["run.sh"]) if r["prog"] == "docker"][0]["argv"]
    # The built-in profile keeps its L3 namespace on (auto): the tutorial's directory is the tier, the server's pages
    # go into its namespace inside it (the other seed profiles set it off and match their documents' paths exactly).
    tier = seed["env"]["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"]
    assert d.cache_dir == tier and d.l3_namespace == "auto"
    assert f"SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR={tier}/{namespace.of(d)}" in run
    assert namespace.of(d).startswith("gpt-oss-20b-")


def test_seed_extraction_sees_the_seed_values(shared):
    """Guard against a vacuous comparison: the extracted seed commands carry their documented values."""
    vast = seeds.launched(seeds.run_recorded(seeds.vast_start_sh(shared)))["argv"]
    assert vast[vast.index("--hicache-storage-backend-extra-config") + 1] == \
        '{"use_direct_io": true, "use_uring": true, "l3_cleaner_enabled": false}'
    assert len(seeds.flag_pairs(vast)) == 18
    netapp = seeds.launched(seeds.run_recorded(seeds.netapp_command(shared)))
    assert netapp["env"]["PYTHONHASHSEED"] == "0" and "--hicache-storage-prefetch-policy" in netapp["argv"]
