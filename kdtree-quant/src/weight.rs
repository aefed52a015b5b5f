//! The quantized weight: symmetric signed int4, one scale per (output row, group of K).

use crate::dtype::Dtype;
use crate::error::{QuantError, Result};
use crate::int4::{self, Q_MAX, Q_MIN};
use crate::scales::{self, Scales};

/// Group sizes the format and the kernels support.
pub const GROUP_SIZES: [usize; 3] = [32, 64, 128];

/// Checks that `group_size` is supported and divides `k`; `tensor` names the weight in errors.
pub fn check_group(tensor: &str, k: usize, group_size: usize) -> Result<()> {
    if !GROUP_SIZES.contains(&group_size) {
        return Err(QuantError::UnsupportedGroupSize { group_size });
    }
    if !k.is_multiple_of(group_size) {
        return Err(QuantError::KNotMultipleOfGroup { tensor: tensor.into(), k, group_size });
    }
    Ok(())
}

/// An [N, K] weight, `w[n][k] = q[n][k] * scale[n][k / group_size]`, in the compressed-tensors
/// `pack-quantized` layout: `packed` is [N, K / 8] words (see [`crate::int4`]), `scales` is
/// [N, K / group_size].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuantizedWeight {
    pub n: usize,
    pub k: usize,
    pub group_size: usize,
    pub packed: Vec<u32>,
    pub scales: Scales,
}

impl QuantizedWeight {
    /// Validates the parts of a weight; `tensor` names it in errors.
    pub fn from_parts(
        tensor: &str,
        n: usize,
        k: usize,
        group_size: usize,
        packed: Vec<u32>,
        scales: Scales,
    ) -> Result<Self> {
        check_group(tensor, k, group_size)?;
        let expect = |what: &str, expected: usize, actual: usize| {
            if expected == actual {
                Ok(())
            } else {
                Err(QuantError::LengthMismatch { tensor: format!("{tensor}.{what}"), expected, actual })
            }
        };
        expect("weight_packed", n * k / int4::PER_WORD, packed.len())?;
        expect("weight_scale", n * k / group_size, scales.len())?;
        Ok(Self { n, k, group_size, packed, scales })
    }

    /// Quantizes a row-major [N, K] f32 weight.
    ///
    /// Convention (compressed-tensors' symmetric int4, `calculate_qparams`): `s = absmax / 7.5`
    /// (half the int4 range 15), `q = clamp(round(w / s), -8, 7)`. One deliberate difference:
    /// `s` is rounded *up* to the scale dtype (compressed-tensors rounds to nearest), which
    /// keeps `|w - q s| <= s / 2` for every element. An all-zero group gets `s = 0`, `q = 0`.
    pub fn quantize(w: &[f32], n: usize, k: usize, group_size: usize, scale_dtype: Dtype) -> Result<Self> {
        check_group("weight", k, group_size)?;
        if w.len() != n * k {
            return Err(QuantError::LengthMismatch { tensor: "weight".into(), expected: n * k, actual: w.len() });
        }
        if let Some(bad) = w.iter().find(|v| !v.is_finite()) {
            return Err(QuantError::OutOfRange { tensor: "weight".into(), value: *bad as i64, range: "finite values" });
        }
        let mut q = Vec::with_capacity(n * k);
        let mut scale_bits = Vec::with_capacity(n * k / group_size);
        for group in w.chunks_exact(group_size) {
            let absmax = group.iter().fold(0f32, |m, v| m.max(v.abs()));
            let bits = scales::round_up(scale_dtype, absmax / 7.5);
            let s = Scales { dtype: scale_dtype, bits: vec![bits] }.get(0);
            scale_bits.push(bits);
            q.extend(
                group.iter().map(
                    |&v| {
                        if s == 0.0 { 0 } else { (v / s).round().clamp(Q_MIN as f32, Q_MAX as f32) as i8 }
                    },
                ),
            );
        }
        Ok(Self { n, k, group_size, packed: int4::pack(&q), scales: Scales { dtype: scale_dtype, bits: scale_bits } })
    }

    /// Builds a weight from int4 values ([N, K], each in [-8, 7]) and scales.
    pub fn from_q(q: &[i8], n: usize, k: usize, group_size: usize, scales: Scales) -> Result<Self> {
        if let Some(&bad) = q.iter().find(|v| !(Q_MIN..=Q_MAX).contains(*v)) {
            return Err(QuantError::OutOfRange { tensor: "q".into(), value: bad as i64, range: "[-8, 7]" });
        }
        if q.len() != n * k {
            return Err(QuantError::LengthMismatch { tensor: "q".into(), expected: n * k, actual: q.len() });
        }
        check_group("weight", k, group_size)?;
        Self::from_parts("weight", n, k, group_size, int4::pack(q), scales)
    }

    pub fn groups_per_row(&self) -> usize {
        self.k / self.group_size
    }

    /// The int4 values, row-major [N, K].
    pub fn q(&self) -> Vec<i8> {
        int4::unpack(&self.packed)
    }

    pub fn scale(&self, row: usize, group: usize) -> f32 {
        self.scales.get(row * self.groups_per_row() + group)
    }

    /// Dequantizes row `row` into `out` (length K). `q * s` is exact in f32.
    #[inline]
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        let words = &self.packed[row * self.k / int4::PER_WORD..][..self.k / int4::PER_WORD];
        let words_per_group = self.group_size / int4::PER_WORD;
        for (g, (group_words, group_out)) in
            words.chunks_exact(words_per_group).zip(out.chunks_exact_mut(self.group_size)).enumerate()
        {
            let s = self.scale(row, g);
            for (&word, o) in group_words.iter().zip(group_out.chunks_exact_mut(int4::PER_WORD)) {
                // Written as one shift per lane so that it vectorises (variable shifts, one convert).
                for (j, dst) in o.iter_mut().enumerate() {
                    *dst = (((word >> (4 * j)) & 0xF) as i32 - int4::OFFSET as i32) as f32 * s;
                }
            }
        }
    }

    /// The whole weight in f32, row-major [N, K].
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.n * self.k];
        for (row, o) in out.chunks_exact_mut(self.k).enumerate() {
            self.dequantize_row(row, o);
        }
        out
    }

    /// Bytes of the packed weights plus scales: what a kernel must stream.
    pub fn bytes(&self) -> usize {
        self.packed.len() * 4 + self.scales.len() * 2
    }
}
