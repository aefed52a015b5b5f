// DeepSeek-V3's noaux_tc router, one warp per token: the engine's CPU `route` (engine/src/model/moe.rs)
// step for step, with the same comparisons, ties and sums, so that the two agree on the experts and on
// the weights' bits.
//
// 1. s = sigmoid(logit), choice = s + bias (the bias only selects).
// 2. A group's score is the sum of its two best choices; the topk_group best groups stay eligible, the
//    other groups' experts count as -inf.
// 3. The top_k best eligible choices win; ids are written in ascending expert index.
// 4. Weights are the unbiased s, divided by their sum (+1e-20, summed in ascending expert index) when
//    norm_topk_prob, times routed_scaling_factor.
// Every "best" is f32::total_cmp's order with ties to the lowest index (group index, then expert index).
#define MAX_EXPERTS 512  // scores in shared memory; the safe wrapper checks experts <= MAX_EXPERTS
#define FULL 0xffffffffu
#define NEG_INF __int_as_float(0xff800000)
#define NONE 0xffffffffu      // no expert or group yet
#define KEY_MIN (-2147483647 - 1)  // the lowest total_key; NVRTC has no <climits> INT_MIN

// f32::total_cmp's order as a signed integer: negative floats' magnitude bits flipped.
__device__ __forceinline__ int total_key(float f) {
    const int b = __float_as_int(f);
    return b ^ (int)((unsigned int)(b >> 31) >> 1);
}

struct Best { int key; unsigned int i; };

__device__ __forceinline__ bool better(Best a, Best b) { return a.key > b.key || (a.key == b.key && a.i < b.i); }

__device__ __forceinline__ void take(Best& best, float v, unsigned int i) {
    const Best c = {total_key(v), i};
    if (better(c, best)) best = c;
}

// The warp's best; distinct indices make it a strict order, so every lane ends with the same winner.
__device__ __forceinline__ Best warp_best(Best b) {
    for (int o = 16; o > 0; o >>= 1) {
        const Best other = {__shfl_xor_sync(FULL, b.key, o), __shfl_xor_sync(FULL, b.i, o)};
        if (better(other, b)) b = other;
    }
    return b;
}

// exp(x) rounded once to f32: the exponential in double, which has error far below an f32 ulp. The CPU's
// f32 exp (glibc's expf) is correctly rounded almost everywhere; CUDA's expf is off by up to 2 ulp, which
// would change the weights' bits and could flip a near tie. The router's work is tiny.
__device__ __forceinline__ float exp_rn(float x) { return (float)exp((double)x); }

extern "C" __global__ void route_noaux_tc(const float* __restrict__ logits, const float* __restrict__ bias,
                                          unsigned int* __restrict__ ids, float* __restrict__ weights,
                                          unsigned int tokens, unsigned int experts, unsigned int top_k,
                                          unsigned int n_group, unsigned int topk_group, bool norm_topk_prob,
                                          float routed_scaling_factor) {
    __shared__ float score[MAX_EXPERTS], choice[MAX_EXPERTS], group_score[32];
    __shared__ unsigned int chosen[32];
    const unsigned int token = blockIdx.x, lane = threadIdx.x;
    if (token >= tokens) return;
    const float* x = logits + (size_t)token * experts;
    for (unsigned int e = lane; e < experts; e += 32) {
        const float s = 1.0f / (1.0f + exp_rn(-x[e]));
        score[e] = s;
        choice[e] = s + bias[e];
    }
    __syncwarp();

    // 2. Each group's two best choices, summed best first (Rust's sum: -0.0 + a + b, which is a + b).
    const unsigned int per_group = experts / n_group;
    for (unsigned int g = 0; g < n_group; ++g) {
        const unsigned int start = g * per_group, end = start + per_group;
        Best first = {KEY_MIN, NONE};
        for (unsigned int e = start + lane; e < end; e += 32) take(first, choice[e], e);
        first = warp_best(first);
        float sum = choice[first.i];
        if (per_group > 1) {
            Best second = {KEY_MIN, NONE};
            for (unsigned int e = start + lane; e < end; e += 32)
                if (e != first.i) take(second, choice[e], e);
            sum += choice[warp_best(second).i];
        }
        if (lane == 0) group_score[g] = sum;
    }
    __syncwarp();
    unsigned int eligible = 0;  // bit g: group g is among the topk_group best
    for (unsigned int r = 0; r < topk_group; ++r) {
        Best b = {KEY_MIN, NONE};
        if (lane < n_group && !(eligible >> lane & 1u)) take(b, group_score[lane], lane);
        eligible |= 1u << warp_best(b).i;
    }

    // 3. top_k rounds, each taking the best expert not yet taken. Lane l owns experts l + 32 j; bit j of
    // `taken` marks the ones already chosen.
    unsigned int taken = 0, mine = NONE;
    for (unsigned int r = 0; r < top_k; ++r) {
        Best b = {KEY_MIN, NONE};
        for (unsigned int e = lane, j = 0; e < experts; e += 32, ++j)
            if (!(taken >> j & 1u)) take(b, eligible >> (e / per_group) & 1u ? choice[e] : NEG_INF, e);
        b = warp_best(b);
        if (b.i % 32 == lane) taken |= 1u << (b.i / 32);
        if (lane == r) mine = b.i;
    }
    // Ascending expert order: lane r < top_k holds the r-th pick; its rank among the picks is its place.
    unsigned int rank = 0;
    for (unsigned int r = 0; r < top_k; ++r) rank += __shfl_sync(FULL, mine, r) < mine ? 1u : 0u;
    if (lane < top_k) chosen[rank] = mine;
    __syncwarp();

    // 4. Every lane sums the same values in the same order (Rust's sum starts from -0.0).
    float sum = -0.0f;
    for (unsigned int r = 0; r < top_k; ++r) sum += score[chosen[r]];
    sum += 1e-20f;
    if (lane < top_k) {
        const unsigned int e = chosen[lane];
        const float w = norm_topk_prob ? score[e] / sum : score[e];
        ids[(size_t)token * top_k + lane] = e;
        weights[(size_t)token * top_k + lane] = w * routed_scaling_factor;
    }
}
