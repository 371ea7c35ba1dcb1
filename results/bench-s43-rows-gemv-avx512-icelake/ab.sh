# A/B on AVX-512: PROTO_ROWS_MAX=000000 (38n as committed: the GEMM takes rows 4 at a time, 2-3 left over through
# the GEMV over rows) against PROTO_ROWS_MAX=100000 (every row through the GEMV over rows in groups of at most 16);
# both values 6 characters, so the environment (and the stack it shifts) is the same size in both arms.
M=$1; P=$2; N=$3
for i in $(seq $N); do ORDER="000000 100000"; [ $((i % 2)) = 0 ] && ORDER="100000 000000"; for MX in $ORDER; do
PROTO_ROWS_MAX=$MX /tmp/build-rows/bin/llama-bench -m $M -p $P -n 0 -t 2 -r ${R:-2} -o csv 2>/dev/null | python3 -c "
import csv,sys
r=list(csv.DictReader(sys.stdin)); print('$i', 'gemm' if '$MX'=='000000' else 'rows', ' '.join(f\"{x['n_prompt']}:{int(x['avg_ns'])/1e6:.1f}\" for x in r), flush=True)"
done; done
