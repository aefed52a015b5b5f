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
