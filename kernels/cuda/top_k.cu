// A drafter's per-depth candidates without its logits leaving the device. Each row's logits are
// transformed (a multiplier, then an optional tanh softcap) and log-softmaxed as the host does
// (max-subtracted exponentials, divided by their sum, then ln); the k largest finite log-probs are
// kept, ties to the lower token. A row of a large vocabulary is split into chunks of CHUNK tokens so
// that the whole GPU works on it:
//   top_k_max_sum: per chunk, its max and its sum of exponentials below that max;
//   top_k_chunk:   per chunk, the row's max and sum from those (the same fixed order in every block),
//                  the chunk's log-probs, and its k best, written in token order;
//   top_k_merge:   per row, the k best of its chunks' candidates.
// Selection is a radix select over order-preserving keys of the log-probs (four passes of 8 bits),
// then block scans over contiguous per-thread ranges that place the chosen in token order.

#define THREADS 256
#define WARPS (THREADS / 32)
#define CHUNK 4096  // tokens a chunk; the launcher's `chunk` must equal it
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

__device__ __forceinline__ float lp_of_key(unsigned int key) {
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

struct Max {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct Sum {
    template <typename T>
    __device__ T operator()(T a, T b) const { return a + b; }
};

// A block-wide reduction in a fixed order (within warps, then across them): the same result on
// every run; `identity` fills the lanes past the warps.
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

// An exclusive prefix sum of one value a thread, in thread order.
__device__ unsigned int block_scan(unsigned int v, unsigned int* partial) {
    const unsigned int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    unsigned int inclusive = v;
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned int other = __shfl_up_sync(0xffffffffu, inclusive, o);
        if (lane >= o) inclusive += other;
    }
    if (lane == 31) partial[warp] = inclusive;
    __syncthreads();
    if (warp == 0) {
        const unsigned int w = lane < WARPS ? partial[lane] : 0u;
        unsigned int wi = w;
        for (int o = 1; o < 32; o <<= 1) {
            const unsigned int other = __shfl_up_sync(0xffffffffu, wi, o);
            if (lane >= o) wi += other;
        }
        if (lane < WARPS) partial[lane] = wi - w;
    }
    __syncthreads();
    const unsigned int out = partial[warp] + inclusive - v;
    __syncthreads();
    return out;
}

// The up-to-k largest nonzero keys of `key(i)`, i < len, ties to the lower i: calls emit(slot, i,
// key) for each, slots 0.. in index order, and returns how many.
template <typename Key, typename Emit>
__device__ unsigned int select_top(Key key, unsigned int len, unsigned int k, Emit emit) {
    __shared__ unsigned int hist[256];
    __shared__ unsigned int upartial[WARPS];
    unsigned int valid = 0u;
    for (unsigned int i = threadIdx.x; i < len; i += THREADS) valid += key(i) != 0u;
    const unsigned int want = min(k, block_reduce(valid, 0u, Sum(), upartial));
    if (want == 0u) return 0u;

    // The want-th largest key a byte at a time from the top: `prefix` holds the bytes found, `need`
    // how many keys equal to the final threshold to take.
    unsigned int prefix = 0u, mask = 0u, need = want;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (unsigned int b = threadIdx.x; b < 256; b += THREADS) hist[b] = 0u;
        __syncthreads();
        for (unsigned int i = threadIdx.x; i < len; i += THREADS) {
            const unsigned int kk = key(i);
            if (kk != 0u && (kk & mask) == prefix) atomicAdd(&hist[(kk >> shift) & 0xffu], 1u);
        }
        __syncthreads();
        // Every thread walks the bins from the top: the same answer everywhere.
        unsigned int above = 0u, bin = 255u;
        for (; bin > 0u && above + hist[bin] < need; --bin) above += hist[bin];
        need -= above;
        prefix |= bin << shift;
        mask |= 0xffu << shift;
        __syncthreads();  // hist is cleared by the next pass
    }

    // Contiguous ranges a thread, so that scans order by index: which tied keys are taken (the
    // lowest `need`), then where each taken key goes.
    const unsigned int per = (len + THREADS - 1) / THREADS;
    const unsigned int begin = min(len, threadIdx.x * per), end = min(len, begin + per);
    unsigned int tied = 0u;
    for (unsigned int i = begin; i < end; ++i) tied += key(i) == prefix;
    const unsigned int tie_rank = block_scan(tied, upartial);
    unsigned int taken = 0u, rank = tie_rank;
    for (unsigned int i = begin; i < end; ++i) {
        const unsigned int kk = key(i);
        if (kk > prefix) ++taken;
        else if (kk == prefix) taken += rank++ < need;
    }
    unsigned int slot = block_scan(taken, upartial);
    rank = tie_rank;
    for (unsigned int i = begin; i < end; ++i) {
        const unsigned int kk = key(i);
        if (kk > prefix || (kk == prefix && rank++ < need)) emit(slot++, i, kk);
    }
    return want;
}

// Grid (chunks, rows): each chunk's max (`part[2c]`) and sum of exp(x - its max) (`part[2c + 1]`,
// 0 where its max is -inf: it adds nothing).
extern "C" __global__ void __launch_bounds__(THREADS) top_k_max_sum(
    const float* __restrict__ logits, float* __restrict__ part, unsigned int rows, unsigned int vocab,
    unsigned int chunk, float multiplier, float softcap) {
    __shared__ float fpartial[WARPS];
    const unsigned int c = blockIdx.x, chunks = gridDim.x, r = blockIdx.y;
    if (r >= rows) return;
    const float* row = logits + (size_t)r * vocab;
    const unsigned int begin = c * chunk, end = min(vocab, begin + chunk);
    float m = NEG_INF;
    for (unsigned int i = begin + threadIdx.x; i < end; i += THREADS) m = fmaxf(m, transformed(row[i], multiplier, softcap));
    m = block_reduce(m, NEG_INF, Max(), fpartial);
    float s = 0.0f;
    if (m != NEG_INF) {
        for (unsigned int i = begin + threadIdx.x; i < end; i += THREADS) s += expf(transformed(row[i], multiplier, softcap) - m);
    }
    s = block_reduce(s, 0.0f, Sum(), fpartial);
    if (threadIdx.x == 0) {
        part[((size_t)r * chunks + c) * 2] = m;
        part[((size_t)r * chunks + c) * 2 + 1] = s;
    }
}

// Grid (chunks, rows): the chunk's k best log-probs into cand_token/cand_lp ([rows, chunks, k], in
// token order), how many into cand_count ([rows, chunks]).
extern "C" __global__ void __launch_bounds__(THREADS) top_k_chunk(
    const float* __restrict__ logits, const float* __restrict__ part, unsigned int* __restrict__ cand_token,
    float* __restrict__ cand_lp, unsigned int* __restrict__ cand_count, unsigned int rows, unsigned int vocab,
    unsigned int chunk, unsigned int k, float multiplier, float softcap) {
    __shared__ unsigned int keys[CHUNK];
    const unsigned int c = blockIdx.x, chunks = gridDim.x, r = blockIdx.y;
    if (r >= rows) return;
    const float* row = logits + (size_t)r * vocab;
    const float* p = part + (size_t)r * chunks * 2;
    // The row's max and sum, combined in chunk order: every block of the row gets the same bits.
    float m = NEG_INF;
    for (unsigned int j = 0; j < chunks; ++j) m = fmaxf(m, p[2 * j]);
    float sum = 0.0f;
    for (unsigned int j = 0; j < chunks; ++j) sum += p[2 * j] == NEG_INF ? 0.0f : p[2 * j + 1] * expf(p[2 * j] - m);
    const unsigned int begin = c * chunk, len = min(vocab, begin + chunk) - begin;
    for (unsigned int i = threadIdx.x; i < len; i += THREADS) {
        keys[i] = key_of(logf(expf(transformed(row[begin + i], multiplier, softcap) - m) / sum));
    }
    __syncthreads();
    const size_t at = ((size_t)r * chunks + c) * k;
    const unsigned int n = select_top([&](unsigned int i) { return keys[i]; }, len, k, [&](unsigned int slot, unsigned int i, unsigned int key) {
        cand_token[at + slot] = begin + i;
        cand_lp[at + slot] = lp_of_key(key);
    });
    if (threadIdx.x == 0) cand_count[(size_t)r * chunks + c] = n;
}

// Grid rows: the row's k best of its chunks' candidates (which lie in token order, chunk after
// chunk) into tokens/log_probs ([rows, k], token order), how many into counts ([rows]).
extern "C" __global__ void __launch_bounds__(THREADS) top_k_merge(
    const unsigned int* __restrict__ cand_token, const float* __restrict__ cand_lp,
    const unsigned int* __restrict__ cand_count, unsigned int* __restrict__ tokens, float* __restrict__ log_probs,
    unsigned int* __restrict__ counts, unsigned int rows, unsigned int chunks, unsigned int k) {
    const unsigned int r = blockIdx.x;
    if (r >= rows) return;
    const size_t at = (size_t)r * chunks * k;
    const unsigned int* count = cand_count + (size_t)r * chunks;
    auto key = [&](unsigned int i) { return i % k < count[i / k] ? key_of(cand_lp[at + i]) : 0u; };
    const unsigned int n = select_top(key, chunks * k, k, [&](unsigned int slot, unsigned int i, unsigned int kk) {
        tokens[(size_t)r * k + slot] = cand_token[at + i];
        log_probs[(size_t)r * k + slot] = lp_of_key(kk);
    });
    if (threadIdx.x == 0) counts[r] = n;
}
