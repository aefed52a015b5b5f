# Sourced by scripts/run.sh and scripts/test.sh: NVRTC from PyPI into target/nvrtc, where
# kdtree-jit's probe looks for it, so nothing needs a CUDA toolkit or a library path.
# Pinned to CUDA 13.0's NVRTC, the oldest that kdtree supports and the one the GPU machines' toolkit
# has: later ones accept source that 13.0 refuses (an unannotated lambda in a kernel compiled with
# 13.5 here and failed there), so the compile tests check what the oldest compiler takes.
nvrtc_dir=target/nvrtc
nvrtc_version=13.0.88
if [ "$(cat "$nvrtc_dir/VERSION" 2>/dev/null)" != "$nvrtc_version" ]; then
    echo "installing NVRTC $nvrtc_version from PyPI (nvidia-cuda-nvrtc) into $nvrtc_dir" >&2
    rm -rf "$nvrtc_dir"
    python3 -m pip install --quiet --disable-pip-version-check --target "$nvrtc_dir" "nvidia-cuda-nvrtc==$nvrtc_version"
    echo "$nvrtc_version" > "$nvrtc_dir/VERSION"
fi
