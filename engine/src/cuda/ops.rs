//! The CUDA backend's calls of kdtree-kernels' launchers, each checking the lengths its kernel
//! relies on first: the engine's only `#[kernel]` launches.

use cudarc::driver::CudaSlice;
use kdtree_jit::kernel::Kernels;
use kdtree_kernels::launch;
use kdtree_quant::Dtype;

use crate::error::{EngineError, Result};
use crate::model::Routing;
use crate::registry::{Heads, RopeLayout, RopeSpan};

fn check(op: &str, ok: bool, reason: impl FnOnce() -> String) -> Result<()> {
    if ok { Ok(()) } else { Err(EngineError::InvalidArgument(format!("{op}: {}", reason()))) }
}

fn u32_of(op: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| EngineError::InvalidArgument(format!("{op}: {v} does not fit in 32 bits")))
}

/// The first `x.len()` values of `out` = `x` rounded to `dtype` (bf16 or f16 bits).
pub fn to_half(k: &Kernels, x: &CudaSlice<f32>, dtype: Dtype, out: &mut CudaSlice<u16>) -> Result<()> {
    check("to_half", x.len() <= out.len(), || format!("{} values into {}", x.len(), out.len()))?;
    let n = u32_of("to_half", x.len())?;
    // SAFETY: x and out hold n values.
    match dtype {
        Dtype::Bf16 => unsafe { launch::f32_to_bf16(k, x, out, n) }?,
        Dtype::F16 => unsafe { launch::f32_to_f16(k, x, out, n) }?,
    }
    Ok(())
}

/// `out = x` widened from `dtype` bits.
pub fn from_half(k: &Kernels, x: &CudaSlice<u16>, dtype: Dtype, out: &mut CudaSlice<f32>) -> Result<()> {
    check("from_half", x.len() == out.len(), || format!("{} values into {}", x.len(), out.len()))?;
    let n = u32_of("from_half", x.len())?;
    // SAFETY: x and out hold n values.
    match dtype {
        Dtype::Bf16 => unsafe { launch::bf16_to_f32(k, x, out, n) }?,
        Dtype::F16 => unsafe { launch::f16_to_f32(k, x, out, n) }?,
    }
    Ok(())
}

pub fn add_assign(k: &Kernels, x: &mut CudaSlice<f32>, y: &CudaSlice<f32>) -> Result<()> {
    check("add", x.len() == y.len(), || format!("{} and {} values", x.len(), y.len()))?;
    let n = u32_of("add", x.len())?;
    // SAFETY: x and y hold n values.
    unsafe { launch::add_assign(k, x, y, n) }?;
    Ok(())
}

/// Columns `start..start + cols` of `rows` rows of `stride`.
pub fn copy_cols(
    k: &Kernels,
    x: &CudaSlice<f32>,
    rows: usize,
    stride: usize,
    start: usize,
    cols: usize,
    out: &mut CudaSlice<f32>,
) -> Result<()> {
    check("columns", start + cols <= stride && x.len() == rows * stride && out.len() == rows * cols, || {
        format!("{start}..{} of {rows} rows of {stride}", start + cols)
    })?;
    let u = |v| u32_of("columns", v);
    // SAFETY: x holds rows rows of stride, out rows rows of cols, and start + cols <= stride.
    unsafe { launch::copy_cols(k, x, out, u(rows)?, u(stride)?, u(start)?, u(cols)?) }?;
    Ok(())
}

/// Rotates `span` of every head of `rows` rows of `cols`, row r at `positions[r]`.
#[allow(clippy::too_many_arguments)]
pub fn rope(
    k: &Kernels,
    x: &mut CudaSlice<f32>,
    rows: usize,
    cols: usize,
    span: RopeSpan,
    positions: &CudaSlice<u32>,
    cos: &CudaSlice<f32>,
    sin: &CudaSlice<f32>,
) -> Result<()> {
    let RopeSpan { stride, offset, dim, layout } = span;
    let half = dim / 2;
    check(
        "rope",
        dim % 2 == 0
            && half > 0
            && stride > 0
            && cols % stride == 0
            && offset + dim <= stride
            && x.len() == rows * cols
            && positions.len() == rows
            && cos.len() == sin.len()
            && cos.len() % half == 0,
        || format!("{span:?} over {rows} rows of {cols}"),
    )?;
    let u = |v| u32_of("rope", v);
    let (heads, max_pos) = (cols / stride, cos.len() / half);
    u(rows * heads * half)?;
    // SAFETY: x is [rows, heads, stride] with offset + dim <= stride; positions holds rows values, and a
    // position past max_pos rows of the tables gives NaN rather than a read past them.
    unsafe {
        launch::rope_strided(
            k,
            x,
            positions,
            cos,
            sin,
            u(rows)?,
            u(heads)?,
            u(stride)?,
            u(offset)?,
            u(dim)?,
            u(max_pos)?,
            layout == RopeLayout::HalfSplit,
        )
    }?;
    Ok(())
}

/// Writes `n` tokens' keys and values to cache rows `start..start + n` of caches of `capacity` rows.
#[allow(clippy::too_many_arguments)]
pub fn kv_append(
    k: &Kernels,
    kv: &CudaSlice<f32>,
    k_rope: &CudaSlice<f32>,
    n: usize,
    h: Heads,
    start: usize,
    capacity: usize,
    k_cache: &mut CudaSlice<f32>,
    v_cache: &mut CudaSlice<f32>,
) -> Result<()> {
    check(
        "kv_append",
        kv.len() == n * h.heads * (h.nope + h.v)
            && k_rope.len() == n * h.rope
            && start + n <= capacity
            && k_cache.len() == capacity * h.heads * h.qk()
            && v_cache.len() == capacity * h.heads * h.v,
        || format!("{n} entries at {start} of a cache of {capacity}"),
    )?;
    let u = |v| u32_of("kv_append", v);
    // SAFETY: kv holds n rows of heads * (nope + v), k_rope n rows of rope, and the caches hold
    // capacity >= start + n rows of their widths.
    unsafe {
        launch::kv_append(
            k,
            kv,
            k_rope,
            k_cache,
            v_cache,
            u(n)?,
            u(h.heads)?,
            u(h.nope)?,
            u(h.rope)?,
            u(h.v)?,
            u(start)?,
        )
    }?;
    Ok(())
}

/// Tree attention of `n` queries over `past` cached entries and the `n` new ones.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    k: &Kernels,
    q: &CudaSlice<f32>,
    k_cache: &CudaSlice<f32>,
    v_cache: &CudaSlice<f32>,
    mask: &CudaSlice<u32>,
    past: usize,
    n: usize,
    h: Heads,
    out: &mut CudaSlice<f32>,
) -> Result<()> {
    let entries = past + n;
    check(
        "attention",
        h.qk() <= 256
            && h.v <= 256
            && q.len() == n * h.heads * h.qk()
            && k_cache.len() >= entries * h.heads * h.qk()
            && v_cache.len() >= entries * h.heads * h.v
            && mask.len() == n * n.div_ceil(32)
            && out.len() == n * h.heads * h.v,
        || format!("{n} queries over {past} + {n} entries of {} heads", h.heads),
    )?;
    let u = |v| u32_of("attention", v);
    // SAFETY: the buffers hold what the checks above say; head dims are at most the kernel's 256.
    unsafe {
        launch::attention_tree(
            k,
            q,
            k_cache,
            v_cache,
            mask,
            out,
            u(n)?,
            u(past)?,
            u(h.heads)?,
            u(h.qk())?,
            u(h.v)?,
            h.scale,
        )
    }?;
    Ok(())
}

/// DeepSeek-V3's router over `tokens` rows of logits: ids and weights `[tokens, top_k]`.
pub fn route(
    k: &Kernels,
    logits: &CudaSlice<f32>,
    bias: &CudaSlice<f32>,
    r: &Routing,
    tokens: usize,
    ids: &mut CudaSlice<u32>,
    weights: &mut CudaSlice<f32>,
) -> Result<()> {
    check(
        "route",
        logits.len() == tokens * r.n_experts
            && bias.len() == r.n_experts
            && ids.len() == tokens * r.top_k
            && weights.len() == tokens * r.top_k
            && r.n_group > 0
            && r.n_experts % r.n_group == 0
            && r.topk_group <= r.n_group
            && r.top_k <= r.n_experts,
        || format!("{tokens} tokens, {} experts, top {}", r.n_experts, r.top_k),
    )?;
    let u = |v| u32_of("route", v);
    // SAFETY: the buffers hold tokens rows of their widths; the group counts divide the experts.
    unsafe {
        launch::route_noaux_tc(
            k,
            logits,
            bias,
            ids,
            weights,
            u(tokens)?,
            u(r.n_experts)?,
            u(r.top_k)?,
            u(r.n_group)?,
            u(r.topk_group)?,
            r.norm_topk_prob,
            r.routed_scaling_factor,
        )
    }?;
    Ok(())
}

/// `out[i] = src[idx[start + i]]` for `i < m`, rows of `cols` 16-bit values.
pub fn gather_rows_u16(
    k: &Kernels,
    src: &CudaSlice<u16>,
    idx: &CudaSlice<u32>,
    start: usize,
    m: usize,
    cols: usize,
    out: &mut CudaSlice<u16>,
) -> Result<()> {
    check("gather", start + m <= idx.len() && out.len() == m * cols && cols > 0 && src.len() % cols == 0, || {
        format!("{m} rows of {cols} from index {start} of {}", idx.len())
    })?;
    let u = |v| u32_of("gather", v);
    // SAFETY: out holds m rows; an index past src's rows gives NaN bits, not a read past it.
    unsafe {
        launch::gather_rows_u16(k, src, &idx.slice(start..start + m), out, u(m)?, u(src.len() / cols)?, u(cols)?)
    }?;
    Ok(())
}

/// `out[i] = src[idx[i]]`, rows of `cols` f32.
pub fn gather_rows_f32(
    k: &Kernels,
    src: &CudaSlice<f32>,
    idx: &CudaSlice<u32>,
    cols: usize,
    out: &mut CudaSlice<f32>,
) -> Result<()> {
    let m = idx.len();
    check("gather", out.len() == m * cols && cols > 0 && src.len() % cols == 0, || format!("{m} rows of {cols}"))?;
    let u = |v| u32_of("gather", v);
    // SAFETY: out holds m rows; an index past src's rows gives NaN, not a read past it.
    unsafe { launch::gather_rows_f32(k, src, &idx.as_view(), out, u(m)?, u(src.len() / cols)?, u(cols)?) }?;
    Ok(())
}

/// `dst[idx[start + i]] = f32(src[i])` for `i < m`, `src` half rows of `cols`.
#[allow(clippy::too_many_arguments)]
pub fn scatter_rows_to_f32(
    k: &Kernels,
    src: &CudaSlice<u16>,
    dtype: Dtype,
    idx: &CudaSlice<u32>,
    start: usize,
    m: usize,
    cols: usize,
    dst: &mut CudaSlice<f32>,
) -> Result<()> {
    check("scatter", dtype == Dtype::Bf16, || "f16 experts are not supported on CUDA yet".into())?;
    check("scatter", start + m <= idx.len() && src.len() == m * cols && cols > 0 && dst.len() % cols == 0, || {
        format!("{m} rows of {cols} to index {start} of {}", idx.len())
    })?;
    let u = |v| u32_of("scatter", v);
    // SAFETY: src holds m rows; an index past dst's rows writes nothing.
    unsafe {
        launch::scatter_rows_bf16_to_f32(
            k,
            src,
            &idx.slice(start..start + m),
            dst,
            u(m)?,
            u(dst.len() / cols)?,
            u(cols)?,
        )
    }?;
    Ok(())
}

/// `out = silu(a) * b` rounded to bf16, rows `[a | b]` of `cols` f32.
pub fn silu_mul_halves_f32_to_bf16(
    k: &Kernels,
    x: &CudaSlice<f32>,
    rows: usize,
    cols: usize,
    out: &mut CudaSlice<u16>,
) -> Result<()> {
    check("silu_mul", cols % 2 == 0 && x.len() == rows * cols && out.len() == rows * cols / 2, || {
        format!("{rows} rows of {cols}")
    })?;
    let u = |v| u32_of("silu_mul", v);
    // SAFETY: x holds rows rows of 2 * inter, out rows of inter.
    unsafe { launch::silu_mul_halves_f32(k, x, out, u(rows)?, u(cols / 2)?) }?;
    Ok(())
}

/// `out = silu(a) * b`, rows `[a | b]` of `cols` half values, into half rows.
pub fn silu_mul_halves_u16(
    k: &Kernels,
    x: &CudaSlice<u16>,
    rows: usize,
    cols: usize,
    dtype: Dtype,
    out: &mut CudaSlice<u16>,
) -> Result<()> {
    check("silu_mul", dtype == Dtype::Bf16, || "f16 experts are not supported on CUDA yet".into())?;
    check("silu_mul", cols % 2 == 0 && x.len() == rows * cols && out.len() == rows * cols / 2, || {
        format!("{rows} rows of {cols}")
    })?;
    let u = |v| u32_of("silu_mul", v);
    // SAFETY: x holds rows rows of 2 * inter, out rows of inter.
    unsafe { launch::silu_mul_halves_bf16(k, x, out, u(rows)?, u(cols / 2)?) }?;
    Ok(())
}

/// `out[t] = Σ_s weights[t, s] * slots[t * top_k + s]`, ascending s.
pub fn moe_combine(
    k: &Kernels,
    slots: &CudaSlice<f32>,
    weights: &CudaSlice<f32>,
    tokens: usize,
    top_k: usize,
    h: usize,
    out: &mut CudaSlice<f32>,
) -> Result<()> {
    check(
        "moe_combine",
        slots.len() == tokens * top_k * h && weights.len() == tokens * top_k && out.len() == tokens * h,
        || format!("{tokens} tokens, top {top_k}, rows of {h}"),
    )?;
    let u = |v| u32_of("moe_combine", v);
    // SAFETY: the buffers hold what the check above says.
    unsafe { launch::moe_combine(k, slots, weights, out, u(tokens)?, u(top_k)?, u(h)?) }?;
    Ok(())
}

/// Rows `ids` of a half table `[vocab, dim]` into f32 rows; ids were checked on the host.
pub fn embedding(
    k: &Kernels,
    table: &CudaSlice<u16>,
    dtype: Dtype,
    vocab: usize,
    dim: usize,
    ids: &CudaSlice<u32>,
    out: &mut CudaSlice<f32>,
) -> Result<()> {
    check("embedding", dtype == Dtype::Bf16, || "an f16 embedding table is not supported on CUDA yet".into())?;
    check("embedding", table.len() == vocab * dim && out.len() == ids.len() * dim, || {
        format!("{} ids of a [{vocab}, {dim}] table", ids.len())
    })?;
    let u = |v| u32_of("embedding", v);
    // SAFETY: out holds a row per id; an id past the table gives a row of NaN, not a read past it.
    unsafe { launch::embedding_bf16(k, table, ids, out, u(ids.len())?, u(vocab)?, u(dim)?) }?;
    Ok(())
}
