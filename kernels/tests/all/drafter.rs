//! A DFlash drafter's kernels against the engine's CPU ops: grouped-query attention (the same softmax,
//! summed in another order: an online softmax over key tiles and splits, so the two agree to f32
//! rounding) and the per-depth top-k of log-softmaxed logits.

use crate::common::{kernels, max_error};
use kdtree_engine::ops::cpu;
use kdtree_engine::registry::{GqaShape, LogitTransform};
use kdtree_kernels::shape::GqaSizes;
use proptest::prelude::*;

/// Outputs are convex combinations of values of at most 1 in size; f32 sums over at most a few
/// thousand keys in two orders stay far inside this.
const BOUND: f64 = 1e-5;

fn values(len: usize, scale: f32, seed: u64) -> Vec<f32> {
    kdtree_quant::sample::symmetric(len, seed, scale)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    #[ignore = "needs a GPU"]
    fn gqa_attention_matches_the_cpu_op(
        n in 1usize..20, context in 0usize..1500, kv_heads in 1usize..5, group in 1usize..9,
        head_dim in prop::sample::select(vec![8usize, 40, 64, 96, 128]), seed: u64,
    ) {
        // The context buffers hold spare rows past `context`, as a growing row store does.
        let s = GqaSizes { n, context, heads: kv_heads * group, kv_heads, head_dim };
        let shape = GqaShape { heads: s.heads, kv_heads, head_dim };
        let (q_width, kv_width) = (shape.q_width(), shape.kv_width());
        // Scores up to ~head_dim·q·k/sqrt(head_dim): large enough that the softmax is peaked.
        let q = values(n * q_width, 2.0, seed);
        let ctx = [values((context + 3) * kv_width, 2.0, seed ^ 1), values((context + 3) * kv_width, 1.0, seed ^ 2)];
        let block = [values(n * kv_width, 2.0, seed ^ 3), values(n * kv_width, 1.0, seed ^ 4)];
        let used = context * kv_width;
        let want = cpu::gqa_attention(&q, [&ctx[0][..used], &block[0]], [&ctx[1][..used], &block[1]], shape);
        let k = kernels();
        let up = |x: &[f32]| k.stream().clone_htod(x).unwrap();
        let (dq, dctx, dblock) = (up(&q), ctx.each_ref().map(|c| up(c)), block.each_ref().map(|b| up(b)));
        let mut out = k.stream().alloc_zeros::<f32>(n * q_width).unwrap();
        kdtree_kernels::gqa_attention(k, &dq, [&dctx[0], &dctx[1]], [&dblock[0], &dblock[1]], s, &mut out).unwrap();
        let error = max_error(&k.stream().clone_dtoh(&out).unwrap(), &want);
        prop_assert!(error <= BOUND, "error {error:.2e} over {BOUND:.0e} for {s:?}");
    }
}

#[test]
#[ignore = "needs a GPU"]
fn gqa_attention_refuses_short_buffers_and_changes_nothing() {
    let s = GqaSizes { n: 2, context: 4, heads: 4, kv_heads: 2, head_dim: 8 };
    let k = kernels();
    let buf = |len: usize| k.stream().alloc_zeros::<f32>(len).unwrap();
    let (q, ctx, block) = (buf(2 * 32), buf(3 * 16), buf(2 * 16));
    let mut out = k.stream().clone_htod(&[7f32; 64]).unwrap();
    let err = kdtree_kernels::gqa_attention(k, &q, [&ctx, &ctx], [&block, &block], s, &mut out).unwrap_err();
    assert!(err.to_string().contains("fewer than 4 rows"), "{err}");
    assert!(k.stream().clone_dtoh(&out).unwrap().iter().all(|&v| v == 7.0));
}

/// The top-k's log-probs, relative: an exp, a division and a ln, each to a few ulps.
const LOG_PROB_BOUND: f32 = 1e-5;

/// Candidates compared: the same tokens in the same order, log-probs within [`LOG_PROB_BOUND`] plus
/// what the softmax's sum may differ by: the CPU adds `vocab` terms one after another in f32 (up to
/// `vocab` roundings of 2^-24, relative, which a ln turns into an absolute error), the GPU in a tree.
/// Seen on an H100: 8e-5 at a vocabulary of 18196.
fn same_candidates(got: &[Vec<(u32, f32)>], want: &[Vec<(u32, f32)>], vocab: usize) -> Result<(), TestCaseError> {
    let sum_error = vocab as f32 * f32::EPSILON / 2.0;
    prop_assert_eq!(got.len(), want.len());
    for (r, (g, w)) in got.iter().zip(want).enumerate() {
        let tokens = |x: &[(u32, f32)]| x.iter().map(|c| c.0).collect::<Vec<_>>();
        prop_assert_eq!(tokens(g), tokens(w), "row {}", r);
        for (a, b) in g.iter().zip(w) {
            let bound = LOG_PROB_BOUND * b.1.abs().max(1.0) + sum_error;
            prop_assert!((a.1 - b.1).abs() <= bound, "row {r}: {a:?} against {b:?}");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    #[ignore = "needs a GPU"]
    fn top_k_log_softmax_matches_the_cpu_op(
        rows in 1usize..6, vocab in 1usize..20_000, k in 1usize..70, step in prop::sample::select(vec![1f32 / 64.0, 1.0, 4.0]),
        softcap in proptest::option::of(20f32..60.0), multiplier in 0.25f32..3.0, seed: u64,
    ) {
        // Logits on a grid: distinct ones stay far apart through the transform (below the softcap,
        // tanh does not saturate), so the two sides rank them alike whatever their roundings, and equal
        // ones tie exactly on both sides. The coarse grids put ties at the k-th place, which both break
        // to the lower tokens.
        let x: Vec<f32> = values(rows * vocab, 8.0, seed).into_iter().map(|v| (v / step).round() * step).collect();
        let t = LogitTransform { multiplier, softcap };
        let want = cpu::top_k_log_softmax(&x, vocab, k, t);
        let k_ = kernels();
        let got = kdtree_kernels::top_k_log_softmax(k_, &k_.stream().clone_htod(&x).unwrap(), vocab, k, multiplier, softcap).unwrap();
        same_candidates(&got, &want, vocab)?;
    }
}

#[test]
#[ignore = "needs a GPU"]
fn top_k_log_softmax_drops_what_the_host_drops() {
    // Row 0: a NaN (its softmax is NaN: nothing); row 1: -inf entries are never proposed; row 2: an
    // infinite maximum (nothing); row 3: a vocabulary-sized row, far larger than the block.
    let vocab = 163_840;
    let mut x = values(4 * vocab, 4.0, 11);
    x[17] = f32::NAN;
    x[vocab..2 * vocab].iter_mut().skip(3).for_each(|v| *v = f32::NEG_INFINITY);
    x[2 * vocab + 5] = f32::INFINITY;
    let k = kernels();
    let got = kdtree_kernels::top_k_log_softmax(k, &k.stream().clone_htod(&x).unwrap(), vocab, 32, 1.0, None).unwrap();
    let want = cpu::top_k_log_softmax(&x, vocab, 32, LogitTransform { multiplier: 1.0, softcap: None });
    assert_eq!((got[0].len(), got[1].len(), got[2].len(), got[3].len()), (0, 3, 0, 32), "{got:?}");
    same_candidates(&got, &want, vocab).unwrap();
}
