# Sourced by scripts/run.sh and scripts/test.sh: NVRTC from PyPI into target/nvrtc, where
# kdtree-jit's probe looks for it, so nothing needs a CUDA toolkit or a library path.
nvrtc_dir=target/nvrtc
if [ ! -e "$nvrtc_dir/nvidia/cu13/lib/libnvrtc.so.13" ]; then
    echo "installing NVRTC from PyPI (nvidia-cuda-nvrtc) into $nvrtc_dir" >&2
    python3 -m pip install --quiet --disable-pip-version-check --target "$nvrtc_dir" 'nvidia-cuda-nvrtc>=13,<14'
fi
