#!/bin/sh
# Rows of n-row passes against one-row decodes on the tiny Gemma 4 (rows_probe.py: as built, and
# requantized by the bindings' llama_model_quantize to Q4_K_M 15, Q5_K_S 16, Q5_K_M 17, Q6_K 18;
# long_probe.py: after 600 tokens, flash attention on), for each lib folder given
# (LLAMA_CPP_LIB_PATH; "wheel" = the installed bindings). "=": byte for byte; else the largest |diff|.
for lib in "$@"; do
  if [ "$lib" = wheel ]; then E=""; else E="LD_LIBRARY_PATH=$lib LLAMA_CPP_LIB_PATH=$lib"; fi
  for ft in -1 15 16 17 18; do
    echo "$lib ftype $ft: $(env $E .venv/bin/python results/s46-k-quant-rows-39h/rows_probe.py $ft 2>&1 | tail -1)"
  done
  echo "$lib long context: $(env $E .venv/bin/python results/s46-k-quant-rows-39h/long_probe.py 2>&1 | tail -1)"
done
