use kdtree_quant::QuantizedWeight;
use kdtree_quant::reference::{dot, w4a16_gemm_f32};
use rayon::prelude::*;

use crate::error::{EngineError, Result};
use crate::registry::{DenseValues, DenseWeight};

/// Output features computed by one rayon task.
const FEATURE_BLOCK: usize = 16;

/// Dense `y[m, n] = x[m, k] · w[n, k]ᵀ`, each output one fixed-order [`dot`]: bit-identical to
/// [`w4a16_linear`] when `w` holds the dequantized values of the INT4 weight.
pub(crate) fn linear(x: &[f32], m: usize, w: &[f32], n: usize) -> Result<Vec<f32>> {
    let k = w.len().checked_div(n).unwrap_or(0);
    if w.len() != n * k || x.len() != m * k {
        return Err(EngineError::shape(
            "linear",
            format!("x holds {} values for {m} rows, w {} values for {n} rows: K disagrees", x.len(), w.len()),
        ));
    }
    if m == 0 || n == 0 {
        return Ok(vec![0.0; m * n]);
    }
    // Y transposed ([N, M]) so that a block of output features is one contiguous slice.
    let mut yt = vec![0f32; n * m];
    yt.par_chunks_mut(FEATURE_BLOCK * m).zip(w.par_chunks(FEATURE_BLOCK * k)).for_each(|(out, wblock)| {
        for (col, wrow) in out.chunks_exact_mut(m).zip(wblock.chunks_exact(k)) {
            for (o, xrow) in col.iter_mut().zip(x.chunks_exact(k)) {
                *o = dot(xrow, wrow);
            }
        }
    });
    Ok(transpose(&yt, n, m))
}

/// [`linear`] over a weight in its stored dtype: 16-bit rows are widened to f32 (exactly) a block
/// at a time, so the result is bit-identical to [`linear`] over the widened weight.
pub(crate) fn dense_linear(x: &[f32], m: usize, w: &DenseWeight) -> Result<Vec<f32>> {
    let (n, k) = (w.n, w.k);
    if x.len() != m * k {
        return Err(EngineError::shape(
            "linear",
            format!("x holds {} values for {m} rows, the weight's K is {k}", x.len()),
        ));
    }
    if let DenseValues::F32(values) = &w.values {
        return linear(x, m, values, n);
    }
    if m == 0 || n == 0 {
        return Ok(vec![0.0; m * n]);
    }
    let mut yt = vec![0f32; n * m];
    yt.par_chunks_mut(FEATURE_BLOCK * m).enumerate().for_each(|(block, out)| {
        let first = block * FEATURE_BLOCK;
        let rows = out.len() / m;
        let wblock = w.values.widen(first * k..(first + rows) * k);
        for (col, wrow) in out.chunks_exact_mut(m).zip(wblock.chunks_exact(k)) {
            for (o, xrow) in col.iter_mut().zip(x.chunks_exact(k)) {
                *o = dot(xrow, wrow);
            }
        }
    });
    Ok(transpose(&yt, n, m))
}

/// W4A16 `y[m, n] = x[m, k] · dequant(w)[n, k]ᵀ` through the reference GEMM of kdtree-quant.
pub(crate) fn w4a16_linear(x: &[f32], m: usize, w: &QuantizedWeight) -> Result<Vec<f32>> {
    w4a16_gemm_f32(x, m, w).map_err(|source| EngineError::Quant {
        file: "<activations>".into(),
        tensor: "x".into(),
        source: Box::new(source),
    })
}

fn transpose(a: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; a.len()];
    for (r, row) in a.chunks_exact(cols).enumerate() {
        for (c, &v) in row.iter().enumerate() {
            t[c * rows + r] = v;
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use kdtree_quant::Dtype;

    fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len).map(|i| (((i + seed) * 7919) % 211) as f32 / 50.0 - 2.0).collect()
    }

    #[test]
    fn dense_matches_a_plain_dot_per_output() {
        let (m, n, k) = (3, 37, 20);
        let (x, w) = (values(m * k, 1), values(n * k, 2));
        let y = linear(&x, m, &w, n).unwrap();
        for i in 0..m {
            for j in 0..n {
                assert_eq!(y[i * n + j], dot(&x[i * k..][..k], &w[j * k..][..k]));
            }
        }
        assert!(linear(&x, m, &w[1..], n).is_err());
    }

    #[test]
    fn w4a16_equals_dense_over_the_dequantized_weight_bitwise() {
        let (m, n, k) = (5, 33, 64);
        let qw = QuantizedWeight::quantize(&values(n * k, 3), n, k, 32, Dtype::Bf16).unwrap();
        let x = values(m * k, 4);
        assert_eq!(w4a16_linear(&x, m, &qw).unwrap(), linear(&x, m, &qw.dequantize(), n).unwrap());
    }

    #[test]
    fn bf16_weights_give_the_bits_of_their_f32_widening() {
        let (m, n, k) = (3, 37, 20);
        let (x, w) = (values(m * k, 7), values(n * k, 8));
        let half: Vec<half::bf16> = w.iter().map(|&v| half::bf16::from_f32(v)).collect();
        let widened: Vec<f32> = half.iter().map(|v| v.to_f32()).collect();
        let dense = DenseWeight::new(n, k, DenseValues::Bf16(half)).unwrap();
        assert_eq!(dense_linear(&x, m, &dense).unwrap(), linear(&x, m, &widened, n).unwrap());
        assert!(dense_linear(&x[1..], m, &dense).is_err());
    }

    #[test]
    fn a_row_alone_equals_the_row_in_a_batch() {
        let (m, n, k) = (7, 19, 24);
        let (x, w) = (values(m * k, 5), values(n * k, 6));
        let all = linear(&x, m, &w, n).unwrap();
        assert_eq!(linear(&x[4 * k..5 * k], 1, &w, n).unwrap(), all[4 * n..5 * n]);
    }
}
