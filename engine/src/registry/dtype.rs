//! The dtype dense weights are computed in: the checkpoint's by default, or another one asked for
//! (the CLI's `--dtype`). The loader converts each dense weight to it as it is read; INT4 weights,
//! norms, the router and its bias are not dense weights of this kind and stay as they are.

use half::{bf16, f16};

use super::DenseValues;

/// A dense compute dtype. f32 keeps an f32 checkpoint's arithmetic f32 end to end (f32 GEMMs with
/// no TF32, an f32 KV cache); bf16 and f16 round the weights (once, at load) and, on the GPU, the
/// activations a GEMM reads.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ComputeDtype {
    Bf16,
    F16,
    F32,
}

impl ComputeDtype {
    pub fn name(self) -> &'static str {
        match self {
            ComputeDtype::Bf16 => "bf16",
            ComputeDtype::F16 => "f16",
            ComputeDtype::F32 => "f32",
        }
    }

    pub fn bytes(self) -> usize {
        match self {
            ComputeDtype::Bf16 | ComputeDtype::F16 => 2,
            ComputeDtype::F32 => 4,
        }
    }

    /// The dtype `values` are stored in.
    pub fn of(values: &DenseValues) -> ComputeDtype {
        match values {
            DenseValues::F32(_) => ComputeDtype::F32,
            DenseValues::Bf16(_) => ComputeDtype::Bf16,
            DenseValues::F16(_) => ComputeDtype::F16,
        }
    }
}

impl std::fmt::Display for ComputeDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The compute dtype of a loaded model and where it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Dtypes {
    /// What dense weights are computed in.
    pub compute: ComputeDtype,
    /// What the checkpoint stores its dense weights in (its embedding table's dtype).
    pub checkpoint: ComputeDtype,
    /// Whether `compute` was asked for (the CLI's `--dtype`) rather than taken from the checkpoint.
    pub chosen: bool,
}

impl std::fmt::Display for Dtypes {
    /// `f32 (the checkpoint's)`, or `bf16 (asked for; the checkpoint is f32)`: the library names no
    /// flag, whatever asked for it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.chosen, self.compute == self.checkpoint) {
            (false, _) | (true, true) => write!(f, "{} (the checkpoint's)", self.compute),
            (true, false) => write!(f, "{} (asked for; the checkpoint is {})", self.compute, self.checkpoint),
        }
    }
}

impl DenseValues {
    /// The values in `dtype`: unchanged when they are already, widened exactly to f32, or rounded to
    /// the nearest even 16-bit value (a 16-bit value to the other 16-bit type through f32, which
    /// holds either exactly).
    pub(crate) fn into_dtype(self, dtype: ComputeDtype) -> DenseValues {
        if ComputeDtype::of(&self) == dtype {
            return self;
        }
        let wide = self.widen(0..self.len());
        match dtype {
            ComputeDtype::F32 => DenseValues::F32(wide),
            ComputeDtype::Bf16 => DenseValues::Bf16(wide.into_iter().map(bf16::from_f32).collect()),
            ComputeDtype::F16 => DenseValues::F16(wide.into_iter().map(f16::from_f32).collect()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversion_widens_exactly_and_rounds_to_nearest_even() {
        // 1 + 2^-8 is halfway between two bf16 values: ties to even (1.0); 1 + 3 * 2^-9 rounds up.
        let f = DenseValues::F32(vec![1.0 + 1.0 / 256.0, 1.0 + 3.0 / 512.0, -2.5]);
        let b = f.clone().into_dtype(ComputeDtype::Bf16);
        assert_eq!(b.widen(0..3), [1.0, 1.0 + 1.0 / 128.0, -2.5]);
        assert_eq!(b.clone().into_dtype(ComputeDtype::F32), DenseValues::F32(vec![1.0, 1.0 + 1.0 / 128.0, -2.5]));
        assert_eq!(b.clone().into_dtype(ComputeDtype::Bf16), b, "the same dtype is no conversion");
        assert_eq!(f.into_dtype(ComputeDtype::F16).widen(0..3), [1.0 + 1.0 / 256.0, 1.0 + 3.0 / 512.0, -2.5]);
    }

    #[test]
    fn the_description_says_where_the_dtype_came_from() {
        let d = Dtypes { compute: ComputeDtype::F32, checkpoint: ComputeDtype::F32, chosen: false };
        assert_eq!(d.to_string(), "f32 (the checkpoint's)");
        let d = Dtypes { compute: ComputeDtype::Bf16, checkpoint: ComputeDtype::F32, chosen: true };
        assert_eq!(d.to_string(), "bf16 (asked for; the checkpoint is f32)");
    }
}
