//! Without a GPU: how the backend is chosen at startup, and which W4A16 variant each weight shape
//! gets from a tuning DB (a hit, the nearest M bucket, a stale entry, a missing one).

use kdtree_engine::EngineError;
use kdtree_engine::cuda::{CudaBackend, Mode, Source, WeightShape, default_variant, plan};
use kdtree_engine::registry::{BackendKind, Selection, select};
use kdtree_jit::tune::bench::Timing;
use kdtree_jit::tune::db::{Entry, TuningDb};
use kdtree_jit::tune::env::Environment;
use kdtree_jit::tune::key::{ProblemKey, Shape};
use kdtree_jit::tune::peers::Peers;
use kdtree_jit::w4a16::dense::{DenseFamily, DenseVariant};
use kdtree_jit::w4a16::{Algo, W4a16};
use kdtree_jit::{Arch, Target, Variant};
use kdtree_quant::Dtype;

fn no_gpu() -> kdtree_engine::Result<&'static str> {
    Err(EngineError::Gpu(kdtree_jit::Error::NoDriver { reason: "libcuda.so.1 is missing".into() }))
}

#[test]
fn cpu_never_probes_the_gpu() {
    let selection = select(BackendKind::Cpu, || -> kdtree_engine::Result<&str> { panic!("probed") }).unwrap();
    assert!(matches!(selection, Selection::Cpu { note: None }));
}

#[test]
fn auto_takes_the_gpu_when_it_opens_and_falls_back_with_the_reason_otherwise() {
    assert!(matches!(select(BackendKind::Auto, || Ok("gpu")).unwrap(), Selection::Gpu("gpu")));
    let Selection::Cpu { note: Some(note) } = select(BackendKind::Auto, no_gpu).unwrap() else { panic!("not the CPU") };
    assert!(note.contains("running on the CPU") && note.contains("libcuda.so.1 is missing"), "{note}");
    assert_eq!(note.lines().count(), 1, "{note}");
}

#[test]
fn cuda_without_a_gpu_is_an_error_naming_what_is_missing() {
    let err = select(BackendKind::Cuda, no_gpu).unwrap_err();
    assert!(matches!(err, EngineError::BackendUnavailable { .. }), "{err:?}");
    assert!(err.to_string().contains("no CUDA driver found"), "{err}");
    // The flag is the CLI's to name (tests/cli.rs).
    assert!(!err.to_string().contains("--backend"), "{err}");
}

#[test]
fn opening_cuda_returns_a_backend_or_an_error_never_a_panic() {
    let options = crate::gpu_common::options();
    if let Err(e) = CudaBackend::open(&options) {
        let message = e.to_string();
        assert!(["CUDA driver", "GPU", "NVRTC"].iter().any(|what| message.contains(what)), "{message}");
    }
}

const ARCH: Arch = Arch(90);
const SHAPE: WeightShape = WeightShape { n: 4096, k: 7168, group_size: 32, dtype: Dtype::Bf16 };

/// The default variant with some axes changed: a variant named through the generated type.
fn variant(algo: Algo, bm: u32, split_k: u32) -> DenseVariant {
    let stages = if algo == Algo::Gemv { 1 } else { 4 };
    DenseVariant::Tiles(W4a16 { algo, bm, split_k, stages, ..default_variant(&SHAPE) })
}

fn entry(bucket: u32, v: &DenseVariant, env: &Environment) -> Entry {
    let timing = Timing { median_us: 10.0, p10_us: 9.0, p90_us: 11.0, reps: 100 };
    Entry {
        key: ProblemKey::w4a16(bucket, Shape { n: SHAPE.n as u32, k: SHAPE.k as u32 }, 32, Dtype::Bf16, ARCH),
        env: env.clone(),
        variant: v.name(),
        m: bucket,
        timing,
        error: 1e-3,
        peers: Peers { cublas_bf16: Some(timing), cublas_f16: None, copy_gbps: 4000.0 },
        bytes: 1 << 20,
        timed: 10,
        rejected: Vec::new(),
        tuned_at_unix: 0,
    }
}

fn db(entries: Vec<Entry>) -> TuningDb {
    TuningDb { entries, ..TuningDb::default() }
}

#[test]
fn exact_mode_takes_the_dbs_pick_for_the_asked_bucket_for_every_m() {
    let (gemv, mma16, mma64) = (variant(Algo::Gemv, 1, 4), variant(Algo::Mma, 16, 4), variant(Algo::Mma, 64, 1));
    let e = Environment::sample_h200();
    let db = db(vec![entry(1, &gemv, &e), entry(16, &mma16, &e), entry(64, &mma64, &e)]);
    let p = plan(&db, &e, ARCH, &SHAPE, Mode::Exact { m: 9 });
    assert_eq!(p.general.variant, mma16);
    assert_eq!(p.general.source, Source::Tuned { bucket: 16, nearest: false });
    assert!([1, 9, 33, 128, 4096].iter().all(|&m| *p.variant_for(m) == mma16), "one variant for all M");
    // M = 1 is tuned to a gemv variant of one row: it runs every M, a row per launch.
    let p = plan(&db, &e, ARCH, &SHAPE, Mode::Exact { m: 1 });
    assert_eq!(p.general.variant, gemv);
    assert_eq!(p.general.source, Source::Tuned { bucket: 1, nearest: false });
    assert!([1, 9, 128].iter().all(|&m| *p.variant_for(m) == gemv), "one variant for all M");
}

#[test]
fn a_stale_or_missing_entry_falls_back_to_the_default_with_the_reason() {
    let mut newer_driver = Environment::sample_h200();
    newer_driver.driver = 13010;
    let stale = db(vec![entry(16, &variant(Algo::Mma, 32, 4), &Environment::sample_h200())]);
    let p = plan(&stale, &newer_driver, ARCH, &SHAPE, Mode::Exact { m: 16 });
    assert_eq!(p.general.variant, DenseVariant::Tiles(default_variant(&SHAPE)));
    let Source::Default { reason } = &p.general.source else { panic!("{:?}", p.general.source) };
    assert!(reason.contains("stale") && reason.contains("driver was 13000, is 13010"), "{reason}");

    let other_shape = WeightShape { n: 7168, ..SHAPE };
    let p = plan(&stale, &Environment::sample_h200(), ARCH, &other_shape, Mode::Exact { m: 16 });
    assert_eq!(p.general.variant, DenseVariant::Tiles(default_variant(&other_shape)));
    assert_eq!(p.general.source, Source::Default { reason: "not in the tuning DB".into() });

    // Fast mode's variant beyond the buckets must serve every M in one launch: not a gemv.
    let gemv_only = db(vec![entry(128, &variant(Algo::Gemv, 1, 1), &Environment::sample_h200())]);
    let p = plan(&gemv_only, &Environment::sample_h200(), ARCH, &SHAPE, Mode::Fast);
    assert!(matches!(&p.general.source, Source::Default { reason } if reason.contains("every M")), "{p:?}");
}

#[test]
fn fast_mode_runs_each_buckets_pick_and_the_largest_buckets_beyond() {
    let (gemv, mma16, mma128) = (variant(Algo::Gemv, 1, 4), variant(Algo::Mma, 16, 4), variant(Algo::Mma, 64, 1));
    let e = Environment::sample_h200();
    let db = db(vec![entry(1, &gemv, &e), entry(16, &mma16, &e), entry(128, &mma128, &e)]);
    let p = plan(&db, &e, ARCH, &SHAPE, Mode::Fast);
    assert_eq!(*p.variant_for(1), gemv);
    assert_eq!(*p.variant_for(12), mma16);
    assert_eq!(*p.variant_for(100), mma128);
    assert_eq!(*p.variant_for(1000), mma128, "beyond the buckets: the largest bucket's pick");
    assert!(p.variants().contains(&gemv) && p.variants().len() == 3);
    // Bucket 2 has no entry; gemv m1 cannot run 2 rows, so its nearest usable pick is mma.
    assert!(matches!(p.variant_for(2), DenseVariant::Tiles(v) if v.algo == Algo::Mma), "{:?}", p.variant_for(2));
}

#[test]
fn a_wgmma_pick_serves_every_m_on_sm_90_and_is_passed_over_elsewhere() {
    let wgmma = DenseVariant::from_name("w4a16_wgmma_bf16_g32_m64n128k128_s4_sk2_f32acc").expect("a wgmma variant");
    let (e, gemv) = (Environment::sample_h200(), variant(Algo::Gemv, 1, 4));
    let db = db(vec![entry(1, &gemv, &e), entry(64, &wgmma, &e)]);
    // Exact mode at M = 64 runs it for every M (it has no row limit), from its sm_90a cubin.
    let p = plan(&db, &e, ARCH, &SHAPE, Mode::Exact { m: 64 });
    assert_eq!((p.general.variant, p.general.source.clone()), (wgmma, Source::Tuned { bucket: 64, nearest: false }));
    assert_eq!(wgmma.compile_arch(ARCH), Arch::SM_90A);
    // Fast mode mixes the families across M: the weight is then uploaded in both layouts.
    let fast = plan(&db, &e, ARCH, &SHAPE, Mode::Fast);
    assert_eq!((*fast.variant_for(1), *fast.variant_for(64)), (gemv, wgmma));
    // An sm_120 device has no wgmma: the entry is not usable there, and the nearest usable one is.
    let p = plan(&db, &e, Arch(120), &SHAPE, Mode::Exact { m: 64 });
    assert_ne!(p.general.variant, wgmma);
}

#[test]
fn a_db_read_from_disk_plans_like_the_one_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tuning.json");
    let in_memory = db(vec![entry(16, &variant(Algo::Mma, 32, 4), &Environment::sample_h200())]);
    in_memory.save(&path).unwrap();
    let read = TuningDb::open(&path).unwrap();
    let mode = Mode::Exact { m: 16 };
    assert_eq!(
        plan(&read, &Environment::sample_h200(), ARCH, &SHAPE, mode),
        plan(&in_memory, &Environment::sample_h200(), ARCH, &SHAPE, mode)
    );
    assert_eq!(plan(&read, &Environment::sample_h200(), ARCH, &SHAPE, mode).general.variant, variant(Algo::Mma, 32, 4));
}

#[test]
fn the_default_variant_is_valid_and_serves_any_m_for_every_group_dtype_and_arch() {
    for arch in [Arch(80), Arch(90), Arch(120)] {
        for dtype in Dtype::ALL {
            for group_size in [32, 64, 128] {
                let shape = WeightShape { n: 100, k: 3 * group_size, group_size, dtype };
                let v = default_variant(&shape);
                assert_eq!(v.check(&Target { arch }), Ok(()), "{} on {arch}", v.name());
                assert!([1, 7, 129, 5000].iter().all(|&m| v.supports(m, shape.n, shape.k)), "{}", v.name());
            }
        }
    }
}

#[test]
fn opening_the_backends_gives_the_cpu_when_asked_and_auto_says_why_it_fell_back() {
    let options = crate::gpu_common::options();
    let open = || CudaBackend::open(&options);
    assert!(matches!(select(BackendKind::Cpu, open).unwrap(), Selection::Cpu { note: None }));
    match select(BackendKind::Auto, open).unwrap() {
        Selection::Cpu { note: Some(note) } => assert_eq!(note.lines().count(), 1, "{note}"),
        Selection::Gpu(cuda) => assert!(cuda.plans().is_empty(), "nothing uploaded yet"),
        Selection::Cpu { note: None } => panic!("auto fell back without saying why"),
    }
}
