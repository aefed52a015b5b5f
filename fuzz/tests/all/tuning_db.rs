//! Tuning DB files edited at random, as JSON and as bytes: opening one either works or is an error,
//! and an opened DB answers lookups and saves again, never panicking.

use kdtree_fuzz::mutate::{byte_edits, cases, edited, edits};
use kdtree_jit::Arch;
use kdtree_jit::tune::bench::Timing;
use kdtree_jit::tune::db::{CompileFailure, Entry, TuningDb};
use kdtree_jit::tune::env::Environment;
use kdtree_jit::tune::key::{ProblemKey, Shape};
use kdtree_jit::tune::peers::Peers;
use kdtree_jit::tune::search::Rejection;
use kdtree_quant::Dtype;
use proptest::prelude::*;
use proptest::test_runner::{Config as Run, TestRunner};

fn key(m: u32) -> ProblemKey {
    ProblemKey::w4a16(m, Shape { n: 4096, k: 7168 }, 32, Dtype::Bf16, Arch(90))
}

fn db() -> TuningDb {
    let t = Timing { median_us: 7.5, p10_us: 7.3, p90_us: 7.9, reps: 100 };
    let mut db = TuningDb::default();
    for m in [1, 16] {
        db.insert(Entry {
            key: key(m),
            env: Environment::sample_h200(),
            variant: format!("w4a16_v{m}"),
            m,
            timing: t,
            error: 2.5e-3,
            peers: Peers { cublas_bf16: Some(t), cublas_f16: None, copy_gbps: 4226.0 },
            bytes: 15_597_568,
            timed: 12,
            rejected: vec![Rejection { variant: "w4a16_bad".into(), reason: "wrong result".into() }],
            tuned_at_unix: 1_796_000_000,
        });
    }
    db.record_compile_failure(CompileFailure {
        variant: "w4a16_huge".into(),
        arch: Arch(90),
        nvrtc: (13, 0),
        templates: Environment::sample_h200().templates,
        log: "too many resources".into(),
    });
    db
}

#[test]
fn edited_tuning_dbs_open_or_fail_and_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let (path, copy) = (dir.path().join("tuning.json"), dir.path().join("copy.json"));
    let original = serde_json::to_value(db()).unwrap();
    let strategy = (edits(), byte_edits(), prop::bool::weighted(0.2));
    TestRunner::new(Run { cases: cases(256), failure_persistence: None, ..Run::default() })
        .run(&strategy, |(edits, bytes, raw)| {
            let mut text = serde_json::to_vec_pretty(&edited(&original, &edits)).unwrap();
            if raw {
                bytes.iter().for_each(|b| b.apply(&mut text));
            }
            std::fs::write(&path, &text).unwrap();
            if let Ok(db) = TuningDb::open(&path) {
                for m in [1, 2, 16, 4096] {
                    let _ = db.lookup(&key(m), &Environment::sample_h200(), |_| true);
                }
                let _ = db.partition(&Environment::sample_h200());
                let _ = std::fs::remove_file(&copy);
                db.save(&copy).unwrap();
                prop_assert!(TuningDb::open(&copy).is_ok(), "a saved DB reads back");
            }
            Ok(())
        })
        .unwrap();
}
