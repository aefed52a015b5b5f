// The routed experts' outputs, weighted and summed per token: out[t] = sum over s < k of
// weights[t, s] * slots[t * k + s], slots being [T * k, h] (slot s of token t: its s-th expert, in the
// router's ascending expert order). Accumulated from 0 in ascending s with the product and the sum
// rounded separately (never fused into an FMA), as the engine's CPU MoE adds them: the same bits.
// One block per token, 4 columns per thread when h allows.
__device__ __forceinline__ float combine(const float* __restrict__ s, const float* __restrict__ w, unsigned int k,
                                         unsigned int h, unsigned int d) {
    float acc = 0.0f;
    for (unsigned int j = 0; j < k; ++j) acc = __fadd_rn(acc, __fmul_rn(s[(size_t)j * h + d], w[j]));
    return acc;
}

extern "C" __global__ void moe_combine(const float* __restrict__ slots, const float* __restrict__ weights,
                                       float* __restrict__ out, unsigned int tokens, unsigned int k, unsigned int h) {
    const unsigned int t = blockIdx.x;
    if (t >= tokens) return;
    const float* s = slots + (size_t)t * k * h;
    const float* w = weights + (size_t)t * k;
    float* o = out + (size_t)t * h;
    const bool vec = h % 4 == 0 && ((reinterpret_cast<unsigned long long>(slots) | reinterpret_cast<unsigned long long>(out)) & 15) == 0;
    if (vec) {
        for (unsigned int d = threadIdx.x; d < h / 4; d += blockDim.x) {
            float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            for (unsigned int j = 0; j < k; ++j) {
                const float4 v = reinterpret_cast<const float4*>(s + (size_t)j * h)[d];
                const float wj = w[j];
                acc.x = __fadd_rn(acc.x, __fmul_rn(v.x, wj));
                acc.y = __fadd_rn(acc.y, __fmul_rn(v.y, wj));
                acc.z = __fadd_rn(acc.z, __fmul_rn(v.z, wj));
                acc.w = __fadd_rn(acc.w, __fmul_rn(v.w, wj));
            }
            reinterpret_cast<float4*>(o)[d] = acc;
        }
    } else {
        for (unsigned int d = threadIdx.x; d < h; d += blockDim.x) o[d] = combine(s, w, k, h, d);
    }
}

// bf16 bits -> f32, exact, NaN made quiet: cast.cu's from_bf16 (NVRTC has no include path), as
// scatter_rows_bf16_to_f32 widens.
__device__ __forceinline__ float from_bf16(unsigned int x) {
    return __uint_as_float(((x & 0x7fffu) > 0x7f80u ? x | 0x40u : x) << 16);
}

#define MAX_K 32  // the router's most picks (kdtree-kernels' MAX_TOP_K)

// Columns a block of moe_combine_sorted_bf16 takes (a float4 a thread of 256): a token's row is cut
// across blocks, so one token (a decode step) spreads over h / COLS blocks instead of one.
#define COLS 1024

// moe_combine of the grouped experts' output where it lies: `rows` ([n_rows, h] bf16 bits) in
// moe_align's sorted order, `positions[t * k + s]` the sorted position of token t's slot s (moe_align's
// inverse of `sorted`). Each value is widened exactly as scatter_rows_bf16_to_f32 widens it and summed
// as moe_combine sums: the bits of that scatter then moe_combine, without the [T * k, h] f32 slots or
// a launch between. A position past the rows makes the token's row NaN, never a read outside them.
// Block (t, y) takes columns y * COLS .. of token t.
extern "C" __global__ void moe_combine_sorted_bf16(const unsigned short* __restrict__ rows,
                                                   const unsigned int* __restrict__ positions,
                                                   const float* __restrict__ weights, float* __restrict__ out,
                                                   unsigned int tokens, unsigned int k, unsigned int h,
                                                   unsigned int n_rows) {
    __shared__ const unsigned short* slot[MAX_K];
    __shared__ float wt[MAX_K];
    __shared__ int missing;
    const unsigned int t = blockIdx.x, c0 = blockIdx.y * COLS, c1 = c0 + COLS < h ? c0 + COLS : h;
    if (t >= tokens || k > MAX_K || c0 >= h) return;  // the wrapper never launches these
    if (threadIdx.x == 0) missing = 0;
    __syncthreads();
    if (threadIdx.x < k) {
        const unsigned int p = positions[(size_t)t * k + threadIdx.x];
        slot[threadIdx.x] = rows + (size_t)(p < n_rows ? p : 0) * h;
        wt[threadIdx.x] = weights[(size_t)t * k + threadIdx.x];
        if (p >= n_rows) missing = 1;
    }
    __syncthreads();
    float* o = out + (size_t)t * h;
    if (missing) {
        for (unsigned int d = c0 + threadIdx.x; d < c1; d += blockDim.x) o[d] = __int_as_float(0x7fffffff);
        return;
    }
    // 4 columns per thread: 8-byte loads of bf16 bits (every row starts 8-byte aligned when h % 4 == 0).
    // The k loads go out before the sums that consume them.
    const bool vec = h % 4 == 0 && ((reinterpret_cast<unsigned long long>(rows) & 7) |
                                    (reinterpret_cast<unsigned long long>(out) & 15)) == 0;
    if (vec) {
        for (unsigned int d = c0 / 4 + threadIdx.x; d < c1 / 4; d += blockDim.x) {
            uint2 v[MAX_K];
#pragma unroll
            for (unsigned int j = 0; j < MAX_K; ++j) {
                if (j < k) v[j] = reinterpret_cast<const uint2*>(slot[j])[d];
            }
            float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (unsigned int j = 0; j < MAX_K; ++j) {
                if (j < k) {
                    const float wj = wt[j];
                    acc.x = __fadd_rn(acc.x, __fmul_rn(from_bf16(v[j].x & 0xffffu), wj));
                    acc.y = __fadd_rn(acc.y, __fmul_rn(from_bf16(v[j].x >> 16), wj));
                    acc.z = __fadd_rn(acc.z, __fmul_rn(from_bf16(v[j].y & 0xffffu), wj));
                    acc.w = __fadd_rn(acc.w, __fmul_rn(from_bf16(v[j].y >> 16), wj));
                }
            }
            reinterpret_cast<float4*>(o)[d] = acc;
        }
    } else {
        for (unsigned int d = c0 + threadIdx.x; d < c1; d += blockDim.x) {
            float acc = 0.0f;
            for (unsigned int j = 0; j < k; ++j) acc = __fadd_rn(acc, __fmul_rn(from_bf16(slot[j][d]), wt[j]));
            o[d] = acc;
        }
    }
}
