//! The CPU reference of absorbed MLA, fuzzed on random head shapes (rope 0 included), contexts and
//! masks (causal, full, draft trees given by parent pointers, random bits): absorbed attention against
//! the textbook form over decompressed heads within a derived f32 bound, every row against the same
//! row run alone over its compact sequence bit for bit (the batch invariance tree verification rests
//! on), and rows that see nothing.

use kdtree_jit::mla::reference::{Weights, absorb_query, attention, unabsorb_output};
use kdtree_jit::mla::{MlaShape, NewMask};
use kdtree_quant::sample::symmetric;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;

/// Small head sizes on the kernels' grid (latent a multiple of 32, rope of 16, 0 included), `scale`
/// about `1 / sqrt(nope + rope)` as the models set it.
fn shape() -> impl Strategy<Value = MlaShape> {
    (1usize..=8, 1usize..=24, 0usize..=4, 1usize..=24, 1usize..=4, 0.25f32..2.0).prop_map(
        |(heads, nope, rope, v, latent, k)| {
            let (rope, latent) = (16 * rope, 32 * latent);
            MlaShape { heads, nope, rope, v, latent, scale: k / ((nope + rope) as f32).sqrt() }
        },
    )
}

/// Random words, dense or sparse, with the bits past `n` set too (no token: never read); each row
/// sees itself.
fn random_bits(n: usize) -> impl Strategy<Value = Vec<u32>> {
    let words = n.div_ceil(32);
    (vec(any::<u32>(), n * words), vec(any::<u32>(), n * words), any::<bool>()).prop_map(move |(a, b, sparse)| {
        let mut bits: Vec<u32> = a.iter().zip(&b).map(|(&a, &b)| if sparse { a & b } else { a }).collect();
        (0..n).for_each(|i| bits[i * words + i / 32] |= 1 << (i % 32));
        bits
    })
}

fn mask(n: usize) -> impl Strategy<Value = NewMask> {
    prop_oneof![
        1 => Just(NewMask::Causal),
        1 => Just(NewMask::Full),
        2 => kdtree_fuzz::draft_tree(n).prop_map(|parents| NewMask::tree(&parents)),
        1 => random_bits(n).prop_map(NewMask::Bits),
    ]
}

/// A shape, `past` committed entries, `n` new rows and their mask, and a seed for the data.
fn case() -> impl Strategy<Value = (MlaShape, usize, usize, NewMask, u64)> {
    (shape(), 0usize..200, 1usize..40)
        .prop_flat_map(|(s, past, n)| (Just(s), Just(past), Just(n), mask(n), any::<u64>()))
}

/// Attention the textbook way, each head's keys and values decompressed from the cache: `k = [W_UK c
/// | k_pe]`, `v = W_UV c`, `o = softmax(scale q · k) v`. Returns `o` `[n, heads, v]` and, per row and
/// head, how far the absorbed form may be from it in f32 (first order, both sides' roundings, unit
/// roundoff u = EPSILON / 2):
/// - a score is a sum of products whose magnitudes add to `A` (nope latent-long sums, then nope + rope
///   terms here; a nope-long sum per latent value, then latent + rope terms absorbed): the two forms'
///   scores differ by at most `(nope + latent + rope + 8) EPSILON A = d`;
/// - scores off by at most `d` move each softmax weight by a factor within `exp(±2d)`, so the
///   convex combination by at most `(exp(2d) - 1) V`, with `V` the largest `Σ |W_UV| |c|` of a seen
///   entry (an output's magnitude bound);
/// - the value sums (latent long, on either side of the weighting), the exps, their sum over the
///   `L` seen entries and the division add at most `(L + latent + 8) EPSILON V`.
///
/// Twice the sum of the last two is the bound.
fn decompressed(
    q: &[f32],
    kv: &[f32],
    kv_b: &[f32],
    past: usize,
    mask: &NewMask,
    s: &MlaShape,
) -> (Vec<f32>, Vec<f32>) {
    let (w, qk, hw) = (s.width(), s.nope + s.rope, s.nope + s.v);
    let n = q.len() / (s.heads * qk);
    // Every entry's decompressed head rows, [t, heads, nope + v], with the sums of magnitudes.
    let mut up = vec![(0f32, 0f32); (past + n) * s.heads * hw];
    for (t, c) in kv.chunks_exact(w).enumerate() {
        for (r, out) in up[t * s.heads * hw..][..s.heads * hw].iter_mut().enumerate() {
            let wr = &kv_b[r * s.latent..][..s.latent];
            *out = wr.iter().zip(&c[..s.latent]).fold((0.0, 0.0), |(a, m), (&x, &y)| (a + x * y, m + (x * y).abs()));
        }
    }
    let (mut o, mut bound) = (vec![0f32; n * s.heads * s.v], vec![0f32; n * s.heads]);
    for i in 0..n {
        let seq = mask.compact(past, n, i).collect::<Vec<_>>();
        for h in 0..s.heads {
            let qh = &q[(i * s.heads + h) * qk..][..qk];
            let head = |t: usize| &up[(t * s.heads + h) * hw..][..hw];
            let (mut scores, mut a) = (Vec::new(), 0f32);
            for &t in &seq {
                let pe = &kv[t * w + s.latent..][..s.rope];
                let k = head(t)[..s.nope].iter().copied().chain(pe.iter().map(|&x| (x, x.abs())));
                let (dot, mag) =
                    qh.iter().zip(k).fold((0f32, 0f32), |(d, m), (&x, (y, ym))| (d + x * y, m + x.abs() * ym));
                scores.push(s.scale * dot);
                a = a.max(s.scale * mag);
            }
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let p: Vec<f32> = scores.iter().map(|x| (x - max).exp()).collect();
            let sum: f32 = p.iter().sum();
            let oh = &mut o[(i * s.heads + h) * s.v..][..s.v];
            let mut v_max = 0f32;
            for (&t, &pt) in seq.iter().zip(&p) {
                for (acc, &(x, m)) in oh.iter_mut().zip(&head(t)[s.nope..]) {
                    *acc += pt * x;
                    v_max = v_max.max(m);
                }
            }
            oh.iter_mut().for_each(|x| *x /= sum);
            let d = (s.nope + s.latent + s.rope + 8) as f32 * f32::EPSILON * a;
            let rounding = (seq.len() + s.latent + 8) as f32 * f32::EPSILON;
            bound[i * s.heads + h] = 2.0 * ((2.0 * d).exp_m1() + rounding) * v_max;
        }
    }
    (o, bound)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn absorbed_attention_equals_attention_over_decompressed_heads(
        (s, past, n, mask, seed) in case(),
        q_amp in 0.1f32..4.0,
    ) {
        let q = symmetric(n * s.heads * (s.nope + s.rope), seed, q_amp);
        let kv = symmetric((past + n) * s.width(), seed ^ 1, 1.0);
        let kv_b = symmetric(s.heads * (s.nope + s.v) * s.latent, seed ^ 2, 1.0 / (s.latent as f32).sqrt());
        let o_lat = attention(&absorb_query(&q, &kv_b, &s), &kv, past, &mask, &s, Weights::F32);
        let got = unabsorb_output(&o_lat, &kv_b, &s);
        let (want, bound) = decompressed(&q, &kv, &kv_b, past, &mask, &s);
        for (r, (g, w)) in got.chunks_exact(s.v).zip(want.chunks_exact(s.v)).enumerate() {
            for (e, (g, w)) in g.iter().zip(w).enumerate() {
                prop_assert!(
                    (g - w).abs() <= bound[r],
                    "row {} head {} value {}: {} against {} (bound {:.2e})", r / s.heads, r % s.heads, e, g, w, bound[r]
                );
            }
        }
    }

    #[test]
    fn every_row_equals_the_same_row_run_alone_over_its_compact_sequence(
        (s, past, n, mask, seed) in case(),
    ) {
        let w = s.width();
        let q = symmetric(n * s.heads * w, seed, 2.0);
        let kv = symmetric((past + n) * w, seed ^ 1, 1.0);
        let all = attention(&q, &kv, past, &mask, &s, Weights::Bf16);
        for i in 0..n {
            // The row's sequence (for a tree row: the committed entries, then its path from the root)
            // as committed entries, its own entry last as the one new row.
            let seq = mask.compact(past, n, i).collect::<Vec<_>>();
            let alone_kv: Vec<f32> = seq.iter().flat_map(|&t| kv[t * w..][..w].iter().copied()).collect();
            let row_q = &q[i * s.heads * w..][..s.heads * w];
            let alone = attention(row_q, &alone_kv, seq.len() - 1, &NewMask::Causal, &s, Weights::Bf16);
            let row = &all[i * s.heads * s.latent..][..s.heads * s.latent];
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&alone), bits(row), "row {} of {} over {} committed", i, n, past);
        }
    }

    /// With nothing committed, a row whose mask shows no token has an empty softmax: the reference
    /// returns zeros for every value of every head, as the GPU combine writes them. The other rows
    /// are finite.
    #[test]
    fn a_row_that_sees_nothing_is_zeros_and_the_others_are_finite(
        (s, n, bits, blind, seed) in (shape(), 1usize..40)
            .prop_flat_map(|(s, n)| (Just(s), Just(n), random_bits(n), vec(any::<bool>(), n), any::<u64>())),
        first_blind in any::<Index>(),
    ) {
        let (w, words) = (s.width(), n.div_ceil(32));
        let mut bits = bits;
        let mut blind = blind;
        blind[first_blind.index(n)] = true;
        for (row, _) in blind.iter().enumerate().filter(|(_, b)| **b) {
            bits[row * words..][..words].fill(0);
        }
        let q = symmetric(n * s.heads * w, seed, 2.0);
        let kv = symmetric(n * w, seed ^ 1, 1.0);
        let out = attention(&q, &kv, 0, &NewMask::Bits(bits), &s, Weights::Bf16);
        for (i, row) in out.chunks_exact(s.heads * s.latent).enumerate() {
            if blind[i] {
                prop_assert!(row.iter().all(|x| x.to_bits() == 0), "row {} sees nothing: {:?}", i, &row[..4]);
            } else {
                prop_assert!(row.iter().all(|x| x.is_finite()), "row {} sees itself", i);
            }
        }
    }
}
