#!/usr/bin/env bash
# Build llama-server, llama-bench, llama-perplexity and llama-quantize from the
# llama-cpp-python sdist pinned in checksums/ (same llama.cpp commit as the bindings).
#   scripts/build-llama-cpp.sh              # CPU
#   scripts/build-llama-cpp.sh --cuda 86    # RTX 3050 (75: GTX 1650 Ti); needs nvcc, cuBLAS from a wheel if missing
#   scripts/build-llama-cpp.sh --vulkan     # Vulkan (libvulkan-dev, glslc, spirv-headers)
# Cached in ~/.cache/gguf-exact/llama.cpp/<commit>-<backend>/bin (printed on stdout);
# a second run returns at once. A thin wrapper over gguf_exact.builds.llama_build.build_llama_cpp.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
exec "$PY" -m gguf_exact.builds.llama_build "$@"
