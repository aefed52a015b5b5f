//! A whole grouped MoE tuning run on a GPU, on a small layer: compile, gate both products, time
//! the step, save the DB, find the result as the engine does. Run on a GPU machine:
//! `cargo test --release -p kdtree-jit --test tune_moe_gpu -- --ignored --nocapture`.

use kdtree_jit::tune::db::{Match, TuningDb};
use kdtree_jit::tune::flush::FlushMode;
use kdtree_jit::tune::key::{MoeShape, RoutingDist, Shape};
use kdtree_jit::tune::moe::best_grouped;
use kdtree_jit::tune::moe_gpu::MoeSession;
use kdtree_jit::tune::run::{self, TuneRequest};
use kdtree_jit::tune::session::Session;
use kdtree_jit::{Gpu, Target};
use kdtree_quant::Dtype;

#[test]
#[ignore = "needs a GPU"]
fn tuning_a_small_moe_layer_fills_the_db_with_correct_steps_for_each_routing() {
    let gpu = Gpu::open(0).unwrap();
    let mut session = Session::open(&gpu, FlushMode::Read).unwrap();
    // Hidden 544: down's N off the 64-column tile, gate-up's K off every stage's; T not a power of
    // two; more experts than distinct weights.
    let uniform = MoeShape {
        gate_up: Shape { n: 256, k: 544 },
        down: Shape { n: 544, k: 128 },
        experts: 12,
        top_k: 3,
        routing: RoutingDist::Uniform,
    };
    let skewed = MoeShape { routing: RoutingDist::Skewed, ..uniform };
    let request = TuneRequest::grid(&[uniform, skewed], &[1, 5, 32], 32, Dtype::Bf16);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tuning.json");
    let mut db = TuningDb::default();

    let outcome = run::tune(&mut MoeSession(&mut session), &mut db, &path, None, &request, &mut |_| {}).unwrap();

    assert_eq!(outcome.refused, 0);
    assert!(outcome.failed.is_empty(), "{:?}", outcome.failed);
    assert_eq!(outcome.entries.len(), 6);
    for e in &outcome.entries {
        assert!(e.rejected.is_empty(), "{}: {:?}", e.key, e.rejected);
        assert!(e.timing.median_us > 0.0 && e.timing.p10_us <= e.timing.p90_us, "{}", e.key);
        assert!(e.timed > 0 && e.peers.copy_gbps > 100.0);
    }
    let saved = TuningDb::open(&path).unwrap();
    assert_eq!(saved, db);
    let target = Target { arch: gpu.arch };
    let (_, matched) = best_grouped(&saved, &session.env, &target, &uniform, (32, Dtype::Bf16), 5).unwrap();
    assert_eq!(matched, Match::Exact, "T = 5 is bucket 8, tuned");
    let (_, matched) = best_grouped(&saved, &session.env, &target, &skewed, (32, Dtype::Bf16), 2).unwrap();
    assert!(matches!(matched, Match::NearestM { .. }), "T = 2 falls back to a tuned bucket");
}
