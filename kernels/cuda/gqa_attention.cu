// Grouped-query attention with no mask, in f32 on the CUDA cores: a drafter's block of n query rows
// over its context's keys and values followed by the block's own, split over the keys
// (flash-decoding) and combined.
//
// gqa_attention_partial: one block per (kv head g, query row r, split), one warp per query head of
// g's group. Keys go through shared memory a tile of 32 at a time, shared by the group's heads; each
// lane scores one key of the tile (the whole dot product, no shuffles), the warp keeps an online
// softmax (running max m and sum l) and lane d's accumulators hold output dims d, d + 32, ...
// gqa_attention_combine: each (row, head) rescales its splits' partials to one max and divides.

#define TILE 32
#define MAX_D 128  // head_dim at most; the launcher checks
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Shared memory: the group's queries [group, D], a key tile [TILE, D + 1] (padded: lane j reads row
// j, so rows must not share banks), a value tile [TILE, D].
extern "C" __global__ void gqa_attention_partial(
    const float* __restrict__ q, const float* __restrict__ ctx_k, const float* __restrict__ ctx_v,
    const float* __restrict__ blk_k, const float* __restrict__ blk_v, float* __restrict__ part_o,
    float* __restrict__ part_ml, unsigned int n, unsigned int ctx, unsigned int heads, unsigned int kv_heads,
    unsigned int head_dim, unsigned int splits, unsigned int chunk, float scale) {
    extern __shared__ float smem[];
    const unsigned int g = blockIdx.x, r = blockIdx.y, split = blockIdx.z;
    const unsigned int group = heads / kv_heads, D = head_dim, kv_width = kv_heads * D;
    const unsigned int warp = threadIdx.x / 32, lane = threadIdx.x % 32, h = g * group + warp;
    float* sq = smem;
    float* sk = sq + group * D;
    float* sv = sk + TILE * (D + 1);
    for (unsigned int i = threadIdx.x; i < group * D; i += blockDim.x) sq[i] = q[((size_t)r * heads + g * group) * D + i];

    const unsigned int keys = ctx + n, begin = split * chunk, end = min(keys, begin + chunk);
    float m = NEG_INF, l = 0.0f, acc[MAX_D / 32];
#pragma unroll
    for (int i = 0; i < MAX_D / 32; ++i) acc[i] = 0.0f;
    for (unsigned int t0 = begin; t0 < end; t0 += TILE) {
        const unsigned int rows = min(TILE, end - t0);
        __syncthreads();  // the last tile is consumed (and, the first time, the queries are in)
        for (unsigned int i = threadIdx.x; i < rows * D; i += blockDim.x) {
            const unsigned int j = i / D, d = i % D, key = t0 + j;
            const size_t at = (key < ctx ? (size_t)key : (size_t)(key - ctx)) * kv_width + g * D + d;
            sk[j * (D + 1) + d] = key < ctx ? ctx_k[at] : blk_k[at];
            sv[j * D + d] = key < ctx ? ctx_v[at] : blk_v[at];
        }
        __syncthreads();
        float s = NEG_INF;
        if (lane < rows) {
            const float* k = sk + lane * (D + 1);
            const float* qh = sq + warp * D;
            float dot = 0.0f;
            for (unsigned int d = 0; d < D; ++d) dot = fmaf(qh[d], k[d], dot);
            s = dot * scale;
        }
        const float m_new = fmaxf(m, warp_max(s));
        const float p = lane < rows ? expf(s - m_new) : 0.0f;
        const float rescale = expf(m - m_new);  // 0 on the first tile, where m is -inf
        l = l * rescale + warp_sum(p);
#pragma unroll
        for (int i = 0; i < MAX_D / 32; ++i) acc[i] *= rescale;
        for (unsigned int j = 0; j < rows; ++j) {
            const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
            for (int i = 0; i < MAX_D / 32; ++i) {
                const unsigned int d = lane + 32 * i;
                if (d < D) acc[i] = fmaf(pj, sv[j * D + d], acc[i]);
            }
        }
        m = m_new;
    }
    const size_t slot = ((size_t)r * heads + h) * splits + split;
#pragma unroll
    for (int i = 0; i < MAX_D / 32; ++i) {
        const unsigned int d = lane + 32 * i;
        if (d < D) part_o[slot * D + d] = acc[i];
    }
    if (lane == 0) {
        part_ml[2 * slot] = m;
        part_ml[2 * slot + 1] = l;
    }
}

// One block per (row, head) of `rows_heads`: out = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s.
extern "C" __global__ void gqa_attention_combine(
    const float* __restrict__ part_o, const float* __restrict__ part_ml, float* __restrict__ out,
    unsigned int rows_heads, unsigned int splits, unsigned int head_dim) {
    const unsigned int rh = blockIdx.x;
    if (rh >= rows_heads) return;
    const float* ml = part_ml + (size_t)rh * splits * 2;
    float big = NEG_INF;
    for (unsigned int s = 0; s < splits; ++s) big = fmaxf(big, ml[2 * s]);
    float sum = 0.0f;
    for (unsigned int s = 0; s < splits; ++s) sum += ml[2 * s] == NEG_INF ? 0.0f : expf(ml[2 * s] - big) * ml[2 * s + 1];
    for (unsigned int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float o = 0.0f;
        for (unsigned int s = 0; s < splits; ++s) {
            if (ml[2 * s] != NEG_INF) o = fmaf(expf(ml[2 * s] - big), part_o[((size_t)rh * splits + s) * head_dim + d], o);
        }
        out[(size_t)rh * head_dim + d] = o / sum;
    }
}
