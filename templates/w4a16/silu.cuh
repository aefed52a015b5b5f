// SwiGLU's gate on the grouped gate-up kernel's sums: kdtree-kernels' silu_mul_halves_bf16
// (kernels/cuda/silu_mul.cu), so that the fused kernel gives its bits. Neither source can include the
// other (NVRTC has no include path; the two crates embed their own directories), so these three
// functions are that file's, verbatim, and kdtree-kernels' compile test fails when the texts differ.
// Every dtype's module includes them; f16's gate uses only silu_times.

// f32 -> bf16 bits, round to nearest even, NaN kept and made quiet: cast.cu's to_bf16 (NVRTC has no
// include path), so that this matches half::bf16::from_f32 as the cast does.
__device__ __forceinline__ unsigned short to_bf16(float f) {
    const unsigned int x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);
    const unsigned int round = 0x8000u;
    return (unsigned short)((x >> 16) + ((x & round) && (x & (3 * round - 1)) ? 1u : 0u));
}

// bf16 bits -> f32, exact; cast.cu's from_bf16.
__device__ __forceinline__ float from_bf16(unsigned short b) {
    const unsigned int x = b;
    return __uint_as_float(((x & 0x7fffu) > 0x7f80u ? x | 0x40u : x) << 16);
}

// The CPU op's expression and order: silu first, then the product with up.
__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.0f + expf(-g)) * u; }
