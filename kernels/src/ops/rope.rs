//! Rotary embedding of a column range of each head, in place, with the positions on the device.

use cudarc::driver::CudaSlice;
use kdtree_jit::kernel::Kernels;

use crate::error::Result;
use crate::{launch, shape};

/// Which columns of the rotated range pair up (a model config's `rope_interleave`). The engine's own type
/// too: its CPU reference and this kernel take the same value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    /// `(x[2i], x[2i+1])`: DeepSeek-V3's own rotation (the engine's `rope_interleaved`).
    Interleaved,
    /// `(x[i], x[i + dim/2])`: the `rotate_half` layout (the engine's `rope_half_split`).
    HalfSplit,
}

/// Where the rotated columns sit: `x` is [rows, heads, head_stride], and columns
/// `[offset, offset + dim)` of each head are rotated (`offset + dim <= head_stride`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RopeColumns {
    pub heads: usize,
    pub head_stride: usize,
    pub offset: usize,
    pub dim: usize,
    pub layout: RopeLayout,
}

/// Rotates `cols` of every head of `x` in place, row r by the angles of table row `positions[r]`
/// (`positions` holds one u32 per row); `cos`/`sin` are [max_pos, dim / 2]. The same arithmetic as the
/// engine's CPU ops, unfused: the same bits. A position past the table (the host cannot see the device's
/// positions) turns its row's rotated columns into NaN.
pub fn rope_strided(
    k: &Kernels,
    x: &mut CudaSlice<f32>,
    cols: RopeColumns,
    positions: &CudaSlice<u32>,
    cos: &CudaSlice<f32>,
    sin: &CudaSlice<f32>,
) -> Result<()> {
    let RopeColumns { heads, head_stride, offset, dim, layout } = cols;
    let a = shape::rope_strided(x.len(), heads, head_stride, offset, dim, positions.len(), (cos.len(), sin.len()))?;
    if a.rows > 0 {
        let half_split = layout == RopeLayout::HalfSplit;
        // SAFETY: x is rows x heads x head_stride with offset + dim <= head_stride; positions holds rows
        // values, each checked by the kernel against max_pos, the tables' rows of dim / 2.
        unsafe {
            launch::rope_strided(
                k,
                x,
                positions,
                cos,
                sin,
                a.rows,
                a.heads,
                a.head_stride,
                a.offset,
                a.dim,
                a.max_pos,
                half_split,
            )
        }?;
    }
    Ok(())
}
