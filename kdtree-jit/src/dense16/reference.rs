//! The CPU reference of [`super::Dense16`]: each output the f64 sum of its exact products (a 16-bit
//! value's product with another is exact in f64), rounded once to f32. The kernels sum in f32 in
//! their own order, so they part from it by a few f32 ulps of the sums along the way.

use kdtree_quant::Dtype;

use crate::tune::problem::from_bits;

/// `Y[m, n] = X[m, k] · W[n, k]ᵀ` of `dtype` bits, in f32.
pub fn product(x: &[u16], w: &[u16], (m, n, k): (usize, usize, usize), dtype: Dtype) -> Vec<f32> {
    let widen = |v: &[u16]| -> Vec<f64> { v.iter().map(|&b| f64::from(from_bits(dtype, b))).collect() };
    let (x, w) = (widen(&x[..m * k]), widen(&w[..n * k]));
    let mut y = vec![0.0f32; m * n];
    for (r, out) in y.chunks_mut(n).enumerate() {
        let xr = &x[r * k..(r + 1) * k];
        for (c, o) in out.iter_mut().enumerate() {
            *o = xr.iter().zip(&w[c * k..(c + 1) * k]).map(|(a, b)| a * b).sum::<f64>() as f32;
        }
    }
    y
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
