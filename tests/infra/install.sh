#!/usr/bin/env bash
# The project's venv (.venv) with hicachectl and its test tools. Idempotent: re-runs skip pip when
# pyproject.toml has not changed since the last successful install.
set -euo pipefail
cd "$(dirname "$0")/../.."
# Debian's own python3 where it will do: Debian builds it with PGO and LTO, and the suite's controller side (Ansible,
# pytest, hicachectl) then costs about a tenth less CPU than with this machine kind's pyenv build (shared, no PGO):
# `hicachectl plan --inventory local` 10.5 against 11.6 CPU-seconds at best of five, 2026-12-03. PYTHON overrides.
new_enough() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; }
python="${PYTHON:-python3}"
if [ -z "${PYTHON:-}" ] && new_enough /usr/bin/python3 2>/dev/null && /usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null; then
  python=/usr/bin/python3
fi
if ! new_enough "$python"; then
  echo "install: $python is $("$python" --version 2>&1); hicache-deploy needs Python 3.11 or newer" >&2
  exit 1
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv
stamp=".venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  # bench: the suite's bench tests check the chart (tests/test_bench.py, tests/fleet/test_fleet_router.py)
  .venv/bin/pip install -q --disable-pip-version-check -e '.[test,bench]'
  rm -f .venv/.installed-*
  touch "$stamp"
fi
