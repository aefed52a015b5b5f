//! Row copies: columns out of a wider buffer, rows by device-side indices, embedding rows.

use super::{ensure, to_u32};
use crate::error::Result;

/// Columns `[col_offset, col_offset + cols)` of `x` (rows of `stride`) into `out` (rows of `cols`);
/// returns (rows, stride, col_offset, cols).
pub fn copy_cols(x: usize, stride: usize, col_offset: usize, cols: usize, out: usize) -> Result<(u32, u32, u32, u32)> {
    let op = "copy_cols";
    ensure(op, stride > 0 && x.is_multiple_of(stride), || format!("x holds {x} values, not rows of {stride}"))?;
    ensure(op, cols > 0 && col_offset + cols <= stride, || {
        format!("columns {col_offset}..{} are not within rows of {stride}", col_offset + cols)
    })?;
    let rows = x / stride;
    ensure(op, out == rows * cols, || format!("out holds {out} values, {rows} rows of {cols} need {}", rows * cols))?;
    Ok((
        to_u32(op, "rows", rows)?,
        to_u32(op, "stride", stride)?,
        to_u32(op, "col_offset", col_offset)?,
        to_u32(op, "cols", cols)?,
    ))
}

/// `m` rows of `cols` picked by `idx[idx_offset..idx_offset + m]` from (a gather) or into (a scatter)
/// `table`, which is whole rows of `cols`; `packed` holds the m rows. Returns (m, table rows, cols).
pub fn indexed_rows(
    op: &'static str,
    table: usize,
    cols: usize,
    idx: usize,
    idx_offset: usize,
    m: usize,
    packed: usize,
) -> Result<(u32, u32, u32)> {
    ensure(op, cols > 0 && table.is_multiple_of(cols), || {
        format!("the table holds {table} values, not rows of {cols}")
    })?;
    ensure(op, idx_offset.checked_add(m).is_some_and(|end| end <= idx), || {
        format!("indices {idx_offset}..{} are past the {idx} of idx", idx_offset.saturating_add(m))
    })?;
    ensure(op, packed / cols >= m, || format!("the packed rows hold {packed} values, not {m} rows of {cols}"))?;
    Ok((to_u32(op, "m", m)?, to_u32(op, "table rows", table / cols)?, to_u32(op, "cols", cols)?))
}

/// A table of rows of `dim` and `n_ids` rows of `dim` out; returns (vocab, dim).
pub fn embedding_rows(table: usize, dim: usize, n_ids: usize, out: usize) -> Result<(u32, u32)> {
    let op = "embedding_bf16";
    ensure(op, dim > 0 && table.is_multiple_of(dim), || format!("table holds {table} values, not rows of {dim}"))?;
    ensure(op, out == n_ids * dim, || format!("out holds {out}, {n_ids} ids x {dim} need {}", n_ids * dim))?;
    Ok((to_u32(op, "vocab", table / dim)?, to_u32(op, "dim", dim)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn copy_cols_stays_within_the_row() {
        // MLA's kv_a output: 512 latent columns and 64 rope columns of rows of 576.
        assert_eq!(copy_cols(3 * 576, 576, 0, 512, 3 * 512).unwrap(), (3, 576, 0, 512));
        assert_eq!(copy_cols(3 * 576, 576, 512, 64, 3 * 64).unwrap(), (3, 576, 512, 64));
        assert!(matches!(copy_cols(3 * 576, 576, 513, 64, 3 * 64), Err(Error::Shape { .. })));
        assert!(matches!(copy_cols(3 * 576 + 1, 576, 0, 64, 3 * 64), Err(Error::Shape { .. })));
        assert!(matches!(copy_cols(3 * 576, 576, 0, 64, 2 * 64), Err(Error::Shape { .. })));
        assert!(matches!(copy_cols(3 * 576, 576, 0, 0, 0), Err(Error::Shape { .. })));
    }

    #[test]
    fn indexed_rows_checks_the_index_range_and_the_packed_rows() {
        // A table of 5 rows of 4; 3 rows through indices 2..5 of 6.
        assert_eq!(indexed_rows("t", 20, 4, 6, 2, 3, 12).unwrap(), (3, 5, 4));
        assert_eq!(indexed_rows("t", 20, 4, 6, 2, 3, 16).unwrap(), (3, 5, 4));
        assert!(matches!(indexed_rows("t", 20, 4, 6, 4, 3, 12), Err(Error::Shape { .. })));
        assert!(matches!(indexed_rows("t", 20, 4, 6, usize::MAX, 3, 12), Err(Error::Shape { .. })));
        assert!(matches!(indexed_rows("t", 20, 4, 6, 2, 3, 11), Err(Error::Shape { .. })));
        assert!(matches!(indexed_rows("t", 21, 4, 6, 2, 3, 12), Err(Error::Shape { .. })));
    }

    #[test]
    fn embedding_rows_need_whole_rows() {
        assert_eq!(embedding_rows(6, 2, 3, 6).unwrap(), (3, 2));
        assert!(matches!(embedding_rows(6, 2, 3, 4), Err(Error::Shape { .. })));
        assert!(matches!(embedding_rows(7, 2, 3, 6), Err(Error::Shape { .. })));
    }
}
