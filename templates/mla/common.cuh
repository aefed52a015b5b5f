// Shared by the MLA kernels: bf16 as raw bits (u16, or a pair in a u32 with the lower index in the
// low half), cp.async, ldmatrix and the bf16 mma. No CUDA headers: inline PTX pins the instructions
// and keeps NVRTC independent of a toolkit's include directory.

#define INFINITY __int_as_float(0x7f800000)

// bf16 is the high half of an f32: widening is a shift, exact.
__device__ __forceinline__ float bf16_f32(u16 h) { return __uint_as_float((u32)h << 16); }
// Rounded to nearest even, as half::bf16::from_f32 rounds.
__device__ __forceinline__ u16 f32_bf16(float f) {
    u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
// (lo, hi) -> one pair, each rounded to nearest even.
__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

{% include "common/async_copy.cuh" %}

// Two matrices: lanes 0..15 give the addresses.
__device__ __forceinline__ void ldmatrix_x2(u32 (&r)[2], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 { %0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
// Four matrices, transposed: a row-major [k][n] tile read as the mma's column-major B.
__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 { %0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// c += a · b, m16n8k16, bf16 inputs, f32 sums (sm_80+: portable to sm_90 and sm_120).
// C element c of a lane (g = lane / 4, t = lane % 4): row g + 8 (c / 2), column 2t + c % 2.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 { %0, %1, %2, %3}, { %4, %5, %6, %7}, { %8, %9}, "
        "{ %0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Bytes of one cache entry (a multiple of 16: entries are copied in 16-byte pieces): bf16 [c_kv |
// k_pe], or FP8 (mla/fp8.cuh: latent codes and one scale byte per 32 padded to 16 bytes, then the
// rope key in bf16).
__host__ __device__ constexpr int fp8_entry_bytes(int latent, int rope) { return (latent + latent / 32 + 15) / 16 * 16 + 2 * rope; }
__device__ __forceinline__ int entry_bytes(int latent, int rope) {
    return {% if kv %}fp8_entry_bytes(latent, rope){% else %}2 * (latent + rope){% endif %};
}
