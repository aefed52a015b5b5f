//! The grouped product on the CPU, from the per-expert W4A16 reference, and the experts' weights
//! stacked in the layout the grouped kernel reads.

use std::borrow::Borrow;

use kdtree_quant::{QuantizedWeight, reference};

use crate::w4a16::grouped::{Alignment, W4a16Grouped};
use crate::w4a16::layout::{DeviceWeights, lengths, repack};
use crate::{Error, Result, Variant};

/// Which row of X each row of Y reads. Row r of Y is sorted position r of an [`Alignment`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XRows<'a> {
    /// X row `index[r] / div`: the gate-up projection reads token `a / top_k` of assignment `a`
    /// through the sorted list (`index` = [`Alignment::sorted`], `div` = top_k).
    Gather { index: &'a [u32], div: usize },
    /// X row r: the down projection reads the activations, already in sorted order.
    Identity,
}

impl XRows<'_> {
    /// The X row of Y row `r`.
    pub fn of(&self, r: usize) -> usize {
        match self {
            XRows::Gather { index, div } => index[r] as usize / (*div).max(1),
            XRows::Identity => r,
        }
    }
}

fn unsupported(v: &W4a16Grouped, reason: String) -> Error {
    Error::Unsupported { variant: v.name(), reason }
}

/// The experts' weights (all [n, k], one group size and scale dtype) repacked for `v` and stacked:
/// expert e's words at `e * packed_len`, its scales at `e * scales_len`
/// ([`crate::w4a16::layout::lengths`]`(n, k, group_size)`).
pub fn repack_experts(v: &W4a16Grouped, experts: &[QuantizedWeight]) -> Result<DeviceWeights> {
    let Some(first) = experts.first() else {
        return Err(unsupported(v, "no experts".into()));
    };
    let (n, k) = (first.n, first.k);
    if let Some((e, w)) = experts.iter().enumerate().find(|(_, w)| (w.n, w.k) != (n, k)) {
        return Err(unsupported(v, format!("expert {e} is {} x {}, expert 0 {n} x {k}", w.n, w.k)));
    }
    let (packed_len, scales_len) = lengths(n, k, v.group_size as usize);
    let mut stacked = DeviceWeights {
        packed: Vec::with_capacity(experts.len() * packed_len),
        scales: Vec::with_capacity(experts.len() * scales_len),
    };
    let stream = v.stream();
    for w in experts {
        let d = repack(&stream, w)?;
        stacked.packed.extend_from_slice(&d.packed);
        stacked.scales.extend_from_slice(&d.scales);
    }
    Ok(stacked)
}

/// `Y[r] = X[rows.of(r)] · dequant(experts[e(r)])ᵀ` in f32 ([`reference::w4a16_gemm_f32`]'s
/// arithmetic, so each row is what the per-expert reference gives it), for every sorted position r
/// of `a`; `x` is [x_rows, k] in f32 (values of the activation dtype). Rows whose assignment is not
/// routed to an expert (`a.invalid`) and rows whose X row is past X are NaN. `experts` may be
/// references, so that a tuning problem can give many experts a few weights.
pub fn grouped_reference<W: Borrow<QuantizedWeight>>(
    x: &[f32],
    k: usize,
    rows: XRows,
    experts: &[W],
    a: &Alignment,
) -> Result<Vec<f32>> {
    let n = experts.first().map_or(0, |w| w.borrow().n);
    let x_rows = x.len().checked_div(k).unwrap_or(0);
    let y_rows = a.sorted.len();
    let mut y = vec![f32::NAN; y_rows * n];
    for (e, w) in experts.iter().enumerate() {
        let span = a.offsets[e] as usize..a.offsets[e + 1] as usize;
        let picked: Vec<usize> = span.filter(|&r| rows.of(r) < x_rows).collect();
        if picked.is_empty() {
            continue;
        }
        let xs: Vec<f32> = picked.iter().flat_map(|&r| &x[rows.of(r) * k..(rows.of(r) + 1) * k]).copied().collect();
        let ys = reference::w4a16_gemm_f32(&xs, picked.len(), w.borrow())?;
        for (i, &r) in picked.iter().enumerate() {
            y[r * n..(r + 1) * n].copy_from_slice(&ys[i * n..(i + 1) * n]);
        }
    }
    Ok(y)
}

/// The rows of a gate-up weight (`[2 * inter, k]`: gate rows, then up rows, as the checkpoints stack
/// w1 and w3) reordered for [`Epilogue::Silu`](crate::w4a16::grouped::launch::Epilogue::Silu): each
/// 64-row tile j holds the gate rows of features 32j.. then the up rows of the same features, 32 of
/// each, fewer in a last partial tile. Words and scales move with their rows; the int4 values, groups
/// and scale bits are untouched.
pub fn interleave_gate_up(w: &QuantizedWeight) -> Result<QuantizedWeight> {
    if !w.n.is_multiple_of(2) {
        return Err(Error::Quant(kdtree_quant::QuantError::ShapeMismatch {
            tensor: "a gate-up weight".into(),
            expected: vec![2 * (w.n / 2), w.k],
            actual: vec![w.n, w.k],
        }));
    }
    let inter = w.n / 2;
    let (words, groups) = (w.packed.len() / w.n.max(1), w.scales.len() / w.n.max(1));
    let (mut packed, mut bits) = (Vec::with_capacity(w.packed.len()), Vec::with_capacity(w.scales.len()));
    for f0 in (0..inter).step_by(32) {
        let features = f0..(f0 + 32).min(inter);
        for row in features.clone().chain(features.map(|f| inter + f)) {
            packed.extend_from_slice(&w.packed[row * words..(row + 1) * words]);
            bits.extend_from_slice(&w.scales.bits[row * groups..(row + 1) * groups]);
        }
    }
    let scales = kdtree_quant::Scales { dtype: w.scales.dtype, bits };
    Ok(QuantizedWeight::from_parts("the interleaved gate-up weight", w.n, w.k, w.group_size, packed, scales)?)
}

/// SwiGLU of [`grouped_reference`]'s gate-up rows, as the fused epilogue computes it: `experts` are the
/// gate-up weights as stored (not interleaved), and each output `[sorted rows, n / 2]` is
/// `silu(g) * u` in f32 of the gate and up sums each rounded to `dtype`, before its final rounding
/// (rows that `grouped_reference` leaves NaN stay NaN).
pub fn grouped_silu_reference(
    x: &[f32],
    k: usize,
    rows: XRows,
    experts: &[QuantizedWeight],
    a: &Alignment,
    dtype: kdtree_quant::Dtype,
) -> Result<Vec<f32>> {
    let y = grouped_reference(x, k, rows, experts, a)?;
    let n = experts.first().map_or(0, |w| w.n);
    let inter = n / 2;
    let silu_times = |g: f32, u: f32| g / (1.0 + (-g).exp()) * u;
    Ok(y.chunks_exact(n.max(1))
        .flat_map(|row| (0..inter).map(move |f| silu_times(dtype.round(row[f]), dtype.round(row[inter + f]))))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::w4a16::grouped::align;
    use crate::w4a16::unpack;
    use kdtree_quant::Dtype;

    #[test]
    fn interleaving_pairs_each_features_gate_and_up_rows_in_every_tile() {
        // inter = 40: tile 0 holds features 0..32, tile 1 the last 8 (16 rows).
        let (n, k) = (80, 64);
        let w: Vec<f32> = (0..n * k).map(|i| ((i / k * 3 + i % k) % 15) as f32 - 7.0).collect();
        let q = QuantizedWeight::quantize(&w, n, k, 32, Dtype::Bf16).unwrap();
        let p = interleave_gate_up(&q).unwrap();
        let (dq, dp) = (q.dequantize(), p.dequantize());
        let row = |d: &[f32], r: usize| d[r * k..(r + 1) * k].to_vec();
        for (at, from) in [(0, 0), (31, 31), (32, 40), (63, 71), (64, 32), (71, 39), (72, 72), (79, 79)] {
            assert_eq!(row(&dp, at), row(&dq, from), "interleaved row {at} is row {from}");
        }
        let odd = QuantizedWeight::quantize(&[1.0; 3 * 32], 3, 32, 32, Dtype::Bf16).unwrap();
        assert!(interleave_gate_up(&odd).is_err());
    }

    #[test]
    fn the_silu_reference_gates_the_rounded_gate_up_rows() {
        let (n, k) = (6, 32);
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 5) % 11) as f32 - 5.0).collect();
        let experts = [QuantizedWeight::quantize(&w, n, k, 32, Dtype::Bf16).unwrap()];
        let x: Vec<f32> = (0..2 * k).map(|i| (i % 7) as f32 * 0.125 - 0.375).collect();
        let a = align(&[0, 0], 1, 8);
        let y = grouped_reference(&x, k, XRows::Identity, &experts, &a).unwrap();
        let act = grouped_silu_reference(&x, k, XRows::Identity, &experts, &a, Dtype::Bf16).unwrap();
        assert_eq!(act.len(), 2 * 3);
        for (r, f) in [(0, 0), (1, 2)] {
            let (g, u) = (Dtype::Bf16.round(y[r * n + f]), Dtype::Bf16.round(y[r * n + 3 + f]));
            assert_eq!(act[r * 3 + f], g / (1.0 + (-g).exp()) * u);
        }
    }

    #[test]
    fn stacked_experts_unpack_one_by_one() {
        let v = W4a16Grouped::default_for(Dtype::Bf16, 32, &crate::Target { arch: crate::Arch(90) });
        let experts: Vec<QuantizedWeight> = (0..3)
            .map(|e| {
                let w: Vec<f32> = (0..70 * 64).map(|i| ((i * 7 + e * 13) % 15) as f32 - 7.0).collect();
                QuantizedWeight::quantize(&w, 70, 64, 32, Dtype::Bf16).unwrap()
            })
            .collect();
        let d = repack_experts(&v, &experts).unwrap();
        let (pl, sl) = lengths(70, 64, 32);
        assert_eq!((d.packed.len(), d.scales.len()), (3 * pl, 3 * sl));
        for (e, w) in experts.iter().enumerate() {
            let one = DeviceWeights {
                packed: d.packed[e * pl..(e + 1) * pl].to_vec(),
                scales: d.scales[e * sl..(e + 1) * sl].to_vec(),
            };
            assert_eq!(&unpack(&v.stream(), &one, 70, 64).unwrap(), w);
        }
        let odd = QuantizedWeight::quantize(&[1.0; 64 * 64], 64, 64, 32, Dtype::Bf16).unwrap();
        assert!(repack_experts(&v, &[experts[0].clone(), odd]).is_err());
        assert!(repack_experts(&v, &[]).is_err());
    }

    #[test]
    fn each_row_is_its_experts_reference_product_of_its_token() {
        // Two tokens, top-2, three experts of 5 x 32: t0 -> 0, 2; t1 -> 2, 1.
        let (n, k, top_k) = (5, 32, 2);
        let experts: Vec<QuantizedWeight> = (0..3)
            .map(|e| {
                let w: Vec<f32> = (0..n * k).map(|i| ((i + 3 * e) % 9) as f32 - 4.0).collect();
                QuantizedWeight::quantize(&w, n, k, 32, Dtype::F16).unwrap()
            })
            .collect();
        let x: Vec<f32> = (0..2 * k).map(|i| (i % 5) as f32 * 0.25 - 0.5).collect();
        let a = align(&[0, 2, 2, 1], 3, 8);
        let rows = XRows::Gather { index: &a.sorted, div: top_k };
        let y = grouped_reference(&x, k, rows, &experts, &a).unwrap();
        for r in 0..4 {
            let (e, t) = (a.expert_of(r).unwrap(), a.sorted[r] as usize / top_k);
            let want = reference::w4a16_gemm_f32(&x[t * k..(t + 1) * k], 1, &experts[e]).unwrap();
            assert_eq!(&y[r * n..(r + 1) * n], &want[..], "row {r}");
        }
        // Identity rows: row r of X for sorted position r.
        let y = grouped_reference(&x, k, XRows::Identity, &experts, &align(&[1, 1], 3, 8)).unwrap();
        let want = reference::w4a16_gemm_f32(&x, 2, &experts[1]).unwrap();
        assert_eq!(y, want);
    }
}
