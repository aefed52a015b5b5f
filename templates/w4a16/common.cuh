// Shared by every W4A16 kernel: 16-bit float helpers for the variant's dtype and the int4
// dequantization. No CUDA headers: inline PTX pins the exact instructions and keeps NVRTC
// independent of a toolkit's include directory. Every 16-bit value travels as raw bits
// (u16, or a pair in a u32 with the lower index in the low half).
typedef unsigned int u32;
typedef unsigned short u16;

{% if dtype == "f16" %}
__device__ __forceinline__ float to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ u16 from_f32(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
// (lo, hi) -> one pair, each rounded to nearest even.
__device__ __forceinline__ u32 pack2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ u32 fma2(u32 a, u32 b, u32 c) {
    u32 d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ u32 mul2(u32 a, u32 b) {
    u32 d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
{% else %}
// bf16 is the high half of an f32: widening is a shift, exact.
__device__ __forceinline__ float to_f32(u16 h) { return __uint_as_float((u32)h << 16); }
__device__ __forceinline__ u16 from_f32(float f) {
    u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ u32 pack2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
// fma.rn.bf16x2 is sm_80+; mul.bf16x2 would need sm_90, so multiply as a*b + (-0).
__device__ __forceinline__ u32 fma2(u32 a, u32 b, u32 c) {
    u32 d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ u32 mul2(u32 a, u32 b) { return fma2(a, b, 0x80008000u); }
{% endif %}

// (a & b) | c in one instruction; the compiler does not always find this lop3 by itself.
__device__ __forceinline__ u32 and_or(u32 a, u32 b, u32 c) {
    u32 d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// A packed word's four pairs (layout below) as (magic + stored nibble), exactly: no subtraction.
// The stream kernel folds every element's -(magic + 8) into its sums instead (one mma per k16
// tile against a constant NEG_BIAS2 matrix), which leaves 7 instructions a word: 3 shifts, 4 lop3.
{% if dtype == "f16" %}
constexpr u32 MAGIC2 = 0x64006400u;     // (1024, 1024): ulp 1
constexpr u32 NEG_BIAS2 = 0xe408e408u;  // (-1032, -1032) = -(magic + 8), exact
{% else %}
constexpr u32 MAGIC2 = 0x43004300u;     // (128, 128): ulp 1
constexpr u32 NEG_BIAS2 = 0xc308c308u;  // (-136, -136) = -(magic + 8), exact
{% endif %}
__device__ __forceinline__ void biased_pairs(u32 w, u32 (&p)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) p[i] = and_or(w >> (4 * i), 0x000f000fu, MAGIC2);
}

// A packed word holds eight stored nibbles (q + 8), nibble j at bits 4j. The layout (layout.rs)
// puts pair p = nibbles (p, p + 4) where one thread wants two consecutive K elements of one
// column, so each pair lands in the two halves of one register without any shuffling.
//
// Dequantizes the four pairs to q - 8, exactly (small integers are exact in both dtypes),
// with the magic-number trick: OR-ing a nibble into the mantissa of a float whose unit in the
// last place is 1 gives (magic + nibble); one subtraction then yields q. No int->float converts.
__device__ __forceinline__ void dequant_pairs(u32 w, u32 (&p)[4]) {
{% if dtype == "f16" %}
    // f16: 0x6400 = 1024 (ulp 1). The nibbles at bits 4..7 and 20..23 are OR-ed in place as
    // 1024 + 16 q and fixed by one fma (x / 16 - 72 = q - 8), which saves two shifts (Marlin's trick).
    const u32 w8 = w >> 8;
    p[0] = fma2(and_or(w, 0x000f000fu, 0x64006400u), 0x3c003c00u, 0xe408e408u);   // x * 1 - 1032
    p[1] = fma2(and_or(w, 0x00f000f0u, 0x64006400u), 0x2c002c00u, 0xd480d480u);   // x / 16 - 72
    p[2] = fma2(and_or(w8, 0x000f000fu, 0x64006400u), 0x3c003c00u, 0xe408e408u);
    p[3] = fma2(and_or(w8, 0x00f000f0u, 0x64006400u), 0x2c002c00u, 0xd480d480u);
{% else %}
    // bf16: 0x4300 = 128 (ulp 1 up to 256). Only 7 mantissa bits, so 16 q would not fit:
    // every pair is shifted down to bits 0..3 / 16..19 first.
    biased_pairs(w, p);
#pragma unroll
    for (int i = 0; i < 4; ++i) p[i] = fma2(p[i], 0x3f803f80u, NEG_BIAS2);  // x * 1 - 136
{% endif %}
}

// The same eight values as f32, in nibble order, exactly. 0x4B000000 = 2^23 has ulp 1, and a
// nibble j OR-ed in place (bits 4j..4j+3, below bit 23 for j <= 4) gives 2^23 + 16^j q';
// one fma by 16^-j minus (2^23 16^-j + 8) is exact and yields q' - 8. Nibbles 5..7 are
// shifted down by 12 first. Two instructions an element: a lop3 and an fma.
__device__ __forceinline__ void dequant_f32(u32 w, float (&f)[8]) {
    const u32 w12 = w >> 12;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int s = j < 5 ? j : j - 3;
        const u32 src = j < 5 ? w : w12;
        const float scale = __uint_as_float((127u - 4u * s) << 23);              // 16^-s
        const float offset = -(8388608.0f * scale + 8.0f);                       // -(2^23 16^-s + 8)
        f[j] = fmaf(__uint_as_float(and_or(src, 0xfu << (4 * s), 0x4b000000u)), scale, offset);
    }
}
