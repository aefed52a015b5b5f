#!/usr/bin/env bash
# The main job. Builds kdtree, then:
#   with a GPU:    tunes Kimi K2's decode GEMMs (every W4A16 variant JIT-compiled for the device,
#                  checked against the CPU reference, timed against cuBLAS) into the tuning DB,
#                  and draws the result into target/kdtree-run/kimi-k2.svg;
#   without one:   compiles every W4A16 variant offline for sm_90 and sm_120 instead;
# and in both cases decodes with DDTree speculative decoding on a tiny INT4 model of the Kimi K2
# architecture, next to plain greedy decoding: the tokens are identical, the target forwards fewer.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/nvrtc.sh

cargo build --release -p kdtree-jit -p kdtree-engine
jit=target/release/kdtree-jit
engine=target/release/kdtree-engine
out=target/kdtree-run
mkdir -p "$out"

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    "$jit" tune --preset kimi-k2 --plot "$out/kimi-k2.svg"
else
    echo "no GPU here: compiling the variant space offline (tuning needs a GPU)"
    "$jit" compile --arch sm_90
    "$jit" compile --arch sm_120
fi

"$engine" make-tiny --out "$out/tiny-int4" --int4 --seed 1
"$engine" generate --model "$out/tiny-int4" --prompt-ids 5,6,7,8,9,5,6,7,8,9,5,6,7,8,9,5,6,7 --max-new 64 \
    --spec ddtree --budget 32 --draft-len 8 --drafter lookup
