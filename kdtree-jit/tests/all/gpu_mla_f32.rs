//! The f32 MLA family on a GPU against the CPU reference (`mla::reference` with f32 weights): absorb
//! bit for bit, attention and unabsorb within f32 rounding, on tiny and K2-sized heads, contexts off
//! the tile edge, a draft tree, causal and full blocks, over shuffled pages; a tree row against the
//! same row over its path alone, bit for bit (batch invariance); append then gather round-tripping
//! exactly. Run on a GPU machine:
//! `cargo test --release -p kdtree-jit --test gpu_mla_f32 -- --ignored --nocapture`.

use std::path::Path;

use cudarc::driver::CudaSlice;
use kdtree_jit::mla::reference::{Weights, absorb_query, attention, unabsorb_output};
use kdtree_jit::mla::{Companions, absorb_host, unabsorb_host, upload_cache};
use kdtree_jit::mla::{MlaShape, NewMask, PagedCache};
use kdtree_jit::mla_f32::{MlaF32, MlaF32Kernel, attention_host};
use kdtree_jit::{Cache, Gpu, Target};
use kdtree_quant::sample::symmetric;

const K2: MlaShape = MlaShape { heads: 64, nope: 128, rope: 64, v: 128, latent: 512, scale: 0.1352 };
const TINY: MlaShape = MlaShape { heads: 4, nope: 16, rope: 16, v: 16, latent: 32, scale: 0.25 };

fn kernel(gpu: &Gpu) -> MlaF32Kernel {
    let cache = Cache::open(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("cubin")).unwrap();
    MlaF32Kernel::compile(gpu, MlaF32::default_for(&Target { arch: gpu.arch }), Some(&cache)).unwrap()
}

/// `max |got - want| / max |want|`.
fn relative(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(f32::MIN_POSITIVE, |m, x| m.max(x.abs()));
    got.iter().zip(want).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale
}

/// The bound on attention's and unabsorb's difference from the reference: f32 sums in another order
/// (fma, lane-strided and butterfly sums) over at most a few thousand terms of unit size, and exp2f's
/// 2 ulp; 1e-5 of the output's scale is ~100 ulp, and bf16 rounding anywhere would be 4e-3.
const BOUND: f32 = 1e-5;

#[test]
#[ignore = "needs a GPU"]
fn absorb_attention_and_unabsorb_match_the_reference() {
    let gpu = Gpu::open(0).expect("a GPU");
    let k = kernel(&gpu);
    let tree = NewMask::tree(&[None, Some(0), Some(0), Some(1), Some(3)]);
    let cases = [
        (TINY, 0, 1, NewMask::Causal, 16),
        (TINY, 37, 5, tree.clone(), 16),
        (TINY, 63, 7, NewMask::Full, 64),
        (TINY, 130, 9, NewMask::Causal, 64),
        (K2, 200, 5, tree, 64),
        (K2, 0, 3, NewMask::Causal, 64),
    ];
    for (i, (s, past, n, mask, page)) in cases.into_iter().enumerate() {
        let seed = 10 * i as u64;
        let q = symmetric(n * s.heads * (s.nope + s.rope), seed, 1.0);
        let kv_b = symmetric(s.heads * (s.nope + s.v) * s.latent, seed + 1, 0.2);
        let kv = symmetric((past + n) * s.width(), seed + 2, 1.0);
        let q_lat = absorb_host(&gpu, &k, &s, &q, &kv_b).unwrap();
        assert_eq!(q_lat, absorb_query(&q, &kv_b, &s), "case {i}: absorb is the reference's, bit for bit");
        let o_lat = attention_host(&gpu, &k, &s, &q_lat, &kv, past, &mask, page).unwrap();
        let want = attention(&q_lat, &kv, past, &mask, &s, Weights::F32);
        let err = relative(&o_lat, &want);
        let out = unabsorb_host(&gpu, &k, &s, &want, &kv_b).unwrap();
        let err_out = relative(&out, &unabsorb_output(&want, &kv_b, &s));
        println!("case {i}: past {past} n {n}: attention {err:.2e}, unabsorb {err_out:.2e}");
        assert!(err < BOUND && err_out < BOUND, "case {i}: {err:e} {err_out:e}");
    }
}

#[test]
#[ignore = "needs a GPU"]
fn a_tree_row_equals_the_same_row_over_its_path_alone_bit_for_bit() {
    let gpu = Gpu::open(0).expect("a GPU");
    let k = kernel(&gpu);
    let (s, past, w) = (TINY, 70, TINY.width());
    let parents = [None, Some(0), Some(0), Some(2), Some(3)];
    let n = parents.len();
    let q = symmetric(n * s.heads * w, 3, 1.0);
    let kv = symmetric((past + n) * w, 4, 1.0);
    let tree = attention_host(&gpu, &k, &s, &q, &kv, past, &NewMask::tree(&parents), 16).unwrap();
    // Node 4's path: the past, then nodes 0, 2, 3, 4.
    let path: Vec<f32> =
        (0..past).chain([0, 2, 3, 4].map(|j| past + j)).flat_map(|t| kv[t * w..][..w].to_vec()).collect();
    let row = |r: usize| q[r * s.heads * w..(r + 1) * s.heads * w].to_vec();
    let alone = attention_host(&gpu, &k, &s, &row(4), &path, past + 3, &NewMask::Causal, 16).unwrap();
    let per_row = s.heads * s.latent;
    assert_eq!(tree[4 * per_row..5 * per_row], alone[..]);
}

#[test]
#[ignore = "needs a GPU"]
fn append_then_gather_round_trips_through_shuffled_pages_exactly() {
    let gpu = Gpu::open(0).expect("a GPU");
    let k = kernel(&gpu);
    let (s, page, past, n) = (TINY, 16, 21, 19);
    let w = s.width();
    let old = symmetric(past * w, 5, 1.0);
    let mut all = old.clone();
    all.extend(vec![0f32; n * w]);
    let (_pool, table) = upload_cache(&gpu, &all, w, page, 2, 1).unwrap();
    let new = symmetric(n * w, 6, 1.0);
    let latent: Vec<f32> = new.chunks(w).flat_map(|e| e[..s.latent].to_vec()).collect();
    let k_pe: Vec<f32> = new.chunks(w).flat_map(|e| e[s.latent..].to_vec()).collect();
    let st = &gpu.stream;
    let (latent, k_pe, at) =
        (st.clone_htod(&latent).unwrap(), st.clone_htod(&k_pe).unwrap(), st.clone_htod(&[past as u32]).unwrap());
    let cache = PagedCache { table: table.as_view(), page, layer: 1 };
    k.append(&gpu, &s, n, &latent.as_view(), &k_pe.as_view(), &cache, &at.as_view()).unwrap();
    let idx: Vec<u32> = (0..(past + n) as u32).rev().collect();
    let idx_d = st.clone_htod(&idx).unwrap();
    let mut out: CudaSlice<f32> = st.alloc_zeros(idx.len() * w).unwrap();
    k.gather(&gpu, &s, &idx_d.as_view(), &cache, &mut out.as_view_mut()).unwrap();
    let out = st.clone_dtoh(&out).unwrap();
    let want: Vec<f32> = idx
        .iter()
        .flat_map(|&t| {
            if (t as usize) < past {
                old[t as usize * w..][..w].to_vec()
            } else {
                new[(t as usize - past) * w..][..w].to_vec()
            }
        })
        .collect();
    assert_eq!(
        out.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        want.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
}
