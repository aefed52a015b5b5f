// The routed assignments of an MoE layer sorted by expert and cut into tiles, on the GPU, so that the
// grouped W4A16 kernel runs without the routing crossing to the host. kdtree-jit's
// `w4a16::grouped::align` is the same computation on the CPU, and the reference of this one.
//
// Assignment a = t * top_k + j is token t's j-th expert ids[a]. Out:
// - sorted[n]: the assignments ordered by (expert, a); ids >= experts form a last bucket.
// - positions[n]: its inverse, positions[sorted[i]] = i: where assignment a's row lies in the sorted
//   order, for the combine that reads the experts' rows there (moe_combine_sorted_bf16).
// - offsets[experts + 1]: expert e's assignments are sorted[offsets[e] .. offsets[e + 1]].
// - tiles[3 * max_tiles]: (expert, start, rows <= bm) covering each expert's run in order, experts
//   ascending; the invalid bucket gets none. The caller sizes max_tiles with kdtree-jit's
//   `tile_bound`, which no routing exceeds (the guard below only keeps a wrong size in bounds).
// - meta[3]: tiles written, experts with assignments, invalid assignments.
// Everything is integer counting in a fixed order: the same ids give the same bits every time.
//
// One block of BLOCK threads: the counts and prefix sums of every bucket live in shared memory (one
// bucket per thread), so experts + 1 <= BLOCK; the safe wrapper checks experts <= MAX_EXPERTS and n.
#define BLOCK 1024
#define MAX_BUCKETS 1024  // experts + 1 (the invalid bucket)
#define WARPS (BLOCK / 32)
#define FULL 0xffffffffu
#define NONE 0xffffffffu  // no bucket: the lanes past n in the last round of the scatter

__device__ __forceinline__ unsigned int bucket_of(unsigned int id, unsigned int experts) {
    return id < experts ? id : experts;
}

extern "C" __global__ void __launch_bounds__(BLOCK) moe_align(const unsigned int* __restrict__ ids,
                                                              unsigned int* __restrict__ sorted,
                                                              unsigned int* __restrict__ positions,
                                                              unsigned int* __restrict__ offsets,
                                                              unsigned int* __restrict__ tiles,
                                                              unsigned int* __restrict__ meta, unsigned int n,
                                                              unsigned int experts, unsigned int bm,
                                                              unsigned int max_tiles) {
    __shared__ unsigned int count[MAX_BUCKETS];       // assignments per bucket
    __shared__ unsigned int start[MAX_BUCKETS + 1];   // exclusive prefix of count; start[experts + 1] = n
    __shared__ unsigned int first_tile[MAX_BUCKETS];  // exclusive prefix of each expert's tiles
    __shared__ unsigned int next[MAX_BUCKETS];        // the scatter's next position per bucket
    __shared__ unsigned int warp_count[WARPS], warp_tiles[WARPS];
    const unsigned int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    if (blockIdx.x != 0 || experts + 1 > MAX_BUCKETS || bm == 0) return;  // the wrapper never launches these

    // 1. Counts: integer atomics, so their order does not matter.
    for (unsigned int b = tid; b <= experts; b += BLOCK) count[b] = 0;
    __syncthreads();
    for (unsigned int a = tid; a < n; a += BLOCK) atomicAdd(&count[bucket_of(ids[a], experts)], 1u);
    __syncthreads();

    // 2. Exclusive prefix sums of the counts and of each expert's ceil(count / bm) tiles, thread b
    //    holding bucket b: within each warp by shuffles, then across the warps' totals.
    const unsigned int c = tid <= experts ? count[tid] : 0;
    const unsigned int t = tid < experts ? (c + bm - 1) / bm : 0;
    const int touched = __syncthreads_count(tid < experts && c > 0);
    unsigned int ic = c, it = t;  // inclusive within the warp
    for (unsigned int o = 1; o < 32; o <<= 1) {
        const unsigned int pc = __shfl_up_sync(FULL, ic, o), pt = __shfl_up_sync(FULL, it, o);
        if (lane >= o) {
            ic += pc;
            it += pt;
        }
    }
    if (lane == 31) {
        warp_count[warp] = ic;
        warp_tiles[warp] = it;
    }
    __syncthreads();
    if (warp == 0) {  // WARPS == 32: one total per lane, scanned inclusive
        unsigned int wc = warp_count[lane], wt = warp_tiles[lane];
        for (unsigned int o = 1; o < 32; o <<= 1) {
            const unsigned int pc = __shfl_up_sync(FULL, wc, o), pt = __shfl_up_sync(FULL, wt, o);
            if (lane >= o) {
                wc += pc;
                wt += pt;
            }
        }
        warp_count[lane] = wc;
        warp_tiles[lane] = wt;
    }
    __syncthreads();
    const unsigned int before_c = (warp > 0 ? warp_count[warp - 1] : 0) + ic - c;
    const unsigned int before_t = (warp > 0 ? warp_tiles[warp - 1] : 0) + it - t;
    if (tid <= experts) {
        start[tid] = before_c;
        next[tid] = before_c;
        first_tile[tid] = before_t;  // first_tile[experts] = every expert's tiles
        offsets[tid] = before_c;
    }
    if (tid == experts) start[experts + 1] = before_c + c;
    __syncthreads();
    const unsigned int total_tiles = first_tile[experts];
    if (tid == 0) {
        meta[0] = total_tiles < max_tiles ? total_tiles : max_tiles;
        meta[1] = (unsigned int)touched;
        meta[2] = n - start[experts];
    }

    // 3. Tiles, spread over all threads: tile i is expert e's (i - first_tile[e])-th, e the last expert
    //    with first_tile[e] <= i (a binary search; empty experts share their successor's first_tile and
    //    are never the last such, as first_tile[e + 1] > i for the one found).
    for (unsigned int i = tid; i < total_tiles && i < max_tiles; i += BLOCK) {
        unsigned int lo = 0, hi = experts;  // first_tile[lo] <= i < first_tile[hi]
        while (hi - lo > 1) {
            const unsigned int mid = (lo + hi) / 2;
            if (first_tile[mid] <= i) lo = mid; else hi = mid;
        }
        const unsigned int j = i - first_tile[lo], row0 = start[lo] + j * bm, left = start[lo + 1] - row0;
        tiles[3 * i] = lo;
        tiles[3 * i + 1] = row0;
        tiles[3 * i + 2] = left < bm ? left : bm;
    }

    // 4. The stable scatter, by warp 0 alone: 32 assignments a round, in index order. Lanes with the
    //    same bucket find each other (match.any); a lane's place is its bucket's next position plus the
    //    lanes before it in the same bucket, and the lowest of them advances the bucket afterwards.
    if (warp == 0) {
        for (unsigned int base = 0; base < n; base += 32) {
            const unsigned int a = base + lane;
            const unsigned int b = a < n ? bucket_of(ids[a], experts) : NONE;
            const unsigned int same = __match_any_sync(FULL, b);
            const unsigned int rank = __popc(same & ((1u << lane) - 1u));
            unsigned int pos = 0;
            if (b != NONE) pos = next[b] + rank;
            __syncwarp();  // every lane has read next[] before any lane moves it
            if (b != NONE) {
                sorted[pos] = a;
                positions[a] = pos;
                if (rank == 0) next[b] += __popc(same);
            }
            __syncwarp();
        }
    }
}
