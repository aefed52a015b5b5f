// Tensor-core building blocks of the mma algorithm: cp.async, ldmatrix, mma.sync m16n8k16.
// All portable from sm_80 to sm_120 (no wgmma, no TMA).

{% include "common/async_copy.cuh" %}

__device__ __forceinline__ uint4 lds128(u32 addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 { %0, %1, %2, %3 }, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
    return v;
}

{% if acc == "f16" %}
// f16 accumulation: C is two f16 pairs, (row g, cols 2t..2t+1) and (row g + 8, same cols).
constexpr int ACC_REGS = 2;
typedef u32 acc_t;
__device__ __forceinline__ void mma_16816(acc_t (&c)[ACC_REGS], const u32 (&a)[4], u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 { %0, %1 }, { %2, %3, %4, %5 }, { %6, %7 }, { %0, %1 };"
                 : "+r"(c[0]), "+r"(c[1])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void acc_to_f32(const acc_t (&c)[ACC_REGS], float (&v)[4]) {
    v[0] = to_f32((u16)c[0]);
    v[1] = to_f32((u16)(c[0] >> 16));
    v[2] = to_f32((u16)c[1]);
    v[3] = to_f32((u16)(c[1] >> 16));
}
{% else %}
// f32 accumulation: C is four floats, (row g, cols 2t, 2t+1) then (row g + 8, cols 2t, 2t+1).
constexpr int ACC_REGS = 4;
typedef float acc_t;
__device__ __forceinline__ void mma_16816(acc_t (&c)[ACC_REGS], const u32 (&a)[4], u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.{{ dtype }}.{{ dtype }}.f32 { %0, %1, %2, %3 }, { %4, %5, %6, %7 }, { %8, %9 }, { %0, %1, %2, %3 };"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// d = a b + c with c left as it is.
__device__ __forceinline__ void mma_16816_from(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1, const float (&c)[4]) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.{{ dtype }}.{{ dtype }}.f32 { %0, %1, %2, %3 }, { %4, %5, %6, %7 }, { %8, %9 }, { %10, %11, %12, %13 };"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}
__device__ __forceinline__ void acc_to_f32(const acc_t (&c)[ACC_REGS], float (&v)[4]) {
    v[0] = c[0];
    v[1] = c[1];
    v[2] = c[2];
    v[3] = c[3];
}
{% endif %}
