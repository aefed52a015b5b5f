#!/usr/bin/env bash
# The test command: sets up what the tests need on a fresh machine, then runs them all.
# No GPU and no CUDA toolkit needed: NVRTC comes from PyPI, so every template variant and
# #[kernel] source is compiled for sm_90 and sm_120 here too. GPU-only tests are #[ignore]d
# with a reason; run them on a GPU machine with `cargo test --release -- --ignored`.
set -euo pipefail
cd "$(dirname "$0")/.."

nvrtc_dir=target/nvrtc
if [ ! -e "$nvrtc_dir/nvidia/cu13/lib/libnvrtc.so.13" ]; then
    echo "installing NVRTC from PyPI (nvidia-cuda-nvrtc) into $nvrtc_dir" >&2
    python3 -m pip install --quiet --disable-pip-version-check --target "$nvrtc_dir" 'nvidia-cuda-nvrtc>=13,<14'
fi

cargo test --workspace --all-targets "$@"
cargo test --workspace --doc
