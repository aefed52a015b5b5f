//! The raw launchers: one `#[kernel]` per CUDA source under `cuda/`. They trust their scalar arguments
//! to describe the buffers, hence `unsafe`; [`crate::ops`] wraps each in a function that checks lengths.

use cudarc::driver::{CudaSlice, CudaView};
use kdtree_jit::kernel::{KernelDef, kernel};

/// RMSNorm of `rows` rows of `cols`, `x_stride` apart in `x`: `out = x / sqrt(mean(x²) + eps) * weight`.
#[kernel(file = "cuda/rmsnorm.cu", grid = rows, block = 256)]
pub unsafe fn rmsnorm(
    x: &CudaView<f32>,
    weight: &CudaSlice<f32>,
    out: &mut CudaSlice<f32>,
    rows: u32,
    cols: u32,
    x_stride: u32,
    eps: f32,
);

/// [`rmsnorm()`], and `out` rounded to bf16 bits into `bits` (`rows * cols` values).
#[kernel(file = "cuda/rmsnorm.cu", grid = rows, block = 256)]
pub unsafe fn rmsnorm_bf16(
    x: &CudaView<f32>,
    weight: &CudaSlice<f32>,
    out: &mut CudaSlice<f32>,
    bits: &mut CudaSlice<u16>,
    rows: u32,
    cols: u32,
    x_stride: u32,
    eps: f32,
);

/// `x += y`, then [`rmsnorm()`] of the sum into `out`.
#[kernel(file = "cuda/rmsnorm.cu", grid = rows, block = 256)]
pub unsafe fn add_rmsnorm(
    x: &mut CudaSlice<f32>,
    y: &CudaSlice<f32>,
    weight: &CudaSlice<f32>,
    out: &mut CudaSlice<f32>,
    rows: u32,
    cols: u32,
    eps: f32,
);

/// [`add_rmsnorm()`], and `out` rounded to bf16 bits into `bits` (`rows * cols` values).
#[kernel(file = "cuda/rmsnorm.cu", grid = rows, block = 256)]
pub unsafe fn add_rmsnorm_bf16(
    x: &mut CudaSlice<f32>,
    y: &CudaSlice<f32>,
    weight: &CudaSlice<f32>,
    out: &mut CudaSlice<f32>,
    bits: &mut CudaSlice<u16>,
    rows: u32,
    cols: u32,
    eps: f32,
);

/// `out = silu(gate) * up` over `n` elements.
#[kernel(file = "cuda/silu_mul.cu", grid = n.div_ceil(256), block = 256)]
pub unsafe fn silu_mul(gate: &CudaSlice<f32>, up: &CudaSlice<f32>, out: &mut CudaSlice<f32>, n: u32);

/// Rotates adjacent pairs of `x` ([rows, heads, head_dim]) in place by the table rows `positions`.
#[kernel(file = "cuda/rope_interleaved.cu", grid = (rows * heads * (head_dim / 2)).div_ceil(256), block = 256)]
pub unsafe fn rope_interleaved(
    x: &mut CudaSlice<f32>,
    positions: &CudaSlice<u32>,
    cos: &CudaSlice<f32>,
    sin: &CudaSlice<f32>,
    rows: u32,
    heads: u32,
    head_dim: u32,
);

/// Row-wise softmax of `rows` rows of `cols`, in place.
#[kernel(template = "cuda/softmax.cu.tera", params(BLOCK = 1024), grid = rows, block = 1024)]
pub unsafe fn softmax(x: &mut CudaSlice<f32>, rows: u32, cols: u32);

/// The best (value, index) of each `chunk` columns of `rows` rows of `cols`, into `part_v`/`part_i`
/// ([rows, cols.div_ceil(chunk)]); `chunk` is a multiple of 4.
#[kernel(template = "cuda/argmax.cu.tera", params(BLOCK = 1024), grid = (rows, cols.div_ceil(chunk)), block = 1024)]
pub unsafe fn argmax_partial(
    x: &CudaSlice<f32>,
    part_v: &mut CudaSlice<f32>,
    part_i: &mut CudaSlice<u32>,
    rows: u32,
    cols: u32,
    chunk: u32,
);

/// Each row's argmax from its `chunks` partial results, into `out` (`[rows]`).
#[kernel(template = "cuda/argmax.cu.tera", params(BLOCK = 1024), grid = rows, block = 32)]
pub unsafe fn argmax_finish(
    part_v: &CudaSlice<f32>,
    part_i: &CudaSlice<u32>,
    out: &mut CudaSlice<u32>,
    rows: u32,
    chunks: u32,
);

/// Gathers rows `ids` of `table` ([vocab, dim]) into `out` ([n_ids, dim]).
#[kernel(file = "cuda/embedding.cu", grid = n_ids, block = 256)]
pub unsafe fn embedding(
    table: &CudaSlice<f32>,
    ids: &CudaSlice<u32>,
    out: &mut CudaSlice<f32>,
    n_ids: u32,
    vocab: u32,
    dim: u32,
);

/// Rows `ids` of a bf16 `table` ([vocab, dim], bits) into f32 `out` ([n_ids, dim]); an id past the
/// table gives a row of NaN.
#[kernel(file = "cuda/embedding.cu", grid = n_ids, block = 256)]
pub unsafe fn embedding_bf16(
    table: &CudaSlice<u16>,
    ids: &CudaSlice<u32>,
    out: &mut CudaSlice<f32>,
    n_ids: u32,
    vocab: u32,
    dim: u32,
);

/// `out[i] = bf16(x[i])` (bits) for `i < n`, rounding to nearest even as `half::bf16::from_f32`.
#[kernel(file = "cuda/cast.cu", grid = n.div_ceil(1024), block = 256)]
pub unsafe fn f32_to_bf16(x: &CudaSlice<f32>, out: &mut CudaSlice<u16>, n: u32);

/// `out[i] = f16(x[i])` (bits) for `i < n`, rounding to nearest even as `half::f16::from_f32`.
#[kernel(file = "cuda/cast.cu", grid = n.div_ceil(1024), block = 256)]
pub unsafe fn f32_to_f16(x: &CudaSlice<f32>, out: &mut CudaSlice<u16>, n: u32);

/// `out[i] = f32(x[i])` for `i < n`, `x` bf16 bits.
#[kernel(file = "cuda/cast.cu", grid = n.div_ceil(1024), block = 256)]
pub unsafe fn bf16_to_f32(x: &CudaSlice<u16>, out: &mut CudaSlice<f32>, n: u32);

/// `out[i] = f32(x[i])` for `i < n`, `x` f16 bits.
#[kernel(file = "cuda/cast.cu", grid = n.div_ceil(1024), block = 256)]
pub unsafe fn f16_to_f32(x: &CudaSlice<u16>, out: &mut CudaSlice<f32>, n: u32);

/// `x[i] += y[i]` for `i < n`.
#[kernel(file = "cuda/add_assign.cu", grid = n.div_ceil(1024), block = 256)]
pub unsafe fn add_assign(x: &mut CudaSlice<f32>, y: &CudaSlice<f32>, n: u32);

/// `out[r * out_stride + out_offset + c] = x[r * x_stride + x_offset + c]` for `r < rows`, `c < cols`.
#[kernel(file = "cuda/rows.cu", grid = rows, block = 128)]
pub unsafe fn copy_cols(
    x: &CudaSlice<f32>,
    out: &mut CudaSlice<f32>,
    rows: u32,
    x_stride: u32,
    x_offset: u32,
    out_stride: u32,
    out_offset: u32,
    cols: u32,
);

/// `out[i] = src[idx[i]]` for `i < m`, rows of `cols` 16-bit values; an index past `src_rows` gives a
/// row of NaN bits.
#[kernel(file = "cuda/rows.cu", grid = m, block = 128)]
pub unsafe fn gather_rows_u16(
    src: &CudaSlice<u16>,
    idx: &CudaView<u32>,
    out: &mut CudaSlice<u16>,
    m: u32,
    src_rows: u32,
    cols: u32,
);

/// `out[i] = src[idx[i]]` for `i < m`, rows of `cols` f32; an index past `src_rows` gives a row of NaN.
#[kernel(file = "cuda/rows.cu", grid = m, block = 128)]
pub unsafe fn gather_rows_f32(
    src: &CudaSlice<f32>,
    idx: &CudaView<u32>,
    out: &mut CudaSlice<f32>,
    m: u32,
    src_rows: u32,
    cols: u32,
);

/// `dst[idx[i]] = f32(src[i])` for `i < m`, `src` bf16 bits; an index past `dst_rows` writes nothing.
#[kernel(file = "cuda/rows.cu", grid = m, block = 128)]
pub unsafe fn scatter_rows_bf16_to_f32(
    src: &CudaSlice<u16>,
    idx: &CudaView<u32>,
    dst: &mut CudaSlice<f32>,
    m: u32,
    dst_rows: u32,
    cols: u32,
);

/// `out[r] = bf16(silu(x[r, ..inter]) * x[r, inter..])` for `r < rows`, `x` f32.
#[kernel(file = "cuda/silu_mul.cu", grid = (rows, inter.div_ceil(1024)), block = 256)]
pub unsafe fn silu_mul_halves_f32(x: &CudaSlice<f32>, out: &mut CudaSlice<u16>, rows: u32, inter: u32);

/// `out[r] = bf16(silu(x[r, ..inter]) * x[r, inter..])` for `r < rows`, `x` bf16 bits.
#[kernel(file = "cuda/silu_mul.cu", grid = (rows, inter.div_ceil(1024)), block = 256)]
pub unsafe fn silu_mul_halves_bf16(x: &CudaSlice<u16>, out: &mut CudaSlice<u16>, rows: u32, inter: u32);

/// Rotates columns `[offset, offset + dim)` of every head of `x` ([rows, heads, head_stride]) in place,
/// row r by table row `positions[r]` (below `max_pos`, else NaN); adjacent pairs, or `(i, i + dim/2)`
/// pairs when `half_split`.
#[kernel(file = "cuda/rope_strided.cu", grid = (rows * heads * (dim / 2)).div_ceil(256), block = 256)]
pub unsafe fn rope_strided(
    x: &mut CudaSlice<f32>,
    positions: &CudaSlice<u32>,
    cos: &CudaSlice<f32>,
    sin: &CudaSlice<f32>,
    rows: u32,
    heads: u32,
    head_stride: u32,
    offset: u32,
    dim: u32,
    max_pos: u32,
    half_split: bool,
);

/// DeepSeek-V3's `noaux_tc` router, one warp per token.
#[kernel(file = "cuda/route.cu", grid = tokens, block = 32)]
pub unsafe fn route_noaux_tc(
    logits: &CudaSlice<f32>,
    bias: &CudaSlice<f32>,
    ids: &mut CudaSlice<u32>,
    weights: &mut CudaSlice<f32>,
    tokens: u32,
    experts: u32,
    top_k: u32,
    n_group: u32,
    topk_group: u32,
    norm_topk_prob: bool,
    routed_scaling_factor: f32,
);

/// `out[t] = sum over s < k of weights[t, s] * slots[t * k + s]`, ascending s.
#[kernel(file = "cuda/moe_combine.cu", grid = tokens, block = 256)]
pub unsafe fn moe_combine(
    slots: &CudaSlice<f32>,
    weights: &CudaSlice<f32>,
    out: &mut CudaSlice<f32>,
    tokens: u32,
    k: u32,
    h: u32,
);

/// Sorts the `n` assignments `ids` by expert (ids >= `experts` last) into `sorted` (and its inverse,
/// each assignment's sorted position, into `positions`), with each expert's
/// start in `offsets` (`[experts + 1]`), tiles of at most `bm` rows in `tiles` (`[3 * max_tiles]`) and
/// (tiles, experts touched, invalid ids) in `meta`. One block.
#[kernel(file = "cuda/moe_align.cu", grid = 1u32, block = 1024u32)]
pub unsafe fn moe_align(
    ids: &CudaView<u32>,
    sorted: &mut CudaSlice<u32>,
    positions: &mut CudaSlice<u32>,
    offsets: &mut CudaSlice<u32>,
    tiles: &mut CudaSlice<u32>,
    meta: &mut CudaSlice<u32>,
    n: u32,
    experts: u32,
    bm: u32,
    max_tiles: u32,
);
/// `out[t] = sum over s < k of weights[t, s] * f32(rows[positions[t * k + s]])`, ascending s, `rows`
/// bf16 bits `[n_rows, h]`; a position past `n_rows` makes token t's row NaN. A block per token and
/// 1024 columns (the kernel's COLS).
#[kernel(file = "cuda/moe_combine.cu", grid = (tokens, h.div_ceil(1024)), block = 256)]
pub unsafe fn moe_combine_sorted_bf16(
    rows: &CudaSlice<u16>,
    positions: &CudaView<u32>,
    weights: &CudaSlice<f32>,
    out: &mut CudaSlice<f32>,
    tokens: u32,
    k: u32,
    h: u32,
    n_rows: u32,
);

/// Adds to `count[0]` how many of the `n` values of `x` are NaN or infinite; a grid of at most 1024
/// blocks, each thread a grid-stride share of at least 16 values.
#[kernel(file = "cuda/finite.cu", grid = n.div_ceil(4096).clamp(1, 1024), block = 256)]
pub unsafe fn count_nonfinite(x: &CudaSlice<f32>, count: &mut CudaSlice<u32>, n: u32);

/// Grouped-query attention of `n` query rows over `ctx` context keys then the `n` block's, a block per
/// (kv head, row, split of `chunk` keys) and a warp per query head of the group, into per-split
/// outputs `part_o` (`[n, heads, splits, head_dim]`) and (max, sum) pairs `part_ml`. Its shared memory
/// is [`crate::shape::GqaArgs::shared`].
#[kernel(
    file = "cuda/gqa_attention.cu",
    grid = (kv_heads, n, splits),
    block = 32 * (heads / kv_heads),
    shared = 4 * ((heads / kv_heads) * head_dim + 32 * (2 * head_dim + 1))
)]
pub unsafe fn gqa_attention_partial(
    q: &CudaSlice<f32>,
    ctx_k: &CudaSlice<f32>,
    ctx_v: &CudaSlice<f32>,
    blk_k: &CudaSlice<f32>,
    blk_v: &CudaSlice<f32>,
    part_o: &mut CudaSlice<f32>,
    part_ml: &mut CudaSlice<f32>,
    n: u32,
    ctx: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    splits: u32,
    chunk: u32,
    scale: f32,
);

/// Each of `rows_heads` (row, head) outputs from its `splits` partials.
#[kernel(file = "cuda/gqa_attention.cu", grid = rows_heads, block = 128)]
pub unsafe fn gqa_attention_combine(
    part_o: &CudaSlice<f32>,
    part_ml: &CudaSlice<f32>,
    out: &mut CudaSlice<f32>,
    rows_heads: u32,
    splits: u32,
    head_dim: u32,
);

/// Per chunk of `chunk` tokens of each row of `logits` (`[rows, vocab]`, transformed: `× multiplier`,
/// then `softcap · tanh(x / softcap)` where `softcap > 0`): its max and sum of exponentials, into `part`
/// (`[rows, chunks, 2]`). `chunk` is [`crate::shape::TOP_K_CHUNK`].
#[kernel(file = "cuda/top_k.cu", grid = (vocab.div_ceil(chunk), rows), block = 256)]
pub unsafe fn top_k_max_sum(
    logits: &CudaSlice<f32>,
    part: &mut CudaSlice<f32>,
    rows: u32,
    vocab: u32,
    chunk: u32,
    multiplier: f32,
    softcap: f32,
);

/// Per chunk: its best `k` log-probs (the row's log-softmax, from `part`) into `cand_token`/`cand_lp`
/// (`[rows, chunks, k]`, token order), how many into `cand_count` (`[rows, chunks]`).
#[kernel(file = "cuda/top_k.cu", grid = (vocab.div_ceil(chunk), rows), block = 256)]
pub unsafe fn top_k_chunk(
    logits: &CudaSlice<f32>,
    part: &CudaSlice<f32>,
    cand_token: &mut CudaSlice<u32>,
    cand_lp: &mut CudaSlice<f32>,
    cand_count: &mut CudaSlice<u32>,
    rows: u32,
    vocab: u32,
    chunk: u32,
    k: u32,
    multiplier: f32,
    softcap: f32,
);

/// Per row: the best `k` of its chunks' candidates into `tokens`/`log_probs` (`[rows, k]`, token
/// order), how many into `counts` (`[rows]`).
#[kernel(file = "cuda/top_k.cu", grid = rows, block = 256)]
pub unsafe fn top_k_merge(
    cand_token: &CudaSlice<u32>,
    cand_lp: &CudaSlice<f32>,
    cand_count: &CudaSlice<u32>,
    tokens: &mut CudaSlice<u32>,
    log_probs: &mut CudaSlice<f32>,
    counts: &mut CudaSlice<u32>,
    rows: u32,
    chunks: u32,
    k: u32,
);

/// This crate's kernels; naming them also links their registrations into the program.
pub fn all() -> [&'static KernelDef; 33] {
    [
        &rmsnorm::KERNEL,
        &rmsnorm_bf16::KERNEL,
        &add_rmsnorm::KERNEL,
        &add_rmsnorm_bf16::KERNEL,
        &silu_mul::KERNEL,
        &rope_interleaved::KERNEL,
        &softmax::KERNEL,
        &argmax_partial::KERNEL,
        &argmax_finish::KERNEL,
        &embedding::KERNEL,
        &embedding_bf16::KERNEL,
        &f32_to_bf16::KERNEL,
        &f32_to_f16::KERNEL,
        &bf16_to_f32::KERNEL,
        &f16_to_f32::KERNEL,
        &add_assign::KERNEL,
        &copy_cols::KERNEL,
        &gather_rows_u16::KERNEL,
        &gather_rows_f32::KERNEL,
        &scatter_rows_bf16_to_f32::KERNEL,
        &silu_mul_halves_f32::KERNEL,
        &silu_mul_halves_bf16::KERNEL,
        &rope_strided::KERNEL,
        &route_noaux_tc::KERNEL,
        &moe_combine::KERNEL,
        &moe_combine_sorted_bf16::KERNEL,
        &moe_align::KERNEL,
        &count_nonfinite::KERNEL,
        &gqa_attention_partial::KERNEL,
        &gqa_attention_combine::KERNEL,
        &top_k_max_sum::KERNEL,
        &top_k_chunk::KERNEL,
        &top_k_merge::KERNEL,
    ]
}
