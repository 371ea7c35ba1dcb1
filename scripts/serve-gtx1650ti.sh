#!/usr/bin/env bash
# Serve a Gemma 4 E2B target with its MTP drafter on a GTX 1650 Ti (4 GB):
#   scripts/serve-gtx1650ti.sh --model gemma-4-E2B_q4_0-it.gguf \
#       --draft gemma-4-E2B-it-qat-assistant-q4_0-exact.gguf [--port 8080] [--detach] [--set KEY=VALUE]
# Builds the CUDA sm_75 llama-server once (cached), then runs `gguf-exact serve --profile gtx1650ti`.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"   # model paths stay relative to where you are
GE="${GGUF_EXACT:-$here/.venv/bin/gguf-exact}"
[ -x "$GE" ] || GE=gguf-exact
"$GE" build-llama --cuda 75 >/dev/null
exec "$GE" serve --profile gtx1650ti "$@"
