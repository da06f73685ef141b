#!/usr/bin/env bash
# Build (once) the environment in which SGLang's real argument parser and storage backends run on a CPU-only machine:
#   $HICACHE_CACHE/sglang-base      a venv with CPU torch and SGLang's import-time dependencies; with --storage also
#                                   what SGLang's HiCacheFile / HiCacheNixl import (transformers, apache-tvm-ffi) and
#                                   NIXL (nixl-cu12 1.5.1 with its POSIX plugin, and the `nixl` 1.5.1 module that
#                                   SGLang imports: 1.5.2's meta package names a nixl-cu12 wheel PyPI does not have)
#   $HICACHE_CACHE/sglang-<version> SGLang itself (--no-deps), put on PYTHONPATH beside the base venv
# Usage: tests/infra/sglang_env.sh [--storage] 0.5.21 [0.5.23 ...]   Re-runs are instant; a half-built part is rebuilt.
# Concurrent callers (the fleet streams of tests/run) wait for one another (flock), so a part is built once.
set -euo pipefail
cache="${HICACHE_CACHE:-$HOME/.cache/hicache-deploy}"
base="$cache/sglang-base"
python="${HICACHE_SGLANG_PYTHON:-python3.11}"   # SGLang's wheels are cp311
storage=0
if [ "${1:-}" = --storage ]; then storage=1; shift; fi
mkdir -p "$cache"
exec 9>"$cache/.sglang_env.lock"
flock 9
pip=("$base/bin/pip" install -q --disable-pip-version-check)

if [ ! -f "$base/.complete" ]; then
  echo "sglang_env: building $base (CPU torch, about 2 minutes)" >&2
  rm -rf "$base"
  "$python" -m venv "$base"
  "${pip[@]}" torch==2.13.0
  "${pip[@]}" triton==3.8.0 numpy orjson psutil pybase64 \
    requests pillow starlette packaging msgspec pydantic pyzmq tqdm ipython aiohttp pyyaml
  touch "$base/.complete"
fi
if [ "$storage" = 1 ] && [ ! -f "$base/.storage-complete" ]; then
  echo "sglang_env: adding SGLang's storage backends' imports and NIXL 1.5.1 to $base (about 1 minute)" >&2
  "${pip[@]}" transformers apache-tvm-ffi nixl-cu12==1.5.1
  "${pip[@]}" --no-deps nixl==1.5.1
  touch "$base/.storage-complete"
fi
for version in "$@"; do
  target="$cache/sglang-$version"
  if [ ! -f "$target/.complete" ]; then
    echo "sglang_env: installing sglang==$version into $target" >&2
    rm -rf "$target"
    "${pip[@]}" --no-deps --target "$target" "sglang==$version"
    touch "$target/.complete"
  fi
done
