#!/usr/bin/env bash
# The test command: sets up what the tests need on a fresh machine, then runs them all.
# No GPU and no CUDA toolkit needed: NVRTC comes from PyPI, so every template variant and
# #[kernel] source is compiled for sm_90 and sm_120 here too. GPU-only tests are #[ignore]d
# with a reason; run them on a GPU machine with `cargo test --release -- --ignored`.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/nvrtc.sh
# A clean build gains nothing from incremental state, and it costs disk that CI may not have.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

# The lint gate: formatting, clippy over every target and rustdoc, warnings as errors.
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
# Docs whose links all resolve: a renamed item breaks the build, not a reader's click.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
cargo test --workspace --lib --bins --tests --examples "$@"
cargo test --workspace --doc
