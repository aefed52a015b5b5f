// The wgmma form (sm_90a): two warpgroups take the 64 heads of one row (the instruction's M) and one
// split. Q and each tile sit in shared memory as 64-column blocks (64 or BN rows x 128 bytes) in the
// 128-byte swizzle, so one copy of a tile is S's B operand (K-major: entries x width) and P · V's
// (MN-major: the same bytes, read transposed). Per tile, warpgroup 0 computes S = Q · KVᵀ (m64nBNk16,
// four per column block) and the online softmax, and leaves P (bf16, in the same swizzle) and each
// head's rescale in shared memory; then each warpgroup rescales and accumulates O for its half of the
// latent dims (m64n256k16, 128 f32 sums a thread). 32-entry tiles fit 4 stages beside Q, 64-entry
// ones 2: more bytes in flight against fewer softmax steps. Tensor cores read a tile once a block, where the
// mma form's warps read it once per 16 heads. Columns past the entry's width are zero in Q and in
// every tile (all WB blocks, whatever the width: a fixed count of wgmmas keeps them pipelined), so
// S sums the entry's own products only.
//
// An FP8 cache's tiles land as they are in a ring of their own, and warpgroup 1 widens tile k + 1
// into the other of two swizzled bf16 tiles while warpgroup 0 computes S and the softmax of tile k
// (warpgroup 1's idle time in the bf16 form), so the math reads bf16 tiles as it does for a bf16
// cache.

{% include "common/wgmma.cuh" %}

constexpr int THREADS = 256;
constexpr int WB = (MAX_LATENT + MAX_ROPE) / 64;  // 64-column blocks of the widest entry
constexpr int QBLOCK = 64 * 128;             // a column block of Q (64 heads) or of P
constexpr int KBLOCK = BN * 128;             // a column block of a tile
constexpr int Q_BYTES = WB * QBLOCK;
constexpr int TILE_BYTES = WB * KBLOCK;
constexpr int HALF = MAX_LATENT / 2;         // latent dims a warpgroup accumulates: P · V's N
// FP8: the widest entry as it is stored (latent codes and scales padded to 16 bytes, bf16 rope), and
// the ring of STAGES raw tiles beside two widened ones; bf16: STAGES tiles.
constexpr int RAW_ROW = fp8_entry_bytes(MAX_LATENT, MAX_ROPE);
// P after the ring starts a swizzle atom: the raw ring is rounded up to 1024 bytes.
constexpr int RAW_BYTES = (STAGES * BN * RAW_ROW + 1023) / 1024 * 1024;
constexpr int RING_BYTES = KV_FP8 ? 2 * TILE_BYTES + RAW_BYTES : STAGES * TILE_BYTES;
static_assert(HB == 64 && (BN == 32 || BN == 64), "the wgmma form takes 64 heads and 32- or 64-entry tiles");
{% set ns = bn / 2 %}
// s (BN / 2 sums a thread) += A · Bᵀ, m64nBNk16, both K-major from shared memory.
__device__ __forceinline__ void wgmma_s(float (&d)[BN / 2], u64 a, u64 b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %{{ ns + 2 }}, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n{{ bn }}k16.f32.bf16.bf16 {"
        {% for i in range(end=ns) %}"%{{ i }}{% if not loop.last %}, {% endif %}"{% endfor %}
        "}, %{{ ns }}, %{{ ns + 1 }}, p, 1, 1, 0, 0;\n}\n"
        : {% for i in range(end=ns) %}"+f"(d[{{ i }}]){% if not loop.last %}, {% endif %}{% endfor %}
        : "l"(a), "l"(b), "r"(1));
}

// o (128 sums a thread) += A · B, m64n256k16: A K-major, B MN-major (the transpose flag), both from
// shared memory.
__device__ __forceinline__ void wgmma_pv(float (&d)[128], u64 a, u64 b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        {% for i in range(end=128) %}"%{{ i }}{% if not loop.last %}, {% endif %}"{% endfor %}
        "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
        : {% for i in range(end=128) %}"+f"(d[{{ i }}]){% if not loop.last %}, {% endif %}{% endfor %}
        : "l"(a), "l"(b), "r"(1));
}

// The arguments and outputs are the mma form's (see there).
extern "C" __global__ void __launch_bounds__(THREADS, 1) {{ name }}(
    const u16* __restrict__ q, const u64* __restrict__ table, const u32* __restrict__ past_ptr,
    const u32* __restrict__ bits, float* __restrict__ part_o, float* __restrict__ part_ml, int row0, int n,
    int heads, int latent, int rope, int layer, int page_shift, int mode, float scale_log2) {
    // Shared memory, all dynamic (its base is then 1024-aligned, as the swizzle atoms must be): Q,
    // the tiles (RING_BYTES), P [64 heads][BN entries] bf16 (in one 64-column block), the heads'
    // rescales [64] f32, the visible list and its count.
    extern __shared__ uint4 smem[];
    const u32 q_s = smem_addr(smem);
    if (q_s % 1024 != 0) __trap();  // the descriptors' base offset 0 assumes aligned atoms
    const u32 kv_s = q_s + Q_BYTES;  // FP8: the two widened tiles, then the raw ring
    const u32 p_s = kv_s + RING_BYTES;
    u32* p_words = (u32*)((char*)smem + Q_BYTES + RING_BYTES);
    float* alpha_s = (float*)((char*)p_words + QBLOCK);
    u16* vis = (u16*)(alpha_s + HB);
    int* vis_count = (int*)(vis + MAX_NEW);

    const int row = row0 + blockIdx.x, head0 = blockIdx.y * HB, split = blockIdx.z;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t = lane % 4;
    const int wg = warp / 4;
    const int r0 = (warp % 4) * 16 + g;  // this thread's rows of S, P and O: r0 and r0 + 8
    const int width = latent + rope;

    if (warp == 0) list_visible(mode, bits, n, row, lane, vis, vis_count);
    __syncthreads();
    const int past = (int)*past_ptr;
    int start, end, ntiles;
    if (!split_range(past + *vis_count, split, start, end, ntiles)) return;

    // Copies go row by row: LPR lanes a row, lane lp taking 16-byte piece lp of each column block to
    // its swizzled place (piece c of row r lands at c ^ (r % 8): address bits 4-6 XOR bits 7-9, as the
    // descriptors name). Pieces past the width, and rows not ok, are zero-filled.
    const int lr = tid / LPR, lp = tid % LPR;
    auto load_row = [&](u32 dst, int block_bytes, int r, const u16* src, bool ok) {
#pragma unroll
        for (int b = 0; b < WB; ++b) {
            const int col = (b * 8 + lp) * 8;
            const bool in = ok && col < width;
            cp_async16(dst + b * block_bytes + r * 128 + ((lp ^ (r % 8)) << 4), in ? src + col : q, in);
        }
    };
    // The query rows; heads past `heads` are zero (their scores are never stored).
    for (int h = lr; h < HB; h += THREADS / LPR) {
        const bool ok = head0 + h < heads;
        load_row(q_s, QBLOCK, h, q + ((size_t)row * heads + (ok ? head0 + h : 0)) * width, ok);
    }
    // Warpgroup 1 copies the tiles, so that warpgroup 0 starts S as soon as a tile has landed, with
    // no copies of its own to issue first: LPR lanes a row, rows cr, cr + 16, ... A tile's copies take
    // their rows' sources from `src` (null past `end`: zero-filled, never read), which `locate` fills
    // a tile ahead: the page-table reads' latency then hides behind a tile's math.
    constexpr int COPIERS = THREADS / 2;
    constexpr int ROWS = BN / (COPIERS / LPR);
    const int cr = (tid - COPIERS) / LPR;
    const int stride = entry_bytes(latent, rope);
    const char* src[ROWS];
    auto locate = [&](int k) {
        if (wg != 1) return;
#pragma unroll
        for (int i = 0; i < ROWS; ++i) {
            const int ci = start + k * BN + cr + i * (COPIERS / LPR);
            src[i] = k < ntiles && ci < end ? entry_at(table, past, vis, ci, layer, page_shift, stride) : nullptr;
        }
    };
{% if kv %}
    // Raw tile k into ring slot k % STAGES, entries as they are (rows past `end` zero-filled: they
    // widen to zeros, their scale byte being 0).
    const u32 raw_s = kv_s + 2 * TILE_BYTES;
    auto load_tile = [&](int k) {
        if (wg != 1) return;
#pragma unroll
        for (int i = 0; i < ROWS; ++i) {
            const u32 dst = raw_s + ((k % STAGES) * BN + cr + i * (COPIERS / LPR)) * RAW_ROW;
            const bool ok = src[i] != nullptr;
            for (int piece = lp; piece < stride / 16; piece += LPR) {
                cp_async16(dst + piece * 16, ok ? src[i] + piece * 16 : (const char*)q, ok);
            }
        }
    };
    // Warpgroup 1 widens raw tile k into widened tile k % 2, in the swizzle: value piece c (8 values)
    // of row r at column block c / 8, place (c % 8) ^ (r % 8). Lane i takes row i % BN, so a warp's
    // loads and stores at one piece span every bank (entries 656 bytes apart; the swizzle's eight
    // places), and pieces PPT i / BN .. of it: their scale bytes are one word.
    constexpr int PPT = MAX_LATENT / 16 / (COPIERS / BN);  // latent pieces (16 codes) a lane widens
    constexpr int RPT = MAX_ROPE / 8 / (COPIERS / BN);     // rope pieces (8 bf16) a lane copies
    static_assert(PPT == 8, "a lane's scale bytes are one word: 32-entry tiles");
    const int lat = latent / 16;
    // Warpgroup 1's own barrier (named barrier 1): its threads' copies of a raw tile, each waited for
    // by the thread that issued it, are all in place before any thread widens them.
    auto copiers_sync = [] { asm volatile("bar.sync 1, 128;" ::: "memory"); };
    auto widen = [&](int k) {
        const int r = (tid - COPIERS) % BN, part = (tid - COPIERS) / BN;
        const char* e = (const char*)smem + Q_BYTES + 2 * TILE_BYTES + ((k % STAGES) * BN + r) * RAW_ROW;
        char* tile = (char*)smem + Q_BYTES + (k % 2) * TILE_BYTES;
        auto at = [&](int c) { return (uint4*)(tile + (c / 8) * KBLOCK + r * 128 + (((c % 8) ^ (r % 8)) << 4)); };
        const u32 scales = part * PPT < lat ? *(const u32*)(e + latent + part * PPT / 2) : 0;
#pragma unroll
        for (int j = 0; j < PPT; ++j) {
            const int p = part * PPT + j;
            if (p < lat) {
                u32 v[8];
                widen16(*(const uint4*)(e + p * 16), (unsigned char)(scales >> (8 * (j / 2))), v);
                *at(2 * p) = make_uint4(v[0], v[1], v[2], v[3]);
                *at(2 * p + 1) = make_uint4(v[4], v[5], v[6], v[7]);
            }
        }
#pragma unroll
        for (int j = 0; j < RPT; ++j) {
            const int p = part * RPT + j;
            if (p < rope / 8) *at(latent / 8 + p) = *(const uint4*)(e + stride - 2 * rope + p * 16);
        }
    };
    // Pieces past the width are never widened: zero in both widened tiles once.
    for (int i = tid; i < 2 * BN * (WB * 8 - width / 8); i += THREADS) {
        const int per = WB * 8 - width / 8, slot = i / (BN * per), r = i / per % BN, c = width / 8 + i % per;
        *(uint4*)((char*)smem + Q_BYTES + slot * TILE_BYTES + (c / 8) * KBLOCK + r * 128 + (((c % 8) ^ (r % 8)) << 4)) =
            make_uint4(0, 0, 0, 0);
    }
    // The raw ring runs STAGES tiles ahead of the widening, which runs one ahead of the math.
    locate(0);
#pragma unroll
    for (int k = 0; k < STAGES; ++k) {
        if (k < ntiles) load_tile(k);
        cp_async_commit();
        locate(k + 1);
    }
    cp_async_wait<STAGES - 1>();  // Q and raw tile 0
    if (wg == 1) {
        copiers_sync();
        widen(0);
    }
{% else %}
    auto load_tile = [&](int slot) {
        if (wg != 1) return;
#pragma unroll
        for (int i = 0; i < ROWS; ++i) {
            const u16* row_src = (const u16*)src[i];
            load_row(kv_s + slot * TILE_BYTES, KBLOCK, cr + i * (COPIERS / LPR), row_src ? row_src : q, row_src != nullptr);
        }
    };
    locate(0);
#pragma unroll
    for (int k = 0; k < (STAGES > 1 ? STAGES - 1 : 1); ++k) {
        if (k < ntiles) load_tile(k);
        cp_async_commit();
        locate(k + 1);
    }
{% endif %}

    float o[128];
#pragma unroll
    for (int j = 0; j < 128; ++j) o[j] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // warpgroup 0's rows r0, r0 + 8
    const bool o_live = wg * HALF < latent;  // warpgroup 1 adds nothing to a latent of 256 or less

    for (int k = 0; k < ntiles; ++k) {
{% if kv %}
        fence_proxy_async();
        __syncthreads();  // tile k is widened, visible to wgmma; both P · V of tile k - 1 are done
        if (k + STAGES < ntiles) load_tile(k + STAGES);  // into the raw slot widening tile k emptied
        cp_async_commit();  // an empty group near the end keeps the wait's count right
        locate(k + STAGES + 1);
        if (wg == 1 && k + 1 < ntiles) {
            cp_async_wait<STAGES - 1>();  // raw tile k + 1
            copiers_sync();
            widen(k + 1);  // into the tile k - 1 left: both P · V of it are done
        }
        const u32 kb = kv_s + (k % 2) * TILE_BYTES;
{% else %}
        cp_async_wait<(STAGES > 1 ? STAGES - 2 : 0)>();
        fence_proxy_async();
        __syncthreads();  // tile k (and Q) landed, visible to wgmma; both P · V of tile k - 1 are done
        if (STAGES > 1) {
            if (k + STAGES - 1 < ntiles) load_tile((k + STAGES - 1) % STAGES);
            cp_async_commit();  // an empty group near the end keeps the wait's count right
            locate(k + STAGES);
        }
        const u32 kb = kv_s + (k % STAGES) * TILE_BYTES;
{% endif %}

        if (wg == 0) {
            float s[BN / 2];
#pragma unroll
            for (int j = 0; j < BN / 2; ++j) {
                s[j] = 0.0f;
                pin(s[j]);  // zeroed before the fence, or ptxas serializes the wgmmas
            }
            wgmma_fence();
#pragma unroll
            for (int b = 0; b < WB; ++b) {
#pragma unroll
                for (int kk = 0; kk < 4; ++kk) {
                    wgmma_s(s, desc_sw128(q_s + b * QBLOCK + kk * 32), desc_sw128(kb + b * KBLOCK + kk * 32));
                }
            }
            wgmma_commit();
            wgmma_wait<0>();

            // Online softmax. Sum 4j + c of a thread is row r0 + 8 (c / 2), entry 8j + 2t + c % 2: a
            // row's BN entries lie in one quad of lanes.
            const int key0 = start + k * BN;
            const bool partial = start + (k + 1) * BN > end;  // only a split's last tile can be
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    float& x = s[4 * j + c];
                    x *= scale_log2;
                    if (partial && key0 + 8 * j + 2 * t + c % 2 >= end) x = -INFINITY;
                    mx[c / 2] = fmaxf(mx[c / 2], x);
                }
            }
            float alpha[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(~0u, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(~0u, mx[r], 2));
                // Every tile holds at least one visible entry: the new max is finite, and an integer.
                const float mnew = ceilf(fmaxf(m[r], mx[r]));
                alpha[r] = exp2f(m[r] - mnew);
                m[r] = mnew;
            }
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    // The sum adds the weights P · V takes: P rounded to bf16.
                    const u32 p = pack_bf16(exp2f(s[4 * j + 2 * r] - m[r]), exp2f(s[4 * j + 2 * r + 1] - m[r]));
                    sum[r] += bf16_f32((u16)(p & 0xffff));
                    sum[r] += bf16_f32((u16)(p >> 16));
                    const int pr = r0 + 8 * r;
                    p_words[(pr * 128 + ((j ^ (pr % 8)) << 4) + 4 * t) / 4] = p;
                }
            }
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                sum[r] += __shfl_xor_sync(~0u, sum[r], 1);
                sum[r] += __shfl_xor_sync(~0u, sum[r], 2);
                l[r] = l[r] * alpha[r] + sum[r];
                if (t == 0) alpha_s[r0 + 8 * r] = alpha[r];
            }
            fence_proxy_async();  // P's stores, for the wgmmas that read them
        }
{% if kv %}
        if (wg == 1) fence_proxy_async();  // the widened tile k + 1's stores, for the next S
{% endif %}
        __syncthreads();  // P and the rescales are in shared memory

        if (o_live) {
            const float a0 = alpha_s[r0], a1 = alpha_s[r0 + 8];
            // Once the max settles every alpha is exactly 1: skipping the rescale then changes no bit.
            if (__any_sync(~0u, a0 != 1.0f || a1 != 1.0f)) {
#pragma unroll
                for (int j = 0; j < 32; ++j) {
                    o[4 * j] *= a0;
                    o[4 * j + 1] *= a0;
                    o[4 * j + 2] *= a1;
                    o[4 * j + 3] *= a1;
                }
            }
#pragma unroll
            for (int j = 0; j < 128; ++j) pin(o[j]);  // rescaled before the fence
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) {
                // 16 entries (two 8-row atoms) from entry 16 kk; this warpgroup's 4 column blocks.
                wgmma_pv(o, desc_sw128(p_s + kk * 32), desc_sw128_mn(kb + wg * 4 * KBLOCK + kk * 16 * 128, KBLOCK));
            }
            wgmma_commit();
            wgmma_wait<0>();
        }
        if (STAGES == 1 && !KV_FP8) {
            __syncthreads();  // both warpgroups are done with the tile's only slot
            if (k + 1 < ntiles) load_tile(0);
            cp_async_commit();
            locate(k + 2);
        }
    }

    // This split's partial: unnormalised O (each warpgroup its half), the max and the sum.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int head = head0 + r0 + 8 * r;
        if (head >= heads) continue;
        const size_t at = ((size_t)blockIdx.x * MAX_SPLITS + split) * heads + head;
        float* dst = part_o + at * latent + wg * HALF + 2 * t;
#pragma unroll
        for (int j = 0; j < 32; ++j) {
            if (wg * HALF + 8 * j < latent) *(float2*)(dst + 8 * j) = make_float2(o[4 * j + 2 * r], o[4 * j + 2 * r + 1]);
        }
        if (wg == 0 && t == 0) *(float2*)(part_ml + at * 2) = make_float2(m[r], l[r]);
    }
}
