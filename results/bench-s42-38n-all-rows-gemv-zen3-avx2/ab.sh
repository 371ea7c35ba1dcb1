# The A/B of llama-bench-e2b-e4b-same-binary-38m-38n.txt: one prototype build of the pinned checkout with
# prototype-switch.diff applied (PROTO_ROWS_MAX=4: patch 38m as committed, the GEMM for 4 rows and more;
# PROTO_ROWS_MAX=100000 PROTO_GROUP=16: every row through the GEMV over rows in groups of at most 16, 38n),
# alternated, each call llama-bench -t 2 -r 2 -n 0 over the row counts.
#   bash ab.sh /work/bench/real26/e2b/target.gguf 1,2,3,4,5,6,8,12,16,64,512 3
#   bash ab.sh /work/bench/real26/e4b/target.gguf 1,3,4,5,8,16 2
M=$1; P=$2; N=$3
for i in $(seq $N); do for MX in 4 100000; do
PROTO_GROUP=16 PROTO_ROWS_MAX=$MX /tmp/build-rows/bin/llama-bench -m $M -p $P -n 0 -t 2 -r 2 -o csv 2>/dev/null | python3 -c "
import csv,sys
r=list(csv.DictReader(sys.stdin)); print('$i', '38m' if '$MX'=='4' else 'new', ' '.join(f\"{x['n_prompt']}:{int(x['avg_ns'])/1e6:.1f}\" for x in r), flush=True)"
done; done
