use kdtree_quant::reference::dot;
use rayon::prelude::*;

/// RMSNorm over rows of `weight.len()`: `out = x / sqrt(mean(x²) + eps) * weight`, as DeepSeek-V3's
/// `RMSNorm` computes it in f32 (the sum of squares through the fixed-order [`dot`]).
pub fn rmsnorm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let dim = weight.len();
    assert_eq!(x.len(), out.len(), "rmsnorm: x and out differ in length");
    assert_eq!(x.len() % dim, 0, "rmsnorm: x is not a whole number of rows");
    out.par_chunks_mut(dim).zip(x.par_chunks(dim)).for_each(|(o, row)| {
        let inv = 1.0 / (dot(row, row) / dim as f32 + eps).sqrt();
        for ((o, &v), &w) in o.iter_mut().zip(row).zip(weight) {
            *o = v * inv * w;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_rms_rows_are_scaled_by_the_weight() {
        // Row [1, -1, 1, -1] has mean square 1, so with eps = 0 the output is x * weight.
        let x = [1.0, -1.0, 1.0, -1.0, 2.0, 2.0, 2.0, 2.0];
        let w = [1.0, 2.0, 3.0, 4.0];
        let mut out = [0.0; 8];
        rmsnorm(&x, &w, 0.0, &mut out);
        assert_eq!(out, [1.0, -2.0, 3.0, -4.0, 1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn a_row_alone_equals_the_row_in_a_batch() {
        let x: Vec<f32> = (0..3 * 37).map(|i| ((i * 7919) % 101) as f32 / 13.0 - 3.0).collect();
        let w: Vec<f32> = (0..37).map(|i| 0.5 + i as f32 / 37.0).collect();
        let mut all = vec![0.0; x.len()];
        rmsnorm(&x, &w, 1e-6, &mut all);
        let mut one = vec![0.0; 37];
        rmsnorm(&x[37..74], &w, 1e-6, &mut one);
        assert_eq!(one, all[37..74]);
    }
}
