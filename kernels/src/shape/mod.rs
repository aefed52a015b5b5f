//! The length checks each safe op makes before launching, as pure functions of buffer lengths so that
//! they are tested without a GPU. Each returns the kernel's `unsigned int` size arguments.
//!
//! Where an op takes a count (`n`, `m`, `rows`), its buffers must hold at least what that count needs,
//! so that one buffer serves calls of many sizes; otherwise the sizes come from the buffers' lengths,
//! which must then agree exactly.

mod attention;
mod elementwise;
mod moe;
mod moe_align;
mod rope;
mod rows;
mod top_k;

pub use attention::{GqaArgs, GqaSizes, MAX_HEAD_DIM, TILE, gqa_attention};
pub use elementwise::{at_least, silu_halves};
pub use moe::{
    CombineSortedArgs, MAX_EXPERTS, MAX_GROUPS, MAX_TOP_K, RouteArgs, moe_combine, moe_combine_sorted, route,
};
pub use moe_align::{AlignArgs, MAX_ASSIGNMENTS, moe_align};
pub use rope::{RopeArgs, rope_strided};
pub use rows::{ColRange, copy_cols, embedding_rows, indexed_rows};
pub use top_k::{TOP_K_CHUNK, TopKArgs, top_k_log_softmax};

use crate::error::{Error, Result};

fn ensure(op: &'static str, ok: bool, reason: impl FnOnce() -> String) -> Result<()> {
    if ok { Ok(()) } else { Err(Error::Shape { op, reason: reason() }) }
}

fn unsupported(op: &'static str, ok: bool, reason: impl FnOnce() -> String) -> Result<()> {
    if ok { Ok(()) } else { Err(Error::Unsupported { op, reason: reason() }) }
}

fn to_u32(op: &'static str, what: &str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::Shape { op, reason: format!("{what} = {n} does not fit in 32 bits") })
}

/// `x` is whole rows of `cols`; returns (rows, cols).
pub fn rows(op: &'static str, x: usize, cols: usize) -> Result<(u32, u32)> {
    ensure(op, cols > 0 && x.is_multiple_of(cols), || format!("{x} values are not rows of {cols}"))?;
    Ok((to_u32(op, "rows", x / cols)?, to_u32(op, "cols", cols)?))
}

/// How argmax splits rows of `cols` into chunks, (chunk, chunks): about 512 (row, chunk) blocks so that a
/// few rows still cover every SM, chunks of at least one float4 per thread of a 1024-thread block (4096
/// columns), a multiple of 4 so that float4 loads stay aligned, and at most 65535 chunks (the grid's y).
pub fn argmax_chunks(rows: u32, cols: u32) -> (u32, u32) {
    let want = (512 / rows.max(1)).max(1);
    let chunk = cols.div_ceil(want).max(4096).max(cols.div_ceil(65535)).next_multiple_of(4);
    (chunk, cols.div_ceil(chunk).max(1))
}

/// Columns `start .. start + len` of rows of `cols`: they must lie within a row.
pub fn within_row(op: &'static str, start: usize, len: usize, cols: usize) -> Result<()> {
    ensure(op, start.checked_add(len).is_some_and(|end| end <= cols), || {
        format!("columns {start}..{} of rows of {cols}", start.saturating_add(len))
    })
}

/// Buffers that must have the same length.
pub fn same(op: &'static str, what: &str, a: usize, b: usize) -> Result<()> {
    ensure(op, a == b, || format!("{what} hold {a} and {b} values"))
}

/// A value the kernel reads from device memory: its buffer must hold it.
pub fn scalar(op: &'static str, what: &str, len: usize) -> Result<()> {
    ensure(op, len >= 1, || format!("{what} is an empty buffer; the kernel reads its first value"))
}

pub fn count(op: &'static str, what: &str, n: usize) -> Result<u32> {
    to_u32(op, what, n)
}

/// x [rows, heads, head_dim] against `rows` positions and [max_pos, head_dim / 2] tables; returns
/// (rows, heads, head_dim, positions) as u32.
pub fn rope(
    x: usize,
    head_dim: usize,
    positions: &[usize],
    table: (usize, usize),
) -> Result<(u32, u32, u32, Vec<u32>)> {
    let (op, rows, half) = ("rope_interleaved", positions.len(), head_dim / 2);
    ensure(op, head_dim > 0 && head_dim.is_multiple_of(2), || {
        format!("head_dim {head_dim} is not a positive even number")
    })?;
    ensure(op, rows > 0 && x.is_multiple_of(rows * head_dim), || {
        format!("x holds {x} values, not {rows} rows of heads of {head_dim}")
    })?;
    let (cos, sin) = table;
    ensure(op, cos == sin && cos.is_multiple_of(half), || {
        format!("cos ({cos}) and sin ({sin}) are not [max_pos, {half}]")
    })?;
    let max = cos / half;
    if let Some(&position) = positions.iter().find(|&&p| p >= max) {
        return Err(Error::PositionOutOfRange { position, max });
    }
    let heads = x / (rows * head_dim);
    // The kernel's grid covers every pair with a u32 count.
    to_u32(op, "rows * heads * head_dim / 2", rows * heads * half)?;
    let positions = positions.iter().map(|&p| to_u32(op, "position", p)).collect::<Result<_>>()?;
    Ok((to_u32(op, "rows", rows)?, to_u32(op, "heads", heads)?, to_u32(op, "head_dim", head_dim)?, positions))
}

/// Every id below the table's rows; returns (vocab, dim).
pub fn embedding(table: usize, dim: usize, ids: &[u32], out: usize) -> Result<(u32, u32)> {
    let op = "embedding";
    ensure(op, dim > 0 && table.is_multiple_of(dim), || format!("table holds {table} values, not rows of {dim}"))?;
    ensure(op, out == ids.len() * dim, || {
        format!("out holds {out}, {} ids x {dim} need {}", ids.len(), ids.len() * dim)
    })?;
    let vocab = table / dim;
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(Error::TokenOutOfRange { id, vocab });
    }
    Ok((to_u32(op, "vocab", vocab)?, to_u32(op, "dim", dim)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_scalar_needs_a_value() {
        assert!(scalar("t", "past", 1).is_ok());
        assert!(matches!(scalar("t", "past", 0), Err(Error::Shape { .. })));
    }

    #[test]
    fn rows_must_be_whole_and_nonempty() {
        assert_eq!(rows("t", 12, 4).unwrap(), (3, 4));
        assert!(matches!(rows("t", 10, 4), Err(Error::Shape { .. })));
        assert!(matches!(rows("t", 0, 0), Err(Error::Shape { .. })));
        assert!(matches!(rows("t", 1 << 33, 1), Err(Error::Shape { .. })));
    }

    #[test]
    fn columns_must_lie_within_the_row() {
        assert!(within_row("t", 1536, 512, 2112).is_ok() && within_row("t", 2048, 64, 2112).is_ok());
        assert!(matches!(within_row("t", 2049, 64, 2112), Err(Error::Shape { .. })));
        assert!(matches!(within_row("t", usize::MAX, 2, 8), Err(Error::Shape { .. })));
    }

    #[test]
    fn argmax_chunks_cover_the_row_and_stay_aligned() {
        for (rows, cols) in [(1, 163_840), (128, 163_840), (1024, 163_840), (3, 5), (1, u32::MAX - 3)] {
            let (chunk, chunks) = argmax_chunks(rows, cols);
            assert!(chunk.is_multiple_of(4) && chunks <= 65535, "{rows} x {cols}: {chunk} x {chunks}");
            assert!(
                chunk as u64 * chunks as u64 >= cols as u64
                    && (chunks - 1) as u64 * (chunk as u64) < cols.max(1) as u64
            );
        }
        assert_eq!(argmax_chunks(128, 163_840), (40_960, 4));
        assert_eq!(argmax_chunks(1024, 163_840), (163_840, 1));
    }

    #[test]
    fn rope_checks_head_dim_table_and_positions() {
        // 2 rows of 3 heads of 4; tables of 10 positions x 2.
        assert_eq!(rope(24, 4, &[0, 9], (20, 20)).unwrap(), (2, 3, 4, vec![0, 9]));
        assert!(matches!(rope(24, 4, &[0, 10], (20, 20)), Err(Error::PositionOutOfRange { position: 10, max: 10 })));
        assert!(matches!(rope(24, 3, &[0, 1], (20, 20)), Err(Error::Shape { .. })));
        assert!(matches!(rope(24, 4, &[0, 1], (20, 18)), Err(Error::Shape { .. })));
        assert!(matches!(rope(20, 4, &[0, 1], (20, 20)), Err(Error::Shape { .. })));
    }

    #[test]
    fn embedding_rejects_ids_past_the_table() {
        assert_eq!(embedding(6, 2, &[2, 0], 4).unwrap(), (3, 2));
        assert!(matches!(embedding(6, 2, &[3, 0], 4), Err(Error::TokenOutOfRange { id: 3, vocab: 3 })));
        assert!(matches!(embedding(6, 2, &[1], 4), Err(Error::Shape { .. })));
    }
}
