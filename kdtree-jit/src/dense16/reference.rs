//! The CPU reference of [`super::Dense16`]: each output the f64 sum of its exact products (a 16-bit
//! value's product with another is exact in f64), rounded once to f32. The kernels sum in f32 in
//! their own order, so they part from it by a few f32 ulps of the sums along the way.

use kdtree_quant::Dtype;
use rayon::prelude::*;

use crate::tune::problem::from_bits;

/// `Y[m, n] = X[m, k] · W[n, k]ᵀ` of `dtype` bits, in f32; W's rows shared among the CPU's cores (a
/// tuning problem's reference is up to 33 G multiply-adds).
pub fn product(x: &[u16], w: &[u16], (m, n, k): (usize, usize, usize), dtype: Dtype) -> Vec<f32> {
    let widen = |v: &[u16]| -> Vec<f64> { v.iter().map(|&b| f64::from(from_bits(dtype, b))).collect() };
    let x = widen(&x[..m * k]);
    // Column c of Y: row c of W against every row of X.
    let columns: Vec<Vec<f32>> = w[..n * k]
        .par_chunks(k)
        .map(|wc| {
            let wc = widen(wc);
            x.chunks(k).map(|xr| xr.iter().zip(&wc).map(|(a, b)| a * b).sum::<f64>() as f32).collect()
        })
        .collect();
    (0..m * n).map(|i| columns[i % n][i / n]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_are_summed_exactly_before_one_rounding() {
        let bits = |v: &[f32]| -> Vec<u16> { v.iter().map(|&f| half::bf16::from_f32(f).to_bits()).collect() };
        // 2^24 + 1 - 2^24 is 1 exactly; an f32 running sum would give 0.
        let x = bits(&[1.0, 1.0, 1.0, 2.0]);
        let w = bits(&[16_777_216.0, 1.0, -16_777_216.0, 0.5]);
        assert_eq!(product(&x, &w, (1, 1, 4), Dtype::Bf16), [2.0]);
        // Two rows, two columns: row-major Y.
        let x = bits(&[1.0, 2.0, 3.0, 4.0]);
        let w = bits(&[1.0, 0.0, 0.0, 1.0]);
        assert_eq!(product(&x, &w, (2, 2, 2), Dtype::Bf16), [1.0, 2.0, 3.0, 4.0]);
    }
}
