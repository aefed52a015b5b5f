//! The correctness gate: a candidate's output against the CPU reference
//! ([`kdtree_quant::reference::w4a16_gemm_f32`], f32 before its final rounding), by the workspace's
//! one error measure ([`kdtree_quant::compare`]), norm-wise: `max |y - r| / max |r|`.
//!
//! The per-variant tolerance table is the W4A16 space's own, next to its kernels:
//! [`crate::w4a16::accuracy`] (2 eps of the dtype for f32 sums, 8 eps for f16 sums, each bound
//! explained there with what the H200 measured). The gate judges against the largest output alone
//! (no floor: a tuning problem has many outputs), names the worst element for the report, and
//! refuses outputs of the wrong length or with NaN. tests/all/tune_gate.rs checks the table against
//! simulated kernels: the arithmetic a correct kernel may do passes, the bugs a wrong one has do not.

use kdtree_quant::compare::Measure;
pub(crate) use kdtree_quant::compare::Mismatch;

/// The gate's measure: norm-wise, without a floor.
pub(crate) const MEASURE: Measure = Measure::whole(0.0);

/// `Ok(error)` when `out` matches `reference` within `tolerance` by `MEASURE`.
pub fn pass(out: &[f32], reference: &[f32], tolerance: f64) -> Result<f64, Mismatch> {
    MEASURE.check(out, reference, tolerance)
}
