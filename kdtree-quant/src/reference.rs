//! The CPU reference W4A16 GEMM: `Y[M, N] = X[M, K] · dequant(W)[N, K]ᵀ`.
//!
//! It is the oracle of the autotuner, the fuzzers and the engine, so its arithmetic is fixed
//! and documented, and a row's result never depends on how many rows are computed with it:
//!
//! 1. `w[n][k] = q * s` in f32 (exact: a 4-bit integer times a 16-bit float fits in f32);
//!    X is widened to f32 (exact).
//! 2. `y[m][n] = dot(x[m], w[n])`, where [`dot`] keeps [`LANES`] partial sums, lane `l`
//!    adding `x[k] * w[k]` for `k ≡ l (mod LANES)` in increasing `k` (a rounded multiply,
//!    then a rounded add: no fused multiply-add), and adds the lanes pairwise at the end.
//! 3. The f32 result is rounded once to the activation dtype.
//!
//! A dense linear layer that calls [`dot`] with the dequantized weight therefore gives
//! bit-identical results. Work is split over output rows (threads via rayon); every
//! `(m, n)` runs the same sequence of operations whatever the split.

use rayon::prelude::*;

use crate::dtype::Half;
use crate::error::{QuantError, Result};
use crate::weight::QuantizedWeight;

/// Partial sums kept by [`dot`]; eight f32 lanes map onto two SSE or one AVX register.
pub const LANES: usize = 8;

/// Output rows dequantized together: each row of X is read once per block.
const ROW_BLOCK: usize = 4;

/// The fixed-order f32 dot product every CPU op of kdtree uses.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; LANES];
    let (a_main, a_tail) = a.split_at(a.len() / LANES * LANES);
    let (b_main, b_tail) = b.split_at(a_main.len());
    for (ca, cb) in a_main.chunks_exact(LANES).zip(b_main.chunks_exact(LANES)) {
        for l in 0..LANES {
            acc[l] += ca[l] * cb[l];
        }
    }
    for (l, (x, y)) in a_tail.iter().zip(b_tail).enumerate() {
        acc[l] += x * y;
    }
    reduce(acc)
}

/// [`dot`] of one `a` against [`ROW_BLOCK`] rows at once: bit-identical to four calls.
#[inline(always)]
fn dot_block(a: &[f32], rows: [&[f32]; ROW_BLOCK]) -> [f32; ROW_BLOCK] {
    let mut acc = [[0f32; LANES]; ROW_BLOCK];
    let main = a.len() / LANES * LANES;
    let [r0, r1, r2, r3] = rows.map(|r| r[..main].chunks_exact(LANES));
    for ((((ca, c0), c1), c2), c3) in a[..main].chunks_exact(LANES).zip(r0).zip(r1).zip(r2).zip(r3) {
        for (acc, cb) in acc.iter_mut().zip([c0, c1, c2, c3]) {
            for l in 0..LANES {
                acc[l] += ca[l] * cb[l];
            }
        }
    }
    for (acc, row) in acc.iter_mut().zip(rows) {
        for (l, k) in (main..a.len()).enumerate() {
            acc[l] += a[k] * row[k];
        }
    }
    acc.map(reduce)
}

#[inline]
fn reduce(acc: [f32; LANES]) -> f32 {
    ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
}

/// Output rows `n0..n0 + out.len() / m` of Yᵀ: dequantize them, then dot every row of X.
fn row_block(w: &QuantizedWeight, x: &[f32], m: usize, n0: usize, wbuf: &mut [f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above). AVX2 adds wider registers, not
        // fused multiply-adds, so the results are bit-identical to the portable path.
        return unsafe { row_block_avx2(w, x, m, n0, wbuf, out) };
    }
    row_block_portable(w, x, m, n0, wbuf, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn row_block_avx2(w: &QuantizedWeight, x: &[f32], m: usize, n0: usize, wbuf: &mut [f32], out: &mut [f32]) {
    row_block_portable(w, x, m, n0, wbuf, out)
}

#[inline(always)]
fn row_block_portable(w: &QuantizedWeight, x: &[f32], m: usize, n0: usize, wbuf: &mut [f32], out: &mut [f32]) {
    let k = w.k;
    let rows = out.len() / m;
    for r in 0..rows {
        w.dequantize_row(n0 + r, &mut wbuf[r * k..(r + 1) * k]);
    }
    if rows == ROW_BLOCK {
        let wrows: [&[f32]; ROW_BLOCK] = std::array::from_fn(|r| &wbuf[r * k..(r + 1) * k]);
        for (i, xrow) in x.chunks_exact(k).enumerate() {
            for (r, v) in dot_block(xrow, wrows).into_iter().enumerate() {
                out[r * m + i] = v;
            }
        }
    } else {
        for r in 0..rows {
            for (i, xrow) in x.chunks_exact(k).enumerate() {
                out[r * m + i] = dot(xrow, &wbuf[r * k..(r + 1) * k]);
            }
        }
    }
}

/// `Y = X · dequant(W)ᵀ` with X in f32 (values of the activation dtype), Y in f32 before the
/// final rounding: the form the engine and the tests compare against.
pub fn w4a16_gemm_f32(x: &[f32], m: usize, w: &QuantizedWeight) -> Result<Vec<f32>> {
    if x.len() != m * w.k {
        return Err(QuantError::LengthMismatch { tensor: "x".into(), expected: m * w.k, actual: x.len() });
    }
    // Y transposed ([N, M]) so that each block of output rows is one contiguous slice.
    let mut yt = vec![0f32; w.n * m];
    yt.par_chunks_mut(ROW_BLOCK * m).enumerate().for_each_init(
        || vec![0f32; ROW_BLOCK * w.k],
        |wbuf, (block, out)| row_block(w, x, m, block * ROW_BLOCK, wbuf, out),
    );
    let mut y = vec![0f32; m * w.n];
    for (n, col) in yt.chunks_exact(m).enumerate() {
        for (i, &v) in col.iter().enumerate() {
            y[i * w.n + n] = v;
        }
    }
    Ok(y)
}

/// `Y = X · dequant(W)ᵀ` with X and Y in the activation dtype `T` (f16 or bf16).
pub fn w4a16_gemm<T: Half>(x: &[T], m: usize, w: &QuantizedWeight) -> Result<Vec<T>> {
    let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
    Ok(w4a16_gemm_f32(&xf, m, w)?.into_iter().map(T::from_f32).collect())
}
