//! Every valid MLA decode variant on the GPU against the CPU reference, on random head shapes (heads
//! that pad a block, latent 32..=512, rope 0..=64), contexts (none, a few entries, thousands: many
//! tiles a split), row counts (two mask words past 32), masks (causal, full, draft trees, random bits
//! in which a row may see nothing) and page sizes, inputs rounded to bf16 (or quantized, for the
//! variants of an FP8 cache, against the reference over the values it holds); one random row of each case
//! decoded alone over its compact sequence, bit for bit; the f32 family on the same launches; and
//! absorb and unabsorb against their references on random shapes. Run on a GPU machine:
//! `cargo test --release -p kdtree-fuzz --test gpu_mla -- --ignored`.

use kdtree_fuzz::each_variant;
use kdtree_jit::mla::reference::{Weights, absorb_query, attention, unabsorb_output};
use kdtree_jit::mla::{
    AuxKernel, MlaAux, MlaDecode, MlaKernel, MlaShape, NewMask, absorb_host, mla_host, unabsorb_host,
};
use kdtree_jit::mla_f32::{MlaF32, MlaF32Kernel, attention_host};
use kdtree_jit::{Gpu, Target, Variant};
use kdtree_quant::Dtype;
use kdtree_quant::sample::symmetric;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{Index, select};
use proptest::test_runner::{Config, TestRunner};

/// bf16 bits of `values`, rounded to nearest even.
fn bits(values: &[f32]) -> Vec<u16> {
    values.iter().map(|&x| (Dtype::Bf16.round(x).to_bits() >> 16) as u16).collect()
}

fn widen(b: &[u16]) -> Vec<f32> {
    b.iter().map(|&x| f32::from_bits(u32::from(x) << 16)).collect()
}

/// Causal, full, a tree, or random words (half or an eighth of the bits set, those past `n` too): a
/// row of random bits may see no new token, nothing at all when nothing is committed.
fn mask(n: usize) -> impl Strategy<Value = NewMask> {
    let words = n.div_ceil(32);
    let random = (vec(any::<[u32; 3]>(), n * words), any::<bool>())
        .prop_map(|(w, sparse)| NewMask::Bits(w.iter().map(|&[a, b, c]| if sparse { a & b & c } else { a }).collect()));
    prop_oneof![
        1 => Just(NewMask::Causal),
        1 => Just(NewMask::Full),
        2 => kdtree_fuzz::draft_tree(n).prop_map(|parents| NewMask::tree(&parents)),
        1 => random,
    ]
}

/// One launch's inputs, drawn at random.
#[derive(Clone, Debug)]
struct Launch {
    s: MlaShape,
    past: usize,
    n: usize,
    mask: NewMask,
    page: usize,
    /// The queries' range: larger values make peakier softmaxes.
    q_amp: f32,
    seed: u64,
}

/// Heads 1..=80 (a block takes 16, 32 or 64: partial and several head groups), every latent and rope
/// the kernels take, nothing to thousands of committed entries, 1..=70 rows, pages of 1 to 256.
fn launch() -> impl Strategy<Value = Launch> {
    let shape = (1usize..=80, 1usize..=16, 0usize..=4, 0.25f32..2.0).prop_map(|(heads, latent, rope, k)| {
        let (latent, rope) = (32 * latent, 16 * rope);
        // nope and v are not read by the attention kernels. The scale keeps scores, sums over the
        // width of products of the queries' and entries' ranges, between flat and peaky.
        MlaShape { heads, nope: 128, rope, v: 128, latent, scale: k / ((latent / 4 + rope) as f32).sqrt() }
    });
    let past = prop_oneof![Just(0usize), 1usize..=64, 65usize..=3000];
    let n = prop_oneof![1usize..=8, 9usize..=70];
    (shape, past, n).prop_flat_map(|(s, past, n)| {
        let page = select(vec![1usize, 2, 16, 64, 256]);
        (Just(s), Just(past), Just(n), mask(n), page, 0.25f32..3.0, any::<u64>())
            .prop_map(|(s, past, n, mask, page, q_amp, seed)| Launch { s, past, n, mask, page, q_amp, seed })
    })
}

/// Runs `l` on `kernel` against the reference, and row `alone` (of the rows that see something) by
/// itself over its compact sequence in pages of `alone_page`. Returns the worst error over its bound:
/// each (row, head)'s output is a convex combination of its entries' latent values, and the kernel
/// and the reference round the same softmax weights to bf16; they part only where a score's last
/// f32 bits (summation order) or exp2's last bit move a weight across a rounding boundary, one bf16
/// step (2^-8 relative) for that weight, so the error is at most about 2^-8 of the largest latent
/// magnitude. The bound, 1e-2 of that magnitude, leaves a factor 2.5 (kdtree-jit's tests/gpu_mla.rs
/// uses the same). A row that sees nothing is zeros, as the
/// reference's.
fn check(gpu: &Gpu, kernel: &MlaKernel, l: &Launch, alone: Index, alone_page: usize) -> Result<f32, TestCaseError> {
    let (s, w, name) = (&l.s, l.s.width(), kernel.variant().name());
    let q = bits(&symmetric(l.n * s.heads * w, l.seed, l.q_amp));
    let (kv, kvf) = kernel.variant().kv.encode(&symmetric((l.past + l.n) * w, l.seed ^ 1, 1.0), s);
    let ew = kernel.variant().kv.entry_words(s);
    let want = attention(&widen(&q), &kvf, l.past, &l.mask, s, Weights::Bf16);
    let got = mla_host(gpu, kernel, s, &q, &kv, l.past, &l.mask, l.page).expect("runs");
    let kv_max = kvf.chunks_exact(w).flat_map(|e| &e[..s.latent]).fold(0f32, |m, x| m.max(x.abs()));
    let bound = 1e-2 * kv_max;
    let row_len = s.heads * s.latent;
    let mut worst = 0f32;
    let mut seeing = Vec::new();
    for (i, (g, r)) in got.chunks_exact(row_len).zip(want.chunks_exact(row_len)).enumerate() {
        if l.mask.compact(l.past, l.n, i).next().is_none() {
            prop_assert!(g.iter().chain(r).all(|&x| x == 0.0), "{}: row {} sees nothing but is not zeros", name, i);
            continue;
        }
        seeing.push(i);
        for (at, (g, r)) in g.iter().zip(r).enumerate() {
            let e = (g - r).abs();
            prop_assert!(
                e <= bound,
                "{}: row {} head {} value {}: {} against {} (bound {:.2e})",
                name,
                i,
                at / s.latent,
                at % s.latent,
                g,
                r,
                bound
            );
            worst = worst.max(e / bound);
        }
    }
    if !seeing.is_empty() {
        let i = seeing[alone.index(seeing.len())];
        let seq = l.mask.compact(l.past, l.n, i).collect::<Vec<_>>();
        let alone_kv: Vec<u16> = seq.iter().flat_map(|&t| kv[t * ew..][..ew].iter().copied()).collect();
        let row_q = &q[i * s.heads * w..][..s.heads * w];
        let one = mla_host(gpu, kernel, s, row_q, &alone_kv, seq.len() - 1, &NewMask::Causal, alone_page)
            .expect("runs alone");
        let same = one.iter().zip(&got[i * row_len..][..row_len]).all(|(a, b)| a.to_bits() == b.to_bits());
        prop_assert!(same, "{}: row {} differs from the same row decoded alone", name, i);
    }
    Ok(worst)
}

#[test]
#[ignore = "needs a GPU"]
fn every_valid_decode_variant_matches_the_reference() {
    let gpu = Gpu::open(0).expect("a GPU");
    let variants = MlaDecode::valid_on(gpu.arch);
    assert!(!variants.is_empty());
    let load = |v, c: &_| MlaKernel::load(&gpu, v, c).expect("loads");
    let strategy = |_: &_| (launch(), (any::<Index>(), select(vec![1usize, 16, 128])));
    let check = |k: &MlaKernel, (l, (row, page))| check(&gpu, k, &l, row, page);
    let (e, name) = each_variant(&variants, |v| v.compile_arch(gpu.arch), load, 4, strategy, check);
    println!(
        "{} variants, 4 random launches each, within tolerance; worst {e:.3} of the bound ({name})",
        variants.len()
    );
}

/// The f32 family (an f32 checkpoint's attention, [`MlaF32`]) on the same random launches, f32 inputs:
/// within f32 rounding of the reference with f32 weights (kdtree-jit's tests/gpu_mla_f32.rs's bound,
/// 1e-5 of the largest latent magnitude: sums in another order over at most a few thousand terms, and
/// exp2f's 2 ulp; one bf16 rounding anywhere would be 4e-3), rows that see nothing zeros, and one
/// random row decoded alone over its compact sequence bit for bit.
#[test]
#[ignore = "needs a GPU"]
fn the_f32_family_matches_the_reference_on_random_launches() {
    let gpu = Gpu::open(0).expect("a GPU");
    let variants = MlaF32::valid(&Target { arch: gpu.arch });
    assert!(!variants.is_empty());
    let load = |v, c: &_| MlaF32Kernel::load(&gpu, v, c).expect("loads");
    let strategy = |_: &_| (launch(), (any::<Index>(), select(vec![1usize, 16, 128])));
    let check = |k: &MlaF32Kernel, (l, (alone, alone_page)): (Launch, (Index, usize))| {
        let (s, w) = (&l.s, l.s.width());
        let q = symmetric(l.n * s.heads * w, l.seed, l.q_amp);
        let kv = symmetric((l.past + l.n) * w, l.seed ^ 1, 1.0);
        let want = attention(&q, &kv, l.past, &l.mask, s, Weights::F32);
        let got = attention_host(&gpu, k, s, &q, &kv, l.past, &l.mask, l.page).expect("runs");
        let bound = 1e-5 * kv.chunks_exact(w).flat_map(|e| &e[..s.latent]).fold(0f32, |m, x| m.max(x.abs()));
        let row_len = s.heads * s.latent;
        let mut worst = 0f32;
        let mut seeing = Vec::new();
        for (i, (g, r)) in got.chunks_exact(row_len).zip(want.chunks_exact(row_len)).enumerate() {
            if l.mask.compact(l.past, l.n, i).next().is_none() {
                prop_assert!(g.iter().chain(r).all(|&x| x == 0.0), "row {} sees nothing but is not zeros", i);
                continue;
            }
            seeing.push(i);
            let e = g.iter().zip(r).fold(0f32, |m, (g, r)| m.max((g - r).abs()));
            prop_assert!(e <= bound, "row {}: {:e} from the reference (bound {:.2e})", i, e, bound);
            worst = worst.max(e / bound);
        }
        if !seeing.is_empty() {
            let i = seeing[alone.index(seeing.len())];
            let seq = l.mask.compact(l.past, l.n, i).collect::<Vec<_>>();
            let alone_kv: Vec<f32> = seq.iter().flat_map(|&t| kv[t * w..][..w].iter().copied()).collect();
            let row_q = &q[i * s.heads * w..][..s.heads * w];
            let one = attention_host(&gpu, k, s, row_q, &alone_kv, seq.len() - 1, &NewMask::Causal, alone_page)
                .expect("runs alone");
            let same = one.iter().zip(&got[i * row_len..][..row_len]).all(|(a, b)| a.to_bits() == b.to_bits());
            prop_assert!(same, "row {} differs from the same row decoded alone", i);
        }
        Ok(worst)
    };
    let (e, name) = each_variant(&variants, |_| gpu.arch, load, 16, strategy, check);
    println!(
        "{} f32 variants, 16 random launches each, within f32 rounding; worst {e:.3} of the bound ({name})",
        variants.len()
    );
}

#[test]
#[ignore = "needs a GPU"]
fn absorb_and_unabsorb_match_their_references_on_random_shapes() {
    let gpu = Gpu::open(0).expect("a GPU");
    let aux = AuxKernel::compile(&gpu, MlaAux::default_for(&Target { arch: gpu.arch }), None).expect("compiles");
    let shape = (1usize..=64, 1usize..=256, 0usize..=4, 1usize..=192, 1usize..=16).prop_map(
        |(heads, nope, rope, v, latent)| MlaShape { heads, nope, rope: 16 * rope, v, latent: 32 * latent, scale: 1.0 },
    );
    TestRunner::new(Config { cases: 64, failure_persistence: None, ..Config::default() })
        .run(&(shape, 1usize..=40, any::<u64>()), |(s, n, seed)| {
            let kv_b = bits(&symmetric(s.heads * (s.nope + s.v) * s.latent, seed, 0.1));
            let kv_b_f = widen(&kv_b);
            // Absorb sums in the reference's order with the same roundings: equal bits.
            let q = symmetric(n * s.heads * (s.nope + s.rope), seed ^ 1, 2.0);
            let want = bits(&absorb_query(&q, &kv_b_f, &s));
            prop_assert_eq!(absorb_host(&gpu, &aux, &s, &q, &kv_b).expect("absorbs"), want, "absorb of {} rows", n);
            // Unabsorb sums in another fixed order (lane-strided with fma, then a butterfly): the
            // reference's sum of latent products is within latent u of the exact one, the kernel's
            // within (latent / 32 + 6) u, of the sum of their magnitudes (u = EPSILON / 2); (latent +
            // 40) EPSILON of it bounds both. A row's bits do not depend on n.
            let o_lat = symmetric(n * s.heads * s.latent, seed ^ 2, 1.0);
            let want = unabsorb_output(&o_lat, &kv_b_f, &s);
            let got = unabsorb_host(&gpu, &aux, &s, &o_lat, &kv_b).expect("unabsorbs");
            let abs_o: Vec<f32> = o_lat.iter().map(|x| x.abs()).collect();
            let abs_w: Vec<f32> = kv_b_f.iter().map(|x| x.abs()).collect();
            let magnitude = unabsorb_output(&abs_o, &abs_w, &s);
            for (at, ((g, r), m)) in got.iter().zip(&want).zip(&magnitude).enumerate() {
                let bound = (s.latent + 40) as f32 * f32::EPSILON * m;
                prop_assert!(
                    (g - r).abs() <= bound,
                    "unabsorb value {}: {} against {} (bound {:.2e})",
                    at,
                    g,
                    r,
                    bound
                );
            }
            let last = n - 1;
            let one = unabsorb_host(&gpu, &aux, &s, &o_lat[last * s.heads * s.latent..], &kv_b).expect("unabsorbs");
            let same = one.iter().zip(&got[last * s.heads * s.v..]).all(|(a, b)| a.to_bits() == b.to_bits());
            prop_assert!(same, "unabsorb's last row alone differs, n = {}", n);
            Ok(())
        })
        .unwrap();
}
