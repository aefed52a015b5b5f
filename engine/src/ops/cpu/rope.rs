//! Rotary position embedding. DeepSeek-V3 rotates *adjacent pairs* `(x[2i], x[2i+1])` by the
//! angle `pos * inv_freq[i]`: its reference `model.py` does it with `view_as_complex`; the Hugging
//! Face port (`rope_interleave = true`) first permutes each head to `[evens, odds]` and then applies
//! `rotate_half`, which equals the pair rotation followed by the same permutation of q and k, so
//! `q · k` is the same sum. [`rope_half_split`] is the `rope_interleave = false` form.

use rayon::prelude::*;

/// Rotates adjacent pairs of every head: `x` is `[rows, heads, head_dim]`, row `r` at `positions[r]`.
pub fn rope_interleaved(x: &mut [f32], head_dim: usize, positions: &[usize], cos: &[f32], sin: &[f32]) {
    rotate(x, head_dim, positions, cos, sin, |i| (2 * i, 2 * i + 1));
}

/// Rotates `(x[i], x[i + head_dim/2])` pairs: the GPT-NeoX / `rotate_half` layout.
pub(crate) fn rope_half_split(x: &mut [f32], head_dim: usize, positions: &[usize], cos: &[f32], sin: &[f32]) {
    let half = head_dim / 2;
    rotate(x, head_dim, positions, cos, sin, |i| (i, i + half));
}

fn rotate(
    x: &mut [f32],
    head_dim: usize,
    positions: &[usize],
    cos: &[f32],
    sin: &[f32],
    pair: impl Fn(usize) -> (usize, usize) + Sync,
) {
    let half = head_dim / 2;
    if positions.is_empty() || half == 0 {
        return;
    }
    let row_len = x.len() / positions.len();
    x.par_chunks_mut(row_len).zip(positions).for_each(|(row, &p)| {
        let (c, s) = (&cos[p * half..][..half], &sin[p * half..][..half]);
        for head in row.chunks_exact_mut(head_dim) {
            for i in 0..half {
                let (a, b) = pair(i);
                let (xa, xb) = (head[a], head[b]);
                head[a] = xa * c[i] - xb * s[i];
                head[b] = xa * s[i] + xb * c[i];
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::RopeTable;

    #[test]
    fn a_quarter_turn_maps_each_pair_to_its_perpendicular() {
        // One frequency pi/2 per position: position 1 turns (a, b) into (-b, a).
        let table = RopeTable::new(&[std::f64::consts::FRAC_PI_2; 2], 2, 1.0);
        let mut x = [1.0, 2.0, 3.0, 4.0];
        rope_interleaved(&mut x, 4, &[1], &table.cos, &table.sin);
        let expect = [-2.0, 1.0, -4.0, 3.0];
        assert!(x.iter().zip(expect).all(|(a, b)| (a - b).abs() < 1e-6), "{x:?}");
        let mut y = [1.0, 2.0, 3.0, 4.0];
        rope_half_split(&mut y, 4, &[1], &table.cos, &table.sin);
        let expect = [-3.0, -4.0, 1.0, 2.0];
        assert!(y.iter().zip(expect).all(|(a, b)| (a - b).abs() < 1e-6), "{y:?}");
    }

    #[test]
    fn position_zero_is_the_identity_and_dot_products_depend_on_distance_only() {
        let table = RopeTable::new(&[1.0, 0.1], 16, 1.0);
        let mut x = [0.3, -1.2, 2.0, 0.7];
        rope_interleaved(&mut x, 4, &[0], &table.cos, &table.sin);
        assert_eq!(x, [0.3, -1.2, 2.0, 0.7]);
        let rotated_dot = |pq: usize, pk: usize| {
            let (mut q, mut k) = ([0.5, 1.0, -0.25, 2.0], [1.5, -0.5, 1.0, 0.75]);
            rope_interleaved(&mut q, 4, &[pq], &table.cos, &table.sin);
            rope_interleaved(&mut k, 4, &[pk], &table.cos, &table.sin);
            q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>()
        };
        assert!((rotated_dot(5, 2) - rotated_dot(13, 10)).abs() < 1e-4);
    }
}
