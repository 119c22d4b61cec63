#!/usr/bin/env bash
# The device check lives in benchmarks/gpu_check.py (see its docstring); this runs it with the
# lab's virtual environment when there is one:   bash benchmarks/gpu_check.sh [--dry-run] [...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
exec "$PY" benchmarks/gpu_check.py "$@"
