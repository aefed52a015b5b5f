#!/usr/bin/env bash
# Runs on a GPU machine from a bundle made by scripts/gpu-bundle.sh (no Rust toolchain needed):
#   1. every GPU-gated test of every crate (`--ignored`; the kernel benchmarks skipped), a log per crate;
#   2. with --bench: a 4-layer Kimi K2-shaped model (a dense layer, 3 MoE layers of 16 INT4
#      experts), `kdtree-engine bench` at 64 and 32768 tokens of context (T = 1..8, copy
#      bandwidth measured in the same run), and, where Nsight Compute is installed, one T = 1
#      forward kernel by kernel (scripts/ncu-forward.py).
# Results go to RESULTS_DIR; the last line reads 'N passed, N failed'.
#
#   gpu-check.sh RESULTS_DIR [--bench] [--timeout SECONDS] [TEST_FILTER...]
#
# NVRTC: KDTREE_NVRTC_DIR if set, else the first CUDA toolkit's under /usr/local.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 1 ] || usage
out=$1; shift
bench=0 timeout=300 filters=()
while [ $# -gt 0 ]; do
    case $1 in
        --bench) bench=1 ;;
        --timeout) timeout=${2:?--timeout takes seconds}; shift ;;
        -h|--help) usage ;;
        *) filters+=("$1") ;;
    esac
    shift
done
mkdir -p "$out"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu-check: no GPU here (nvidia-smi finds none): the GPU-gated tests need one" >&2
    exit 1
fi
if [ -z "${KDTREE_NVRTC_DIR:-}" ]; then
    KDTREE_NVRTC_DIR=$(dirname "$(ls /usr/local/cuda*/targets/x86_64-linux/lib/libnvrtc.so.1[0-9]* 2>/dev/null | head -1)")
    export KDTREE_NVRTC_DIR
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
echo "binaries of $(cat "$here/COMMIT" 2>/dev/null || echo '?'), NVRTC from $KDTREE_NVRTC_DIR" | tee -a "$out/gpu.txt"

passed=0 failed=0
for t in "$here"/bin/*-tests; do
    crate=$(basename "$t" -tests)
    log="$out/tests-$crate.txt"
    echo "== $crate: GPU tests (log $log)"
    timeout "$timeout" "$t" --ignored --test-threads 2 --skip gpu_mla::bench_ --skip report::kernels_at_kimi_k2_sizes "${filters[@]}" > "$log" 2>&1
    rc=$?
    count() { grep '^test result' "$log" | grep -Eo "[0-9]+ $1" | awk '{s += $1} END {print s + 0}'; }
    p=$(count passed) f=$(count failed)
    # A binary that died or timed out without its summary counts as one failure.
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "   exit $rc with no failure counted (timeout or crash)"; fi
    grep -E '^test .* FAILED$' "$log" | sed 's/^/   /'
    passed=$((passed + p)) failed=$((failed + f))
done

if [ "$bench" -eq 1 ]; then
    model=$(mktemp -d)/k4
    echo "== bench: 4-layer K2 shape in $model"
    engine=$here/bin/kdtree-engine
    "$engine" make-model --out "$model" --layers 4 --experts 16 --max-position 65536 > "$out/make-model.txt" 2>&1
    "$engine" bench --model "$model" --backend cuda --tune-budget 0 --tuning-db "$out/bench-db.json" \
        --context 64,32768 --max-t 8 --reps 10 --generate 32 > "$out/bench.txt" 2>&1 || echo "   bench failed: $out/bench.txt"
    if command -v ncu >/dev/null; then
        ncu --metrics gpu__time_duration.sum --graph-profiling node --csv "$engine" bench --model "$model" \
            --backend cuda --tune-budget 0 --tuning-db "$out/bench-db.json" --context 64 --max-t 1 --reps 1 \
            --generate 2 > "$out/ncu.csv" 2> "$out/ncu.err"
        python3 "$here/ncu-forward.py" "$out/ncu.csv" > "$out/ncu-forward.txt" && head -30 "$out/ncu-forward.txt"
    fi
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
