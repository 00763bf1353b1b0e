#!/usr/bin/env bash
# Set-up and the default test suite in one command: a virtual environment in .venv (made if missing),
# specrt installed into it with the exporter and the test tools (a CPU build of torch first, so the [export]
# extra's torch range is already met), then pytest. Arguments go on to pytest:
#   bash scripts/test.sh                      # the default suite
#   bash scripts/test.sh -x -k batch          # a part of it
#   bash scripts/test.sh -m real              # the real-weight checks (after scripts/demo.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

[ -x .venv/bin/python ] || python3 -m venv .venv
here=$(pwd -P)
if ! .venv/bin/python - "$here" 2>/dev/null <<'PY'; then
import sys, specrt, specrt.export, torch, pytest, hypothesis, openai, starlette, ruff, ray.serve  # noqa
assert specrt.__file__.startswith(sys.argv[1]), specrt.__file__  # installed from this checkout
PY
    echo "== installing specrt with the exporter and the test tools into .venv" >&2
    .venv/bin/pip install --quiet torch==2.13.0
    .venv/bin/pip install --quiet -e ".[export,dev]"
fi
exec .venv/bin/python -m pytest "$@"
