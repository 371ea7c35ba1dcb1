#!/bin/sh
# A B B A llama-bench of two static binaries on one model: $1 old, $2 new, $3 model, rest: llama-bench args
OLD=$1; NEW=$2; M=$3; shift 3
for b in $OLD $NEW $NEW $OLD; do
  echo "== $(basename $b) $(date +%T)"
  $b -m $M -t 2 -o csv "$@" 2>/dev/null | awk -F, 'NR>1 {print $(NF-7), $(NF-6), $(NF-5), $(NF-4), $(NF-3), $(NF-2), $(NF-1), $NF}' | tr -d '"'
done
