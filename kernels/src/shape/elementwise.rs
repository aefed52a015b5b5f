//! Element-wise ops: casts, adds and SiLU-and-multiply.

use super::{ensure, to_u32};
use crate::error::Result;

/// `n` elements of buffers that hold `a` and `b`: both at least `n`; returns n.
pub fn at_least(op: &'static str, n: usize, a: usize, b: usize) -> Result<u32> {
    ensure(op, n <= a && n <= b, || format!("{n} elements asked of buffers of {a} and {b}"))?;
    to_u32(op, "n", n)
}

/// `rows` rows of `2 * inter` in `x`, of `inter` in `out`; returns (rows, inter).
pub fn silu_halves(op: &'static str, x: usize, out: usize, rows: usize, inter: usize) -> Result<(u32, u32)> {
    ensure(op, inter > 0, || "inter is 0".to_owned())?;
    ensure(op, x / 2 / inter >= rows, || format!("x holds {x} values, not {rows} rows of 2 x {inter}"))?;
    ensure(op, out / inter >= rows, || format!("out holds {out} values, not {rows} rows of {inter}"))?;
    // The kernel's column index reaches 2 * inter within a row.
    to_u32(op, "2 * inter", 2 * inter)?;
    Ok((to_u32(op, "rows", rows)?, to_u32(op, "inter", inter)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn a_count_must_fit_both_buffers() {
        assert_eq!(at_least("t", 3, 3, 5).unwrap(), 3);
        assert!(matches!(at_least("t", 4, 3, 5), Err(Error::Shape { .. })));
        assert!(matches!(at_least("t", 1 << 33, 1 << 34, 1 << 34), Err(Error::Shape { .. })));
    }

    #[test]
    fn silu_halves_needs_two_halves_per_row() {
        assert_eq!(silu_halves("t", 12, 6, 2, 3).unwrap(), (2, 3));
        assert_eq!(silu_halves("t", 13, 7, 2, 3).unwrap(), (2, 3));
        assert!(matches!(silu_halves("t", 11, 6, 2, 3), Err(Error::Shape { .. })));
        assert!(matches!(silu_halves("t", 12, 5, 2, 3), Err(Error::Shape { .. })));
        assert!(matches!(silu_halves("t", 12, 6, 2, 0), Err(Error::Shape { .. })));
    }
}
