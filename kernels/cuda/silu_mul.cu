// SwiGLU's gate: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)); one thread per element.
extern "C" __global__ void silu_mul(const float* __restrict__ gate, const float* __restrict__ up,
                                    float* __restrict__ out, unsigned int n) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = gate[i];
    // expf, not __expf: the CPU reference uses the accurate exponential.
    out[i] = g / (1.0f + expf(-g)) * up[i];
}

// The same gate on the fused gate_up GEMM's output: row r of x ([rows, 2 * inter]) holds the gate
// projection in its first inter columns and the up projection in the rest; out ([rows, inter]) is bf16
// bits, ready for the down GEMM. Grid (rows, column quads / 256), 4 columns per thread.

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

// The three functions above are also kdtree-jit's templates/w4a16/silu.cuh, the grouped gate-up
// kernel's fused epilogue (tests/compile.rs checks the copies agree).
__device__ __forceinline__ unsigned short gated(float g, float u) { return to_bf16(silu_times(g, u)); }

extern "C" __global__ void silu_mul_halves_f32(const float* __restrict__ x, unsigned short* __restrict__ out,
                                               unsigned int rows, unsigned int inter) {
    const unsigned int r = blockIdx.x, c = 4 * (blockIdx.y * blockDim.x + threadIdx.x);
    if (r >= rows || c >= inter) return;
    const float* gate = x + (size_t)r * 2 * inter;
    const float* up = gate + inter;
    unsigned short* o = out + (size_t)r * inter;
    // Quads stay 16-byte (in) and 8-byte (out) aligned when inter is a multiple of 4.
    const bool aligned = inter % 4 == 0 && ((reinterpret_cast<unsigned long long>(x) & 15) |
                                            (reinterpret_cast<unsigned long long>(out) & 7)) == 0;
    if (aligned) {
        const float4 g = *reinterpret_cast<const float4*>(gate + c), u = *reinterpret_cast<const float4*>(up + c);
        *reinterpret_cast<uint2*>(o + c) = make_uint2((unsigned int)gated(g.x, u.x) | ((unsigned int)gated(g.y, u.y) << 16),
                                                      (unsigned int)gated(g.z, u.z) | ((unsigned int)gated(g.w, u.w) << 16));
    } else {
        for (unsigned int j = c; j < c + 4 && j < inter; ++j) o[j] = gated(gate[j], up[j]);
    }
}

extern "C" __global__ void silu_mul_halves_bf16(const unsigned short* __restrict__ x, unsigned short* __restrict__ out,
                                                unsigned int rows, unsigned int inter) {
    const unsigned int r = blockIdx.x, c = 4 * (blockIdx.y * blockDim.x + threadIdx.x);
    if (r >= rows || c >= inter) return;
    const unsigned short* gate = x + (size_t)r * 2 * inter;
    const unsigned short* up = gate + inter;
    unsigned short* o = out + (size_t)r * inter;
    const bool aligned = inter % 4 == 0 && ((reinterpret_cast<unsigned long long>(x) |
                                             reinterpret_cast<unsigned long long>(out)) & 7) == 0;
    if (aligned) {
        const uint2 g = *reinterpret_cast<const uint2*>(gate + c), u = *reinterpret_cast<const uint2*>(up + c);
        const unsigned short a = gated(from_bf16(g.x & 0xffffu), from_bf16(u.x & 0xffffu));
        const unsigned short b = gated(from_bf16(g.x >> 16), from_bf16(u.x >> 16));
        const unsigned short d = gated(from_bf16(g.y & 0xffffu), from_bf16(u.y & 0xffffu));
        const unsigned short e = gated(from_bf16(g.y >> 16), from_bf16(u.y >> 16));
        *reinterpret_cast<uint2*>(o + c) = make_uint2((unsigned int)a | ((unsigned int)b << 16), (unsigned int)d | ((unsigned int)e << 16));
    } else {
        for (unsigned int j = c; j < c + 4 && j < inter; ++j) o[j] = gated(from_bf16(gate[j]), from_bf16(up[j]));
    }
}
