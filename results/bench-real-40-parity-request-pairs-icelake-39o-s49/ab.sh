#!/bin/sh
# static llama-bench (llama-server's build) vs llama-bench on the wheel's shared libraries, A B B A
M=$1; shift
for i in 1 2; do
 for which in static wheel wheel static; do
  if [ $which = static ]; then /root/.cache/gguf-exact/llama.cpp/0c1e57098+41patches.3fa204+rpc-cpu-avx.avx2.avx512.avx512_vbmi.avx512_vnni.bmi2.f16c.fma.sse42/bin/llama-bench -m $M "$@" -o csv 2>/dev/null | tail -n +2 | sed "s/^/static,/";
  else LD_LIBRARY_PATH=/work/main/.venv/lib/python3.11/site-packages/llama_cpp/lib /tmp/build-shared/bin/llama-bench -m $M "$@" -o csv 2>/dev/null | tail -n +2 | sed "s/^/wheel,/"; fi
 done
done
