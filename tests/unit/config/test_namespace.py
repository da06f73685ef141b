"""The L3 namespace: derived from everything that changes the page format, the same for identical servers."""

from __future__ import annotations

import json
import re

import pytest
from helpers import deployment, rendered
from support import ROOT

from hicachectl import rules

# Each setting that changes what a page holds, with a second value: each must give another namespace.
from hicachectl.config import namespace, schema
from hicachectl.plans import launch

PAGE_FORMAT = {
    "kv_cache_dtype": "fp8_e4m3",
    "page_size": 64,
    "tp_size": 2,
    "pp_size": 2,
    "attn_cp_size": 2,
    "mem_layout": "layer_first",
    "storage_backend": "nixl",
    "served_model_name": "another-model",
    "model_path": "/models/other",
    "model_revision": "refs-pr-1",
}


def test_identical_servers_share_a_namespace_and_it_lies_under_the_tier():
    a, b = deployment("local"), deployment("local")
    assert namespace.of(a) == namespace.of(b) and namespace.is_derived(namespace.of(a))
    assert namespace.host_dir(a) == f"{a.cache_dir}/{namespace.of(a)}"
    assert namespace.differences(a, b) == []


@pytest.mark.parametrize(("field", "value"), PAGE_FORMAT.items())
def test_every_page_format_setting_changes_the_namespace_and_is_named(field, value):
    base = deployment("local")
    changed = deployment("local", **{field: value})
    assert namespace.of(changed) != namespace.of(base)
    differences = namespace.differences(base, changed)
    assert differences[-1].startswith("namespace ") and len(differences) >= 2, differences


def test_a_setting_left_unset_and_sglangs_default_set_explicitly_share_a_namespace():
    assert namespace.of(deployment("local")) == namespace.of(deployment("local", kv_cache_dtype="auto", tp_size=1, mem_layout="page_first"))


def test_settings_that_do_not_change_pages_keep_the_namespace():
    base = deployment("local")
    for field, value in {"port": 30001, "max_running_requests": 8, "write_policy": "write_back", "ratio": 3}.items():
        assert namespace.of(deployment("local", **{field: value})) == namespace.of(base), field


def test_off_a_literal_and_no_tier():
    off = deployment("local", l3_namespace="off")
    assert namespace.of(off) is None and namespace.host_dir(off) == off.cache_dir
    assert "off" in namespace.explain(off)
    literal = deployment("local", l3_namespace="team-a")
    assert namespace.of(literal) == "team-a" and not namespace.is_derived("team-a")
    assert namespace.host_dir(literal).endswith("/team-a")
    none = deployment("local", storage_backend=None)
    assert namespace.of(none) is None and namespace.host_dir(none) is None


def test_a_long_model_name_still_gives_a_name_the_catalogue_accepts():
    d = deployment("local", served_model_name="Some-Org/" + "A" * 200 + " v2")
    name = namespace.of(d)
    assert len(name.encode()) <= 64 and namespace.is_derived(name)
    assert re.fullmatch(schema.BY_NAME["hicache_l3_namespace"].domain.pattern, name)


def test_the_server_gets_its_namespaced_directory():
    d = deployment("local")
    env = launch.container_env(d)
    assert env["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] == f"{d.cache_container_dir}/{namespace.of(d)}"
    assert "mkdir -p \"${CACHE_DIR}\"" in rendered(d)["run.sh"] and namespace.of(d) in rendered(d)["run.sh"]
    bare = deployment("local", container_runtime="none", launcher=["python3", "server.py"])
    assert f"mkdir -p {namespace.host_dir(bare)}" in rendered(bare)["serve.sh"]
    off = deployment("local", container_runtime="none", launcher=["python3", "server.py"], l3_namespace="off")
    assert "mkdir" not in rendered(off)["serve.sh"]


def test_the_dynamic_backend_gets_the_namespace_as_its_key_namespace():
    d = deployment("adp", l3_namespace="auto")
    config = json.loads(launch.extra_config_arg(d))
    assert config["key_namespace"] == namespace.of(d) and namespace.of(d)
    off = deployment("adp")  # the seed profile: namespace off, the document's config unchanged
    assert "key_namespace" not in json.loads(launch.extra_config_arg(off))


def test_a_key_namespace_of_its_own_beside_an_l3_namespace_is_refused_and_off_is_warned():
    adp = deployment("adp")
    _, findings = rules.check_host("gpu-01", {**adp.as_vars(), "hicache_l3_namespace": "auto",
                                              "hicache_extra_config": {**adp.extra_config, "key_namespace": "mine"}})
    assert [f.rule for f in findings if f.level == rules.ERROR] == ["l3-namespace"]
    _, findings = rules.check_host("gpu-01", adp.as_vars())
    assert "l3-namespace-off" in [f.rule for f in findings if f.level == rules.WARNING]


def test_servers_writing_into_one_directory_of_a_shared_tier_must_have_one_page_format():
    a = deployment("local", l3_namespace="off", l3_share="nvme-pool")
    same = deployment("local", l3_namespace="off", l3_share="nvme-pool")
    fp8 = deployment("local", l3_namespace="off", l3_share="nvme-pool", kv_cache_dtype="fp8_e4m3")
    assert rules.check_shared_tiers({"a": a, "b": same}) == []
    [finding] = rules.check_shared_tiers({"a": a, "b": same, "c": fp8})
    assert (finding.host, finding.rule) == ("c", "l3-shared-format") and "KV dtype auto vs fp8_e4m3" in finding.message
    # one literal namespace is one directory too; the first host of the tier may be elsewhere
    team = {h: deployment("local", l3_namespace="team", l3_share="nvme-pool", **kw) for h, kw in
            (("b", {}), ("c", {"mem_layout": "layer_first"}))}
    found = rules.check_shared_tiers({"a": deployment("local", l3_share="nvme-pool"), **team})
    assert [(f.host, f.rule) for f in found if f.level == rules.ERROR] == [("c", "l3-shared-format")]
    assert {f.rule for f in found if f.level == rules.WARNING} == {"l3-share-split"}  # auto vs team: nothing shared across
    # what SGLang's keys hold keeps two servers apart in one directory: another model, page size or TP size is no clash
    for other in ({"served_model_name": "other"}, {"page_size": 64}, {"tp_size": 2}):
        clash = deployment("local", l3_namespace="off", l3_share="nvme-pool", kv_cache_dtype="fp8_e4m3", **other)
        assert [f for f in rules.check_shared_tiers({"a": a, "c": clash}) if f.level == rules.ERROR] == [], other
    # with the namespace on, each format has its own namespace: nothing to refuse; another tier: nothing shared
    assert [f for f in rules.check_shared_tiers({"a": deployment("local", l3_share="nvme-pool"),
                                                 "c": deployment("local", l3_share="nvme-pool", kv_cache_dtype="fp8_e4m3")})
            if f.level == rules.ERROR] == []
    assert rules.check_shared_tiers({"a": a, "c": deployment("local", l3_namespace="off", l3_share="other", kv_cache_dtype="fp8_e4m3")}) == []


def test_extra_args_that_change_the_page_bytes_change_the_namespace_and_the_hash_ignores_wording(monkeypatch):
    base = deployment("local")
    for args in (["--dtype", "float16"], ["--quantization=fp8"], ["--revision", "abc123"]):
        other = deployment("local", extra_args=args)
        assert namespace.of(other) != namespace.of(base), args
        assert any(args[0].split("=")[0] in phrase for phrase in namespace.differences(base, other)), args
    assert namespace.of(deployment("local", extra_args=["--log-level", "info"])) == namespace.of(base)
    before = namespace.of(base)
    monkeypatch.setattr(namespace, "COMPONENTS", tuple((field, words.upper()) for field, words in namespace.COMPONENTS))
    assert namespace.of(base) == before  # display words are not hashed: rewording never empties a fleet's cache


def test_an_mla_models_keys_hold_no_tp_size_so_tp_keeps_no_two_servers_apart():
    """#34: SGLang 0.5.23 keys an MLA model's pages `_{model}` plus PP/CP suffixes in HiCacheFile (hicache_storage.py,
    config_suffix) and `_{model}` in NIXL (hicache_nixl.py): TP size is no key. Two MLA servers of another TP size and
    KV dtype in one directory were called safe, and read each other's pages."""
    configs = ROOT / "tests" / "model_configs"
    base = {"l3_namespace": "off", "l3_share": "nvme-pool"}
    for mla, config in ((True, "deepseek-v3.json"), (False, "llama-3.1-8b-instruct.json")):
        a = deployment("local", model_config=str(configs / config), **base)
        b = deployment("local", model_config=str(configs / config), tp_size=2, kv_cache_dtype="fp8_e4m3", **base)
        errors = [f for f in rules.check_shared_tiers({"a": a, "b": b}) if f.level == rules.ERROR]
        if mla:
            assert [(f.host, f.rule) for f in errors] == [("b", "l3-shared-format")] and "for an MLA model" in errors[0].message
            assert "KV dtype auto vs fp8_e4m3" in errors[0].message
        else:
            assert errors == [] and rules.check_shared_tiers({"a": a, "b": b}) == []  # GQA: TP size is in the keys
    # without the model's config.json validate cannot tell: a warning naming the variable that lets it
    a, b = deployment("local", **base), deployment("local", tp_size=2, kv_cache_dtype="fp8_e4m3", **base)
    [warning] = rules.check_shared_tiers({"a": a, "b": b})
    assert (warning.level, warning.rule, warning.variable) == (rules.WARNING, "l3-shared-format-mla", "hicache_model_config")
    # what the keys hold, by backend and attention type; decode context parallel keys TP in the file backend again
    assert "TP size" not in namespace.keyed("file", mla=True) and "PP size" in namespace.keyed("file", mla=True)
    assert "TP size" not in namespace.keyed("nixl", mla=True) and "TP size" in namespace.keyed("nixl", mla=False)
    assert "TP size" not in namespace.keyed("file", mla=None)  # not known: not taken for a key
    assert "TP size" in namespace.keyed("file", mla=True, dcp=True) and "TP size" not in namespace.keyed("nixl", mla=True, dcp=True)
    dcp = {"extra_args": ["--dcp-size", "2"]}
    assert namespace.dcp_size(deployment("local", **dcp)) == 2 and namespace.dcp_size(deployment("local", extra_args=["--dcp-size=4"])) == 4
    assert namespace.collisions(deployment("local", **base, **dcp), deployment("local", **base, tp_size=2, kv_cache_dtype="fp8_e4m3", **dcp),
                                mla=True) == []  # the DCP suffix holds the TP size


def test_the_unified_key_scheme_flag_is_refused_naming_why():
    """#34: nothing refused --hicache-storage-key-scheme in hicache_extra_args; SGLang 0.5.23's parser has no such
    option (server_args.py), and the toolkit's rules model only the rank-suffix keys."""
    for args in (["--hicache-storage-key-scheme", "unified"], ["--hicache-storage-key-scheme=unified"]):
        _, findings = rules.check_host("gpu-01", {**deployment("local").as_vars(), "hicache_extra_args": args})
        refused = [f for f in findings if f.level == rules.ERROR]
        assert [(f.variable, f.rule) for f in refused] == [("hicache_extra_args[0]", "incompatible-flag")], refused
        assert "no such option" in refused[0].message and "remove --hicache-storage-key-scheme" in refused[0].fix


def _built(name: str, **overrides):
    """A shipped inventory's first host with overrides, built even when a rule refuses it (the namespace is pure)."""
    from helpers import _host_vars
    host, variables = _host_vars(name)
    return rules.build(host, {**variables, **{f"hicache_{k}": v for k, v in overrides.items()}})


@pytest.mark.parametrize("field", ["pp_size", "attn_cp_size"])
def test_what_counts_as_keyed_depends_on_the_backend(field):
    # One directory, two servers differing only in PP (or attention CP): the file backend's names carry the PP and
    # CP ranks (HiCacheFile), NIXL's only _{model}_{tp_rank}_{tp_size} (hicache_nixl.py), so there they collide.
    words = dict(namespace.COMPONENTS)[field]
    assert namespace.collisions(_built("local"), _built("local", **{field: 2})) == []
    assert namespace.collisions(_built("vast"), _built("vast", **{field: 2})) == [f"{words} 1 vs 2"]
    assert words in namespace.keyed("file") and words not in namespace.keyed("nixl") and "TP size" in namespace.keyed("nixl")


def test_servers_of_different_backends_do_not_read_each_others_pages():
    assert namespace.collisions(_built("vast"), _built("vast", storage_backend="file", nixl_plugin=None)) == []


@pytest.mark.parametrize("name,bucket", [("00", True), ("ff", True), ("Ab", True), ("abc", False), ("a", False), (None, False)])
def test_looks_like_bucket(name, bucket):
    assert namespace.looks_like_bucket(name) is bucket
