//! Row copies: column ranges between buffers of different widths, rows by device-side indices (to and from the experts),
//! and the bf16 embedding lookup. An index the host cannot check gives NaN (a gather) or no write (a
//! scatter), never an access outside the buffers.

use cudarc::driver::CudaSlice;
use kdtree_jit::kernel::Kernels;

use crate::error::Result;
use crate::shape::ColRange;
use crate::{launch, shape};

/// `out[r, c] = x[r, col_offset + c]` for every row of `x` (rows of `stride`) and `c < cols`; `out` is
/// [rows, cols]. Takes MLA's latent (512) and rope (64) columns out of kv_a's [rows, 576].
pub fn copy_cols(
    k: &Kernels,
    x: &CudaSlice<f32>,
    stride: usize,
    col_offset: usize,
    cols: usize,
    out: &mut CudaSlice<f32>,
) -> Result<()> {
    let from = ColRange { len: x.len(), stride, offset: col_offset };
    let to = ColRange { len: out.len(), stride: cols, offset: 0 };
    copy_range(k, "copy_cols", x, from, out, to, cols)
}

/// `out[r, col_offset + c] = x[r, c]` for every row of `x` ([rows, cols]) and `c < cols`, `out` rows of
/// `stride`: a layer's hidden states placed beside others' (a forward's taps).
pub fn place_cols(
    k: &Kernels,
    x: &CudaSlice<f32>,
    cols: usize,
    out: &mut CudaSlice<f32>,
    stride: usize,
    col_offset: usize,
) -> Result<()> {
    let from = ColRange { len: x.len(), stride: cols, offset: 0 };
    let to = ColRange { len: out.len(), stride, offset: col_offset };
    copy_range(k, "place_cols", x, from, out, to, cols)
}

fn copy_range(
    k: &Kernels,
    op: &'static str,
    x: &CudaSlice<f32>,
    from: ColRange,
    out: &mut CudaSlice<f32>,
    to: ColRange,
    cols: usize,
) -> Result<()> {
    let [rows, x_stride, x_offset, out_stride, out_offset, cols] = shape::copy_cols(op, from, to, cols)?;
    if rows > 0 {
        // SAFETY: x and out are `rows` whole rows of their strides, each column range inside its row.
        unsafe { launch::copy_cols(k, x, out, rows, x_stride, x_offset, out_stride, out_offset, cols) }?;
    }
    Ok(())
}

/// `out[i] = src[idx[idx_offset + i]]` for `i < m`, rows of `cols` 16-bit values (bf16 or f16 bits,
/// copied); an index past `src`'s rows gives a row of NaN (0xffff, NaN in both formats).
pub fn gather_rows_u16(
    k: &Kernels,
    src: &CudaSlice<u16>,
    cols: usize,
    idx: &CudaSlice<u32>,
    idx_offset: usize,
    m: usize,
    out: &mut CudaSlice<u16>,
) -> Result<()> {
    let (m, src_rows, cols) =
        shape::indexed_rows("gather_rows_u16", src.len(), cols, idx.len(), idx_offset, m, out.len())?;
    if m > 0 {
        let idx = idx.slice(idx_offset..idx_offset + m as usize);
        // SAFETY: src is src_rows x cols and the kernel checks each index against src_rows; idx holds m
        // indices; out at least m x cols values.
        unsafe { launch::gather_rows_u16(k, src, &idx, out, m, src_rows, cols) }?;
    }
    Ok(())
}

/// `out[i] = src[idx[idx_offset + i]]` for `i < m`, rows of `cols` f32; an index past `src`'s rows
/// gives a row of NaN.
pub fn gather_rows_f32(
    k: &Kernels,
    src: &CudaSlice<f32>,
    cols: usize,
    idx: &CudaSlice<u32>,
    idx_offset: usize,
    m: usize,
    out: &mut CudaSlice<f32>,
) -> Result<()> {
    let (m, src_rows, cols) =
        shape::indexed_rows("gather_rows_f32", src.len(), cols, idx.len(), idx_offset, m, out.len())?;
    if m > 0 {
        let idx = idx.slice(idx_offset..idx_offset + m as usize);
        // SAFETY: as gather_rows_u16.
        unsafe { launch::gather_rows_f32(k, src, &idx, out, m, src_rows, cols) }?;
    }
    Ok(())
}

/// `dst[idx[idx_offset + i]] = f32(src[i])` for `i < m`: `src` [m, cols] bf16 bits, `dst` rows of
/// `cols` f32. The m destinations must be distinct (two writes of one row would race); one past `dst`'s
/// rows is skipped.
pub fn scatter_rows_bf16_to_f32(
    k: &Kernels,
    src: &CudaSlice<u16>,
    cols: usize,
    idx: &CudaSlice<u32>,
    idx_offset: usize,
    m: usize,
    dst: &mut CudaSlice<f32>,
) -> Result<()> {
    let op = "scatter_rows_bf16_to_f32";
    let (m, dst_rows, cols) = shape::indexed_rows(op, dst.len(), cols, idx.len(), idx_offset, m, src.len())?;
    if m > 0 {
        let idx = idx.slice(idx_offset..idx_offset + m as usize);
        // SAFETY: dst is dst_rows x cols and the kernel checks each index against dst_rows; idx holds m
        // indices; src at least m x cols values.
        unsafe { launch::scatter_rows_bf16_to_f32(k, src, &idx, dst, m, dst_rows, cols) }?;
    }
    Ok(())
}

/// Row `ids[i]` of the bf16 `table` ([vocab, dim], bits) widened into row `i` of `out` ([ids, dim]).
/// The ids are on the device, where the host cannot check them: an id past the table gives a row of NaN,
/// so the engine checks token ids on the host before it uploads them.
pub fn embedding_bf16(
    k: &Kernels,
    table: &CudaSlice<u16>,
    dim: usize,
    ids: &CudaSlice<u32>,
    out: &mut CudaSlice<f32>,
) -> Result<()> {
    let (vocab, dim) = shape::embedding_rows(table.len(), dim, ids.len(), out.len())?;
    let n = shape::count("embedding_bf16", "ids", ids.len())?;
    if n > 0 {
        // SAFETY: table is vocab x dim and the kernel checks each id against vocab; out holds n x dim.
        unsafe { launch::embedding_bf16(k, table, ids, out, n, vocab, dim) }?;
    }
    Ok(())
}
