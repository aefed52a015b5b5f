//! How close a W4A16 kernel must come to the CPU reference: random problems with their reference
//! and the per-variant tolerance table. Shared by the GPU tests, the fuzzer and the tuner's
//! correctness gate; errors are the workspace's one measure ([`kdtree_quant::compare`]), norm-wise.

use kdtree_quant::compare::Measure;
use kdtree_quant::sample::Uniform;
use kdtree_quant::{Dtype, QuantizedWeight, Scales, reference};

use crate::Result;
use crate::w4a16::{Acc, W4a16};

/// A random W4A16 problem and its CPU reference result.
pub struct RandomGemm {
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

impl RandomGemm {
    /// X uniform in [-1, 1), q uniform in [-8, 7], scales uniform in [0.005, 0.025], all rounded
    /// to `dtype`; deterministic in `seed`.
    pub fn random(m: usize, n: usize, k: usize, group_size: usize, dtype: Dtype, seed: u64) -> Result<RandomGemm> {
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
        Ok(RandomGemm { m, x, w, reference, scale })
    }

    /// The error of a kernel's Y (bits of `dtype`) against the reference [`RandomGemm::reference`]:
    /// [`Measure::whole`] with [`RandomGemm::scale`] as the floor, `max |y - r| / max(scale, max |r|)`.
    /// Norm-wise, since single outputs near zero (cancellation) carry no relative precision for any
    /// kernel.
    pub fn error(&self, dtype: Dtype, y: &[u16]) -> f64 {
        bits_error(dtype, y, &self.reference, self.scale)
    }
}

/// The error of a kernel's Y (bits of `dtype`) against an f32 reference: [`Measure::whole`] with
/// `scale` as the floor, as [`RandomGemm::error`] (the grouped kernels' tests, whose problems are
/// built per expert, use it directly).
pub fn bits_error(dtype: Dtype, y: &[u16], reference: &[f32], scale: f32) -> f64 {
    let to_f32 = |b: u16| match dtype {
        Dtype::F16 => half::f16::from_bits(b).to_f32(),
        Dtype::Bf16 => half::bf16::from_bits(b).to_f32(),
    };
    let y: Vec<f32> = y.iter().map(|&b| to_f32(b)).collect();
    Measure::whole(scale).error(&y, reference)
}

/// The largest [`RandomGemm::error`] a correct variant may show.
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
pub fn tolerance(v: &W4a16) -> f64 {
    tolerance_for(v.dtype, v.acc)
}

/// [`tolerance`] of a variant of any space that rounds as `mma` does (q * s to the dtype, sums in
/// `acc`): by its dtype and accumulation.
pub(crate) fn tolerance_for(dtype: Dtype, acc: Acc) -> f64 {
    let eps = dtype.epsilon() as f64;
    match acc {
        Acc::F32 => 2.0 * eps,
        Acc::F16 => 8.0 * eps,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_problems_are_deterministic_and_in_range() {
        let a = RandomGemm::random(3, 70, 64, 32, Dtype::Bf16, 7).unwrap();
        let b = RandomGemm::random(3, 70, 64, 32, Dtype::Bf16, 7).unwrap();
        assert_eq!((a.x.clone(), a.reference.clone()), (b.x, b.reference));
        assert!(a.w.q().contains(&-8) && a.w.q().contains(&7));
        assert_eq!(a.reference.len(), 3 * 70);
    }

    #[test]
    fn error_is_norm_wise_over_the_problem_scale_and_nan_is_infinite() {
        let p = RandomGemm::random(3, 70, 64, 32, Dtype::F16, 7).unwrap();
        let mut y: Vec<u16> = p.reference.iter().map(|&r| half::f16::from_f32(r).to_bits()).collect();
        assert!(p.error(Dtype::F16, &y) <= Dtype::F16.epsilon() as f64 / 2.0, "the reference rounded");
        let worst = p.reference.iter().fold(0f32, |m, r| m.max(r.abs()));
        y[5] = half::f16::from_f32(p.reference[5] + worst / 8.0).to_bits();
        assert!((p.error(Dtype::F16, &y) - 0.125).abs() < 1e-3, "an eighth of the largest output off");
        y[5] = half::f16::NAN.to_bits();
        assert_eq!(p.error(Dtype::F16, &y), f64::INFINITY);
    }

    #[test]
    fn a_single_cancelling_output_is_judged_against_the_size_of_its_terms() {
        // One output (N = 1), many problems: some outputs cancel to far below their terms' size.
        let problems: Vec<RandomGemm> =
            (0..64).map(|seed| RandomGemm::random(1, 1, 832, 64, Dtype::F16, seed).unwrap()).collect();
        let smallest = problems.iter().map(|p| p.reference[0].abs() / p.scale).fold(f32::INFINITY, f32::min);
        assert!(smallest < 0.05, "some output cancels: {smallest}");
        for p in &problems {
            // sqrt(832 / 3) * rms(q s) = 16.7 * 0.07 ~ 1: the size of the sum, whatever it cancels to.
            assert!((0.3..3.0).contains(&p.scale), "scale {}", p.scale);
        }
        // A typical 3-row, 70-column problem keeps its largest output as the scale.
        let p = RandomGemm::random(3, 70, 640, 32, Dtype::Bf16, 1).unwrap();
        assert_eq!(p.scale, p.reference.iter().fold(0f32, |m, r| m.max(r.abs())));
    }
}
