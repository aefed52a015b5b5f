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
/// ([`crate::w4a16::lengths`]`(n, k, group_size)`).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::w4a16::grouped::align;
    use crate::w4a16::unpack;
    use kdtree_quant::Dtype;

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
