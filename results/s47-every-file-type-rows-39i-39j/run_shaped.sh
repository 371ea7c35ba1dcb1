#!/bin/sh
# Rows of 2-17 and 32-row passes against one-row decodes on the E2B-shaped model (folder $1, made by
# make_e2b_shaped.py), flash attention off and on, for each lib folder given ("wheel": the installed bindings).
D=$1; shift
for lib in "$@"; do
  if [ "$lib" = wheel ]; then E=""; else E="LD_LIBRARY_PATH=$lib LLAMA_CPP_LIB_PATH=$lib"; fi
  for m in donor q15 q16 q17 q18 q7 q1 q32 q0; do
    for fa in 0 1; do
      echo "$lib $m fa=$fa: $(env $E .venv/bin/python results/s47-every-file-type-rows-39i-39j/rows_model.py $D/$m.gguf 2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,32 $fa 2>&1 | tail -1)"
    done
  done
done
