// A drafter's per-depth candidates without its logits leaving the device: one block per row applies
// the logit transform (a multiplier, then an optional tanh softcap), takes the row's log-softmax as
// the host does (max-subtracted exponentials, divided by their sum, then ln), finds the k-th largest
// finite log-prob by a radix select over order-preserving keys (four passes of 8 bits, the row stays
// in L2 between them) and writes the k best. Ties at the k-th value go to the lower tokens, as the
// host's ranking breaks them; the k are written in token order within each class (above / tied), the
// caller sorts them.

#define THREADS 512
#define WARPS (THREADS / 32)
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float transformed(float x, float multiplier, float softcap) {
    x *= multiplier;
    return softcap > 0.0f ? softcap * tanhf(x / softcap) : x;
}

// Larger log-prob, larger key; 0 for what the host drops (NaN, infinities), below every finite key.
__device__ __forceinline__ unsigned int key_of(float lp) {
    if (!isfinite(lp)) return 0u;
    const unsigned int u = __float_as_uint(lp);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct Max {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct Sum {
    template <typename T>
    __device__ T operator()(T a, T b) const { return a + b; }
};

// A block-wide reduction in a fixed order (within warps, then across them in warp 0): the same
// result on every run; `identity` fills the lanes past the warps.
template <typename T, typename Op>
__device__ T block_reduce(T v, T identity, Op op, T* partial) {
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
    __syncthreads();
    const unsigned int lane = threadIdx.x % 32;
    v = lane < WARPS ? partial[lane] : identity;
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();  // the partials are reused by the next reduction
    return v;
}

// An exclusive prefix sum of one value a thread, in thread order; `total` gets the sum.
__device__ unsigned int block_scan(unsigned int v, unsigned int* partial, unsigned int* total) {
    const unsigned int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    unsigned int inclusive = v;
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned int other = __shfl_up_sync(0xffffffffu, inclusive, o);
        if (lane >= o) inclusive += other;
    }
    if (lane == 31) partial[warp] = inclusive;
    __syncthreads();
    if (warp == 0) {
        unsigned int w = lane < WARPS ? partial[lane] : 0u, wi = w;
        for (int o = 1; o < 32; o <<= 1) {
            const unsigned int other = __shfl_up_sync(0xffffffffu, wi, o);
            if (lane >= o) wi += other;
        }
        if (lane < WARPS) partial[lane] = wi - w;  // the warps' exclusive offsets
        if (lane == WARPS - 1) partial[WARPS] = wi;
    }
    __syncthreads();
    const unsigned int out = partial[warp] + inclusive - v;
    *total = partial[WARPS];
    __syncthreads();
    return out;
}

// logits [rows, vocab]; tokens and log_probs [rows, k], the first counts[r] of row r filled: k, or
// fewer where the row has fewer finite log-probs (none for a row with a NaN or an infinite maximum,
// as on the host, where its softmax is all NaN).
extern "C" __global__ void __launch_bounds__(THREADS) top_k_log_softmax(
    const float* __restrict__ logits, unsigned int* __restrict__ tokens, float* __restrict__ log_probs,
    unsigned int* __restrict__ counts, unsigned int rows, unsigned int vocab, unsigned int k, float multiplier,
    float softcap) {
    __shared__ float fpartial[WARPS];
    __shared__ unsigned int upartial[WARPS + 1];
    __shared__ unsigned int hist[256];
    const unsigned int r = blockIdx.x;
    if (r >= rows) return;
    const float* row = logits + (size_t)r * vocab;

    float max = NEG_INF;
    for (unsigned int i = threadIdx.x; i < vocab; i += THREADS) max = fmaxf(max, transformed(row[i], multiplier, softcap));
    max = block_reduce(max, NEG_INF, Max(), fpartial);
    float sum = 0.0f;
    for (unsigned int i = threadIdx.x; i < vocab; i += THREADS) sum += expf(transformed(row[i], multiplier, softcap) - max);
    sum = block_reduce(sum, 0.0f, Sum(), fpartial);
#define LOG_PROB(i) logf(expf(transformed(row[i], multiplier, softcap) - max) / sum)

    unsigned int finite = 0;
    for (unsigned int i = threadIdx.x; i < vocab; i += THREADS) finite += key_of(LOG_PROB(i)) != 0u;
    finite = block_reduce(finite, 0u, Sum(), upartial);
    const unsigned int want = min(k, finite);

    // The want-th largest key, a byte at a time from the top: `prefix` holds the bytes found so far,
    // `need` how many keys equal to the final threshold to take.
    unsigned int prefix = 0u, mask = 0u, need = want;
    for (int shift = 24; shift >= 0 && want > 0; shift -= 8) {
        for (unsigned int b = threadIdx.x; b < 256; b += THREADS) hist[b] = 0u;
        __syncthreads();
        for (unsigned int i = threadIdx.x; i < vocab; i += THREADS) {
            const unsigned int key = key_of(LOG_PROB(i));
            if (key != 0u && (key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xffu], 1u);
        }
        __syncthreads();
        // Every thread walks the 256 bins from the top: the same answer everywhere, no broadcast.
        unsigned int above = 0u, bin = 255u;
        for (;; --bin) {
            if (above + hist[bin] >= need || bin == 0u) break;
            above += hist[bin];
        }
        need -= above;
        prefix |= bin << shift;
        mask |= 0xffu << shift;
        __syncthreads();  // hist is cleared by the next pass
    }

    // Each thread takes a contiguous range of tokens, so that scans give slots in token order.
    const unsigned int per = (vocab + THREADS - 1) / THREADS;
    const unsigned int begin = min(vocab, threadIdx.x * per), end = min(vocab, begin + per);
    unsigned int above = 0u, tied = 0u;
    for (unsigned int i = begin; i < end && want > 0; ++i) {
        const unsigned int key = key_of(LOG_PROB(i));
        above += key > prefix;
        tied += key != 0u && key == prefix;
    }
    unsigned int total_above, total_tied;
    unsigned int slot_above = block_scan(above, upartial, &total_above);
    unsigned int slot_tied = block_scan(tied, upartial, &total_tied);
    unsigned int* out_tokens = tokens + (size_t)r * k;
    float* out_lp = log_probs + (size_t)r * k;
    for (unsigned int i = begin; i < end && want > 0; ++i) {
        const float lp = LOG_PROB(i);
        const unsigned int key = key_of(lp);
        unsigned int slot = 0xffffffffu;
        if (key > prefix) slot = slot_above++;
        else if (key != 0u && key == prefix && slot_tied < need) slot = total_above + slot_tied++;
        else if (key != 0u && key == prefix) ++slot_tied;
        if (slot < want) {
            out_tokens[slot] = i;
            out_lp[slot] = lp;
        }
    }
    if (threadIdx.x == 0) counts[r] = want;
#undef LOG_PROB
}
