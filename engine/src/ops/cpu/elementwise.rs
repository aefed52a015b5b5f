use rayon::prelude::*;

/// `out = silu(gate) * up`, elementwise, `silu(g) = g / (1 + exp(-g))`.
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(gate.len() == up.len() && up.len() == out.len(), "silu_mul: lengths differ");
    out.par_iter_mut().zip(gate.par_iter().zip(up)).for_each(|(o, (&g, &u))| *o = g / (1.0 + (-g).exp()) * u);
}

/// Row-wise softmax over rows of `cols`: max-subtracted, the sum taken left to right.
pub fn softmax(x: &mut [f32], cols: usize) {
    assert_eq!(x.len() % cols.max(1), 0, "softmax: x is not a whole number of rows");
    x.par_chunks_mut(cols.max(1)).for_each(softmax_row);
}

pub(crate) fn softmax_row(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in row.iter_mut() {
        *v /= sum;
    }
}

/// Row-wise index of the largest value; ties go to the lowest index, NaN never wins.
pub fn argmax(x: &[f32], cols: usize) -> Vec<u32> {
    assert_eq!(x.len() % cols.max(1), 0, "argmax: x is not a whole number of rows");
    x.par_chunks(cols.max(1)).map(argmax_row).collect()
}

fn argmax_row(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        // A NaN at index 0 is replaced by the first number after it.
        if v > row[best] || (row[best].is_nan() && !v.is_nan()) {
            best = i;
        }
    }
    best as u32
}

/// How many values of `x` are NaN or infinite: the check of a forward's logits (and, in the checked
/// re-run, of every op's output).
pub fn count_nonfinite(x: &[f32]) -> usize {
    x.par_chunks(1 << 16).map(|c| c.iter().filter(|v| !v.is_finite()).count()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_and_both_infinities_count_and_nothing_else() {
        let x = [0.0, -0.0, f32::MAX, f32::MIN_POSITIVE, 1e-45, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.0];
        assert_eq!(count_nonfinite(&x), 3);
        assert_eq!(count_nonfinite(&[]), 0);
        let mut big = vec![1.0f32; (1 << 16) * 3 + 5];
        big[(1 << 16) + 7] = f32::NAN;
        *big.last_mut().unwrap() = -f32::INFINITY;
        assert_eq!(count_nonfinite(&big), 2);
    }

    #[test]
    fn silu_of_zero_is_zero_and_large_gate_passes_up_through() {
        let mut out = [0.0; 2];
        silu_mul(&[0.0, 100.0], &[5.0, 3.0], &mut out);
        assert_eq!(out, [0.0, 300.0]);
    }

    #[test]
    fn softmax_rows_sum_to_one_and_ignore_a_shift() {
        let mut a = vec![1.0, 2.0, 3.0, 1001.0, 1002.0, 1003.0];
        softmax(&mut a, 3);
        assert_eq!(a[..3], a[3..]);
        assert!((a[..3].iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(a[2] > a[1] && a[1] > a[0]);
    }

    #[test]
    fn argmax_breaks_ties_by_lowest_index() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0, f32::NAN, 0.5, 0.5, -1.0], 4), vec![1, 1]);
    }
}
