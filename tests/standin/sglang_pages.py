"""The stand-in's L3 pages, stored and loaded by SGLang's own storage backends: HiCacheFile and HiCacheNixl.

Not a model of the tier: SGLang's classes (the pinned wheel, CPU torch, NIXL's POSIX plugin from nixl-cu12) write
and read the pages, configured the way SGLang configures them (read in sglang 0.5.23):
- the extra config: `--hicache-storage-backend-extra-config` JSON or `@file` (.json/.toml/.yaml), SGLang's own keys
  popped first (mem_cache/hybrid_cache/hybrid_cache_controller.py parse_storage_backend_extra_config);
- one HiCacheStorageConfig per TP rank (managers/cache_controller.py _generate_storage_config), model_name the
  served name, created by StorageBackendFactory (mem_cache/storage/backend_factory.py); directories, plugin and
  O_DIRECT come from SGLANG_HICACHE_{FILE,NIXL}_BACKEND_* and the extra config, read by the backends themselves;
- the calls of the cache controller: batch_exists for the hit (the ranks agree on the shortest), then for the file
  backend batch_get/batch_set of flat data pages (_generic_page_get/_generic_page_set), for nixl
  batch_get_v1/batch_set_v1 on host indices (_page_get_zero_copy/_page_set_zero_copy).
What is not SGLang's: the host pool (PageFirstHostPool: the part of MHATokenToKVPoolHost, pool_host/mha.py, that the
backends touch, same formulas, on CPU), the model (MODEL: 4 layers, 1 KV head per rank, head dim 128, bf16), and
the token ids (a word's id is the first 4 bytes of its SHA-256). Keys are SGLang's: per page
sha256(previous page's digest || token ids as uint32 little-endian) (mem_cache/utils.py get_hash_str).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import mmap
import os
import struct
import sys
import time
import types

# The model whose pages are written: small, and a page of 4 tokens or more is a multiple of 4096 bytes, so NIXL's
# O_DIRECT zero-copy path (is_stride_page_aligned) runs as on a real server.
MODEL = {"layer_num": 4, "head_num": 1, "head_dim": 128}
# The same model as its config.json, for what sizes pages from one (hicache_model_config, bench --model-config): K and V
# of 1 head of 128 bf16 values in 4 layers, 2048 bytes per token.
CONFIG_JSON = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": MODEL["layer_num"],
               "num_attention_heads": MODEL["head_num"], "num_key_value_heads": MODEL["head_num"], "head_dim": MODEL["head_dim"],
               "hidden_size": MODEL["head_dim"], "torch_dtype": "bfloat16"}
POOL_PAGES = 128  # SGLang's STORAGE_BATCH_SIZE: the most pages one storage call moves
# Where the stand-in finds SGLang (install_standin writes it on a test host; STANDIN_SGLANG_PATH overrides it).
PATH_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sglang_path")


def add_sglang_to_path() -> None:
    raw = os.environ.get("STANDIN_SGLANG_PATH")
    if raw is None and os.path.exists(PATH_FILE):
        with open(PATH_FILE) as handle:
            raw = handle.read()
    for entry in reversed([p for p in (raw or "").replace("\n", ":").split(":") if p]):
        if entry not in sys.path:
            sys.path.insert(0, entry)


def enter_package(name: str, directory: str) -> types.ModuleType:
    """The package `name` in sys.modules with its submodules found in `directory`, its __init__.py not run."""
    package = types.ModuleType(name)
    package.__path__ = [directory]
    sys.modules[name] = package
    return package


def import_sglang():
    """SGLang's storage classes, each package entered without an __init__ the backends do not need:
    - sglang/__init__.py is the frontend's public API (sglang.lang) and patches transformers: it imports transformers
      and two thirds of the import's time (6 of 9 s of CPU at every server start) go to what no backend uses;
    - pool_host/__init__.py imports every device pool and, through them, every model's config (vision ones need
      torchvision, which has no CPU wheel on PyPI); the backends need only pool_host/base.py's HostKVCache."""
    add_sglang_to_path()
    if "sglang" not in sys.modules:
        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("SGLang is not on the stand-in's path (STANDIN_SGLANG_PATH or the sglang_path file)")
        enter_package("sglang", list(spec.submodule_search_locations)[0])
    mem_cache = importlib.import_module("sglang.srt.mem_cache")
    if "sglang.srt.mem_cache.pool_host" not in sys.modules:
        package = enter_package("sglang.srt.mem_cache.pool_host", os.path.join(list(mem_cache.__path__)[0], "pool_host"))
        package.HostKVCache = importlib.import_module("sglang.srt.mem_cache.pool_host.base").HostKVCache
    storage = importlib.import_module("sglang.srt.mem_cache.hicache_storage")
    factory = importlib.import_module("sglang.srt.mem_cache.storage.backend_factory")
    return storage, factory.StorageBackendFactory


def parse_extra_config(raw: str | None) -> tuple[dict, int]:
    """SGLang's parse_storage_backend_extra_config (hybrid_cache_controller.py): (the backend's config, prefetch
    threshold). Its class imports the whole scheduler, so the ~25 lines are followed here."""
    config: dict = {}
    if raw:
        if raw.startswith("@"):
            path = raw[1:]
            ext = os.path.splitext(path)[1].lower()
            with open(path, "rb" if ext == ".toml" else "r") as handle:
                if ext == ".json":
                    config = json.load(handle)
                elif ext == ".toml":
                    import tomllib
                    config = tomllib.load(handle)
                elif ext in (".yaml", ".yml"):
                    import yaml
                    config = yaml.safe_load(handle)
                else:
                    raise ValueError(f"Unsupported config file {path} (config format: {ext})")
        else:
            config = json.loads(raw)
    threshold = config.pop("prefetch_threshold", 256)
    for key in ("prefetch_timeout_base", "prefetch_timeout_per_ki_token", "hicache_storage_pass_prefix_keys"):
        config.pop(key, None)
    if not isinstance(threshold, int):
        raise ValueError(f"prefetch_threshold must be int, got {type(threshold).__name__}")
    return config, threshold


def token_ids(words: list[str]) -> list[int]:
    return [int.from_bytes(hashlib.sha256(w.encode()).digest()[:4], "little") for w in words]


def page_keys(ids: list[int], page_size: int) -> list[str]:
    """SGLang's storage keys: each full page hashed with the previous page's digest (get_hash_str)."""
    keys, prior = [], b""
    for start in range(0, len(ids) - len(ids) % page_size, page_size):
        digest = hashlib.sha256(prior + struct.pack(f"<{page_size}I", *ids[start:start + page_size])).digest()
        keys.append(digest.hex())
        prior = digest
    return keys


class PageFirstHostPool:
    """The host pool of one rank as the storage backends see it: MHATokenToKVPoolHost's page_first layout
    (kv_buffer [2, size, layer, head, dim]) and its get_data_page, get_dummy_flat_data_page,
    set_from_flat_data_page, get_page_buffer_meta and is_stride_page_aligned (pool_host/mha.py). Its buffer is
    mmap'ed, so page-aligned as a pinned host buffer is."""

    def __init__(self, torch, page_size: int, layout: str):
        if layout != "page_first":
            raise ValueError(f"the stand-in's host pool has the page_first layout only, not {layout}")
        self.torch, self.layout, self.page_size, self.pin_memory, self.device = torch, layout, page_size, False, "cpu"
        self.dtype = torch.bfloat16
        self.layer_num, self.head_num, self.head_dim = MODEL["layer_num"], MODEL["head_num"], MODEL["head_dim"]
        self.size = POOL_PAGES * page_size
        count = 2 * self.size * self.layer_num * self.head_num * self.head_dim
        self._map = mmap.mmap(-1, count * self.dtype.itemsize)
        self.kv_buffer = torch.frombuffer(self._map, dtype=self.dtype, count=count).view(
            2, self.size, self.layer_num, self.head_num, self.head_dim)

    def get_data_page(self, index, flat: bool = True):
        page = self.kv_buffer[:, index:index + self.page_size, :, :, :]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self):
        return self.torch.zeros((2, self.layer_num, self.page_size, self.head_num, self.head_dim), dtype=self.dtype).flatten()

    def set_from_flat_data_page(self, index: int, data_page) -> None:
        self.kv_buffer[:, index:index + self.page_size, :, :, :] = data_page.reshape(
            2, self.page_size, self.layer_num, self.head_num, self.head_dim)

    def get_page_buffer_meta(self, indices):
        base, item = self.kv_buffer.data_ptr(), self.dtype.itemsize
        v_offset = self.layer_num * self.size * self.head_num * self.head_dim * item
        ptrs = []
        for index in indices.tolist()[::self.page_size]:
            k_ptr = base + index * self.layer_num * self.head_num * self.head_dim * item
            ptrs += [k_ptr, k_ptr + v_offset]
        return ptrs, [self.layer_num * item * self.page_size * self.head_num * self.head_dim] * len(ptrs)

    def is_stride_page_aligned(self, page_size_bytes: int = 4096) -> bool:
        stride = self.page_size * self.layer_num * self.head_num * self.head_dim * self.dtype.itemsize
        return self.kv_buffer.data_ptr() % page_size_bytes == 0 and stride % page_size_bytes == 0


class PageStore:
    """The L3 tier of one server: a backend per TP rank, as SGLang's scheduler processes each open one."""

    def __init__(self, backend: str, served_model_name: str, page_size: int, tp_size: int = 1, pp_size: int = 1,
                 mem_layout: str = "page_first", extra_config: str | None = None):
        storage, factory = import_sglang()
        import torch
        self.torch, self.backend_name, self.page_size = torch, backend, page_size
        config, self.prefetch_threshold = parse_extra_config(extra_config)
        self.ranks = []
        for rank in range(tp_size):
            pool = PageFirstHostPool(torch, page_size, mem_layout)
            storage_config = storage.HiCacheStorageConfig(
                tp_rank=rank, tp_size=tp_size, pp_rank=0, pp_size=pp_size, attn_cp_rank=0, attn_cp_size=1,
                is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=mem_layout == "page_first",
                model_name=served_model_name, extra_config=dict(config))
            store = factory.create_backend(backend, storage_config, pool)
            store.register_mem_pool_host(pool)
            self.ranks.append((store, pool))

    def _indices(self, pages: int):
        return self.torch.arange(pages * self.page_size, dtype=self.torch.int64)

    def hits(self, keys: list[str]) -> int:
        """Pages found, from the first: the shortest over the ranks (the ranks agree on the minimum)."""
        keys = keys[:POOL_PAGES]
        return min(store.batch_exists(keys) for store, _ in self.ranks) if keys else 0

    def load(self, keys: list[str]) -> tuple[int, float]:
        """Read the pages into the host pools: (pages every rank read, seconds the backends took)."""
        keys = keys[:POOL_PAGES]
        if not keys:
            return 0, 0.0
        started, loaded = time.perf_counter(), len(keys)
        for store, pool in self.ranks:
            if self.backend_name == "nixl":
                ok = store.batch_get_v1(keys, self._indices(len(keys)))
            else:
                pages = store.batch_get(keys, [pool.get_dummy_flat_data_page() for _ in keys])
                ok = [page is not None for page in pages]
                for i, page in enumerate(pages):
                    if page is None:
                        break
                    pool.set_from_flat_data_page(i * self.page_size, page)
            loaded = min(loaded, next((i for i, good in enumerate(ok) if not good), len(keys)))
        return loaded, time.perf_counter() - started

    def store(self, keys: list[str]) -> int:
        """Write the pages from the host pools (filled from their keys, so a page's bytes are its own): pages written."""
        written = 0
        for start in range(0, len(keys), POOL_PAGES):
            batch = keys[start:start + POOL_PAGES]
            for store, pool in self.ranks:
                for i, key in enumerate(batch):
                    pool.get_data_page(i * self.page_size, flat=False).fill_(int(key[:2], 16) / 16)
                if self.backend_name == "nixl":
                    ok = all(store.batch_set_v1(batch, self._indices(len(batch))))
                else:
                    ok = store.batch_set(batch, [pool.get_data_page(i * self.page_size) for i in range(len(batch))])
                if not ok:
                    return written
            written += len(batch)
        return written
