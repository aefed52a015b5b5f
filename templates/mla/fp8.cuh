// FP8 cache entries (kdtree-jit's mla::fp8): the latent in e4m3 with a scale byte b per 32 values
// standing for 2^(b - 127), padded to 16 bytes, then the rope key in bf16. The conversions are
// sm_89's; each rounds as the CPU reference does, so the bytes and values match it exactly.

// Two f32 -> two e4m3 codes (lo in the low byte): nearest even, finite values saturated to ±448.
__device__ __forceinline__ u16 f32x2_e4m3(float lo, float hi) {
    u16 r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}

// Two e4m3 codes (lo in the low byte) -> two f32, exact (through f16, which holds every code).
__device__ __forceinline__ float2 e4m3x2_f32(u16 codes) {
    u32 h2;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(codes));
    float lo, hi;
    asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"((u16)(h2 & 0xffff)));
    asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"((u16)(h2 >> 16)));
    return make_float2(lo, hi);
}

// The scale byte of a group whose largest magnitude is amax: the least b in 1..254 with amax <= 448 x
// 2^(b - 127) (448 = 1.75 x 2^8).
__device__ __forceinline__ int fp8_scale_byte(float amax) {
    const u32 bits = __float_as_uint(amax) & 0x7fffffffu;
    const int over = (bits & 0x7fffffu) > 0x600000u ? 1 : 0;
    return min(max((int)(bits >> 23) - 8 + over, 1), 254);
}

__device__ __forceinline__ float fp8_scale(unsigned char byte) { return __uint_as_float((u32)byte << 23); }

// 16 codes (little-endian in c) of one scale byte b -> 16 bf16 values (8 pairs, the lower index in
// the low half): each code's value times 2^(b - 127), rounded to bf16 (exact: a power of two times
// 4 significant bits). Through the conversion instructions: a form that builds the bf16 bits with
// masks and an add for normal codes (and this one for the rest) measured 1.3x slower in the decode
// kernels on an H100.
__device__ __forceinline__ void widen16(uint4 c, unsigned char b, u32 (&out)[8]) {
    const u32 w[4] = {c.x, c.y, c.z, c.w};
    const float scale = fp8_scale(b);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 lo = e4m3x2_f32((u16)(w[i] & 0xffff)), hi = e4m3x2_f32((u16)(w[i] >> 16));
        out[2 * i] = pack_bf16(__fmul_rn(lo.x, scale), __fmul_rn(lo.y, scale));
        out[2 * i + 1] = pack_bf16(__fmul_rn(hi.x, scale), __fmul_rn(hi.y, scale));
    }
}
