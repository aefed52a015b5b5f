//! The CPU reference of absorbed MLA: the oracle the GPU family is checked against, and the CPU
//! backend's attention. f32 arithmetic in a fixed order; a row's result depends only on its own
//! inputs and on the sequence of cache entries it sees (its compact sequence), never on how many
//! rows run with it — the batch invariance tree verification rests on.

use rayon::prelude::*;

use super::MlaShape;

/// Which new tokens of a forward each new token sees (every cached entry is always visible).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NewMask {
    /// Token `i` sees new tokens `0..=i`: prefill, and a chain.
    Causal,
    /// Every new token sees every other one: a non-causal block.
    Full,
    /// Bit `j % 32` of word `i * words + j / 32` says whether token `i` sees token `j`, with
    /// `words = n.div_ceil(32)`: a draft tree.
    Bits(Vec<u32>),
}

impl NewMask {
    /// The mask of a draft tree in parents-first order (each node's parent an earlier node, `None`
    /// for a root): row `i` is its parent's row plus `i` itself, so each node sees itself and its
    /// ancestors.
    ///
    /// # Panics
    /// If `parents[i] >= i`: a parent must come before its children.
    pub fn tree(parents: &[Option<usize>]) -> NewMask {
        let words = parents.len().div_ceil(32);
        let mut bits = vec![0u32; parents.len() * words];
        for (i, parent) in parents.iter().enumerate() {
            if let Some(p) = *parent {
                assert!(p < i, "tree node {i} has parent {p}: parents must come first");
                bits.copy_within(p * words..(p + 1) * words, i * words);
            }
            bits[i * words + i / 32] |= 1 << (i % 32);
        }
        NewMask::Bits(bits)
    }

    /// Whether new token `i` of `n` sees new token `j`.
    pub fn visible(&self, n: usize, i: usize, j: usize) -> bool {
        match self {
            NewMask::Causal => j <= i,
            NewMask::Full => true,
            NewMask::Bits(words) => words[i * n.div_ceil(32) + j / 32] >> (j % 32) & 1 == 1,
        }
    }

    /// New row `i`'s compact sequence, as cache positions: the `past` committed entries, then the
    /// new ones (at `past + j`) it sees, in cache order.
    pub fn compact(&self, past: usize, n: usize, i: usize) -> impl Iterator<Item = usize> + '_ {
        (0..past).chain((0..n).filter(move |&j| self.visible(n, i, j)).map(move |j| past + j))
    }
}

/// `q_lat[i, h] = [q_nope[i, h] · W_UK[h] | q_pe[i, h]]`: each head's non-rotary query moved into
/// latent space, its rotary part kept. `q` is `[n, heads, nope + rope]` (the engine's query, rope
/// applied); `kv_b` is `kv_b_proj`'s weight, `[heads * (nope + v), latent]`, whose rows
/// `h * (nope + v) .. + nope` are `W_UK[h]`. Returns `[n, heads, latent + rope]`; each latent value is a sum
/// over `d` ascending.
pub fn absorb_query(q: &[f32], kv_b: &[f32], s: &MlaShape) -> Vec<f32> {
    let (qk, w) = (s.nope + s.rope, s.width());
    assert_eq!(q.len() % (s.heads * qk), 0, "absorb_query: q is not whole rows");
    assert_eq!(kv_b.len(), s.heads * (s.nope + s.v) * s.latent, "absorb_query: kv_b has the wrong size");
    let mut out = vec![0f32; q.len() / qk * w];
    out.par_chunks_mut(w).zip(q.par_chunks(qk)).enumerate().for_each(|(row, (o, qh))| {
        let h = row % s.heads;
        let uk = &kv_b[h * (s.nope + s.v) * s.latent..][..s.nope * s.latent];
        for (d, &x) in qh[..s.nope].iter().enumerate() {
            for (acc, &wv) in o[..s.latent].iter_mut().zip(&uk[d * s.latent..][..s.latent]) {
                *acc += x * wv;
            }
        }
        o[s.latent..].copy_from_slice(&qh[s.nope..]);
    });
    out
}

/// `o[i, h] = W_UV[h] · o_lat[i, h]`: each head's latent output back to its value width. `o_lat`
/// is `[n, heads, latent]`; rows `h * (nope + v) + nope .. + v` of `kv_b` are `W_UV[h]`. Returns
/// `[n, heads, v]`; each value is a sum over the latent index ascending.
pub fn unabsorb_output(o_lat: &[f32], kv_b: &[f32], s: &MlaShape) -> Vec<f32> {
    assert_eq!(o_lat.len() % (s.heads * s.latent), 0, "unabsorb_output: o_lat is not whole rows");
    assert_eq!(kv_b.len(), s.heads * (s.nope + s.v) * s.latent, "unabsorb_output: kv_b has the wrong size");
    let mut out = vec![0f32; o_lat.len() / s.latent * s.v];
    out.par_chunks_mut(s.v).zip(o_lat.par_chunks(s.latent)).enumerate().for_each(|(row, (o, lat))| {
        let h = row % s.heads;
        let uv = &kv_b[(h * (s.nope + s.v) + s.nope) * s.latent..][..s.v * s.latent];
        for (e, acc) in o.iter_mut().enumerate() {
            *acc = lat.iter().zip(&uv[e * s.latent..][..s.latent]).fold(0f32, |a, (&x, &wv)| a + x * wv);
        }
    });
    out
}

/// The dtype the softmax weights `P` take before they multiply the values: the GPU family's
/// tensor cores take them in bf16, beside a bf16 cache; an f32 cache keeps them in f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weights {
    F32,
    Bf16,
}

/// Absorbed attention of `n` new rows over a latent cache of `past + n` entries.
///
/// `q` is `[n, heads, latent + rope]` ([`absorb_query`]'s output); `kv` is `[past + n, latent +
/// rope]` in cache order, the new tokens' entries last: `[c_kv | k_pe]` per token, shared by every
/// head. Row `i` sees the `past` cached entries, then the new entries `mask` lets it see, in cache
/// order (its compact sequence); masked entries are skipped, not zero-weighted. Per head: scores
/// `scale · log2 e · q · kv` over the full width, the softmax in base 2 with the weights `P =
/// 2^(score - m)` taken in `weights`' dtype, where `m` is the maximum score rounded up to an integer
/// (the GPU's online max, whose rescaling is then exact: its P are these P, whichever tile set the
/// max), and `Σ P · latent / Σ P` with the sum over the rounded weights. A row that sees no entry
/// (nothing committed, an empty mask row) is zeros, as the GPU's combine writes it. Returns
/// `o_lat`, `[n, heads, latent]`.
pub fn attention(q: &[f32], kv: &[f32], past: usize, mask: &NewMask, s: &MlaShape, weights: Weights) -> Vec<f32> {
    let w = s.width();
    let n = q.len() / (s.heads * w);
    assert_eq!(q.len(), n * s.heads * w, "mla attention: q is not whole rows");
    assert_eq!(kv.len(), (past + n) * w, "mla attention: kv does not hold past + n entries");
    let mut out = vec![0f32; n * s.heads * s.latent];
    let scale_log2 = s.scale * std::f32::consts::LOG2_E; // as the launch folds it
    out.par_chunks_mut(s.heads * s.latent).enumerate().for_each(|(i, o)| {
        let seq: Vec<&[f32]> = mask.compact(past, n, i).map(|t| &kv[t * w..][..w]).collect();
        if seq.is_empty() {
            return;
        }
        for (h, oh) in o.chunks_exact_mut(s.latent).enumerate() {
            let qh = &q[(i * s.heads + h) * w..][..w];
            let mut p: Vec<f32> = seq.iter().map(|e| kdtree_quant::reference::dot(qh, e) * scale_log2).collect();
            let max = p.iter().copied().fold(f32::NEG_INFINITY, f32::max).ceil();
            let mut sum = 0f32;
            for x in &mut p {
                *x = (*x - max).exp2();
                if weights == Weights::Bf16 {
                    *x = half::bf16::from_f32(*x).to_f32();
                }
                sum += *x;
            }
            for (e, &pe) in seq.iter().zip(&p) {
                for (acc, &x) in oh.iter_mut().zip(&e[..s.latent]) {
                    *acc += pe * x;
                }
            }
            oh.iter_mut().for_each(|x| *x /= sum);
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: MlaShape = MlaShape { heads: 2, nope: 2, rope: 1, v: 2, latent: 3, scale: 0.5 };

    #[test]
    fn a_tree_node_sees_itself_and_its_ancestors_only() {
        // 0 -> {1, 2}, 1 -> 3; 34 nodes so that rows take two words.
        let mut parents = vec![None, Some(0), Some(0), Some(1)];
        parents.extend((4..34).map(|i| Some(i - 1)));
        let m = NewMask::tree(&parents);
        let n = parents.len();
        assert!(m.visible(n, 3, 0) && m.visible(n, 3, 1) && m.visible(n, 3, 3));
        assert!(!m.visible(n, 3, 2) && !m.visible(n, 2, 1) && !m.visible(n, 0, 1));
        assert!(m.visible(n, 33, 32) && m.visible(n, 33, 4) && m.visible(n, 33, 0) && !m.visible(n, 33, 2));
    }

    fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len).map(|i| (((i + seed) * 7919) % 97) as f32 / 20.0 - 2.0).collect()
    }

    #[test]
    fn one_visible_entry_returns_its_latent() {
        let (q, kv) = (values(2 * 4, 1), values(4, 2));
        assert_eq!(attention(&q, &kv, 0, &NewMask::Causal, &S, Weights::F32), [&kv[..3], &kv[..3]].concat());
    }

    #[test]
    fn bf16_weights_are_rounded_against_the_max_score_rounded_up() {
        // One head, one row over three entries whose one-hot latents pick out each weight / sum.
        let s = MlaShape { heads: 1, nope: 1, rope: 1, v: 1, latent: 3, scale: 0.7 };
        let q = [0.31f32, -1.7, 2.9, 0.0];
        let kv = [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]].concat();
        let scale_log2 = s.scale * std::f32::consts::LOG2_E;
        let scores = q[..3].iter().map(|&x| x * scale_log2);
        let m = (q[2] * scale_log2).ceil();
        let p: Vec<f32> = scores.map(|x| half::bf16::from_f32((x - m).exp2()).to_f32()).collect();
        let sum = p.iter().sum::<f32>();
        let got = attention(&q, &kv, 2, &NewMask::Causal, &s, Weights::Bf16);
        assert_eq!(got, [p[0] / sum, p[1] / sum, p[2] / sum]);
        assert_ne!(got, attention(&q, &kv, 2, &NewMask::Causal, &s, Weights::F32), "rounding P changes the sums");
    }

    #[test]
    fn a_tree_row_equals_the_same_row_over_its_path_alone() {
        // Cache of 2, then a tree 0 -> {1, 2}, 2 -> 3: node 3 sees entries 0, 1, 2, 4, 5.
        let (past, n, w) = (2, 4, S.width());
        let q = values(n * S.heads * w, 4);
        let kv = values((past + n) * w, 5);
        let parents = [None, Some(0), Some(0), Some(2)];
        let mut bits = vec![0u32; n];
        #[allow(clippy::needless_range_loop)]
        for i in 0..n {
            let mut at = Some(i);
            while let Some(j) = at {
                bits[i] |= 1 << j;
                at = parents[j];
            }
        }
        let out = attention(&q, &kv, past, &NewMask::Bits(bits), &S, Weights::F32);
        let path: Vec<f32> = [0, 1, 2, 4, 5].iter().flat_map(|&t| kv[t * w..][..w].to_vec()).collect();
        let alone = attention(&q[3 * S.heads * w..], &path, 4, &NewMask::Causal, &S, Weights::F32);
        assert_eq!(out[3 * S.heads * S.latent..], alone[..]);
    }

    #[test]
    fn absorbed_attention_equals_attention_over_decompressed_heads() {
        // softmax(q·k) v with k = [W_UK c | k_pe], v = W_UV c, against the absorbed form.
        let (n, w) = (3, S.width());
        let q = values(n * S.heads * (S.nope + S.rope), 6);
        let kv = values(n * w, 7);
        let kv_b = values(S.heads * (S.nope + S.v) * S.latent, 8);
        let absorbed = unabsorb_output(
            &attention(&absorb_query(&q, &kv_b, &S), &kv, 0, &NewMask::Causal, &S, Weights::F32),
            &kv_b,
            &S,
        );
        for i in 0..n {
            for h in 0..S.heads {
                let row = |r: usize, c: &[f32]| -> f32 { (0..S.latent).map(|x| kv_b[r * S.latent + x] * c[x]).sum() };
                let base = h * (S.nope + S.v);
                let qh = &q[(i * S.heads + h) * (S.nope + S.rope)..][..S.nope + S.rope];
                let scores: Vec<f32> = (0..=i)
                    .map(|t| {
                        let c = &kv[t * w..][..w];
                        let nope: f32 = (0..S.nope).map(|d| qh[d] * row(base + d, c)).sum();
                        S.scale * (nope + qh[S.nope] * c[S.latent])
                    })
                    .collect();
                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f32 = e.iter().sum();
                for d in 0..S.v {
                    let want: f32 = (0..=i).map(|t| e[t] / sum * row(base + S.nope + d, &kv[t * w..][..w])).sum();
                    let got = absorbed[(i * S.heads + h) * S.v + d];
                    assert!(
                        (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                        "row {i} head {h} dim {d}: {got} vs {want}"
                    );
                }
            }
        }
    }
}
