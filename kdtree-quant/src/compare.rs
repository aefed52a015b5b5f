//! How an output is compared with its reference: the one error measure of the workspace, used by
//! the tuner's correctness gate, the W4A16 GPU tests and fuzzer, the kernels' GPU tests and the
//! engine's.
//!
//! `error = max_i |y_i - r_i| / max(floor, s_i)`: the largest difference, relative to a scale `s_i`
//! that is either
//! - [`Scale::Whole`], the output's largest magnitude `max_j |r_j|` (norm-wise), for sums of many
//!   terms (GEMMs, a whole forward's logits): a single output may cancel to near zero, where no
//!   implementation has relative precision, so every output is judged on the output's scale; or
//! - [`Scale::Each`], the element's own magnitude `|r_i|` (element-wise), for element-wise ops,
//!   whose every output must be right on its own scale.
//!
//! `floor` keeps the measure absolute where the reference is small: with a floor of 1, say, the
//! error is absolute below 1 and relative above. Where the denominator is 0 (an all-zero reference
//! and no floor) the difference counts as it is. A NaN or infinite difference is an infinite error,
//! and so is an output of another length than the reference.
//!
//! ```
//! use kdtree_quant::compare::Measure;
//!
//! let reference = [4.0, -2.0, 0.125];
//! // Norm-wise: 0.5 off, against the largest output, 4, is 0.125.
//! assert_eq!(Measure::whole(0.0).error(&[4.0, -2.0, 0.625], &reference), 0.125);
//! // Element-wise with a floor of 1: the same 0.5 off an output below 1 is an absolute 0.5.
//! assert_eq!(Measure::each(1.0).error(&[4.0, -2.0, 0.625], &reference), 0.5);
//! assert!(Measure::whole(0.0).check(&[4.0, -2.0], &reference, 1.0).is_err(), "a missing output");
//! ```

/// What each difference is relative to (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// The largest magnitude of the whole reference.
    Whole,
    /// Each element's own magnitude.
    Each,
}

/// The error measure: a [`Scale`] and the floor under it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Measure {
    pub scale: Scale,
    pub floor: f32,
}

/// An output that is not within its tolerance of the reference.
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

impl Measure {
    /// Norm-wise: relative to `max(floor, max |r|)`.
    pub const fn whole(floor: f32) -> Measure {
        Measure { scale: Scale::Whole, floor }
    }

    /// Element-wise: relative to `max(floor, |r_i|)`.
    pub const fn each(floor: f32) -> Measure {
        Measure { scale: Scale::Each, floor }
    }

    /// The error of `out` against `reference`.
    pub fn error(&self, out: &[f32], reference: &[f32]) -> f64 {
        self.worst(out, reference).0
    }

    /// The error and the element where it is largest (for a length mismatch, infinity at the first
    /// missing or extra element).
    pub fn worst(&self, out: &[f32], reference: &[f32]) -> (f64, usize) {
        if out.len() != reference.len() {
            return (f64::INFINITY, out.len().min(reference.len()));
        }
        let floor = self.floor as f64;
        let whole = reference.iter().fold(floor, |m, &r| m.max((r as f64).abs()));
        let mut worst = (0.0, 0);
        for (i, (&y, &r)) in out.iter().zip(reference).enumerate() {
            let d = (y as f64 - r as f64).abs();
            let scale = match self.scale {
                Scale::Whole => whole,
                Scale::Each => floor.max((r as f64).abs()),
            };
            let e = match (d.is_finite(), scale > 0.0) {
                (false, _) => f64::INFINITY,
                (true, true) => d / scale,
                (true, false) => d,
            };
            if e > worst.0 {
                worst = (e, i);
            }
        }
        worst
    }

    /// `Ok(error)` when `out` matches `reference` within `tolerance`.
    pub fn check(&self, out: &[f32], reference: &[f32], tolerance: f64) -> Result<f64, Mismatch> {
        let (error, index) = self.worst(out, reference);
        if error <= tolerance {
            return Ok(error);
        }
        let at = |v: &[f32]| v.get(index).copied().unwrap_or(f32::NAN);
        Err(Mismatch { error, tolerance, index, got: at(out), expected: at(reference) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_is_relative_to_the_largest_output_and_nan_is_infinite() {
        let whole = Measure::whole(0.0);
        assert_eq!(whole.error(&[1.0, -2.0, 4.0], &[1.0, -2.0, 4.0]), 0.0);
        assert_eq!(whole.error(&[1.0, -2.0, 4.0], &[1.5, -2.0, 4.0]), 0.125);
        assert_eq!(Measure::whole(5.0).error(&[1.0, -2.0, 4.0], &[1.5, -2.0, 4.0]), 0.1, "a larger floor wins");
        assert_eq!(whole.error(&[f32::NAN], &[1.0]), f64::INFINITY);
        assert_eq!(whole.error(&[f32::INFINITY], &[1.0]), f64::INFINITY);
        assert_eq!(whole.worst(&[0.0, 0.5], &[0.0, 0.0]), (0.5, 1), "an all-zero reference: the difference");
    }

    #[test]
    fn each_is_relative_to_the_element_above_the_floor() {
        let each = Measure::each(1.0);
        // 0.5 off 0.125: absolute below the floor; 1 off 128: relative above it.
        assert_eq!(each.worst(&[0.625, 129.0], &[0.125, 128.0]), (0.5, 0));
        assert_eq!(each.error(&[0.125, 160.0], &[0.125, 128.0]), 0.25);
    }

    #[test]
    fn check_names_the_worst_element_and_refuses_other_lengths() {
        let m = Measure::whole(0.0).check(&[1.0, 3.0], &[1.0, 2.0], 0.1).unwrap_err();
        assert_eq!((m.index, m.got, m.expected, m.error), (1, 3.0, 2.0, 0.5));
        assert!(Measure::whole(0.0).check(&[1.0, 2.1], &[1.0, 2.0], 0.1).is_ok());
        let short = Measure::whole(0.0).check(&[1.0], &[1.0, 2.0], 1.0).unwrap_err();
        assert_eq!((short.index, short.error), (1, f64::INFINITY));
        assert!(short.got.is_nan() && short.expected == 2.0);
    }
}
