// The stream algorithm's tile constants and the arithmetic of one pipeline stage, shared by
// w4a16_stream.cu.tera (one GEMM) and w4a16_grouped.cu.tera (all experts of an MoE layer): a warp
// holds one 64-column weight tile and up to ROWS rows of X in each stage of its own cp.async
// pipeline; the including template supplies `load_stage` (where X rows come from) and the kernel.
// Reads the axes bm, warps, bk, stages and group_size.
constexpr int ROWS = {{ bm }};                 // rows of X (m <= ROWS): the columns of NT n8 tiles of the B operand
constexpr int NT = (ROWS + 7) / 8;
constexpr int WARPS = {{ warps }};             // warps of a block: one column tile, K split among them
constexpr int BK = {{ bk }};                   // K per stage of a warp's pipeline (whole groups)
constexpr int STAGES = {{ stages }};
constexpr int GROUP = {{ group_size }};
constexpr int KT = BK / 16;                    // k16 tiles per stage
constexpr int GT = GROUP / 16;                 // k16 tiles per group
constexpr int SG = BK / GROUP;                 // groups per stage
constexpr int TILE_BYTES = 512;                // one 64 x 16 weight tile: 32 lanes x 16 bytes
constexpr int W_BYTES = KT * TILE_BYTES;
constexpr int S_BYTES = SG * 128;              // 64 scales per group
constexpr int X_STRIDE = 2 * BK + 16;          // bytes per row of X in a stage: padded so ldmatrix is conflict-free
constexpr int X_CHUNKS = ROWS * BK / 8;        // 16-byte chunks of X per stage
constexpr int X_COPIES = (X_CHUNKS + 31) / 32;
constexpr int STAGE_BYTES = W_BYTES + S_BYTES + ROWS * X_STRIDE;
constexpr int WARP_BYTES = STAGES * STAGE_BYTES;

// This warp's share of one stage: SG groups, or with FULL false the first `groups` of them (the
// last stage of K; K is a multiple of GROUP, so groups are wholly in or out). Full stages have no
// branch between their groups, so the compiler interleaves the groups' dependent mma chains.
template <bool FULL>
__device__ __forceinline__ void compute_stage(u32 slot, int groups, int lane, float (&acc)[4][NT][4]) {
    const int g = lane / 4;
    const u32 neg_bias[4] = {NEG_BIAS2, NEG_BIAS2, NEG_BIAS2, NEG_BIAS2};
#pragma unroll
    for (int gi = 0; gi < SG; ++gi) {
        if (!FULL && gi >= groups) break;
        // B fragments of the group's X: ldmatrix matrix j holds k 8j..8j+7 of 8 rows, and lane
        // (g, t) gets row g, k 2t, 2t + 1 of each: (b0, b1) of k16 tile u are matrices 2u, 2u + 1.
        u32 xb[GT][NT][2];
#pragma unroll
        for (int u = 0; u < GT; u += 2) {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                u32 r[4];
                // Below 8 rows, the rows past ROWS read the last one: they feed unused columns only.
                const int row = ROWS < 8 ? (lane % 8 < ROWS ? lane % 8 : ROWS - 1) : 8 * nt + lane % 8;
                const int kk = (gi * GT + u) * 16 + 8 * (lane / 8);
                ldmatrix_x4(r, slot + W_BYTES + S_BYTES + row * X_STRIDE + kk * 2);
                xb[u][nt][0] = r[0];
                xb[u][nt][1] = r[1];
                xb[u + 1][nt][0] = r[2];
                xb[u + 1][nt][1] = r[3];
            }
        }
        // -(magic + 8) * (sum of X over the group), per row: every column's starting value.
        float bias[NT][4] = {};
#pragma unroll
        for (int u = 0; u < GT; ++u) {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) mma_16816(bias[nt], neg_bias, xb[u][nt][0], xb[u][nt][1]);
        }
        float sums[4][NT][4];
#pragma unroll
        for (int u = 0; u < GT; ++u) {
            const uint4 wv = lds128(slot + (gi * GT + u) * TILE_BYTES + lane * 16);
            const u32 words[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                // Word i is the A fragment of columns 16i..16i+15: pairs 0, 2 at k 2t, pairs 1, 3 at 2t + 8.
                u32 p[4];
                biased_pairs(words[i], p);
                const u32 a[4] = {p[0], p[2], p[1], p[3]};
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const u32 b0 = xb[u][nt][0], b1 = xb[u][nt][1];
                    if (u == 0) {
                        mma_16816_from(sums[i][nt], a, b0, b1, bias[nt]);
                    } else {
                        mma_16816(sums[i][nt], a, b0, b1);
                    }
                }
            }
        }
        const uint4 sv = lds128(slot + W_BYTES + gi * 128 + g * 16);
        const u32 spairs[4] = {sv.x, sv.y, sv.z, sv.w};  // (column 16i + g, column 16i + 8 + g)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float sa = to_f32((u16)spairs[i]), sb = to_f32((u16)(spairs[i] >> 16));
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                acc[i][nt][0] = fmaf(sa, sums[i][nt][0], acc[i][nt][0]);
                acc[i][nt][1] = fmaf(sa, sums[i][nt][1], acc[i][nt][1]);
                acc[i][nt][2] = fmaf(sb, sums[i][nt][2], acc[i][nt][2]);
                acc[i][nt][3] = fmaf(sb, sums[i][nt][3], acc[i][nt][3]);
            }
        }
    }
}
