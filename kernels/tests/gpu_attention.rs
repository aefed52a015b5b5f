//! MLA's rotary columns, KV cache append and tree attention against the engine's CPU ops.
//! Tolerances:
//! - rope_strided: bit for bit; the kernel rounds the products and the sum separately as the CPU does.
//! - kv_append: exact, a copy.
//! - attention_tree: 1e-5 as max |gpu - cpu| / max(1, |cpu|) ([`common::MEASURE`]; outputs are averages of
//!   values in [-1, 1], so this is the absolute error). The two sum q·k, the softmax and the weighted
//!   values in different orders (lanes and a running softmax against left to right); a transcription of
//!   the kernel's order in f32 differs from the CPU op by about 1e-7 here, so 1e-5 leaves a wide margin
//!   while a wrong key, weight or mask bit shows as 1e-2 or more.
//! - batch invariance: bit for bit, the property the kernel is built for.

mod common;

use common::{kernels, max_error};
use kdtree_engine::TreeMask;
use kdtree_engine::ops::cpu;
use kdtree_kernels::{AttentionShape, KvLayout, RopeColumns, RopeLayout};
use proptest::prelude::*;

fn values(len: usize, scale: f32, seed: u64) -> Vec<f32> {
    kdtree_quant::sample::symmetric(len, seed, scale)
}

fn table(half: usize, max_pos: usize) -> cpu::RopeTable {
    let inv_freq: Vec<f64> = (0..half).map(|i| 10000f64.powf(-(i as f64) / half as f64)).collect();
    cpu::RopeTable::new(&inv_freq, max_pos, 1.0)
}

fn mask_of(m: &TreeMask) -> Vec<u32> {
    kdtree_kernels::mask_words(m.len(), |i, j| m.visible(i, j))
}

/// attention_tree on the GPU: q [n, heads, qk] over caches of whole entries, of which the first
/// `past + n` are the context.
fn gpu_attention(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    past: usize,
    mask: &TreeMask,
    s: AttentionShape,
) -> Vec<f32> {
    let k = kernels();
    let up = |x: &[f32]| k.stream().clone_htod(x).unwrap();
    let (dq, dk, dv) = (up(q), up(k_cache), up(v_cache));
    let dm = k.stream().clone_htod(&mask_of(mask)).unwrap();
    let mut out = k.stream().alloc_zeros::<f32>(mask.len() * s.heads * s.v_dim).unwrap();
    let past = k.stream().clone_htod(&[past as u32]).unwrap();
    kdtree_kernels::attention_tree(k, &dq, &dk, &dv, &dm, &past, s, &mut out).unwrap();
    k.stream().clone_dtoh(&out).unwrap()
}

fn cpu_attention(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    past: usize,
    mask: &TreeMask,
    s: AttentionShape,
) -> Vec<f32> {
    let t = past + mask.len();
    let shape = cpu::AttentionShape { heads: s.heads, qk_dim: s.qk_dim, v_dim: s.v_dim, scale: s.scale };
    cpu::attention(q, &k_cache[..t * s.heads * s.qk_dim], &v_cache[..t * s.heads * s.v_dim], past, mask, shape)
}

/// A forest in parents-first order from proptest's draws: node i's parent is one of 0..i, or none.
fn parents(draws: &[usize]) -> Vec<Option<usize>> {
    draws.iter().enumerate().map(|(i, &d)| if i == 0 || d % (i + 1) == i { None } else { Some(d % (i + 1)) }).collect()
}

/// Cache entries `entries` of `cache` (entries of `width`), in order.
fn pick(cache: &[f32], width: usize, entries: &[usize]) -> Vec<f32> {
    entries.iter().flat_map(|&t| cache[t * width..][..width].to_vec()).collect()
}

const TINY: AttentionShape = AttentionShape { heads: 4, qk_dim: 24, v_dim: 16, scale: 0.204_124_15 };
/// DeepSeek-V3 / K2's head widths (192 = 128 nope + 64 rope, v 128), two heads of their 64.
const K2: AttentionShape = AttentionShape { heads: 2, qk_dim: 192, v_dim: 128, scale: 0.072_168_78 };
/// Widths that are not multiples of a warp.
const ODD: AttentionShape = AttentionShape { heads: 3, qk_dim: 40, v_dim: 24, scale: 0.158_113_88 };

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    #[ignore = "needs a GPU"]
    fn rope_strided_matches_the_cpu_bit_for_bit(
        positions in proptest::collection::vec(0u32..64, 1..9), heads in 1usize..5, half in 1usize..40,
        offset in 0usize..70, spare in 0usize..5, split: bool, seed: u64,
    ) {
        let (dim, rows) = (2 * half, positions.len());
        let head_stride = offset + dim + spare;
        let layout = if split { RopeLayout::HalfSplit } else { RopeLayout::Interleaved };
        let t = table(half, 64);
        let x = values(rows * heads * head_stride, 4.0, seed);
        // The CPU op on the rotated columns alone, put back in place.
        let mut cols: Vec<f32> = x.chunks_exact(head_stride).flat_map(|h| h[offset..offset + dim].to_vec()).collect();
        let pos: Vec<usize> = positions.iter().map(|&p| p as usize).collect();
        let rope = if split { cpu::rope_half_split } else { cpu::rope_interleaved };
        rope(&mut cols, dim, &pos, &t.cos, &t.sin);
        let mut want = x.clone();
        for (h, c) in want.chunks_exact_mut(head_stride).zip(cols.chunks_exact(dim)) {
            h[offset..offset + dim].copy_from_slice(c);
        }
        let k = kernels();
        let mut dx = k.stream().clone_htod(&x).unwrap();
        let dp = k.stream().clone_htod(&positions).unwrap();
        let (cos, sin) = (k.stream().clone_htod(&t.cos).unwrap(), k.stream().clone_htod(&t.sin).unwrap());
        let columns = RopeColumns { heads, head_stride, offset, dim, layout };
        kdtree_kernels::rope_strided(k, &mut dx, columns, &dp, &cos, &sin).unwrap();
        let got: Vec<u32> = k.stream().clone_dtoh(&dx).unwrap().iter().map(|v| v.to_bits()).collect();
        prop_assert_eq!(got, want.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn kv_append_lays_out_each_head_as_nope_then_the_shared_rope(
        n in 1usize..6, heads in 1usize..5, nope in 0usize..40, rope in 1usize..20, v_dim in 1usize..40,
        start in 0usize..5, seed: u64,
    ) {
        let capacity = start + n + 2;
        let (kv, k_rope) = (values(n * heads * (nope + v_dim), 1.0, seed), values(n * rope, 1.0, !seed));
        let (qk, mut want_k, mut want_v) = (nope + rope, vec![-1.0; capacity * heads * (nope + rope)], vec![-1.0; capacity * heads * v_dim]);
        for t in 0..n {
            for h in 0..heads {
                let src = &kv[(t * heads + h) * (nope + v_dim)..][..nope + v_dim];
                let key = &mut want_k[((start + t) * heads + h) * qk..][..qk];
                key[..nope].copy_from_slice(&src[..nope]);
                key[nope..].copy_from_slice(&k_rope[t * rope..][..rope]);
                want_v[((start + t) * heads + h) * v_dim..][..v_dim].copy_from_slice(&src[nope..]);
            }
        }
        let k = kernels();
        let (dkv, dr) = (k.stream().clone_htod(&kv).unwrap(), k.stream().clone_htod(&k_rope).unwrap());
        let mut kc = k.stream().clone_htod(&vec![-1.0f32; want_k.len()]).unwrap();
        let mut vc = k.stream().clone_htod(&vec![-1.0f32; want_v.len()]).unwrap();
        let at = k.stream().clone_htod(&[start as u32]).unwrap();
        kdtree_kernels::kv_append(k, &dkv, &dr, KvLayout { heads, nope, rope, v_dim }, &at, &mut kc, &mut vc).unwrap();
        prop_assert_eq!(k.stream().clone_dtoh(&kc).unwrap(), want_k.clone());
        prop_assert_eq!(k.stream().clone_dtoh(&vc).unwrap(), want_v.clone());
        // A start whose rows run past the capacity writes only the rows that fit.
        let late = capacity - 1;
        let at = k.stream().clone_htod(&[late as u32]).unwrap();
        let mut kc = k.stream().clone_htod(&vec![-1.0f32; want_k.len()]).unwrap();
        let mut vc = k.stream().clone_htod(&vec![-1.0f32; want_v.len()]).unwrap();
        kdtree_kernels::kv_append(k, &dkv, &dr, KvLayout { heads, nope, rope, v_dim }, &at, &mut kc, &mut vc).unwrap();
        let (got_k, got_v) = (k.stream().clone_dtoh(&kc).unwrap(), k.stream().clone_dtoh(&vc).unwrap());
        let (row_k, row_v) = (heads * qk, heads * v_dim);
        prop_assert!(got_k[..late * row_k].iter().chain(&got_v[..late * row_v]).all(|&x| x == -1.0));
        prop_assert_eq!(&got_k[late * row_k..], &want_k[start * row_k..(start + 1) * row_k]);
        prop_assert_eq!(&got_v[late * row_v..], &want_v[start * row_v..(start + 1) * row_v]);
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn attention_tree_matches_the_cpu_and_each_row_its_path_alone(
        draws in proptest::collection::vec(any::<usize>(), 1..70), past in 0usize..300, which in 0usize..3,
        spare in 0usize..3, seed: u64,
    ) {
        let s = [TINY, K2, ODD][which];
        let tree = TreeMask::from_parents(&parents(&draws));
        let n = tree.len();
        // The caches hold `spare` entries past the context, which no query may see.
        let entries = past + n + spare;
        let q = values(n * s.heads * s.qk_dim, 1.0, seed);
        let (kc, vc) = (values(entries * s.heads * s.qk_dim, 1.0, !seed), values(entries * s.heads * s.v_dim, 1.0, seed ^ 7));
        let got = gpu_attention(&q, &kc, &vc, past, &tree, s);
        let want = cpu_attention(&q, &kc, &vc, past, &tree, s);
        prop_assert!(max_error(&got, &want) <= 1e-5, "error {}", max_error(&got, &want));
        // Batch invariance: each row equals, bit for bit, its query alone over a cache holding exactly its
        // path, with the path's last entry as the one new token.
        for i in 0..n {
            let path: Vec<usize> = (0..past).chain((0..n).filter(|&j| tree.visible(i, j)).map(|j| past + j)).collect();
            let (pk, pv) = (pick(&kc, s.heads * s.qk_dim, &path), pick(&vc, s.heads * s.v_dim, &path));
            let qi = &q[i * s.heads * s.qk_dim..][..s.heads * s.qk_dim];
            let alone = gpu_attention(qi, &pk, &pv, path.len() - 1, &TreeMask::causal(1), s);
            let row = &got[i * s.heads * s.v_dim..][..s.heads * s.v_dim];
            prop_assert!(alone.iter().zip(row).all(|(a, b)| a.to_bits() == b.to_bits()), "row {} of {}", i, n);
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn a_tree_query_equals_the_same_query_over_its_path_alone() {
    // The CPU op's test: a cache of 2, then 0 -> {1, 2}, 2 -> 3. Node 3 sees cache + nodes 0, 2, 3.
    let s = AttentionShape { heads: 2, qk_dim: 3, v_dim: 2, scale: 0.5 };
    let (past, n) = (2, 4);
    let q = values(n * 6, 1.0, 4);
    let (k, v) = (values((past + n) * 6, 1.0, 5), values((past + n) * 4, 1.0, 6));
    let tree = TreeMask::from_parents(&[None, Some(0), Some(0), Some(2)]);
    let out = gpu_attention(&q, &k, &v, past, &tree, s);
    let path = [0, 1, 2, 4, 5];
    let alone = gpu_attention(&q[3 * 6..], &pick(&k, 6, &path), &pick(&v, 4, &path), 4, &TreeMask::causal(1), s);
    assert_eq!(out[3 * 4..], alone[..]);
    // And the same path as new tokens, a causal chain after no cache: the same bits again.
    let mut chain_q = vec![0.25; 5 * 6];
    chain_q[4 * 6..].copy_from_slice(&q[3 * 6..4 * 6]);
    let chain = gpu_attention(&chain_q, &pick(&k, 6, &path), &pick(&v, 4, &path), 0, &TreeMask::causal(5), s);
    assert_eq!(chain[4 * 4..], alone[..]);
    assert!(max_error(&out, &cpu_attention(&q, &k, &v, past, &tree, s)) <= 1e-5);
}

#[test]
#[ignore = "needs a GPU"]
fn attention_over_a_context_of_16k_entries_matches_the_cpu() {
    let (past, tree) = (16_389, TreeMask::from_parents(&[None, Some(0), Some(0), Some(1)]));
    let n = tree.len();
    let q = values(n * K2.heads * K2.qk_dim, 1.0, 11);
    let (kc, vc) =
        (values((past + n) * K2.heads * K2.qk_dim, 1.0, 12), values((past + n) * K2.heads * K2.v_dim, 1.0, 13));
    let got = gpu_attention(&q, &kc, &vc, past, &tree, K2);
    let want = cpu_attention(&q, &kc, &vc, past, &tree, K2);
    assert!(max_error(&got, &want) <= 1e-5, "error {}", max_error(&got, &want));
}

#[test]
#[ignore = "needs a GPU"]
fn attention_refuses_what_it_cannot_compute() {
    let k = kernels();
    let s = AttentionShape { heads: 1, qk_dim: 1, v_dim: 1, scale: 1.0 };
    let n = kdtree_kernels::shape::MAX_NEW_TOKENS + 1;
    let q = k.stream().alloc_zeros::<f32>(n).unwrap();
    let cache = k.stream().alloc_zeros::<f32>(n).unwrap();
    let mask = k.stream().alloc_zeros::<u32>(n * n.div_ceil(32)).unwrap();
    let mut out = k.stream().alloc_zeros::<f32>(n).unwrap();
    let zero = k.stream().clone_htod(&[0u32]).unwrap();
    let err = kdtree_kernels::attention_tree(k, &q, &cache, &cache, &mask, &zero, s, &mut out).unwrap_err();
    assert!(matches!(err, kdtree_kernels::Error::Unsupported { .. }), "{err}");
    // A cache shorter than the new tokens.
    let q = k.stream().alloc_zeros::<f32>(2).unwrap();
    let mask = k.stream().clone_htod(&[1u32, 3]).unwrap();
    let mut out = k.stream().alloc_zeros::<f32>(2).unwrap();
    let cache = k.stream().alloc_zeros::<f32>(1).unwrap();
    let err = kdtree_kernels::attention_tree(k, &q, &cache, &cache, &mask, &zero, s, &mut out).unwrap_err();
    assert!(matches!(err, kdtree_kernels::Error::Shape { .. }), "{err}");
    let cache = k.stream().alloc_zeros::<f32>(4).unwrap();
    // A past whose entries and the new ones overrun the cache: nothing is written (the host keeps
    // past + n within the cache; the kernel only refuses to read past it).
    let mut out = k.stream().clone_htod(&[7.0f32, 7.0]).unwrap();
    let three = k.stream().clone_htod(&[3u32]).unwrap();
    kdtree_kernels::attention_tree(k, &q, &cache, &cache, &mask, &three, s, &mut out).unwrap();
    assert_eq!(k.stream().clone_dtoh(&out).unwrap(), [7.0, 7.0]);
}

#[test]
#[ignore = "needs a GPU"]
fn a_position_past_the_table_gives_nan_columns_only() {
    let k = kernels();
    let t = table(2, 4);
    let mut x = k.stream().clone_htod(&[1.0f32; 12]).unwrap();
    let positions = k.stream().clone_htod(&[1u32, 4]).unwrap();
    let (cos, sin) = (k.stream().clone_htod(&t.cos).unwrap(), k.stream().clone_htod(&t.sin).unwrap());
    let columns = RopeColumns { heads: 1, head_stride: 6, offset: 1, dim: 4, layout: RopeLayout::Interleaved };
    kdtree_kernels::rope_strided(k, &mut x, columns, &positions, &cos, &sin).unwrap();
    let got = k.stream().clone_dtoh(&x).unwrap();
    assert!(got[1..5].iter().all(|v| v.is_finite()) && got[7..11].iter().all(|v| v.is_nan()), "{got:?}");
    assert_eq!((got[0], got[5], got[6], got[11]), (1.0, 1.0, 1.0, 1.0));
}
