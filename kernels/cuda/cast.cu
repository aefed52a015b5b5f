// Casts between f32 and the 16-bit float formats, n elements, 4 per thread. bf16 and f16 travel as their
// bits (unsigned short), as the GEMMs take them. Each conversion is integer arithmetic on the bits that
// reproduces Rust's half crate (half::bf16::from_f32 and friends) bit for bit, NaN payloads included:
// CUDA's __float2bfloat16_rn would give every NaN the canonical 0x7fff instead, and the GPU forward must
// round exactly as the CPU reference.

// f32 -> bf16, round to nearest even; a NaN keeps its sign and top payload bits and is made quiet.
__device__ __forceinline__ unsigned short to_bf16(float f) {
    const unsigned int x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);
    // Round up when the dropped half is above one half, or exactly one half and the kept LSB is odd;
    // a carry out of the mantissa bumps the exponent, which makes the largest finite values infinite.
    const unsigned int round = 0x8000u;
    return (unsigned short)((x >> 16) + ((x & round) && (x & (3 * round - 1)) ? 1u : 0u));
}

// f32 -> f16, round to nearest even, with f16 subnormals; overflow gives infinity.
__device__ __forceinline__ unsigned short to_f16(float f) {
    const unsigned int x = __float_as_uint(f);
    const unsigned int sign = (x & 0x80000000u) >> 16, exp = x & 0x7f800000u, man = x & 0x007fffffu;
    if (exp == 0x7f800000u) return (unsigned short)(sign | 0x7c00u | (man ? 0x200u : 0u) | (man >> 13));
    const int half_exp = (int)(exp >> 23) - 127 + 15;
    if (half_exp >= 0x1f) return (unsigned short)(sign | 0x7c00u);
    if (half_exp <= 0) {
        // Below f16's normal range: a subnormal, or zero once even the rounding bit is shifted out.
        if (14 - half_exp > 24) return (unsigned short)sign;
        const unsigned int m = man | 0x00800000u;
        const unsigned int round = 1u << (13 - half_exp);
        const unsigned int up = (m & round) && (m & (3 * round - 1)) ? 1u : 0u;
        return (unsigned short)(sign | ((m >> (14 - half_exp)) + up));
    }
    const unsigned int round = 0x1000u;
    const unsigned int up = (man & round) && (man & (3 * round - 1)) ? 1u : 0u;
    return (unsigned short)((sign | ((unsigned int)half_exp << 10) | (man >> 13)) + up);
}

// bf16 -> f32 is exact; a NaN is made quiet, as half does.
__device__ __forceinline__ float from_bf16(unsigned short b) {
    const unsigned int x = b;
    return __uint_as_float(((x & 0x7fffu) > 0x7f80u ? x | 0x40u : x) << 16);
}

// f16 -> f32 is exact; subnormals are normalised, a NaN is made quiet.
__device__ __forceinline__ float from_f16(unsigned short h) {
    const unsigned int x = h;
    const unsigned int sign = (x & 0x8000u) << 16, exp = x & 0x7c00u, man = x & 0x03ffu;
    if ((x & 0x7fffu) == 0) return __uint_as_float(sign);
    if (exp == 0x7c00u) return __uint_as_float(sign | (man ? 0x7fc00000u | (man << 13) : 0x7f800000u));
    if (exp == 0) {
        // The leading one of a 10-bit mantissa sits e places below the implicit bit's place.
        const unsigned int e = __clz(man) - 16 - 6;
        return __uint_as_float(sign | ((127 - 15 - e) << 23) | ((man << (14 + e)) & 0x007fffffu));
    }
    return __uint_as_float(sign | (((exp >> 10) + 127 - 15) << 23) | (man << 13));
}

// Elements [i, i + 4) of a thread, when they are all in range and both buffers are aligned for one
// 16-byte (f32) and one 8-byte (16-bit) access; otherwise the thread goes element by element.
__device__ __forceinline__ bool whole_quad(unsigned long long i, unsigned int n, const void* a, const void* b) {
    return i + 4 <= n && ((reinterpret_cast<unsigned long long>(a) & 15) | (reinterpret_cast<unsigned long long>(b) & 7)) == 0;
}

__device__ __forceinline__ unsigned long long quad_start() {
    return 4ull * ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x);
}

__device__ __forceinline__ uint2 pack(unsigned short a, unsigned short b, unsigned short c, unsigned short d) {
    return make_uint2((unsigned int)a | ((unsigned int)b << 16), (unsigned int)c | ((unsigned int)d << 16));
}

extern "C" __global__ void f32_to_bf16(const float* __restrict__ x, unsigned short* __restrict__ out, unsigned int n) {
    const unsigned long long i = quad_start();
    if (whole_quad(i, n, x, out)) {
        const float4 v = reinterpret_cast<const float4*>(x)[i / 4];
        reinterpret_cast<uint2*>(out)[i / 4] = pack(to_bf16(v.x), to_bf16(v.y), to_bf16(v.z), to_bf16(v.w));
    } else {
        for (unsigned long long j = i; j < i + 4 && j < n; ++j) out[j] = to_bf16(x[j]);
    }
}

extern "C" __global__ void f32_to_f16(const float* __restrict__ x, unsigned short* __restrict__ out, unsigned int n) {
    const unsigned long long i = quad_start();
    if (whole_quad(i, n, x, out)) {
        const float4 v = reinterpret_cast<const float4*>(x)[i / 4];
        reinterpret_cast<uint2*>(out)[i / 4] = pack(to_f16(v.x), to_f16(v.y), to_f16(v.z), to_f16(v.w));
    } else {
        for (unsigned long long j = i; j < i + 4 && j < n; ++j) out[j] = to_f16(x[j]);
    }
}

extern "C" __global__ void bf16_to_f32(const unsigned short* __restrict__ x, float* __restrict__ out, unsigned int n) {
    const unsigned long long i = quad_start();
    if (whole_quad(i, n, out, x)) {
        const uint2 v = reinterpret_cast<const uint2*>(x)[i / 4];
        reinterpret_cast<float4*>(out)[i / 4] = make_float4(from_bf16(v.x & 0xffffu), from_bf16(v.x >> 16),
                                                            from_bf16(v.y & 0xffffu), from_bf16(v.y >> 16));
    } else {
        for (unsigned long long j = i; j < i + 4 && j < n; ++j) out[j] = from_bf16(x[j]);
    }
}

extern "C" __global__ void f16_to_f32(const unsigned short* __restrict__ x, float* __restrict__ out, unsigned int n) {
    const unsigned long long i = quad_start();
    if (whole_quad(i, n, out, x)) {
        const uint2 v = reinterpret_cast<const uint2*>(x)[i / 4];
        reinterpret_cast<float4*>(out)[i / 4] = make_float4(from_f16(v.x & 0xffffu), from_f16(v.x >> 16),
                                                            from_f16(v.y & 0xffffu), from_f16(v.y >> 16));
    } else {
        for (unsigned long long j = i; j < i + 4 && j < n; ++j) out[j] = from_f16(x[j]);
    }
}
