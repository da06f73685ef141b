#!/usr/bin/env bash
# Build (once) the environment in which SGLang's real argument parser runs on a CPU-only machine:
#   $HICACHE_CACHE/sglang-base      a venv with CPU torch and SGLang's import-time dependencies
#   $HICACHE_CACHE/sglang-<version> SGLang itself (--no-deps), put on PYTHONPATH beside the base venv
# Usage: tests/infra/sglang_env.sh 0.5.21 [0.5.23 ...]   Re-runs are instant; a half-built part is rebuilt.
set -euo pipefail
cache="${HICACHE_CACHE:-$HOME/.cache/hicache-deploy}"
base="$cache/sglang-base"
python="${HICACHE_SGLANG_PYTHON:-python3.11}"   # SGLang's wheels are cp311

if [ ! -f "$base/.complete" ]; then
  echo "sglang_env: building $base (CPU torch, about 2 minutes)" >&2
  rm -rf "$base"
  "$python" -m venv "$base"
  "$base/bin/pip" install -q --disable-pip-version-check torch==2.13.0
  "$base/bin/pip" install -q --disable-pip-version-check triton==3.8.0 numpy orjson psutil pybase64 \
    requests pillow starlette packaging msgspec pydantic pyzmq tqdm ipython aiohttp pyyaml
  touch "$base/.complete"
fi
for version in "$@"; do
  target="$cache/sglang-$version"
  if [ ! -f "$target/.complete" ]; then
    echo "sglang_env: installing sglang==$version into $target" >&2
    rm -rf "$target"
    "$base/bin/pip" install -q --disable-pip-version-check --no-deps --target "$target" "sglang==$version"
    touch "$target/.complete"
  fi
done
