// The mma.sync form (every arch). Warps: HB / 16 head groups of 16 heads (the MMA's M) times 2
// halves. Both halves of a group compute S for half of the tile's keys, exchange row maxima, sums and
// P through shared memory, then each accumulates O for half of the latent dims: with latent 512,
// 16 x 256 f32 sums a warp (128 registers). An FP8 cache's tiles land in the ring as they are, and
// every thread widens the tile's entries to the bf16 tile the warps read (mla/fp8.cuh), so the math
// is the bf16 cache's on the values the FP8 entries hold.

constexpr int WARPS = HB / 16 * 2;            // a pair of warps per head group
constexpr int THREADS = WARPS * 32;
constexpr int NS = BN / 16;                   // S's n8 tiles a warp computes: half of the tile's keys

// q: [n, heads, width] bf16, the absorbed queries. table: page base pointers; logical entry t of
// `layer` is at table[t >> page_shift] + ((layer << page_shift) + t % page) * entry_bytes bytes. past: one u32, the
// committed entries; the new rows' own entries are at past .. past + n. This launch runs rows row0 +
// blockIdx.x; its workspace holds only theirs. part_o: [rows, MAX_SPLITS, heads, latent] f32,
// unnormalised; part_ml: [rows, MAX_SPLITS, heads, 2] f32, the running max (base 2) and sum.
extern "C" __global__ void __launch_bounds__(THREADS, 1) {{ name }}(
    const u16* __restrict__ q, const u64* __restrict__ table, const u32* __restrict__ past_ptr,
    const u32* __restrict__ bits, float* __restrict__ part_o, float* __restrict__ part_ml, int row0, int n,
    int heads, int latent, int rope, int layer, int page_shift, int mode, float scale_log2) {
    extern __shared__ uint4 smem[];
    __shared__ u16 vis[MAX_NEW];  // the new tokens this row sees, ascending
    __shared__ int vis_count;
    const int row = row0 + blockIdx.x, head0 = blockIdx.y * HB, split = blockIdx.z;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t = lane % 4;
    const int hg = warp / 2, half = warp % 2;
    const int width = latent + rope, qs = width + 8;  // row stride in elements: ldmatrix conflict-free

    if (warp == 0) list_visible(mode, bits, n, row, lane, vis, &vis_count);
    __syncthreads();
    const int past = (int)*past_ptr;
    int start, end, ntiles;
    if (!split_range(past + vis_count, split, start, end, ntiles)) return;

    // Shared memory: Q [HB][qs], the ring of STAGES tiles (bf16: [BN][qs]; FP8: [BN] entries as they
    // are, then the bf16 tile [BN][qs] they widen to), P [HB][BN + 8] bf16, then row maxima and sums
    // [2 halves][HB] f32.
    const int stride = entry_bytes(latent, rope);
    const int tile_bytes = BN * qs * 2, row_bytes = KV_FP8 ? stride : qs * 2, slot_bytes = BN * row_bytes;
    const u32 q_s = smem_addr(smem);
    const u32 kv_s = q_s + HB * qs * 2;
    const u32 wide_s = kv_s + STAGES * slot_bytes;  // FP8: the widened tile
    const u32 p_s = wide_s + (KV_FP8 ? tile_bytes : 0);
    constexpr int PS = BN + 8;  // P's row stride: conflict-free ldmatrix
    u16* p_ptr = (u16*)((char*)smem + (p_s - q_s));
    float* red_max = (float*)(p_ptr + HB * PS);
    float* red_sum = red_max + 2 * HB;

    // Copies run row by row: LPR lanes share a row, each taking every LPR-th 16-byte piece, so a row's
    // source address (a page-table lookup for the cache) is worked out once, not per piece.
    const int chunks = width / 8;  // 16-byte pieces of a query row
    const int pieces = stride / 16;  // of a cache entry
    const int lr = tid / LPR, lp = tid % LPR;
    // The query rows of this head group; heads past `heads` are zero (their scores are never stored).
    for (int h = lr; h < HB; h += THREADS / LPR) {
        const bool ok = head0 + h < heads;
        const u16* src = q + ((size_t)row * heads + (ok ? head0 + h : 0)) * width;
        for (int piece = lp; piece < chunks; piece += LPR) cp_async16(q_s + (h * qs + piece * 8) * 2, src + piece * 8, ok);
    }
    // Tile k of this split into slot: compact entries past `end` are zero-filled, never read.
    auto load_tile = [&](int k, int slot) {
        for (int r = lr; r < BN; r += THREADS / LPR) {
            const int ci = start + k * BN + r;
            const bool ok = ci < end;
            const char* src = (const char*)q;
            if (ok) src = entry_at(table, past, vis, ci, layer, page_shift, stride);
            const u32 dst = kv_s + slot * slot_bytes + r * row_bytes;
            for (int piece = lp; piece < pieces; piece += LPR) cp_async16(dst + piece * 16, src + (ok ? piece * 16 : 0), ok);
        }
    };
{% if kv %}
    // FP8: ring slot `slot`'s entries widened into the bf16 tile, 16 latent or 8 rope values a piece
    // (zero-filled entries widen to zeros: their scale byte is 0). Consecutive lanes take consecutive
    // entries at one piece: rows 656 (ring) and 1168 (tile) bytes apart put a warp's 16-byte loads
    // and stores on distinct banks (K2's widths).
    auto widen_tile = [&](int slot) {
        const char* ring = (const char*)smem + (kv_s - q_s) + slot * slot_bytes;
        char* tile = (char*)smem + (wide_s - q_s);
        const int lat = latent / 16, per_row = lat + rope / 8;
        for (int i = tid; i < BN * per_row; i += THREADS) {
            const int r = i % BN, p = i / BN;
            const char* src = ring + r * stride;
            u32* dst = (u32*)(tile + r * qs * 2);
            if (p < lat) {
                u32 v[8];
                widen16(*(const uint4*)(src + p * 16), (unsigned char)src[latent + p / 2], v);
                *(uint4*)(dst + p * 8) = make_uint4(v[0], v[1], v[2], v[3]);
                *(uint4*)(dst + p * 8 + 4) = make_uint4(v[4], v[5], v[6], v[7]);
            } else {
                *(uint4*)(dst + latent / 2 + (p - lat) * 4) = *(const uint4*)(src + stride - 2 * rope + (p - lat) * 16);
            }
        }
    };
{% endif %}
    // The ring: tiles 0 .. STAGES - 2 in flight (one commit group each, Q in the first) before the
    // loop waits for the first.
#pragma unroll
    for (int k = 0; k < (STAGES > 1 ? STAGES - 1 : 1); ++k) {
        if (k < ntiles) load_tile(k, k);
        cp_async_commit();
    }

    const int nto = latent / 16;  // O's n8 tiles a warp owns: half of the latent dims
    float o[MAX_LATENT / 16][4];
#pragma unroll
    for (int j = 0; j < MAX_LATENT / 16; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g and g + 8 of this head group
    const int rows[2] = {hg * 16 + g, hg * 16 + g + 8};

    for (int k = 0; k < ntiles; ++k) {
        cp_async_wait<(STAGES > 1 ? STAGES - 2 : 0)>();
        __syncthreads();  // tile k (and Q) landed for all; every warp is done with tile k - 1
        if (STAGES > 1) {
            // Into the slot tile k - 1 left: every warp passed the barrier above, so none still reads it.
            if (k + STAGES - 1 < ntiles) load_tile(k + STAGES - 1, (k + STAGES - 1) % STAGES);
            cp_async_commit();  // an empty group near the end keeps the wait's count right
        }
        u32 kb = kv_s + (k % STAGES) * slot_bytes;
{% if kv %}
        widen_tile(k % STAGES);
        __syncthreads();  // the widened tile is whole (every warp finished the last one before the barrier above)
        kb = wide_s;
{% endif %}

        // S = Q · KVᵀ for this warp's 16 heads and half of the keys, over the full width.
        float s[NS][4];
#pragma unroll
        for (int j = 0; j < NS; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
        const u32 qa = q_s + ((hg * 16 + lane % 16) * qs + (lane / 16) * 8) * 2;
        for (int kk = 0; kk < width / 16; ++kk) {
            u32 a[4];
            ldmatrix_x4(a, qa + kk * 32);
            if (NS == 1) {
                u32 b[2];
                ldmatrix_x2(b, kb + ((half * 8 + lane % 8) * qs + ((lane / 8) % 2) * 8) * 2 + kk * 32);
                mma_bf16(s[0], a, b[0], b[1]);
            } else {
#pragma unroll
                for (int p = 0; p < NS / 2; ++p) {
                    u32 b[4];
                    const int key = half * (BN / 2) + p * 16 + (lane / 16) * 8 + lane % 8;
                    ldmatrix_x4(b, kb + (key * qs + ((lane / 8) % 2) * 8) * 2 + kk * 32);
                    mma_bf16(s[2 * p], a, b[0], b[1]);
                    mma_bf16(s[2 * p + 1], a, b[2], b[3]);
                }
            }
        }

        // Online softmax: this half's row maxima, then the tile's (both halves'), in both warps alike.
        const int key0 = start + k * BN + half * (BN / 2);
        const bool partial = start + (k + 1) * BN > end;  // only a split's last tile can be
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < NS; ++j) {
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                s[j][c] *= scale_log2;
                if (partial && key0 + j * 8 + 2 * t + c % 2 >= end) s[j][c] = -INFINITY;
                mx[c / 2] = fmaxf(mx[c / 2], s[j][c]);
            }
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(~0u, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(~0u, mx[r], 2));
            if (t == 0) red_max[half * HB + rows[r]] = mx[r];
        }
        __syncthreads();
        float alpha[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            // Every tile holds at least one visible entry: the new max is finite, and an integer.
            const float mnew = ceilf(fmaxf(m[r], fmaxf(red_max[rows[r]], red_max[HB + rows[r]])));
            alpha[r] = exp2f(m[r] - mnew);
            m[r] = mnew;
        }
#pragma unroll
        for (int j = 0; j < NS; ++j) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                // The sum adds the weights P · V takes: P rounded to bf16.
                const u32 p = pack_bf16(exp2f(s[j][2 * r] - m[r]), exp2f(s[j][2 * r + 1] - m[r]));
                sum[r] += bf16_f32((u16)(p & 0xffff));
                sum[r] += bf16_f32((u16)(p >> 16));
                const int col = half * (BN / 2) + j * 8 + 2 * t;
                *(u32*)(p_ptr + rows[r] * PS + col) = p;
            }
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            sum[r] += __shfl_xor_sync(~0u, sum[r], 1);
            sum[r] += __shfl_xor_sync(~0u, sum[r], 2);
            if (t == 0) red_sum[half * HB + rows[r]] = sum[r];
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + (red_sum[rows[r]] + red_sum[HB + rows[r]]);
        // Once the max settles every alpha is exactly 1: skipping the rescale then changes no bit.
        if (__any_sync(~0u, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
            for (int j = 0; j < MAX_LATENT / 16; ++j) {
                o[j][0] *= alpha[0];
                o[j][1] *= alpha[0];
                o[j][2] *= alpha[1];
                o[j][3] *= alpha[1];
            }
        }

        // O += P · V: V is the tile's first `latent` columns, this warp's half of them.
        const u32 pa = p_s + ((hg * 16 + lane % 16) * PS + (lane / 16) * 8) * 2;
        const int mi = lane / 8;
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            u32 a[4];
            ldmatrix_x4(a, pa + kk * 32);
            const u32 vb = kb + ((kk * 16 + (mi % 2) * 8 + lane % 8) * qs + half * (latent / 2) + (mi / 2) * 8) * 2;
#pragma unroll
            for (int jp = 0; jp < MAX_LATENT / 32; ++jp) {
                if (2 * jp < nto) {
                    u32 b[4];
                    ldmatrix_x4_trans(b, vb + jp * 32);
                    mma_bf16(o[2 * jp], a, b[0], b[1]);
                    mma_bf16(o[2 * jp + 1], a, b[2], b[3]);
                }
            }
        }
        if (STAGES == 1) {
            __syncthreads();  // every warp is done with the tile's only slot
            if (k + 1 < ntiles) load_tile(k + 1, 0);
            cp_async_commit();
        }
    }

    // This split's partial: unnormalised O, and (from the first half) the max and the sum.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int head = head0 + rows[r];
        if (head >= heads) continue;
        const size_t at = ((size_t)blockIdx.x * MAX_SPLITS + split) * heads + head;
        float* dst = part_o + at * latent + half * (latent / 2) + 2 * t;
#pragma unroll
        for (int j = 0; j < MAX_LATENT / 16; ++j) {
            if (j < nto) *(float2*)(dst + j * 8) = make_float2(o[j][2 * r], o[j][2 * r + 1]);
        }
        if (half == 0 && t == 0) *(float2*)(part_ml + at * 2) = make_float2(m[r], l[r]);
    }
}
