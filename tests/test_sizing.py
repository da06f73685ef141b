"""`hicachectl size` against values computed by hand from published model configs (tests/model_configs)."""

from __future__ import annotations

import json

import pytest
from support import ROOT, cli, cli_json

from hicachectl.config import sizing

CONFIGS = ROOT / "tests" / "model_configs"


def sized(name: str, **workload) -> sizing.Sizing:
    return sizing.size(sizing.model_shape(sizing.load_config(CONFIGS / f"{name}.json")), sizing.Workload(**workload))


def test_dense_gqa_llama_3_1_8b():
    # 32 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 bytes (bf16)
    s = sized("llama-3.1-8b-instruct", page_size=64, context_tokens=131072)
    assert s.shape.attention == "GQA" and s.shape.window_layers == 0
    assert s.bytes_per_token_per_rank == 32 * 8 * 128 * 2 * 2 == 128 * 1024
    assert s.page_bytes_per_rank == 64 * 128 * 1024  # 8 MiB
    assert s.pages_per_prefix == 2048
    assert s.l3_bytes_per_prefix == 131072 * 128 * 1024  # 16 GiB for one 128k-token prefix


def test_tensor_parallel_splits_kv_heads_then_replicates_them():
    assert sized("llama-3.1-8b-instruct", tp_size=8).bytes_per_token_per_rank == 32 * 1 * 128 * 2 * 2
    # 16 ranks for 8 KV heads: SGLang keeps one head per rank, so each rank stores as much as at tp 8
    tp16 = sized("llama-3.1-8b-instruct", tp_size=16, page_size=64, context_tokens=64)
    assert tp16.bytes_per_token_per_rank == 32 * 128 * 2 * 2
    assert tp16.l3_bytes_per_prefix == 16 * 64 * 32 * 128 * 2 * 2  # every rank writes its copy


def test_mla_deepseek_v3():
    # (kv_lora_rank 512 + rope 64) x 61 layers x 2 bytes; no K/V pair, whole on every rank
    s = sized("deepseek-v3", tp_size=8, page_size=64, context_tokens=128 * 1024, prefixes=10)
    assert s.shape.attention == "MLA" and s.shape.experts == 256
    assert s.bytes_per_token_per_rank == 576 * 61 * 2 == 70_272
    # MLA's L3 keys carry no rank: one copy for all 8 ranks
    assert s.l3_bytes_per_prefix == 128 * 1024 * 70_272
    assert s.l3_capacity == 10 * 128 * 1024 * 70_272


def test_sliding_window_hybrid_gpt_oss_20b():
    # 12 full + 12 sliding (window 128) layers; 8 KV heads x 64 dims x 2 x 2 bytes = 2048 B per layer and token
    s = sized("gpt-oss-20b", page_size=64, context_tokens=8192)
    assert (s.shape.full_layers, s.shape.window_layers, s.shape.window) == (12, 12, 128)
    assert s.shape.experts == 32
    assert s.bytes_per_token_per_rank == 24 * 2048 == 49_152
    # each 64-token page carries its 64 tokens of the full layers and the 128-token window of the sliding ones
    assert s.page_bytes_per_rank == 2048 * (64 * 12 + 128 * 12)
    assert s.pages_per_prefix == 128
    kept_once = 2048 * (8192 * 12 + 128 * 12)
    assert s.window_multiplier == round(128 * 2048 * (64 * 12 + 128 * 12) / kept_once, 2)


def test_chunked_hybrid_llama_4_maverick_reproduces_the_seeds_3x():
    # The VAST seed's shape: tp 8, page 8192, ~120k-token prompts. 48 layers, every 4th global (12),
    # 36 chunked at 8192; 8 KV heads / 8 ranks = 1 head x 128 dims x 2 x 2 bytes = 512 B per layer and token.
    s = sized("llama-4-maverick-17b-128e-instruct-fp8", tp_size=8, page_size=8192, context_tokens=120_000)
    assert (s.shape.full_layers, s.shape.window_layers, s.shape.window) == (12, 36, 8192)
    assert s.shape.experts == 128
    assert s.page_bytes_per_rank == 512 * 8192 * 48  # 192 MiB
    assert s.pages_per_prefix == 15
    # against a store keeping 120k tokens of the 12 global layers and one 8192 window of the 36 chunked ones
    assert s.window_multiplier == round(15 * 512 * 8192 * 48 / (512 * (120_000 * 12 + 8192 * 36)), 2) == 3.4


def test_moe_gqa_qwen3_30b_a3b():
    s = sized("qwen3-30b-a3b", kv_cache_dtype="fp8_e4m3", concurrency=4, context_tokens=32768, page_size=64,
              target_warm_ttft_s=2.0)
    assert s.shape.experts == 128 and not s.shape.notes  # use_sliding_window: false
    assert s.bytes_per_token_per_rank == 48 * 4 * 128 * 2 * 1  # fp8 KV: 1 byte
    assert s.host_pool_per_rank == 4 * 32768 * 48 * 4 * 128 * 2
    assert s.l3_read_bandwidth == pytest.approx(4 * 32768 * 48 * 4 * 128 * 2 / 2.0)


def test_unmodelled_attention_is_refused_by_name():
    with pytest.raises(sizing.SizingError, match="linear_attention"):
        sizing.model_shape({"num_hidden_layers": 2, "num_attention_heads": 2, "head_dim": 8,
                            "layer_types": ["linear_attention", "full_attention"]})
    with pytest.raises(sizing.SizingError, match="num_hidden_layers"):
        sizing.model_shape({"num_attention_heads": 2})


def test_size_command_table_and_json(tmp_path):
    config = CONFIGS / "deepseek-v3.json"
    result = cli("size", "--config", str(config), "--tp", "8", "--page-size", "64")
    assert result.returncode == 0, result.stderr
    assert "70,272 B" in result.stdout and "MLA" in result.stdout
    data = cli_json("size", "--config", str(config), "--tp", "8", "--page-size", "64")
    assert data["bytes_per_token_per_rank"] == 70_272
    assert data["shape"]["kind"] == "MLA, MoE 256 experts"
    broken = tmp_path / "config.json"
    broken.write_text(json.dumps({"num_attention_heads": 2}))
    refused = cli("size", "--config", str(tmp_path))
    assert refused.returncode == 1 and "num_hidden_layers" in refused.stderr


def test_validate_warns_when_the_tiers_cannot_hold_the_working_set(tmp_path):
    from test_validate import VALID, make_inventory

    maverick = str(CONFIGS / "llama-4-maverick-17b-128e-instruct-fp8.json")
    # The VAST seed's shape: 200 GB per rank holds 64 x 120k-token prompts (194 GB needed) ...
    fits = {**VALID, "hicache_model_config": maverick, "hicache_workload_context_tokens": 120_000,
            "hicache_workload_concurrency": 64, "hicache_workload_prefixes": 64, "hicache_storage_capacity_gb": 2000}
    report = cli_json("validate", "--inventory", str(make_inventory(tmp_path / "fits", fits)))
    assert report["ok"] and not [f for f in report["findings"] if f["rule"] in ("host-pool-working-set", "l3-capacity")]
    # ... but not 128 of them, and 1000 GB of L3 cannot keep 64 prefixes of 24.2 GB
    tight = {**fits, "hicache_workload_concurrency": 128, "hicache_storage_capacity_gb": 1000}
    report = cli_json("validate", "--inventory", str(make_inventory(tmp_path / "tight", tight)))
    rules = {f["rule"]: f for f in report["findings"] if f["host"] == "gpu-a"}
    assert report["ok"], "a working set that does not fit is a warning, not a refusal"
    assert rules["host-pool-working-set"]["variable"] == "hicache_size_gb"
    assert "raise hicache_size_gb to 387" in rules["host-pool-working-set"]["fix"]
    assert rules["l3-capacity"]["variable"] == "hicache_storage_capacity_gb"
    assert "1547 GB" in rules["l3-capacity"]["fix"]
    missing = {**fits, "hicache_model_config": str(tmp_path / "nowhere.json")}
    report = cli_json("validate", "--inventory", str(make_inventory(tmp_path / "missing", missing)), check_rc=1)
    assert any(f["rule"] == "model-config" and f["variable"] == "hicache_model_config" for f in report["findings"])


def test_the_inventorys_kv_cache_dtype_sizes_the_pages():
    from helpers import deployment

    assert sizing.workload_for(deployment("local", kv_cache_dtype="fp8_e4m3")).kv_cache_dtype == "fp8_e4m3"
    assert sizing.workload_for(deployment("local")).kv_cache_dtype == "auto"


@pytest.mark.parametrize("config", [
    {"num_hidden_layers": 2, "num_attention_heads": 0, "hidden_size": 64},
    {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": "x"},
    {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": float("inf")},
    {"num_hidden_layers": -2, "num_attention_heads": 4, "hidden_size": 64},
    {"num_hidden_layers": 2, "text_config": 5},
    [1, 2],
    {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "head_dim": True},
    {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "head_dim": 128.5},
])
def test_a_model_config_that_is_not_one_is_a_sizing_error_not_a_crash(config):
    with pytest.raises(sizing.SizingError):
        sizing.model_shape(config)
