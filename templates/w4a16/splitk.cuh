// Split-K across blocks, deterministically. Every split of an output tile stores its f32 partial
// in the workspace; the block that arrives last at the tile's counter sums all partials in split
// order (float atomics would make the result depend on timing) and writes Y.
// Workspace: one u32 counter per output tile (per block of a split), then [SPLIT_K][M][N] partials.
// Counters must be zero before the first launch; the reducing block sets its counter back to 0.
// They come first so that a row-limited kernel's (one per 64-column tile, whatever M) stay in place
// across M: its workspace, zeroed once, serves every M up to its size (the engine's row blocks). A
// 2D-tiled kernel's counters grow with M and the partials follow them: zero them before each M.

// Call with every thread of the block, after the block's partial stores.
// Returns true in the block that must reduce the tile.
__device__ __forceinline__ bool splitk_arrive(u32* counter, int splits) {
    __shared__ bool last;
    __threadfence();  // release: this block's partials are visible before its ticket
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(counter, 1u) == (u32)(splits - 1);
        if (last) *counter = 0;  // every split has arrived: nobody else touches it in this launch
    }
    __syncthreads();
    __threadfence();  // acquire: order the ticket before reading the other splits' partials
    return last;
}

// One element's partials summed in split order, read past L1 (other SMs wrote them).
__device__ __forceinline__ float splitk_sum(const float* ws, size_t stride, int splits, size_t idx) {
    float s = 0.0f;
    for (int i = 0; i < splits; ++i) {
        float v;
        asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(ws + i * stride + idx));
        s += v;
    }
    return s;
}

// An element of Y: 16-bit (rounded to nearest even) or f32.
__device__ __forceinline__ void put(u16* y, float v) { *y = from_f32(v); }
__device__ __forceinline__ void put(float* y, float v) { *y = v; }

// The end of a kernel whose block owns one 64-column tile of Y (`ntile`) and whose warps split K:
// `red` ([WARPS][ROWS][64] f32 in shared memory, complete: call after a __syncthreads) holds
// each warp's sums; they are added in warp order, then Y is written, or with split-K this
// block's partial, and Y by the block that arrives last.
template <int WARPS, int ROWS, int SPLIT_K, typename Out>
__device__ __forceinline__ void store_column_tile(const float* red, Out* y, float* workspace, int m, int n, int ntile) {
    const size_t mn = (size_t)m * n;
    u32* counters = (u32*)workspace;  // one per 64-column tile: the grid's x
    float* partials = workspace + (SPLIT_K > 1 ? gridDim.x : 0);  // no workspace without split-K
    for (int e = threadIdx.x; e < ROWS * 64; e += WARPS * 32) {
        const int r = e / 64, col = ntile * 64 + e % 64;
        float v = 0.0f;
        for (int w = 0; w < WARPS; ++w) v += red[(w * ROWS + r) * 64 + e % 64];
        if (r < m && col < n) {
            if (SPLIT_K == 1) {
                put(y + (size_t)r * n + col, v);
            } else {
                partials[blockIdx.y * mn + (size_t)r * n + col] = v;
            }
        }
    }
    if (SPLIT_K == 1) return;
    if (!splitk_arrive(counters + ntile, SPLIT_K)) return;
    for (int e = threadIdx.x; e < ROWS * 64; e += WARPS * 32) {
        const int r = e / 64, col = ntile * 64 + e % 64;
        if (r < m && col < n) put(y + (size_t)r * n + col, splitk_sum(partials, mn, SPLIT_K, (size_t)r * n + col));
    }
}
