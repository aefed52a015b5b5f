//! Grouped-query attention of a block's queries over every key before them and in the block, with no
//! mask (the reference's `is_causal=False` with no attention mask): a DFlash block sees all of itself.

use kdtree_quant::reference::dot;
use rayon::prelude::*;

use super::softmax;
use crate::registry::GqaShape;

/// `q` is `[n, heads * head_dim]`; the keys and values are the context's rows followed by the block's,
/// each `[rows, kv_heads * head_dim]`; query head `h` reads key/value head `h / (heads / kv_heads)`.
/// Scores are scaled by `1 / sqrt(head_dim)`. Returns `[n, heads * head_dim]`. Each row is computed in
/// a fixed order, so its result does not depend on the other rows.
pub fn gqa_attention(q: &[f32], keys: [&[f32]; 2], values: [&[f32]; 2], s: GqaShape) -> Vec<f32> {
    let (hd, kv_width) = (s.head_dim, s.kv_heads * s.head_dim);
    let group = s.heads / s.kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let key_rows: Vec<&[f32]> = keys.iter().flat_map(|k| k.chunks_exact(kv_width)).collect();
    let value_rows: Vec<&[f32]> = values.iter().flat_map(|v| v.chunks_exact(kv_width)).collect();
    let mut out = vec![0f32; q.len()];
    out.par_chunks_mut(s.heads * hd).zip(q.par_chunks(s.heads * hd)).for_each(|(o, q)| {
        let mut weights = vec![0f32; key_rows.len()];
        for (h, (o, q)) in o.chunks_exact_mut(hd).zip(q.chunks_exact(hd)).enumerate() {
            let kv = (h / group) * hd..(h / group + 1) * hd;
            for (w, k) in weights.iter_mut().zip(&key_rows) {
                *w = dot(q, &k[kv.clone()]) * scale;
            }
            softmax(&mut weights, key_rows.len());
            for (&w, v) in weights.iter().zip(&value_rows) {
                for (o, &v) in o.iter_mut().zip(&v[kv.clone()]) {
                    *o += w * v;
                }
            }
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_scores_average_the_values_and_heads_share_their_group() {
        // Two query heads over one kv head of width 2; all keys zero, so every score ties.
        let s = GqaShape { heads: 2, kv_heads: 1, head_dim: 2 };
        let q = [1.0, 2.0, -3.0, 0.5];
        let keys = [0.0; 6];
        let values = [1.0, 10.0, 3.0, 20.0, 5.0, 30.0];
        let out = gqa_attention(&q, [&keys[..4], &keys[4..]], [&values[..4], &values[4..]], s);
        assert_eq!(out, [3.0, 20.0, 3.0, 20.0]);
    }

    #[test]
    fn a_dominant_key_takes_the_weight_whichever_part_holds_it() {
        let s = GqaShape { heads: 1, kv_heads: 1, head_dim: 2 };
        let q = [10.0, 0.0];
        let keys = [0.0, 0.0, 10.0, 0.0];
        let values = [-1.0, -1.0, 7.0, 8.0];
        let split = gqa_attention(&q, [&keys[..2], &keys[2..]], [&values[..2], &values[2..]], s);
        let whole = gqa_attention(&q, [&keys, &[]], [&values, &[]], s);
        assert_eq!(split, whole);
        assert!((split[0] - 7.0).abs() < 1e-6 && (split[1] - 8.0).abs() < 1e-6, "{split:?}");
    }
}
