#!/usr/bin/env bash
# The GPU path on this machine's card, in one go, through CUDA (an NVIDIA card) or Vulkan (any card,
# or Mesa's lavapipe where there is none):
#   1. finds the card (CUDA: nvidia-smi's name, compute capability, memory; Vulkan: vulkaninfo's
#      first device that is not CPU-type, else lavapipe, and llama-server's own report of it),
#   2. builds the bindings and llama-server for it (cached under ~/.cache/gguf-exact/, keyed by
#      commit, backend and CPU features; make setup / make llama-server [CUDA=NN|VULKAN=1]),
#   3. Vulkan: runs the tests on the device (make test-vulkan: target and drafter on it, the
#      target alone's text, acceptance against the CPU build's, --parallel 2 and 4, the memory plan
#      against what the device allocates), into $OUT/test-vulkan.txt,
#   4. writes a serving profile for the card (every layer on the GPU, flash attention on/auto),
#   5. runs scripts/bench_real.py with it: full-size E2B and E4B pairs (make-pair), target alone
#      and n-max 1..4 in llama-server and the Python engine, --parallel 2 and 4 (not on lavapipe:
#      a software device is no card to measure, and the full-size pairs exceed its 2048 MiB),
#   6. writes one JSON: $OUT/gpu-check.json (the card, the commands, every figure) and
#      $OUT/bench-real.md (the README's table).
#   7. with RPC_WORKER=HOST:PORT, two machines (docs/serving.md, "Across two machines"): the other
#      machine runs `gguf-exact rpc-server --profile gtx1650ti --host ITS_ADDRESS --allow-network`
#      (a private link only; the protocol has no authentication); this one asks it what it
#      holds (doctor --rpc), prints the 31B pair's plan over both cards (scripts/rpc_plan.py,
#      RPC_WORKER_MIB: the worker card's MiB, default 4096) and measures E2B over the worker's
#      card and this one's (scripts/bench_rpc.py --workers): $OUT/rpc-*.txt, $OUT/bench-rpc.json.
#
#   scripts/gpu-check.sh                      # CUDA where nvidia-smi is, else Vulkan (about 30-40 min with the builds)
#   BACKEND=vulkan scripts/gpu-check.sh       # Vulkan on an NVIDIA card too (the gtx1650ti-vulkan path)
#   QUICK=1 scripts/gpu-check.sh              # E2B only, n-max 1,2, 32 tokens (about 10 min after the builds)
#   OUT=build/gpu-check WORK=/tmp/gpu-pairs scripts/gpu-check.sh
#   RPC_WORKER=192.168.1.20:50052 QUICK=1 scripts/gpu-check.sh   # and the two-machine recipe
#
# Bad environment: one `error:` line, exit 1. Nothing here needs the network once the
# sdist is cached (make setup fetches it through pip otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "error: $*" >&2; exit 1; }

OUT=${OUT:-build/gpu-check}
WORK=${WORK:-build/gpu-pairs}
THREADS=${THREADS:-$(nproc)}
mkdir -p "$OUT"
BACKEND=${BACKEND:-$(command -v nvidia-smi >/dev/null 2>&1 && echo cuda || echo vulkan)}
BENCH=1

if [[ "$BACKEND" == cuda ]]; then
    command -v nvidia-smi >/dev/null 2>&1 || die "nvidia-smi not found: CUDA needs an NVIDIA GPU and its driver (BACKEND=vulkan for any other card)"
    CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1)
    CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n1 | tr -d ' .')
    MEM_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n1 | tr -d ' ')
    DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n1)
    [[ "$CAP" =~ ^[0-9]{2,3}$ ]] || die "could not read the card's compute capability (got '$CAP')"
    BUILD="cuda$CAP"; FLASH=on
    echo "card: $CARD (sm_$CAP, $MEM_MIB MiB, driver $DRIVER); out: $OUT"
    # 2. builds (cached: instant the second time)
    make setup CUDA="$CAP"
    make llama-server CUDA="$CAP"
elif [[ "$BACKEND" == vulkan ]]; then
    scripts/install-vulkan-deps.sh
    SUMMARY=$(vulkaninfo --summary 2>/dev/null) || die "vulkaninfo --summary failed: no Vulkan loader or driver"
    # GPU<n> blocks in the loader's order: the first that is not CPU-type, else the first (lavapipe)
    read -r VK_INDEX VK_TYPE < <(awk '/^GPU[0-9]+:/{i=substr($1,4)+0} /deviceType/{print i, $3}' <<<"$SUMMARY" \
        | awk '$2 != "PHYSICAL_DEVICE_TYPE_CPU"{print; found=1; exit} NR==1{first=$0} END{if (!found && first) print first}') || true
    [[ -n "${VK_INDEX:-}" ]] || die "vulkaninfo lists no Vulkan device; install the GPU's Vulkan driver (or mesa-vulkan-drivers for lavapipe)"
    export GGML_VK_VISIBLE_DEVICES=$VK_INDEX   # as serve --vulkan-devices: llama.cpp hides lavapipe otherwise
    BUILD=vulkan; FLASH=auto; CAP=""; DRIVER="$VK_TYPE"
    make setup          # CPU bindings (make test-vulkan builds the Vulkan wheel for its tests; make setup VULKAN=1 installs it where the benchmark runs)
    make llama-server   # the CPU build: the tests' reference
    make llama-server VULKAN=1
    SERVER=$(.venv/bin/python -c "from gguf_exact.builds.llama_build import find_build; print(find_build('vulkan').binary())")
    DEVICE=$("$SERVER" --list-devices 2>/dev/null | grep -m1 'Vulkan' || true)
    [[ -n "$DEVICE" ]] || die "llama-server (vulkan) sees no device with GGML_VK_VISIBLE_DEVICES=$VK_INDEX"
    CARD=$(sed -E 's/^ *Vulkan[0-9]+: (.*) \([0-9]+ MiB, [0-9]+ MiB free\)$/\1/' <<<"$DEVICE")
    MEM_MIB=$(sed -E 's/.*\(([0-9]+) MiB, [0-9]+ MiB free\).*/\1/' <<<"$DEVICE")
    echo "card: $CARD (Vulkan device $VK_INDEX, $VK_TYPE, $MEM_MIB MiB); out: $OUT"
    # 3. the tests on the device
    make test-vulkan 2>&1 | tee "$OUT/test-vulkan.txt"
    if [[ "$VK_TYPE" == PHYSICAL_DEVICE_TYPE_CPU ]]; then
        BENCH=""
    else
        make setup VULKAN=1
    fi
else
    die "BACKEND=$BACKEND: expected cuda or vulkan"
fi

# 4. a profile for this card: the rtx3050 profile's choices, with this card's build and memory
PROFILE="$OUT/gpu.toml"
cat > "$PROFILE" <<EOF
description = "$CARD ($BUILD), written by scripts/gpu-check.sh"
build = "$BUILD"
cards = ["$CARD"]
memory_mib = $MEM_MIB
[server]
n-gpu-layers = 99
flash-attn = "$FLASH"
ctx-size = 8192
parallel = 1
[draft]
spec-type = "draft-mtp"
spec-draft-n-max = 2
n-gpu-layers-draft = "all"
EOF
if [[ -z "$BENCH" ]]; then
    echo "a software device ($CARD): the tests only ($OUT/test-vulkan.txt), no benchmark: its figures are not a card's"
    exit 0
fi

# 5. the benchmark
ARGS=(--profile "$PROFILE" --gpu-layers 99 --threads "$THREADS" --ctx 8192 --work "$WORK" --out "$OUT")
if [[ -n "${QUICK:-}" ]]; then
    ARGS+=(--shapes e2b --n-max 1,2 --n-predict 32 --prompts 2 --parallel 2)
else
    ARGS+=(--shapes e2b,e4b --n-max 1,2,3,4 --n-predict 64 --prompts 4 --parallel 2,4)
fi
START=$(date -u +%Y-%m-%dT%H:%M:%SZ)
.venv/bin/python scripts/bench_real.py "${ARGS[@]}" | tee "$OUT/bench-real.txt"

# 6. one JSON: the card and the run around bench_real's own
.venv/bin/python - "$OUT" "$CARD" "$CAP" "$MEM_MIB" "$DRIVER" "$START" "${ARGS[*]}" <<'EOF'
import json, sys
from pathlib import Path
out, card, cap, mem, driver, start, args = sys.argv[1:]
bench = json.loads((Path(out) / "bench-real.json").read_text())
result = {"card": card, "compute_capability": cap, "memory_mib": int(mem), "driver": driver,
          "started": start, "command": f"scripts/bench_real.py {args}", "bench": bench}
(Path(out) / "gpu-check.json").write_text(json.dumps(result, indent=1) + "\n")
print(f"wrote {out}/gpu-check.json and {out}/bench-real.md ({card})")
EOF

# 6. two machines: the worker's card and this one's
if [[ -n "${RPC_WORKER:-}" ]]; then
    .venv/bin/gguf-exact doctor --rpc "$RPC_WORKER" | tee "$OUT/rpc-doctor.txt"
    .venv/bin/python scripts/rpc_plan.py --size 31B --profile "$PROFILE" --device "RPC0=${RPC_WORKER_MIB:-4096}" \
        --device "CUDA0=$MEM_MIB" --set n-gpu-layers=27 --set tensor-split=2,5 --set ctx-size=4096 | tee "$OUT/rpc-plan-31b.txt"
    .venv/bin/python scripts/bench_rpc.py --work "$WORK" --shape e2b --profile "$PROFILE" --workers "$RPC_WORKER" \
        --split 1,2 --threads "$THREADS" --ctx 4096 --out "$OUT/bench-rpc.json" | tee "$OUT/rpc-bench.txt"
fi
