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

// Codes c0 (low byte) and c1 of a u16 -> a bf16 pair scaled by 2^(b - 127): each value, rounded to
// bf16 (exact: a power of two times 4 significant bits).
__device__ __forceinline__ u32 widen2_slow(u16 codes, float scale) {
    const float2 a = e4m3x2_f32(codes);
    return pack_bf16(__fmul_rn(a.x, scale), __fmul_rn(a.y, scale));
}

// The same through the bits, for the common case: a normal code S.EEEE.MMM times 2^(b - 127) is the
// bf16 S | (E + b - 7) << 7 | M << 4 while that exponent is normal (b in 7..246), so a pair is two
// masks, a shift and an add. Zero, subnormal and NaN codes, and extreme scales, take the slow path:
// the bits are the same either way.
__device__ __forceinline__ u32 widen2(u32 w, int half, u32 ebias, bool fast_scale, float scale) {
    const u32 a = __byte_perm(w, 0, half ? 0x4342 : 0x4140);  // codes in bytes 0 and 2
    const u32 mag = a & 0x007f007fu, e = a & 0x00780078u;
    const bool fast = fast_scale && (e & 0xffffu) != 0 && (e >> 16) != 0 && (mag & 0xffffu) != 0x7fu && (mag >> 16) != 0x7fu;
    if (fast) return ((a & 0x00800080u) << 8) | ((mag << 4) + ebias);
    return widen2_slow((u16)(half ? w >> 16 : w & 0xffff), scale);
}

// 16 codes (little-endian in c) of one scale byte b -> 16 bf16 values (8 pairs, the lower index in
// the low half).
__device__ __forceinline__ void widen16(uint4 c, unsigned char b, u32 (&out)[8]) {
    const u32 w[4] = {c.x, c.y, c.z, c.w};
    const bool fast_scale = b >= 7 && b <= 246;
    const u32 ebias = ((u32)(b - 7) << 7) * 0x10001u;
    const float scale = fp8_scale(b);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        out[2 * i] = widen2(w[i], 0, ebias, fast_scale, scale);
        out[2 * i + 1] = widen2(w[i], 1, ebias, fast_scale, scale);
    }
}
