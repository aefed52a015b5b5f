#!/usr/bin/env bash
# Builds what a GPU machine without a Rust toolchain needs to run kdtree's GPU-gated tests and
# benchmarks: every crate's integration-test binary and the two CLIs, in release, debug info
# stripped, beside scripts/gpu-check.sh, packed into one archive (a few tens of MB).
#
#   ./scripts/gpu-bundle.sh [ARCHIVE]        # default target/gpu-bundle.tar.xz
#   (on the GPU machine) tar -xJf gpu-bundle.tar.xz && gpu-bundle/gpu-check.sh RESULTS_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
archive=${1:-target/gpu-bundle.tar.xz}
stage=target/gpu-bundle
rm -rf "$stage"
mkdir -p "$stage/bin"

# The test binaries' paths come from cargo's own report (stdout; its progress and errors stay on
# stderr), named <crate>-tests on the GPU machine.
cargo build --release --bins
cargo test --release --workspace --no-run --message-format=json |
    python3 -c '
import json, sys
for line in sys.stdin:
    try:
        j = json.loads(line)
    except ValueError:
        continue
    if j.get("reason") == "compiler-artifact" and j.get("executable") and j["target"]["kind"] == ["test"] \
            and j["target"]["name"] == "all":
        print(j["executable"], j["package_id"].split("#")[0].rstrip("/").split("/")[-1])
' | while read -r exe crate; do
    objcopy --strip-debug "$exe" "$stage/bin/$crate-tests"
done
for b in kdtree-engine kdtree-jit; do objcopy --strip-debug "target/release/$b" "$stage/bin/$b"; done
cp scripts/gpu-check.sh scripts/ncu-forward.py "$stage/"
git rev-parse --short HEAD > "$stage/COMMIT"
tar -C target -cf - gpu-bundle | xz -T0 -6 > "$archive"
echo "$archive: $(du -h "$archive" | cut -f1), binaries of $(cat "$stage/COMMIT"): $(ls "$stage/bin" | tr '\n' ' ')"
