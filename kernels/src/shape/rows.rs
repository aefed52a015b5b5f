//! Row copies: column ranges between buffers of different widths, rows by device-side indices, embedding rows.

use super::{ensure, to_u32};
use crate::error::Result;

/// A column range of the rows of one buffer copied into a column range of another's: `cols` columns
/// from column `offset` of each row of `stride`, of both buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColRange {
    pub len: usize,
    pub stride: usize,
    pub offset: usize,
}

/// Columns `[x.offset, x.offset + cols)` of `x`'s rows into columns `[out.offset, out.offset + cols)`
/// of `out`'s: both whole rows, as many of them, each range inside its row. Returns (rows, x stride, x
/// offset, out stride, out offset, cols).
pub fn copy_cols(op: &'static str, x: ColRange, out: ColRange, cols: usize) -> Result<[u32; 6]> {
    for (name, b) in [("x", x), ("out", out)] {
        ensure(op, b.stride > 0 && b.len.is_multiple_of(b.stride), || {
            format!("{name} holds {} values, not rows of {}", b.len, b.stride)
        })?;
        ensure(op, cols > 0 && b.offset.checked_add(cols).is_some_and(|end| end <= b.stride), || {
            format!(
                "{name}'s columns {}..{} are not within rows of {}",
                b.offset,
                b.offset.saturating_add(cols),
                b.stride
            )
        })?;
    }
    let rows = x.len / x.stride;
    ensure(op, out.len / out.stride == rows, || {
        format!("out holds {} rows of {}, x {rows}", out.len / out.stride, out.stride)
    })?;
    Ok([
        to_u32(op, "rows", rows)?,
        to_u32(op, "x stride", x.stride)?,
        to_u32(op, "x offset", x.offset)?,
        to_u32(op, "out stride", out.stride)?,
        to_u32(op, "out offset", out.offset)?,
        to_u32(op, "cols", cols)?,
    ])
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
    fn copy_cols_stays_within_both_rows() {
        let r = |len, stride, offset| ColRange { len, stride, offset };
        // MLA's kv_a output: 512 latent columns and 64 rope columns of rows of 576.
        assert_eq!(copy_cols("t", r(3 * 576, 576, 0), r(3 * 512, 512, 0), 512).unwrap(), [3, 576, 0, 512, 0, 512]);
        assert_eq!(copy_cols("t", r(3 * 576, 576, 512), r(3 * 64, 64, 0), 64).unwrap(), [3, 576, 512, 64, 0, 64]);
        // A layer's hidden state placed as the second of three taps.
        assert_eq!(copy_cols("t", r(2 * 7, 7, 0), r(2 * 21, 21, 7), 7).unwrap(), [2, 7, 0, 21, 7, 7]);
        let bad = [
            (r(3 * 576, 576, 513), r(3 * 64, 64, 0), 64),
            (r(3 * 576 + 1, 576, 0), r(3 * 64, 64, 0), 64),
            (r(3 * 576, 576, 0), r(2 * 64, 64, 0), 64),
            (r(3 * 576, 576, 0), r(0, 0, 0), 0),
            (r(2 * 7, 7, 0), r(2 * 21, 21, 15), 7),
            (r(2 * 7, 7, usize::MAX), r(2 * 21, 21, 0), 7),
        ];
        for (x, out, cols) in bad {
            assert!(matches!(copy_cols("t", x, out, cols), Err(Error::Shape { .. })), "{x:?} {out:?} {cols}");
        }
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
