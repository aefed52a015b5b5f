//! The whole tuning path on a GPU, on a small shape: compile (both families on sm_90: wgmma for
//! sm_90a), gate, time, peers, DB.

use kdtree_jit::tune::db::TuningDb;
use kdtree_jit::tune::flush::FlushMode;
use kdtree_jit::tune::key::Shape;
use kdtree_jit::tune::prune::{Scope, prune};
use kdtree_jit::tune::search::SearchConfig;
use kdtree_jit::tune::session::{AtM, Session};
use kdtree_jit::w4a16::dense::{DenseFamily, DenseVariant, Layout};
use kdtree_jit::{Gpu, Variant};
use kdtree_quant::Dtype;

#[test]
#[ignore = "needs a GPU"]
fn tuning_a_small_shape_fills_the_db_with_correct_fast_variants() {
    let gpu = Gpu::open(0).unwrap();
    let mut session = Session::open(&gpu, FlushMode::Read).unwrap();
    assert!(session.copy_gbps > 100.0, "copy bandwidth {} GB/s", session.copy_gbps);
    // N not a multiple of the 64-column tile, M not a power of two.
    let shape = Shape { n: 1000, k: 2048 };
    let valid = DenseVariant::valid_on(gpu.arch);
    let work: Vec<AtM> = [1, 3, 16, 40]
        .into_iter()
        .map(|m| (m, prune(&valid, &Scope { m, shape, group_size: 32, dtype: Dtype::Bf16, sms: session.sms })))
        .collect();
    let mut all: Vec<DenseVariant> = work.iter().flat_map(|(_, vs)| vs.clone()).collect();
    all.sort_by_key(|v| v.name());
    all.dedup();
    if gpu.arch.capability() == 90 {
        assert!(all.iter().any(|v| v.layout() == Layout::Wgmma), "an H100/H200 tunes wgmma too");
    }
    let mut db = TuningDb::default();
    let kernels = session.compile(&all, &mut db, None, false, |_| {}).unwrap();
    assert!(db.compile_failures.is_empty(), "{:?}", db.compile_failures);
    assert_eq!(kernels.len(), all.len());

    let tuned = session
        .tune_shape((shape, 32, Dtype::Bf16), &work, &kernels, &SearchConfig::default(), || true, || {})
        .unwrap();
    assert_eq!(tuned.len(), 4);
    for t in tuned {
        let entry = t.entry.unwrap_or_else(|| panic!("M bucket {}: nothing correct: {:?}", t.key.m_bucket, t.rejected));
        assert!(t.rejected.is_empty(), "{:?}", t.rejected);
        assert!(entry.timing.median_us > 0.0 && entry.timing.p10_us <= entry.timing.p90_us);
        assert!(entry.peers.cublas_bf16.is_some());
        db.insert(entry);
    }
    let key = kdtree_jit::tune::key::ProblemKey::w4a16(2, shape, 32, Dtype::Bf16, gpu.arch);
    assert!(db.best_variant(&key, &session.env).is_some(), "M = 2 falls back to a tuned bucket");
}
