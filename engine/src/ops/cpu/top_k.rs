//! A drafter's per-depth candidates: the best `k` log-probs of each row, best first.

use std::cmp::Ordering;

use rayon::prelude::*;

use super::softmax;
use crate::registry::LogitTransform;

/// Best first: the higher log-probability, then the lower token.
pub(crate) fn rank_order(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// The best `k` finite entries of one row of log-probs as (token, log-prob), sorted by `rank_order`:
/// a partial sort, O(vocab + k log k).
pub fn top_k(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut all: Vec<(u32, f32)> =
        row.iter().enumerate().filter(|(_, lp)| lp.is_finite()).map(|(token, &lp)| (token as u32, lp)).collect();
    if k < all.len() {
        if k == 0 {
            return Vec::new();
        }
        all.select_nth_unstable_by(k - 1, rank_order);
        all.truncate(k);
    }
    all.sort_by(rank_order);
    all
}

/// Natural-log softmax of rows of `cols`, in place: the reference softmax, then ln.
pub(crate) fn log_softmax(x: &mut [f32], cols: usize) {
    softmax(x, cols);
    x.par_iter_mut().for_each(|p| *p = p.ln());
}

/// Each row of `logits` (`[rows, vocab]`) transformed, log-softmaxed and cut to its best `k`
/// ([`top_k`]): what a drafter proposes from its logits.
pub fn top_k_log_softmax(logits: &[f32], vocab: usize, k: usize, transform: LogitTransform) -> Vec<Vec<(u32, f32)>> {
    let mut x: Vec<f32> = logits.par_iter().map(|&v| transform.apply(v)).collect();
    log_softmax(&mut x, vocab);
    x.par_chunks(vocab.max(1)).map(|row| top_k(row, k)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_keep_their_best_finite_entries_ties_to_the_lower_token() {
        let row = [-1.0, -0.5, f32::NAN, -0.5, f32::NEG_INFINITY, -3.0];
        assert_eq!(top_k(&row, 3), [(1, -0.5), (3, -0.5), (0, -1.0)]);
        assert_eq!(top_k(&row, 10).len(), 4);
        assert!(top_k(&row, 0).is_empty());
    }

    #[test]
    fn logits_are_transformed_before_the_softmax() {
        // × 2 then a softcap of 1: tanh(2), tanh(0), tanh(-2); the softmax of those, then ln.
        let t = LogitTransform { multiplier: 2.0, softcap: Some(1.0) };
        let got = top_k_log_softmax(&[1.0, 0.0, -1.0, 5.0, 5.0, f32::NAN], 3, 2, t);
        let z: Vec<f32> = [2f32.tanh(), 0.0, (-2f32).tanh()].to_vec();
        let lse = z.iter().map(|v| (v - z[0]).exp()).sum::<f32>().ln() + z[0];
        assert_eq!(got[0].iter().map(|c| c.0).collect::<Vec<_>>(), [0, 1]);
        assert!((got[0][0].1 - (z[0] - lse)).abs() < 1e-6 && (got[0][1].1 - (z[1] - lse)).abs() < 1e-6);
        assert!(got[1].is_empty(), "a row with a NaN has no finite log-prob: {got:?}");
    }
}
