"""KV cache sizing from a model's config.json: bytes per token and page, host pool, L3 capacity, L3 bandwidth.

Pure arithmetic, checked in tests against hand-computed values for published configs. The bytes per
token follow SGLang's host pools (mem_cache/pool_host: MHA `head_dim * heads * layers * 2 * dtype`,
MLA `(kv_lora_rank + qk_rope_head_dim) * layers * dtype`); `--hicache-size` is GB = 1e9 bytes per rank.
Hybrid sliding-window models: the VAST document reports that SGLang stores the layers' whole window with
every L3 page (~3x the bytes of a per-token store on Llama-4); `page_bytes_per_rank` models that report,
which is not checked against SGLang's code here.
MLA pages are written once for all TP ranks (their L3 keys carry no rank), MHA pages once per rank.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from collections.abc import Mapping
from typing import Any

GB = 10**9  # SGLang's --hicache-size unit

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "half": 2,
               "fp8_e4m3": 1, "fp8_e5m2": 1}
WINDOW_LAYER_TYPES = ("sliding_attention", "chunked_attention")


class SizingError(ValueError):
    """The config cannot be sized (missing field, an attention kind SGLang sizes differently)."""


@dataclasses.dataclass(frozen=True)
class ModelShape:
    architecture: str
    attention: str  # MHA, GQA or MLA
    full_layers: int
    window_layers: int
    window: int | None  # tokens kept by the window layers
    kv_heads: int  # 1 for MLA (one latent shared by all heads)
    kv_width: int  # bytes-per-element count of one head's K+V (MLA: latent + rope, no K/V pair)
    dtype: str
    experts: int | None
    notes: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        local = "chunked-attention" if self.architecture.startswith("Llama4") else "sliding-window"
        mix = f"hybrid {local} " if self.window_layers and self.full_layers else (f"{local} " if self.window_layers else "")
        return f"{mix}{self.attention}" + (f", MoE {self.experts} experts" if self.experts else "")


def load_config(path: str | pathlib.Path) -> dict[str, Any]:
    path = pathlib.Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SizingError(f"cannot read the model config {path}: {exc}") from exc


def _need(config: Mapping[str, Any], key: str) -> Any:
    value = config.get(key)
    if value is None:
        raise SizingError(f"config.json has no {key!r}; cannot size this model.")
    return value


def _layer_split(text: Mapping[str, Any], model_type: str, layers: int) -> tuple[int, int, int | None, list[str]]:
    """(full layers, window layers, window) from the config's attention pattern."""
    notes: list[str] = []
    layer_types = text.get("layer_types")
    if layer_types:
        unknown = sorted(set(layer_types) - {"full_attention", *WINDOW_LAYER_TYPES})
        if unknown:
            raise SizingError(f"layer types {unknown} (linear attention, Mamba state) are sized differently; not modelled here.")
        window_layers = sum(t in WINDOW_LAYER_TYPES for t in layer_types)
        window = text.get("sliding_window") or text.get("attention_chunk_size")
        return len(layer_types) - window_layers, window_layers, window if window_layers else None, notes
    if text.get("attention_chunk_size"):  # Llama 4: RoPE layers attend within a chunk, NoPE layers globally
        no_rope = text.get("no_rope_layers")
        if no_rope:
            full = sum(1 for flag in no_rope if not flag)
        else:
            full = layers // (text.get("no_rope_layer_interval") or 4)
        return full, layers - full, text["attention_chunk_size"], notes
    window = text.get("sliding_window")
    if window and text.get("sliding_window_pattern"):  # Gemma 3: every Nth layer global
        full = layers // text["sliding_window_pattern"]
        return full, layers - full, window, notes
    if window and model_type == "gemma2":  # alternating local/global
        return layers // 2, layers - layers // 2, window, notes
    if window and text.get("use_sliding_window", True):
        notes.append(f"sliding_window {window} applies to every layer; SGLang caches these models as full attention, "
                     "so every token is counted.")
    return layers, 0, None, notes


def model_shape(config: Mapping[str, Any]) -> ModelShape:
    """The KV cache's shape from a model's config.json; a SizingError (one line) for a config that is not one."""
    if not isinstance(config, Mapping) or not isinstance(config.get("text_config") or {}, Mapping):
        raise SizingError("config.json is not a model config (a JSON object, its text_config one too); cannot size this model.")
    try:
        shape = _model_shape(config)
    except (TypeError, ValueError, ZeroDivisionError, OverflowError, IndexError, AttributeError) as exc:
        raise SizingError(f"config.json has a value that is not a usable number ({type(exc).__name__}: {exc}); cannot size this model.") from None
    counts = {"num_hidden_layers": shape.full_layers + shape.window_layers, "num_key_value_heads": shape.kv_heads,
              "head_dim (or kv_lora_rank + qk_rope_head_dim), as the width of K and V": shape.kv_width}
    for name, value in counts.items():
        if value <= 0:
            raise SizingError(f"config.json gives {name} {value}; cannot size this model.")
    return shape


def _whole(value: Any) -> int:
    """A count from config.json: a whole number (true is not 1, 128.5 is not 128)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"{value!r} is not a whole number")
    return int(value)


def _model_shape(config: Mapping[str, Any]) -> ModelShape:
    text = {**config, **(config.get("text_config") or {})}
    model_type = str(text.get("model_type", ""))
    architecture = (config.get("architectures") or [model_type or "unknown"])[0]
    layers = _whole(_need(text, "num_hidden_layers"))
    dtype = str(text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or "bfloat16")
    experts = text.get("n_routed_experts") or text.get("num_local_experts") or text.get("num_experts")
    if text.get("kv_lora_rank"):
        width = _whole(text["kv_lora_rank"]) + _whole(_need(text, "qk_rope_head_dim"))
        return ModelShape(architecture, "MLA", layers, 0, None, 1, width, dtype, experts)
    heads = _whole(_need(text, "num_attention_heads"))
    kv_heads = _whole(text.get("num_key_value_heads") or heads)
    head_dim = _whole(text.get("head_dim") or _whole(_need(text, "hidden_size")) // heads)
    full, window_layers, window, notes = _layer_split(text, model_type, layers)
    return ModelShape(architecture, "MHA" if kv_heads == heads else "GQA", full, window_layers, window,
                      kv_heads, 2 * head_dim, dtype, experts, tuple(notes))


@dataclasses.dataclass(frozen=True)
class Workload:
    tp_size: int = 1
    pp_size: int = 1
    page_size: int = 1
    kv_cache_dtype: str = "auto"
    context_tokens: int = 131072
    concurrency: int = 1
    prefixes: int = 1  # distinct prefixes L3 must hold
    target_warm_ttft_s: float | None = None



def workload_for(d: Any, **overrides: Any) -> Workload:
    """A deployment's workload: its parallelism, page size, KV dtype and the hicache_workload_* variables."""
    values = dict(
        tp_size=d.tp_size or 1, pp_size=d.pp_size or 1, page_size=d.page_size or 1,
        kv_cache_dtype=d.kv_cache_dtype or "auto",  # --kv-cache-dtype in hicache_extra_args is refused (managed-flag)
        context_tokens=d.workload_context_tokens or d.context_length or Workload.context_tokens,
        concurrency=d.workload_concurrency or d.max_running_requests or 1,
        prefixes=d.workload_prefixes or 1,
    )
    values.update({k: v for k, v in overrides.items() if v is not None})
    return Workload(**values)


@dataclasses.dataclass(frozen=True)
class Sizing:
    shape: ModelShape
    workload: Workload
    dtype_bytes: int
    kv_heads_per_rank: int
    bytes_per_token_per_rank: int  # every layer of this rank, one token (device/host pool view)
    page_bytes_per_rank: int  # one L3 page of this rank, window included
    pages_per_prefix: int
    window_multiplier: float  # L3 bytes stored / bytes of a store that keeps one window per prefix
    host_pool_per_rank: int  # bytes for concurrency x context pages
    l3_bytes_per_prefix: int  # all ranks
    l3_capacity: int  # prefixes x l3_bytes_per_prefix
    l3_read_bandwidth: float | None  # bytes/s for the whole concurrency to load within the target TTFT

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["shape"]["kind"] = self.shape.kind
        return data


def kv_dtype_bytes(shape: ModelShape, kv_cache_dtype: str) -> int:
    name = shape.dtype if kv_cache_dtype in ("auto", None) else kv_cache_dtype
    try:
        return DTYPE_BYTES[name]
    except KeyError as exc:
        raise SizingError(f"KV cache dtype {name!r} unknown; use one of {sorted(DTYPE_BYTES)}.") from exc


def size(shape: ModelShape, workload: Workload) -> Sizing:
    w = workload
    if min(w.tp_size, w.pp_size, w.page_size, w.context_tokens, w.concurrency, w.prefixes) < 1:
        raise SizingError("tp, pp, page size, context, concurrency and prefixes must be at least 1.")
    dtype_bytes = kv_dtype_bytes(shape, w.kv_cache_dtype)
    # SGLang replicates KV heads when there are more TP ranks than heads; MLA's latent is whole on every rank.
    heads = shape.kv_heads if shape.attention == "MLA" else max(1, shape.kv_heads // w.tp_size)
    per_layer = heads * shape.kv_width * dtype_bytes
    full_layers = math.ceil(shape.full_layers / w.pp_size)
    window_layers = math.ceil(shape.window_layers / w.pp_size)
    window_tokens = math.ceil(shape.window / w.page_size) * w.page_size if shape.window_layers else 0
    page_bytes = per_layer * (w.page_size * full_layers + window_tokens * window_layers)
    pages = math.ceil(w.context_tokens / w.page_size)
    kept_once = per_layer * (w.context_tokens * full_layers + min(shape.window or 0, w.context_tokens) * window_layers)
    writers = (1 if shape.attention == "MLA" else w.tp_size) * w.pp_size
    per_prefix = pages * page_bytes * writers
    return Sizing(
        shape=shape, workload=w, dtype_bytes=dtype_bytes, kv_heads_per_rank=heads,
        bytes_per_token_per_rank=per_layer * (full_layers + window_layers),
        page_bytes_per_rank=page_bytes, pages_per_prefix=pages,
        window_multiplier=round(pages * page_bytes / kept_once, 2),
        host_pool_per_rank=w.concurrency * pages * page_bytes,
        l3_bytes_per_prefix=per_prefix, l3_capacity=w.prefixes * per_prefix,
        l3_read_bandwidth=(w.concurrency * per_prefix / w.target_warm_ttft_s) if w.target_warm_ttft_s else None,
    )


def human(n: float, unit: str = "B") -> str:
    """Binary units for bytes (KiB, MiB, ...), which is how pages and pools are usually read."""
    for prefix in ("", "Ki", "Mi", "Gi", "Ti", "Pi"):
        if abs(n) < 1024 or prefix == "Pi":
            return f"{n:.0f} {prefix}{unit}" if prefix == "" else f"{n:.1f} {prefix}{unit}"
        n /= 1024
    raise AssertionError("unreachable")


def lines(s: Sizing) -> list[tuple[str, str]]:
    """The report, as (quantity, value) rows."""
    w, shape = s.workload, s.shape
    rows = [
        ("model", f"{shape.architecture}: {shape.kind}"),
        ("layers", f"{shape.full_layers} full" + (f" + {shape.window_layers} window ({shape.window} tokens)" if shape.window_layers else "")),
        ("KV dtype", f"{shape.dtype if w.kv_cache_dtype == 'auto' else w.kv_cache_dtype} ({s.dtype_bytes} B)"),
        ("KV heads per rank", f"{s.kv_heads_per_rank} (tp {w.tp_size}, pp {w.pp_size})"),
        ("KV bytes per token per rank", f"{s.bytes_per_token_per_rank:,} B ({human(s.bytes_per_token_per_rank)})"),
        ("bytes per page per rank", f"{s.page_bytes_per_rank:,} B ({human(s.page_bytes_per_rank)}, page {w.page_size} tokens)"),
        ("host pool per rank", f"{human(s.host_pool_per_rank)} = --hicache-size {math.ceil(s.host_pool_per_rank / GB)} "
                               f"for {w.concurrency} x {w.context_tokens} tokens"),
        ("L3 per prefix", f"{human(s.l3_bytes_per_prefix)} ({s.pages_per_prefix} pages, all ranks)"),
        ("L3 capacity", f"{human(s.l3_capacity)} for {w.prefixes} prefix(es)"),
    ]
    if shape.window_layers:
        rows.append(("window multiplier", f"{s.window_multiplier}x the bytes of a store keeping one window per prefix"))
    if s.l3_read_bandwidth is not None:
        rows.append(("L3 read bandwidth", f"{s.l3_read_bandwidth / GB:.1f} GB/s to load {w.concurrency} prefix(es) "
                                          f"in {w.target_warm_ttft_s:g} s"))
    rows.extend(("note", note) for note in shape.notes)
    return rows
