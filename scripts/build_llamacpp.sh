#!/usr/bin/env bash
# Build llama.cpp (the benchmark peer) once, from the copy vendored in the llama-cpp-python source
# distribution on PyPI, into a cache folder outside the repository. Skipped when already built.
#
#   bash scripts/build_llamacpp.sh            # prints the folder holding llama-bench, llama-server, ...
#   LLAMACPP_DIR=/some/where bash scripts/build_llamacpp.sh
#
# About 40 minutes on 2 cores (only the four tools the benchmarks run are built). Never run in CI.
set -euo pipefail

VERSION=${LLAMACPP_PY_VERSION:-0.3.36}
ROOT=${LLAMACPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/specrt/llama.cpp-$VERSION}
BIN=$ROOT/build/bin
TOOLS=(llama-bench llama-cli llama-speculative-simple llama-server)
PIP=${PIP:-$(dirname "$0")/../.venv/bin/pip}
[ -x "$PIP" ] || PIP=pip

built() { for t in "${TOOLS[@]}"; do [ -x "$BIN/$t" ] || return 1; done; }

if built; then
    echo "$BIN"
    exit 0
fi
command -v cmake >/dev/null || { echo "error: cmake is not installed (apt install cmake)" >&2; exit 2; }
command -v g++ >/dev/null || { echo "error: g++ is not installed (apt install g++)" >&2; exit 2; }

mkdir -p "$ROOT"
if [ ! -f "$ROOT/src/CMakeLists.txt" ]; then
    echo "fetching llama-cpp-python==$VERSION (source distribution) ..." >&2
    tmp=$(mktemp -d)
    "$PIP" download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$tmp" >&2
    tar -xzf "$tmp"/llama_cpp_python-"$VERSION".tar.gz -C "$tmp"
    rm -rf "$ROOT/src"
    mv "$tmp/llama_cpp_python-$VERSION/vendor/llama.cpp" "$ROOT/src"
    rm -rf "$tmp"
fi

echo "building ${TOOLS[*]} in $ROOT/build (about 40 minutes on 2 cores) ..." >&2
cmake -S "$ROOT/src" -B "$ROOT/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF >&2
cmake --build "$ROOT/build" --config Release -j "$(nproc)" --target "${TOOLS[@]}" >&2
built || { echo "error: build finished but tools are missing from $BIN" >&2; exit 1; }
echo "$BIN"
