//! The correctness gate: a candidate's output against the CPU reference
//! ([`kdtree_quant::reference::w4a16_gemm_f32`], f32 before its final rounding).
//!
//! The error measure and the per-variant tolerance table are the W4A16 space's own, next to its
//! kernels: [`crate::w4a16::check`] (`max |y - r| / max |r|`; 2 eps of the dtype for f32 sums, 8 eps
//! for f16 sums, each bound explained there with what the H200 measured). This module applies the
//! same measure to f32 outputs, names the worst element for the report, and refuses outputs of the
//! wrong length or with NaN. tests/tune_gate.rs checks the table against simulated kernels: the
//! arithmetic a correct kernel may do passes, the bugs a wrong one has do not.

/// Why a candidate failed the gate.
#[derive(Clone, Debug, PartialEq)]
pub struct Mismatch {
    pub error: f64,
    pub tolerance: f64,
    /// Where the error is largest (for a length mismatch, the first missing or extra element).
    pub index: usize,
    pub got: f32,
    pub expected: f32,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "wrong result: error {:.3e} above the tolerance {:.1e} (element {}: {} where the reference has {})",
            self.error, self.tolerance, self.index, self.got, self.expected
        )
    }
}

/// `max |y - r| / max |r|` of `out` against `reference`, and where the difference is largest. NaN
/// or infinity in `out` is an infinite error.
pub fn error(out: &[f32], reference: &[f32]) -> (f64, usize) {
    let scale = reference.iter().fold(0f64, |m, &r| m.max(r.abs() as f64));
    let mut worst = (0.0, 0);
    for (i, (&y, &r)) in out.iter().zip(reference).enumerate() {
        let d = (y as f64 - r as f64).abs();
        let d = if d.is_finite() { d } else { f64::INFINITY };
        if d > worst.0 {
            worst = (d, i);
        }
    }
    // An all-zero reference leaves the absolute difference, as in `w4a16::check`.
    (if scale > 0.0 { worst.0 / scale } else { worst.0 }, worst.1)
}

/// `Ok(error)` when `out` matches `reference` within `tolerance`.
pub fn check(out: &[f32], reference: &[f32], tolerance: f64) -> Result<f64, Mismatch> {
    if out.len() != reference.len() {
        let index = out.len().min(reference.len());
        return Err(Mismatch {
            error: f64::INFINITY,
            tolerance,
            index,
            got: out.get(index).copied().unwrap_or(f32::NAN),
            expected: reference.get(index).copied().unwrap_or(f32::NAN),
        });
    }
    let (error, index) = error(out, reference);
    if error <= tolerance {
        Ok(error)
    } else {
        Err(Mismatch { error, tolerance, index, got: out[index], expected: reference[index] })
    }
}
