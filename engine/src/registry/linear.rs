//! A linear layer's weight as the checkpoint stores it, before a backend takes it.

use half::{bf16, f16};
use kdtree_quant::{QuantizedWeight, Scales};

use crate::error::{EngineError, Result};

/// A dense `[n, k]` weight in its on-disk dtype: bf16 and f16 weights stay 16-bit in memory and are
/// widened to f32 (exactly) only where a row is used.
#[derive(Clone, Debug, PartialEq)]
pub struct DenseWeight {
    pub n: usize,
    pub k: usize,
    pub values: DenseValues,
}

#[derive(Clone, Debug, PartialEq)]
pub enum DenseValues {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
    F16(Vec<f16>),
}

impl DenseValues {
    pub fn len(&self) -> usize {
        match self {
            DenseValues::F32(v) => v.len(),
            DenseValues::Bf16(v) => v.len(),
            DenseValues::F16(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Values `range`, in their dtype.
    pub fn slice(&self, range: std::ops::Range<usize>) -> DenseValues {
        match self {
            DenseValues::F32(v) => DenseValues::F32(v[range].to_vec()),
            DenseValues::Bf16(v) => DenseValues::Bf16(v[range].to_vec()),
            DenseValues::F16(v) => DenseValues::F16(v[range].to_vec()),
        }
    }

    /// Values `range` widened to f32 (exact for every dtype).
    pub fn widen(&self, range: std::ops::Range<usize>) -> Vec<f32> {
        match self {
            DenseValues::F32(v) => v[range].to_vec(),
            DenseValues::Bf16(v) => v[range].iter().map(|x| x.to_f32()).collect(),
            DenseValues::F16(v) => v[range].iter().map(|x| x.to_f32()).collect(),
        }
    }
}

impl DenseWeight {
    /// `values` must hold `n * k` values.
    pub fn new(n: usize, k: usize, values: DenseValues) -> Result<Self> {
        if values.len() != n * k {
            return Err(EngineError::shape(
                "dense weight",
                format!("a [{n}, {k}] weight needs {} values, got {}", n * k, values.len()),
            ));
        }
        Ok(Self { n, k, values })
    }

    /// Row `i`, widened to f32.
    pub fn row(&self, i: usize) -> Vec<f32> {
        self.values.widen(i * self.k..(i + 1) * self.k)
    }

    /// Every value, widened to f32.
    pub fn to_f32(&self) -> Vec<f32> {
        self.values.widen(0..self.values.len())
    }

    /// The bytes a forward reads to apply it.
    pub fn bytes(&self) -> usize {
        match self.values {
            DenseValues::F32(_) => 4 * self.values.len(),
            DenseValues::Bf16(_) | DenseValues::F16(_) => 2 * self.values.len(),
        }
    }
}

/// `y = x · Wᵀ` with W `[n, k]`: dense, or INT4 (W4A16).
#[derive(Clone, Debug, PartialEq)]
pub enum HostLinear {
    Dense(DenseWeight),
    Int4(QuantizedWeight),
}

impl HostLinear {
    pub fn n(&self) -> usize {
        match self {
            HostLinear::Dense(d) => d.n,
            HostLinear::Int4(q) => q.n,
        }
    }

    pub fn k(&self) -> usize {
        match self {
            HostLinear::Dense(d) => d.k,
            HostLinear::Int4(q) => q.k,
        }
    }

    /// The dense f32 equivalent (INT4 weights dequantized): what tests compare against.
    pub(crate) fn dequantized(&self) -> DenseWeight {
        match self {
            HostLinear::Dense(d) => DenseWeight { n: d.n, k: d.k, values: DenseValues::F32(d.to_f32()) },
            HostLinear::Int4(q) => DenseWeight { n: q.n, k: q.k, values: DenseValues::F32(q.dequantize()) },
        }
    }

    /// The bytes a forward reads to apply it (INT4: packed words and scales).
    pub fn bytes(&self) -> usize {
        match self {
            HostLinear::Dense(d) => d.bytes(),
            HostLinear::Int4(q) => 4 * q.packed.len() + 2 * q.scales.len(),
        }
    }

    /// Output rows `rows` of the weight, as a weight of their own (the inverse of [`Self::stack`]):
    /// each output is computed from its own row, so the part's outputs are those columns of the
    /// whole's, bit for bit.
    pub fn rows(&self, rows: std::ops::Range<usize>) -> Result<HostLinear> {
        if rows.start > rows.end || rows.end > self.n() {
            return Err(EngineError::shape(
                "rows",
                format!("rows {}..{} of a [{}, {}] weight", rows.start, rows.end, self.n(), self.k()),
            ));
        }
        let (n, k) = (rows.len(), self.k());
        match self {
            HostLinear::Dense(d) => {
                Ok(HostLinear::Dense(DenseWeight { n, k, values: d.values.slice(rows.start * k..rows.end * k) }))
            }
            HostLinear::Int4(q) => {
                let (words, groups) = (k / kdtree_quant::int4::PER_WORD, k / q.group_size);
                let packed = q.packed[rows.start * words..rows.end * words].to_vec();
                let bits = q.scales.bits[rows.start * groups..rows.end * groups].to_vec();
                let scales = Scales { dtype: q.scales.dtype, bits };
                let part = QuantizedWeight::from_parts("rows", n, k, q.group_size, packed, scales)
                    .map_err(|e| EngineError::QuantParts { op: "rows", source: Box::new(e) })?;
                Ok(HostLinear::Int4(part))
            }
        }
    }

    /// Why [`HostLinear::stack`] cannot take `self` and `other` (K aside), if it cannot: both must
    /// be dense in one dtype, or both INT4 with one group size and scale dtype.
    fn format_mismatch(&self, other: &HostLinear) -> Option<&'static str> {
        match (self, other) {
            (HostLinear::Dense(x), HostLinear::Dense(y)) => {
                (std::mem::discriminant(&x.values) != std::mem::discriminant(&y.values)).then_some("dtypes")
            }
            (HostLinear::Int4(x), HostLinear::Int4(y)) => (x.group_size != y.group_size
                || x.scales.dtype != y.scales.dtype)
                .then_some("group sizes or scale dtypes"),
            _ => Some("formats (dense and INT4)"),
        }
    }

    /// Whether [`HostLinear::stack`] takes `self` and `other` (K aside).
    pub(crate) fn same_format(&self, other: &HostLinear) -> bool {
        self.format_mismatch(other).is_none()
    }

    /// `[a; b]`: the rows of `b` after those of `a`, in one weight (gate and up as one GEMM). Every
    /// output is computed from its own row, so the fused weight's outputs equal the two apart.
    pub fn stack(a: HostLinear, b: HostLinear) -> Result<HostLinear> {
        let mismatch = |what: &str| {
            EngineError::shape(
                "stack",
                format!("cannot stack a [{}, {}] and a [{}, {}] weight: {what} differ", a.n(), a.k(), b.n(), b.k()),
            )
        };
        if a.k() != b.k() {
            return Err(mismatch("K"));
        }
        if let Some(what) = a.format_mismatch(&b) {
            return Err(mismatch(what));
        }
        Ok(match (&a, &b) {
            (HostLinear::Dense(x), HostLinear::Dense(y)) => {
                let values = match (&x.values, &y.values) {
                    (DenseValues::F32(p), DenseValues::F32(q)) => DenseValues::F32([&p[..], q].concat()),
                    (DenseValues::Bf16(p), DenseValues::Bf16(q)) => DenseValues::Bf16([&p[..], q].concat()),
                    (DenseValues::F16(p), DenseValues::F16(q)) => DenseValues::F16([&p[..], q].concat()),
                    _ => return Err(mismatch("dtypes")),
                };
                HostLinear::Dense(DenseWeight { n: x.n + y.n, k: x.k, values })
            }
            (HostLinear::Int4(x), HostLinear::Int4(y)) => {
                let scales = Scales { dtype: x.scales.dtype, bits: [&x.scales.bits[..], &y.scales.bits].concat() };
                let packed = [&x.packed[..], &y.packed].concat();
                let q = QuantizedWeight::from_parts("stacked", x.n + y.n, x.k, x.group_size, packed, scales)
                    .map_err(|e| EngineError::QuantParts { op: "stack", source: Box::new(e) })?;
                HostLinear::Int4(q)
            }
            _ => return Err(mismatch("formats (dense and INT4)")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kdtree_quant::Dtype;

    fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len).map(|i| (((i + seed) * 7919) % 211) as f32 / 50.0 - 2.0).collect()
    }

    #[test]
    fn stacking_puts_the_second_weights_rows_after_the_first() {
        let (a, b) = (values(3 * 32, 1), values(2 * 32, 2));
        let qa = QuantizedWeight::quantize(&a, 3, 32, 32, Dtype::Bf16).unwrap();
        let qb = QuantizedWeight::quantize(&b, 2, 32, 32, Dtype::Bf16).unwrap();
        let both = HostLinear::stack(HostLinear::Int4(qa.clone()), HostLinear::Int4(qb.clone())).unwrap();
        assert_eq!(both.dequantized().to_f32(), [qa.dequantize(), qb.dequantize()].concat());
        let dense = |v: &[f32], n, k| HostLinear::Dense(DenseWeight::new(n, k, DenseValues::F32(v.to_vec())).unwrap());
        let d = HostLinear::stack(dense(&a, 3, 32), dense(&b, 2, 32)).unwrap();
        assert_eq!((d.n(), d.k()), (5, 32));
        assert_eq!(d.dequantized().row(3), b[..32]);
        assert!(HostLinear::stack(dense(&a, 3, 32), HostLinear::Int4(qb)).is_err());
        assert!(HostLinear::stack(dense(&a, 3, 32), dense(&a, 6, 16)).is_err());
        // Rows undo stacking, for both formats.
        assert_eq!(both.rows(0..3).unwrap(), HostLinear::Int4(qa));
        assert_eq!(both.rows(3..5).unwrap().dequantized().to_f32(), both.dequantized().to_f32()[3 * 32..]);
        assert_eq!(d.rows(3..5).unwrap(), dense(&b, 2, 32));
        assert_eq!(d.rows(2..2).unwrap().n(), 0);
        assert!(d.rows(4..6).is_err());
    }

    #[test]
    fn same_format_says_what_stack_takes() {
        let a = values(2 * 64, 3);
        let dense = |v: DenseValues| HostLinear::Dense(DenseWeight::new(2, 64, v).unwrap());
        let f32s = dense(DenseValues::F32(a.clone()));
        let bf16s = dense(DenseValues::F32(a.clone()).into_dtype(crate::registry::ComputeDtype::Bf16));
        let g32 = HostLinear::Int4(QuantizedWeight::quantize(&a, 2, 64, 32, Dtype::Bf16).unwrap());
        let g64 = HostLinear::Int4(QuantizedWeight::quantize(&a, 2, 64, 64, Dtype::Bf16).unwrap());
        let all = [f32s, bf16s, g32, g64];
        for (i, x) in all.iter().enumerate() {
            for (j, y) in all.iter().enumerate() {
                let stacked = HostLinear::stack(x.clone(), y.clone());
                assert_eq!(x.same_format(y), i == j, "{i} {j}");
                assert_eq!(stacked.is_ok(), i == j, "{i} {j}");
                if let Err(e) = stacked {
                    assert!(e.to_string().contains("differ"), "{e}");
                }
            }
        }
    }

    #[test]
    fn half_weights_widen_exactly() {
        let v = [1.5f32, -0.25, 3.0e-3, 7.0];
        let w = DenseWeight::new(2, 2, DenseValues::Bf16(v.iter().map(|&x| bf16::from_f32(x)).collect())).unwrap();
        assert_eq!(w.row(1), [bf16::from_f32(3.0e-3).to_f32(), 7.0]);
        assert_eq!(w.bytes(), 8);
        assert!(DenseWeight::new(3, 2, DenseValues::F32(v.to_vec())).is_err());
    }
}
