//! How close a W4A16 kernel must come to the CPU reference, and how that is measured. Shared by
//! the GPU tests, the fuzzer and the tuner's correctness gate.

use kdtree_quant::sample::Uniform;
use kdtree_quant::{Dtype, QuantizedWeight, Scales, reference};

use crate::Result;
use crate::w4a16::{Acc, W4a16};

/// A random W4A16 problem and its CPU reference result.
pub struct Problem {
    pub m: usize,
    /// X, [m, k], activation dtype bits.
    pub x: Vec<u16>,
    pub w: QuantizedWeight,
    /// [`reference::w4a16_gemm_f32`] of X and W, before rounding to the dtype.
    pub reference: Vec<f32>,
    /// What errors are relative to: the largest output, or, where larger, the size of a sum of K
    /// products x w that does not cancel (largest row norm of X times largest column norm of W,
    /// over sqrt(K)). With a handful of outputs (N = 1), the largest may have cancelled to near
    /// zero, and every kernel's rounding would look like a large relative error.
    pub scale: f32,
}

impl Problem {
    /// X uniform in [-1, 1), q uniform in [-8, 7], scales uniform in [0.005, 0.025], all rounded
    /// to `dtype`; deterministic in `seed`.
    pub fn random(m: usize, n: usize, k: usize, group_size: usize, dtype: Dtype, seed: u64) -> Result<Problem> {
        let mut sample = Uniform::new(seed);
        let mut uniform = move || sample.next().expect("endless");
        let bits = |v: f32| match dtype {
            Dtype::F16 => half::f16::from_f32(v).to_bits(),
            Dtype::Bf16 => half::bf16::from_f32(v).to_bits(),
        };
        let x: Vec<u16> = (0..m * k).map(|_| bits(2.0 * uniform() - 1.0)).collect();
        let q: Vec<i8> = (0..n * k).map(|_| (uniform() * 16.0) as i8 - 8).collect();
        let scales = Scales { dtype, bits: (0..n * k / group_size).map(|_| bits(0.005 + 0.02 * uniform())).collect() };
        let w = QuantizedWeight::from_q(&q, n, k, group_size, scales)?;
        let xf: Vec<f32> = x.iter().map(|&b| Scales { dtype, bits: vec![b] }.get(0)).collect();
        let reference = reference::w4a16_gemm_f32(&xf, m, &w)?;
        let norm = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>().sqrt();
        let x_norm = xf.chunks_exact(k).map(norm).fold(0f32, f32::max);
        let w_norm = w.dequantize().chunks_exact(k).map(norm).fold(0f32, f32::max);
        let scale = reference.iter().fold(x_norm * w_norm / (k as f32).sqrt(), |s, r| s.max(r.abs()));
        Ok(Problem { m, x, w, reference, scale })
    }

    /// [`relative_error`] of a kernel's Y for this problem, relative to its [`Problem::scale`].
    pub fn error(&self, dtype: Dtype, y: &[u16]) -> f32 {
        relative_error(dtype, y, &self.reference, self.scale)
    }
}

/// `max |y - y_ref| / scale` with `y` in `dtype` bits and `y_ref` the f32 reference
/// ([`kdtree_quant::reference::w4a16_gemm_f32`]); `scale` is at least `max |y_ref|`. Normalised by
/// a scale of all outputs, since single outputs near zero (cancellation) carry no relative
/// precision for any kernel.
pub fn relative_error(dtype: Dtype, y: &[u16], reference: &[f32], scale: f32) -> f32 {
    let to_f32 = |b: u16| match dtype {
        Dtype::F16 => half::f16::from_bits(b).to_f32(),
        Dtype::Bf16 => half::bf16::from_bits(b).to_f32(),
    };
    let scale = reference.iter().fold(scale, |m, r| m.max(r.abs()));
    let worst = y.iter().zip(reference).fold(0f32, |m, (&b, r)| {
        let d = (to_f32(b) - r).abs();
        if d.is_nan() { f32::INFINITY } else { m.max(d) }
    });
    if scale == 0.0 { worst } else { worst / scale }
}

/// The largest [`relative_error`] a correct variant may show.
///
/// - Every variant rounds Y once to the dtype: up to eps / 2 of the largest output.
/// - mma rounds each dequantized weight q * s to the dtype before the product (eps / 2 each,
///   independent, so their sum grows like sqrt(K) eps / 2 times a typical |x w|, well under the
///   output's scale): bound by another eps.
/// - f16 accumulation rounds every partial sum (up to K / 16 k-steps, errors again random):
///   measured 2.6e-3 on the H200 at K = 7168, i.e. 2.7 eps; allow 8 eps.
///
/// So 2 eps for f32 accumulation (measured worst on the H200: bf16 4.4e-3 = 0.56 eps,
/// f16 4.6e-4 = 0.47 eps) and 8 eps for f16.
pub fn tolerance(v: &W4a16) -> f32 {
    let eps = v.dtype.epsilon();
    match v.acc {
        Acc::F32 => 2.0 * eps,
        Acc::F16 => 8.0 * eps,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_problems_are_deterministic_and_in_range() {
        let a = Problem::random(3, 70, 64, 32, Dtype::Bf16, 7).unwrap();
        let b = Problem::random(3, 70, 64, 32, Dtype::Bf16, 7).unwrap();
        assert_eq!((a.x.clone(), a.reference.clone()), (b.x, b.reference));
        assert!(a.w.q().contains(&-8) && a.w.q().contains(&7));
        assert_eq!(a.reference.len(), 3 * 70);
    }

    #[test]
    fn error_is_relative_to_the_largest_output_and_nan_is_infinite() {
        let y: Vec<u16> = [1.0f32, -2.0, 4.0].iter().map(|&v| half::f16::from_f32(v).to_bits()).collect();
        assert_eq!(relative_error(Dtype::F16, &y, &[1.0, -2.0, 4.0], 0.0), 0.0);
        assert_eq!(relative_error(Dtype::F16, &y, &[1.5, -2.0, 4.0], 0.0), 0.125);
        assert_eq!(relative_error(Dtype::F16, &y, &[1.5, -2.0, 4.0], 5.0), 0.1, "a larger scale wins");
        let nan = [half::f16::NAN.to_bits()];
        assert_eq!(relative_error(Dtype::F16, &nan, &[1.0], 0.0), f32::INFINITY);
    }

    #[test]
    fn a_single_cancelling_output_is_judged_against_the_size_of_its_terms() {
        // One output (N = 1), many problems: some outputs cancel to far below their terms' size.
        let problems: Vec<Problem> =
            (0..64).map(|seed| Problem::random(1, 1, 832, 64, Dtype::F16, seed).unwrap()).collect();
        let smallest = problems.iter().map(|p| p.reference[0].abs() / p.scale).fold(f32::INFINITY, f32::min);
        assert!(smallest < 0.05, "some output cancels: {smallest}");
        for p in &problems {
            // sqrt(832 / 3) * rms(q s) = 16.7 * 0.07 ~ 1: the size of the sum, whatever it cancels to.
            assert!((0.3..3.0).contains(&p.scale), "scale {}", p.scale);
        }
        // A typical 3-row, 70-column problem keeps its largest output as the scale.
        let p = Problem::random(3, 70, 640, 32, Dtype::Bf16, 1).unwrap();
        assert_eq!(p.scale, p.reference.iter().fold(0f32, |m, r| m.max(r.abs())));
    }
}
