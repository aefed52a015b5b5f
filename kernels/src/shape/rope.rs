//! Rotary embedding of a column range of each head.

use super::{ensure, to_u32};
use crate::error::Result;

/// The kernel's size arguments for [`rope_strided`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RopeArgs {
    pub rows: u32,
    pub heads: u32,
    pub head_stride: u32,
    pub offset: u32,
    pub dim: u32,
    pub max_pos: u32,
}

/// x [rows, heads, head_stride] with columns `[offset, offset + dim)` rotated, one position per row,
/// against [max_pos, dim / 2] tables.
pub fn rope_strided(
    x: usize,
    heads: usize,
    head_stride: usize,
    offset: usize,
    dim: usize,
    positions: usize,
    table: (usize, usize),
) -> Result<RopeArgs> {
    let op = "rope_strided";
    ensure(op, dim > 0 && dim.is_multiple_of(2), || format!("dim {dim} is not a positive even number"))?;
    ensure(op, offset + dim <= head_stride, || {
        format!("columns {offset}..{} are not within heads of {head_stride}", offset + dim)
    })?;
    ensure(op, heads > 0 && x.is_multiple_of(heads * head_stride), || {
        format!("x holds {x} values, not rows of {heads} heads of {head_stride}")
    })?;
    let rows = x / (heads * head_stride);
    ensure(op, positions == rows, || format!("{positions} positions for {rows} rows"))?;
    let (cos, sin, half) = (table.0, table.1, dim / 2);
    ensure(op, cos == sin && cos.is_multiple_of(half) && cos > 0, || {
        format!("cos ({cos}) and sin ({sin}) are not [max_pos, {half}]")
    })?;
    // The kernel's grid covers every pair with a u32 count.
    to_u32(op, "rows * heads * dim / 2", rows * heads * half)?;
    Ok(RopeArgs {
        rows: to_u32(op, "rows", rows)?,
        heads: to_u32(op, "heads", heads)?,
        head_stride: to_u32(op, "head_stride", head_stride)?,
        offset: to_u32(op, "offset", offset)?,
        dim: to_u32(op, "dim", dim)?,
        max_pos: to_u32(op, "max_pos", cos / half)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn rope_strided_checks_columns_rows_and_tables() {
        // DeepSeek's q: 2 rows of 3 heads of 192, the last 64 rotated; tables of 10 positions x 32.
        let args = rope_strided(2 * 3 * 192, 3, 192, 128, 64, 2, (320, 320)).unwrap();
        assert_eq!(args, RopeArgs { rows: 2, heads: 3, head_stride: 192, offset: 128, dim: 64, max_pos: 10 });
        assert!(matches!(rope_strided(2 * 3 * 192, 3, 192, 129, 64, 2, (320, 320)), Err(Error::Shape { .. })));
        assert!(matches!(rope_strided(2 * 3 * 192, 3, 192, 128, 63, 2, (320, 320)), Err(Error::Shape { .. })));
        assert!(matches!(rope_strided(2 * 3 * 192, 3, 192, 128, 64, 3, (320, 320)), Err(Error::Shape { .. })));
        assert!(matches!(rope_strided(2 * 3 * 192, 3, 192, 128, 64, 2, (320, 288)), Err(Error::Shape { .. })));
        assert!(matches!(rope_strided(2 * 3 * 192, 3, 192, 128, 64, 2, (330, 330)), Err(Error::Shape { .. })));
        assert!(matches!(rope_strided(2 * 3 * 192 + 1, 3, 192, 128, 64, 2, (320, 320)), Err(Error::Shape { .. })));
    }
}
