#!/bin/sh
# Rows of 2-17 and 32-row passes against one-row decodes for each file type make_more_types.py wrote (folder $1),
# flash attention off and on, for each lib folder given ("wheel": the installed bindings).
D=$1; shift
for lib in "$@"; do
  if [ "$lib" = wheel ]; then E=""; else E="LD_LIBRARY_PATH=$lib LLAMA_CPP_LIB_PATH=$lib"; fi
  for m in ${MODELS:-q10 q21 q13 q14 q3 q8 q9 q25 q23 q22 q26 q27 q19 q20 q28 q29 q24 q31}; do
    [ -f $D/$m.gguf ] || continue
    for fa in 0 1; do
      echo "$lib $m fa=$fa: $(env $E .venv/bin/python results/s47-every-file-type-rows-39i-39j/rows_model.py $D/$m.gguf 2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,32 $fa 2>&1 | tail -1)"
    done
  done
done
