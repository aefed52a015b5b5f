//! Grouped-query attention against the engine's CPU op: the same softmax, summed in another order
//! (an online softmax over key tiles and splits), so the two agree to f32 rounding.

mod common;

use common::{kernels, max_error};
use kdtree_engine::ops::cpu;
use kdtree_engine::registry::GqaShape;
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
        head_dim in prop::sample::select(vec![8usize, 40, 64, 128, 256]), seed: u64,
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
