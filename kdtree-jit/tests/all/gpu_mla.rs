//! The MLA family on a GPU: every valid decode variant against the CPU reference on K2's dims (64
//! heads, latent 512, rope 64) and tiny ones, contexts off the tile edges, one row, a draft tree
//! (bits), a causal block and a full block, over shuffled pages; a tree row against the same row
//! decoded alone, bit for bit (batch invariance); absorb, unabsorb, append and gather against their
//! references, for a bf16 and an FP8 cache; an FP8 variant against its bf16 twin on the values its
//! cache holds, bit for bit; and a timing of K2's attention. Run on a GPU machine:
//! `cargo test --release -p kdtree-jit --test gpu_mla -- --ignored --nocapture --test-threads=1`.

use std::path::Path;

use cudarc::driver::CudaSlice;
use half::bf16;
use kdtree_jit::mla::reference::{Weights, absorb_query, attention, unabsorb_output};
use kdtree_jit::mla::widen::bf16_pages;
use kdtree_jit::mla::{
    AuxKernel, Companions, DeviceMask, MlaAux, MlaBuffers, MlaDecode, MlaKernel, MlaKv, MlaShape, NewMask, PagedCache,
    absorb_host, mla_host, unabsorb_host, upload_cache,
};
use kdtree_jit::{Cache, Gpu, Target, Variant, compile_all_for};
use kdtree_quant::sample::symmetric;

const K2: MlaShape = MlaShape { heads: 64, nope: 128, rope: 64, v: 128, latent: 512, scale: 0.1352 };

fn bits(values: &[f32]) -> Vec<u16> {
    values.iter().map(|&x| bf16::from_f32(x).to_bits()).collect()
}

fn widen(b: &[u16]) -> Vec<f32> {
    b.iter().map(|&x| bf16::from_bits(x).to_f32()).collect()
}

fn cache() -> Cache {
    Cache::open(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("cubin")).unwrap()
}

/// Every valid decode variant of the GPU, loaded.
fn kernels(gpu: &Gpu) -> Vec<MlaKernel> {
    load(gpu, &MlaDecode::valid(&Target { arch: gpu.arch }))
}

fn load(gpu: &Gpu, variants: &[MlaDecode]) -> Vec<MlaKernel> {
    compile_all_for(variants, |v| v.compile_arch(gpu.arch), Some(&cache()), |_| {})
        .into_iter()
        .map(|(v, c)| MlaKernel::load(gpu, v, &c.unwrap_or_else(|e| panic!("{}: {e}", v.name()))).unwrap())
        .collect()
}

struct Case {
    name: &'static str,
    shape: MlaShape,
    past: usize,
    n: usize,
    mask: NewMask,
    page: usize,
    /// The queries' range: larger values make peakier softmaxes.
    q_amp: f32,
}

fn cases() -> Vec<Case> {
    let tiny = MlaShape { heads: 3, nope: 16, rope: 16, v: 16, latent: 32, scale: 0.25 };
    let odd = MlaShape { heads: 20, nope: 32, rope: 32, v: 32, latent: 96, scale: 0.2 };
    let tree = NewMask::tree(&[None, Some(0), Some(0), Some(1), Some(3)]);
    let c = |name, shape, past, n, mask, page, q_amp| Case { name, shape, past, n, mask, page, q_amp };
    vec![
        c("tiny, one entry", tiny, 0, 1, NewMask::Causal, 16, 1.0),
        c("tiny, 37 + tree of 5", tiny, 37, 5, tree.clone(), 16, 2.0),
        c("20 heads, latent 96, 1000 + 64 causal", odd, 1000, 64, NewMask::Causal, 64, 1.0),
        c("K2, 1 + 1", K2, 1, 1, NewMask::Causal, 64, 1.0),
        c("K2, 37 + tree of 5", K2, 37, 5, tree.clone(), 64, 1.0),
        c("K2, 1000 + 64 causal", K2, 1000, 64, NewMask::Causal, 256, 1.0),
        c("K2, 1000 + 7 full", K2, 1000, 7, NewMask::Full, 64, 0.5),
        c("K2, 5000 + 1, peaky", K2, 4999, 1, NewMask::Causal, 128, 3.0),
        c("K2, 4999 + tree of 5", K2, 4999, 5, tree, 64, 1.0),
    ]
}

/// The worst error of `got` against `want`, over the bound: each (row, head)'s outputs are a convex
/// combination of the entries' latent values, and the kernel and the reference round the same P to
/// bf16: they part only where a score's last f32 bits move a weight across a rounding boundary, by
/// one bf16 step (2^-8 relative), so the error is at most about 2^-8 of the largest latent value.
/// The bound, 1e-2 of the largest latent magnitude, leaves a factor 2.5 over that.
fn worst(got: &[f32], want: &[f32], kv_max: f32) -> f32 {
    assert_eq!(got.len(), want.len());
    got.iter().zip(want).map(|(g, w)| if g.is_finite() { (g - w).abs() } else { f32::INFINITY }).fold(0.0, f32::max)
        / (1e-2 * kv_max)
}

#[test]
#[ignore = "needs a GPU"]
fn every_valid_variant_matches_the_reference() {
    let gpu = Gpu::open(0).unwrap();
    let kernels = kernels(&gpu);
    eprintln!("{} variants on {}", kernels.len(), gpu.arch);
    let mut failures = Vec::new();
    for (ci, case) in cases().iter().enumerate() {
        let s = &case.shape;
        let w = s.width();
        let q = bits(&symmetric(case.n * s.heads * w, 10 + ci as u64, case.q_amp));
        let entries = symmetric((case.past + case.n) * w, 100 + ci as u64, 1.0);
        // Per cache kind: its words, and the reference over the values they hold.
        let inputs = [MlaKv::Bf16, MlaKv::Fp8].map(|kv| {
            let (words, values) = kv.encode(&entries, s);
            (words, attention(&widen(&q), &values, case.past, &case.mask, s, Weights::Bf16))
        });
        let mut worst_case: (f32, String) = (0.0, String::new());
        for k in &kernels {
            let (kv, want) = &inputs[k.variant().kv as usize];
            let got = mla_host(&gpu, k, s, &q, kv, case.past, &case.mask, case.page).unwrap();
            let e = worst(&got, want, 1.0);
            if e > worst_case.0 {
                worst_case = (e, k.variant().name());
            }
            if e > 1.0 {
                failures.push(format!("{}: {}: error {e:.2} of the bound", case.name, k.variant().name()));
            }
        }
        eprintln!("{}: worst {:.3} of the bound ({})", case.name, worst_case.0, worst_case.1);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
#[ignore = "needs a GPU"]
fn a_tree_row_equals_the_same_row_decoded_alone_bit_for_bit() {
    let gpu = Gpu::open(0).unwrap();
    let s = K2;
    let w = s.width();
    // Committed 1000 entries, then a tree: 0 -> {1, 2}, 1 -> 3, 3 -> 4, 2 -> 5.
    let parents = [None, Some(0), Some(0), Some(1), Some(3), Some(2)];
    let (past, n) = (1000, parents.len());
    let q = bits(&symmetric(n * s.heads * w, 1, 1.0));
    let entries = symmetric((past + n) * w, 2, 1.0);
    let mask = NewMask::tree(&parents);
    let causal_q = bits(&symmetric(64 * s.heads * w, 3, 1.0));
    let causal_entries = symmetric((past + 64) * w, 4, 1.0);
    let mut failures = Vec::new();
    for k in &kernels(&gpu) {
        let name = k.variant().name();
        // Entries are quantized one by one: a slice of the words is the words of the slice.
        let (kv, causal_kv) = (k.variant().kv.encode(&entries, &s).0, k.variant().kv.encode(&causal_entries, &s).0);
        let w = k.variant().kv.entry_words(&s);
        let tree = mla_host(&gpu, k, &s, &q, &kv, past, &mask, 64).unwrap();
        for (i, _) in parents.iter().enumerate() {
            // Row i alone: its path's entries appended to the committed ones, decoded as one new row.
            let mut path = Vec::new();
            let mut at = Some(i);
            while let Some(j) = at {
                path.push(j);
                at = parents[j];
            }
            path.reverse();
            let mut alone_kv = kv[..past * w].to_vec();
            for &j in &path {
                alone_kv.extend_from_slice(&kv[(past + j) * w..][..w]);
            }
            let alone_past = past + path.len() - 1;
            let row_q = &q[i * s.heads * s.width()..][..s.heads * s.width()];
            // Other page sizes: the layout must not matter either.
            let alone = mla_host(&gpu, k, &s, row_q, &alone_kv, alone_past, &NewMask::Causal, 16).unwrap();
            let row = &tree[i * s.heads * s.latent..][..s.heads * s.latent];
            if alone.iter().zip(row).any(|(a, b)| a.to_bits() != b.to_bits()) {
                failures.push(format!("{name}: tree row {i} differs from the row alone"));
            }
        }
        // A causal block of 64 rows against its first 10 rows run by themselves, and row 37 alone.
        let all = mla_host(&gpu, k, &s, &causal_q, &causal_kv, past, &NewMask::Causal, 64).unwrap();
        let first = mla_host(
            &gpu,
            k,
            &s,
            &causal_q[..10 * s.heads * s.width()],
            &causal_kv[..(past + 10) * w],
            past,
            &NewMask::Causal,
            256,
        )
        .unwrap();
        if first.iter().zip(&all).any(|(a, b)| a.to_bits() != b.to_bits()) {
            failures.push(format!("{name}: a causal block's first 10 rows depend on the block's size"));
        }
        let r = 37;
        let one = mla_host(
            &gpu,
            k,
            &s,
            &causal_q[r * s.heads * s.width()..][..s.heads * s.width()],
            &causal_kv[..(past + r + 1) * w],
            past + r,
            &NewMask::Causal,
            32,
        )
        .unwrap();
        if one.iter().zip(&all[r * s.heads * s.latent..]).any(|(a, b)| a.to_bits() != b.to_bits()) {
            failures.push(format!("{name}: causal row {r} differs from the row alone"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn aux(gpu: &Gpu, kv: MlaKv) -> AuxKernel {
    AuxKernel::compile(gpu, MlaAux { kv, ..MlaAux::default_for(&Target { arch: gpu.arch }) }, Some(&cache())).unwrap()
}

#[test]
#[ignore = "needs a GPU"]
fn absorb_and_unabsorb_match_their_references() {
    let gpu = Gpu::open(0).unwrap();
    let k = aux(&gpu, MlaKv::Bf16);
    let tiny = MlaShape { heads: 3, nope: 16, rope: 16, v: 24, latent: 32, scale: 1.0 };
    for s in [K2, tiny] {
        let kv_b = bits(&symmetric(s.heads * (s.nope + s.v) * s.latent, 7, 0.1));
        let kv_b_f = widen(&kv_b);
        for n in [1, 5, 37] {
            let q = symmetric(n * s.heads * (s.nope + s.rope), 8 + n as u64, 2.0);
            // Absorb sums in the reference's order with the same roundings: equal bits.
            let want = bits(&absorb_query(&q, &kv_b_f, &s));
            assert_eq!(absorb_host(&gpu, &k, &s, &q, &kv_b).unwrap(), want, "absorb, n = {n}");
            // Unabsorb sums in another fixed order: within f32 rounding of the sum of magnitudes
            // (latent 512 products, a few ulps of their absolute sum), and a row's bits do not
            // depend on n.
            let o_lat = symmetric(n * s.heads * s.latent, 9, 1.0);
            let want = unabsorb_output(&o_lat, &kv_b_f, &s);
            let got = unabsorb_host(&gpu, &k, &s, &o_lat, &kv_b).unwrap();
            let bound = 1e-5 * s.latent as f32 * 0.1;
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() <= bound, "unabsorb, n = {n}: {g} vs {w}");
            }
            // A block runs only the rows it holds: the first row (a full block at n = 37) and the
            // last (a partial one) each equal the row alone.
            for r in [0, n - 1] {
                let row = &o_lat[r * s.heads * s.latent..(r + 1) * s.heads * s.latent];
                let one = unabsorb_host(&gpu, &k, &s, row, &kv_b).unwrap();
                assert_eq!(one, got[r * s.heads * s.v..(r + 1) * s.heads * s.v], "unabsorb's row {r} alone, n = {n}");
            }
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn append_then_gather_round_trips_through_shuffled_pages() {
    let gpu = Gpu::open(0).unwrap();
    let st = &gpu.stream;
    let shapes = [K2, MlaShape { heads: 2, nope: 16, rope: 16, v: 16, latent: 32, scale: 1.0 }];
    for (s, kv) in shapes.into_iter().flat_map(|s| [(s, MlaKv::Bf16), (s, MlaKv::Fp8)]) {
        let k = aux(&gpu, kv);
        let w = s.width();
        let (past, n, page) = (70, 9, 16);
        let (old, old_values) = kv.encode(&symmetric((past + n) * w, 11, 1.0), &s);
        let (_pool, table) = upload_cache(&gpu, &old, kv.entry_words(&s), page, 2, 1).unwrap();
        // Groups of every range, down to e4m3's subnormals, and values beyond bf16's precision.
        let latent: Vec<f32> = symmetric(n * s.latent, 12, 3.0)
            .iter()
            .enumerate()
            .map(|(i, x)| x * 2f32.powi((i / 32 % 7) as i32 * 5 - 20))
            .collect();
        let k_pe = symmetric(n * s.rope, 13, 3.0);
        let (ld, kd, pd) =
            (st.clone_htod(&latent).unwrap(), st.clone_htod(&k_pe).unwrap(), st.clone_htod(&[past as u32]).unwrap());
        let cache = PagedCache { table: table.as_view(), page, layer: 1 };
        k.append(&gpu, &s, n, &ld.as_view(), &kd.as_view(), &cache, &pd.as_view()).unwrap();
        let idx: Vec<u32> = (0..(past + n) as u32).rev().collect();
        let idx_d = st.clone_htod(&idx).unwrap();
        let mut out = st.alloc_zeros::<f32>(idx.len() * w).unwrap();
        k.gather(&gpu, &s, &idx_d.as_view(), &cache, &mut out.as_view_mut()).unwrap();
        let out = st.clone_dtoh(&out).unwrap();
        for (i, &t) in idx.iter().enumerate() {
            let t = t as usize;
            let want: Vec<f32> = if t < past {
                old_values[t * w..][..w].to_vec()
            } else {
                let j = t - past;
                let entry = [&latent[j * s.latent..][..s.latent], &k_pe[j * s.rope..][..s.rope]].concat();
                kv.encode(&entry, &s).1
            };
            let got: Vec<u32> = out[i * w..][..w].iter().map(|x| x.to_bits()).collect();
            assert_eq!(got, want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), "{kv:?}: entry {t}");
        }
        // Widening the layer gives those values as bf16 pages (here in order); a bf16 cache has
        // nothing to widen.
        let (wide, wide_table) = bf16_pages(&gpu, past + n, page, w).unwrap();
        let widened = k.widen(&gpu, &s, n, &cache, &pd.as_view(), &wide_table.as_view());
        if kv == MlaKv::Bf16 {
            assert!(widened.is_err());
            continue;
        }
        widened.unwrap();
        let wide = st.clone_dtoh(&wide).unwrap();
        for (i, &t) in idx.iter().enumerate() {
            let t = t as usize;
            assert_eq!(wide[t * w..][..w], bits(&out[i * w..][..w]), "widened entry {t}");
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn unsupported_shapes_are_errors_not_panics() {
    let gpu = Gpu::open(0).unwrap();
    let k = MlaKernel::compile(&gpu, MlaDecode::default_for(&Target { arch: gpu.arch }), Some(&cache())).unwrap();
    let bad = MlaShape { heads: 2, nope: 16, rope: 8, v: 16, latent: 48, scale: 1.0 };
    let q = vec![0u16; bad.heads * bad.width()];
    let kv = vec![0u16; bad.width()];
    let e = mla_host(&gpu, &k, &bad, &q, &kv, 0, &NewMask::Causal, 16).unwrap_err();
    assert!(e.to_string().contains("latent 48"), "{e}");
}

/// K2's attention at T = 1 and 64 rows over 4096 and 32768 entries: every valid variant, the median
/// of 30 event-timed launches each after an L2 flush (read), and the bytes of the latent cache read
/// once (L x 576 x 2) over that time.
#[test]
#[ignore = "needs a GPU"]
fn a_workspace_of_few_rows_runs_the_rows_in_slices_with_the_same_bits() {
    let gpu = Gpu::open(0).unwrap();
    let s = K2;
    let w = s.width();
    let (past, n) = (300, 40);
    let entries = symmetric((past + n) * w, 31, 1.0);
    let caches = [MlaKv::Bf16, MlaKv::Fp8]
        .map(|kv| upload_cache(&gpu, &kv.encode(&entries, &s).0, kv.entry_words(&s), 64, 1, 0).unwrap());
    let st = &gpu.stream;
    let q = st.clone_htod(&bits(&symmetric(n * s.heads * w, 32, 1.0))).unwrap();
    let past_d = st.clone_htod(&[past as u32]).unwrap();
    for k in &kernels(&gpu) {
        let table = &caches[k.variant().kv as usize].1;
        let run = |rows: usize| {
            let mut workspace = st.alloc_zeros::<f32>(k.variant().workspace_len(rows, s.heads, s.latent)).unwrap();
            let mut o_lat = st.alloc_zeros::<f32>(n * s.heads * s.latent).unwrap();
            let b = MlaBuffers {
                q: q.as_view(),
                cache: PagedCache { table: table.as_view(), page: 64, layer: 0 },
                past: past_d.as_view(),
                mask: DeviceMask::Causal,
                workspace: workspace.as_view_mut(),
                o_lat: o_lat.as_view_mut(),
            };
            k.launch(&gpu, &s, n, b).unwrap();
            st.clone_dtoh(&o_lat).unwrap()
        };
        let whole = run(n);
        // 40 rows in slices of 3: the last slice has one row.
        let sliced = run(3);
        let name = k.variant().name();
        assert!(whole.iter().zip(&sliced).all(|(a, b)| a.to_bits() == b.to_bits()), "{name}");
    }
}

/// What a benchmark times with: an L2 flush over every SM, and CUDA events on the GPU's stream.
fn bench_tools(gpu: &Gpu) -> (kdtree_jit::tune::flush::Flusher, kdtree_jit::tune::clock::CudaClock) {
    use cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
    use kdtree_jit::tune::flush::{FlushMode, Flusher};
    let sms = gpu.ctx.attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).unwrap() as u32;
    (Flusher::new(gpu, FlushMode::Read, sms).unwrap(), kdtree_jit::tune::clock::CudaClock::new(gpu.stream.clone()))
}

/// Where widening a layer once pays: the FP8 default variant against widening the layer to bf16
/// and running its bf16 twin (the engine's path for many rows), by rows, at K2's sizes.
#[test]
#[ignore = "needs a GPU (sm_89 or later: e4m3); a benchmark"]
fn bench_fp8_widening_against_the_fp8_variant() {
    use kdtree_jit::tune::bench::{BenchConfig, measure};
    let gpu = Gpu::open(0).unwrap();
    let (s, st, page) = (K2, &gpu.stream, 64);
    let w = s.width();
    let (mut flusher, mut clock) = bench_tools(&gpu);
    let fp8 = MlaDecode::default_for_kv(&Target { arch: gpu.arch }, MlaKv::Fp8);
    let [fp8_k, twin_k]: [MlaKernel; 2] =
        load(&gpu, &[fp8, MlaDecode { kv: MlaKv::Bf16, ..fp8 }]).try_into().ok().unwrap();
    let aux = aux(&gpu, MlaKv::Fp8);
    let cfg = BenchConfig { warmup: 3, reps: 20, batch: 5, give_up: 3.0 };
    for ctx in [32768usize, 131072] {
        let words = MlaKv::Fp8.encode(&symmetric(ctx * w, 21, 1.0), &s).0;
        let (_pool, table) = upload_cache(&gpu, &words, MlaKv::Fp8.entry_words(&s), page, 1, 0).unwrap();
        let cache = PagedCache { table: table.as_view(), page, layer: 0 };
        let (_wide, wide_table) = bf16_pages(&gpu, ctx, page, w).unwrap();
        let mut time = |run: &mut dyn FnMut() -> Result<(), kdtree_jit::tune::error::TuneError>| {
            measure(&mut clock, &cfg, None, || flusher.flush(st), run).unwrap().median_us
        };
        for n in [1usize, 2, 4, 8, 16, 32, 64] {
            let q = st.clone_htod(&bits(&symmetric(n * s.heads * w, 22, 1.0))).unwrap();
            let past = st.clone_htod(&[(ctx - n) as u32]).unwrap();
            let widen = time(&mut || Ok(aux.widen(&gpu, &s, n, &cache, &past.as_view(), &wide_table.as_view())?));
            let mut workspace = st.alloc_zeros::<f32>(fp8.workspace_len(n, s.heads, s.latent)).unwrap();
            let mut o_lat = st.alloc_zeros::<f32>(n * s.heads * s.latent).unwrap();
            let mut over = |k: &MlaKernel, table: &CudaSlice<u64>| {
                time(&mut || {
                    let b = MlaBuffers {
                        q: q.as_view(),
                        cache: PagedCache { table: table.as_view(), page, layer: 0 },
                        past: past.as_view(),
                        mask: DeviceMask::Causal,
                        workspace: workspace.as_view_mut(),
                        o_lat: o_lat.as_view_mut(),
                    };
                    Ok(k.launch(&gpu, &s, n, b)?)
                })
            };
            let (narrow, twin) = (over(&fp8_k, &table), over(&twin_k, &wide_table));
            eprintln!(
                "FP8 L={ctx} T={n}: {} {narrow:.1} us; widen {widen:.1} + {} {twin:.1} = {:.1} us ({:.2}x)",
                fp8.name(),
                twin_k.variant().name(),
                widen + twin,
                narrow / (widen + twin)
            );
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn bench_k2_attention() {
    use kdtree_jit::tune::bench::{BenchConfig, measure};
    let gpu = Gpu::open(0).unwrap();
    let s = K2;
    let w = s.width();
    let (mut flusher, mut clock) = bench_tools(&gpu);
    let kernels = kernels(&gpu);
    let st = &gpu.stream;
    let cfg = BenchConfig { warmup: 3, reps: 30, batch: 10, give_up: 3.0 };
    for ctx in [32768usize, 131072, 4096] {
        for n in [1usize, 64] {
            let past = ctx - n;
            let entries = symmetric(ctx * w, 21, 1.0);
            let caches = [MlaKv::Bf16, MlaKv::Fp8]
                .map(|kv| upload_cache(&gpu, &kv.encode(&entries, &s).0, kv.entry_words(&s), 64, 1, 0).unwrap());
            let q = st.clone_htod(&bits(&symmetric(n * s.heads * w, 22, 1.0))).unwrap();
            let past_d = st.clone_htod(&[past as u32]).unwrap();
            let most = kernels.iter().map(|k| k.variant().workspace_len(n, s.heads, s.latent)).max().unwrap();
            let mut workspace = st.alloc_zeros::<f32>(most).unwrap();
            let mut o_lat = st.alloc_zeros::<f32>(n * s.heads * s.latent).unwrap();
            let mut rows = Vec::new();
            let mut best: Option<f64> = None;
            for k in &kernels {
                let table = &caches[k.variant().kv as usize].1;
                let mut run = || {
                    let b = MlaBuffers {
                        q: q.as_view(),
                        cache: PagedCache { table: table.as_view(), page: 64, layer: 0 },
                        past: past_d.as_view(),
                        mask: DeviceMask::Causal,
                        workspace: workspace.as_view_mut(),
                        o_lat: o_lat.as_view_mut(),
                    };
                    k.launch(&gpu, &s, n, b).map_err(Into::into)
                };
                let t = measure(&mut clock, &cfg, best, || flusher.flush(st), &mut run).unwrap();
                best = Some(best.map_or(t.median_us, |b: f64| b.min(t.median_us)));
                rows.push((t.median_us, k.variant().name(), k.variant().kv));
            }
            rows.sort_by(|a, b| a.0.total_cmp(&b.0));
            // Per cache kind: the bytes its entries take, read once.
            for kv in [MlaKv::Bf16, MlaKv::Fp8] {
                let rows: Vec<&(f64, String, MlaKv)> = rows.iter().filter(|r| r.2 == kv).collect();
                let Some(best) = rows.first() else { continue };
                let gbps = |us: f64| (ctx * kv.entry_bytes(&s)) as f64 / us / 1e3;
                let default = MlaDecode::default_for_kv(&Target { arch: gpu.arch }, kv).name();
                let of_default = rows.iter().find(|r| r.1 == default).map_or(f64::NAN, |r| r.0);
                let next: Vec<(f64, &str)> = rows[1..4.min(rows.len())].iter().map(|r| (r.0, r.1.as_str())).collect();
                eprintln!(
                    "K2 T={n} L={ctx} {} cache: best {} {:.1} us ({:.0} GB/s); default {default} {of_default:.1} us ({:.0} GB/s); next {next:?}",
                    kv.name(),
                    best.1,
                    best.0,
                    gbps(best.0),
                    gbps(of_default),
                );
            }
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn the_tuner_picks_a_gated_variant_and_the_db_gives_it_back() {
    use kdtree_jit::tune::db::TuningDb;
    use kdtree_jit::tune::flush::FlushMode;
    use kdtree_jit::tune::mla::{tune_mla, tuned_variant};
    use kdtree_jit::tune::session::Session;
    let gpu = Gpu::open(0).unwrap();
    let mut session = Session::open(&gpu, FlushMode::Read).unwrap();
    let mut db = TuningDb::default();
    for kv in [MlaKv::Bf16, MlaKv::Fp8] {
        let mut calls = 0;
        let tuned =
            tune_mla(&mut session, &mut db, Some(&cache()), &K2, kv, &[1, 8], &[2048], &mut |_, _| calls += 1).unwrap();
        eprintln!("{}", serde_json::to_string_pretty(&tuned).unwrap());
        assert!(tuned.rejected.is_empty(), "{:?}", tuned.rejected);
        assert_eq!(tuned.points.len(), 2);
        assert!(tuned.mean_slowdown >= 1.0);
        assert!(calls > 0);
        let chosen = tuned_variant(&db, &session.env, gpu.arch, &K2, kv).expect("saved");
        assert_eq!((chosen.name(), chosen.kv), (tuned.variant, kv));
        assert!(MlaDecode::valid_on(gpu.arch).contains(&chosen));
    }
}

/// An FP8 variant widens its tiles to exactly the bf16 values its entries hold, then runs its bf16
/// twin's arithmetic: on a bf16 cache of those values the twin gives the same bits, row for row, for
/// a tree and a causal block, at K2's sizes. (FP8 stages take less shared memory than bf16 ones:
/// an FP8 point whose twin does not fit the arch is left out.)
#[test]
#[ignore = "needs a GPU (sm_89 or later: e4m3)"]
fn an_fp8_variant_computes_what_its_bf16_twin_computes_on_the_values_it_holds() {
    let gpu = Gpu::open(0).unwrap();
    let target = Target { arch: gpu.arch };
    let twin_of = |v: &MlaDecode| MlaDecode { kv: MlaKv::Bf16, ..*v };
    let fp8: Vec<MlaDecode> = MlaDecode::valid(&target)
        .into_iter()
        .filter(|v| v.kv == MlaKv::Fp8 && twin_of(v).check(&target).is_ok())
        .collect();
    assert!(fp8.len() >= 60, "{} FP8 points with a twin", fp8.len());
    let twins: Vec<MlaDecode> = fp8.iter().map(twin_of).collect();
    let (fp8, twins) = (load(&gpu, &fp8), load(&gpu, &twins));
    let s = K2;
    let tree = NewMask::tree(&[None, Some(0), Some(0), Some(1), Some(3)]);
    let mut failures = Vec::new();
    for (past, n, mask) in [(4999, 5, tree), (1000, 64, NewMask::Causal), (70, 1, NewMask::Causal)] {
        let q = bits(&symmetric(n * s.heads * s.width(), 41, 1.0));
        let (words, values) = MlaKv::Fp8.encode(&symmetric((past + n) * s.width(), 42, 1.0), &s);
        let held = bits(&values);
        assert_eq!(widen(&held), values, "the values an FP8 cache holds are bf16 values");
        for (k, twin) in fp8.iter().zip(&twins) {
            let (name, twin_name) = (k.variant().name(), twin.variant().name());
            let got = mla_host(&gpu, k, &s, &q, &words, past, &mask, 64).unwrap_or_else(|e| panic!("{name}: {e}"));
            let want = mla_host(&gpu, twin, &s, &q, &held, past, &mask, 64)
                .unwrap_or_else(|e| panic!("{twin_name} after {name}: {e}"));
            if got.iter().zip(&want).any(|(a, b)| a.to_bits() != b.to_bits()) {
                failures.push(format!("{name} vs {twin_name}: {past} + {n}"));
            }
        }
    }
    eprintln!("{} FP8 variants against their bf16 twins, 3 cases each", fp8.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
