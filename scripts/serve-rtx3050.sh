#!/usr/bin/env bash
# Serve a Gemma 4 target with its MTP drafter on an RTX 3050 (8 GB):
#   scripts/serve-rtx3050.sh --model gemma-4-E2B_q4_0-it.gguf \
#       --draft gemma-4-E2B-it-qat-assistant-q4_0-exact.gguf [--port 8080] [--detach] [--set KEY=VALUE]
# Builds the CUDA sm_86 llama-server once (cached), then runs `gguf-exact serve --profile rtx3050`.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"   # model paths stay relative to where you are
GE="${GGUF_EXACT:-$here/.venv/bin/gguf-exact}"
[ -x "$GE" ] || GE=gguf-exact
"$GE" build-llama --cuda 86 >/dev/null
exec "$GE" serve --profile rtx3050 "$@"
