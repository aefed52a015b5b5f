//! Tuning grouped MoE steps without a GPU: the key in the DB next to the GEMMs' (and DB files
//! written before it), the routing draws, a step's data, a whole run on a fake device, and the
//! engine's lookup.

use std::collections::HashMap;

use kdtree_jit::tune::bench::Timing;
use kdtree_jit::tune::db::{Entry, Match, TuningDb};
use kdtree_jit::tune::env::Environment;
use kdtree_jit::tune::error::Result;
use kdtree_jit::tune::key::{KIMI_K2_MOE, MoeShape, ProblemKey, RoutingDist, Shape, T_BUCKETS};
use kdtree_jit::tune::moe::{MoeLayer, best_grouped};
use kdtree_jit::tune::peers::Peers;
use kdtree_jit::tune::run::{self, Progress, TuneRequest, Tuner};
use kdtree_jit::tune::search::SearchConfig;
use kdtree_jit::tune::session::{AtM, Tuned};
use kdtree_jit::w4a16::grouped::{W4a16Grouped, align};
use kdtree_jit::{Arch, Cache, Target, Variant};
use kdtree_quant::Dtype;

const K2: MoeShape = KIMI_K2_MOE.layer;
const SM90: Target = Target { arch: Arch(90) };

fn skewed() -> MoeShape {
    MoeShape { routing: RoutingDist::Skewed, ..K2 }
}

fn entry(key: ProblemKey, variant: &W4a16Grouped) -> Entry {
    let t = Timing { median_us: 90.0, p10_us: 88.0, p90_us: 93.0, reps: 100 };
    Entry {
        m: key.m_bucket,
        key,
        env: Environment::sample_h200(),
        variant: variant.name(),
        timing: t,
        error: 3e-3,
        peers: Peers { cublas_bf16: None, cublas_f16: None, copy_gbps: 4200.0 },
        bytes: 1 << 28,
        timed: 14,
        rejected: Vec::new(),
        tuned_at_unix: 1_796_000_000,
    }
}

fn variant(bm: u32) -> W4a16Grouped {
    W4a16Grouped { bm, ..W4a16Grouped::default_for(Dtype::Bf16, 32, &SM90) }
}

#[test]
fn a_db_file_written_before_moe_keys_reads_unchanged_and_saves_byte_for_byte() {
    let old = include_str!("../data/tuning-before-moe.json");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tuning.json");
    std::fs::write(&path, old).unwrap();
    let db = TuningDb::open(&path).unwrap();
    assert_eq!(db.entries.len(), 2);
    assert!(db.entries.iter().all(|e| e.key.moe.is_none() && e.key.op == "w4a16"));
    let key = ProblemKey::w4a16(3, Shape { n: 4096, k: 7168 }, 32, Dtype::Bf16, Arch(90));
    assert_eq!(
        db.best_variant(&key, &Environment::sample_h200()).unwrap().variant,
        "w4a16_stream_bf16_g32_m4n64k128_w4_s4_sk1_f32acc"
    );
    db.save(&path).unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), old, "no field added to a GEMM's entry");
}

#[test]
fn an_moe_key_round_trips_and_names_its_routing() {
    let mut db = TuningDb::default();
    db.insert(entry(ProblemKey::moe(5, &skewed(), 32, Dtype::Bf16, Arch(90)), &variant(8)));
    let text = serde_json::to_string(&db).unwrap();
    assert!(text.contains(r#""routing":"skewed""#) && text.contains(r#""op":"w4a16_moe""#), "{text}");
    let back: TuningDb = serde_json::from_str(&text).unwrap();
    assert_eq!(back, db);
    let key = &back.entries[0].key;
    assert_eq!((key.m_bucket, key.moe_shape()), (8, Some(skewed())));
    assert_eq!(key.to_string(), "moe 4096x7168+7168x2048 E=384 top-8 skewed T=8");
    assert_eq!(ProblemKey::w4a16(5, K2.gate_up, 32, Dtype::Bf16, Arch(90)).to_string(), "4096x7168 M=8");
    // A saturated count (the engine's u32::MAX for a T past u32) is in the last bucket, not a panic.
    assert_eq!(ProblemKey::moe(u32::MAX, &K2, 32, Dtype::Bf16, Arch(90)).m_bucket, 1 << 31);
}

#[test]
fn routings_are_drawn_as_the_router_would_and_skew_piles_tokens_on_few_experts() {
    for routing in [RoutingDist::Uniform, RoutingDist::Skewed] {
        let layer = MoeShape { routing, ..K2 };
        let ids = layer.ids(256);
        assert_eq!(ids.len(), 256 * 8);
        assert_eq!(ids, layer.ids(256), "{routing}: deterministic");
        for token in ids.chunks_exact(8) {
            assert!(token.windows(2).all(|w| w[0] < w[1]) && token[7] < 384, "{routing}: {token:?}");
        }
    }
    assert_ne!(K2.ids(16), skewed().ids(16));
    let busiest = |ids: &[u32]| {
        let a = align(ids, 384, 1);
        let most = a.offsets.windows(2).map(|w| w[1] - w[0]).max().unwrap();
        (most, a.experts_touched)
    };
    let (uniform_most, uniform_touched) = busiest(&K2.ids(256));
    let (skewed_most, skewed_touched) = busiest(&skewed().ids(256));
    // Uniform: 2048 assignments over 384 experts, about 5 each; skewed: expert 0 in most tokens.
    assert!(uniform_most <= 16 && uniform_touched > 370, "{uniform_most} {uniform_touched}");
    assert!(skewed_most > 128 && skewed_touched < uniform_touched, "{skewed_most} {skewed_touched}");
}

#[test]
fn a_step_holds_both_references_each_scaled_to_one_and_bad_layers_are_errors() {
    let layer = MoeShape {
        gate_up: Shape { n: 128, k: 64 },
        down: Shape { n: 64, k: 64 },
        experts: 6,
        top_k: 2,
        routing: RoutingDist::Uniform,
    };
    let moe = MoeLayer::random(layer, 32, Dtype::Bf16).unwrap();
    let step = moe.step(5).unwrap();
    assert_eq!((step.tokens, step.sorted.len(), step.x.len(), step.act.len()), (5, 10, 5 * 64, 10 * 64));
    let (up, down) = step.reference.split_at(10 * 128);
    assert_eq!(down.len(), 10 * 64);
    for part in [up, down] {
        let max = part.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(max, 1.0);
    }
    assert!(step.scales.iter().all(|&s| s > 0.0));
    let bad = MoeLayer::random(MoeShape { down: Shape { n: 64, k: 32 }, ..layer }, 32, Dtype::Bf16);
    let err = bad.err().unwrap().to_string();
    assert!(err.contains("are not [2 x inter, hidden] and [hidden, inter]"), "{err}");
    let err = MoeLayer::random(layer, 48, Dtype::Bf16).err().unwrap().to_string();
    assert!(err.contains("not a multiple of the group size 48"), "{err}");
}

/// A device on which every grouped variant compiles and the smallest tile height wins.
struct FakeMoeDevice {
    env: Environment,
    /// The layers set up, each with the T it tuned.
    tuned: Vec<(MoeShape, Vec<u32>)>,
}

impl Tuner for FakeMoeDevice {
    type Variant = W4a16Grouped;
    type Kernel = ();

    fn env(&self) -> &Environment {
        &self.env
    }

    fn arch(&self) -> Arch {
        Arch(90)
    }

    fn sms(&self) -> u32 {
        132
    }

    fn compile(
        &self,
        variants: &[W4a16Grouped],
        _: &mut TuningDb,
        _: Option<&Cache>,
        _: bool,
        progress: &(dyn Fn(usize) + Sync),
    ) -> Result<HashMap<String, ()>> {
        progress(variants.len());
        Ok(variants.iter().map(|v| (v.name(), ())).collect())
    }

    fn tune_shape(
        &mut self,
        (layer, group_size, dtype): (MoeShape, u32, Dtype),
        work: &[AtM<W4a16Grouped>],
        _: &HashMap<String, ()>,
        _: &SearchConfig,
        proceed: &mut dyn FnMut() -> bool,
        progress: &mut dyn FnMut(),
    ) -> Result<Vec<Tuned>> {
        let mut results = Vec::new();
        for (t, candidates) in work {
            if !proceed() {
                break;
            }
            candidates.iter().for_each(|_| progress());
            let key = ProblemKey::moe(*t, &layer, group_size, dtype, Arch(90));
            let best = candidates.iter().min_by_key(|v| v.bm).unwrap();
            results.push(Tuned { entry: Some(entry(key.clone(), best)), key, rejected: Vec::new() });
        }
        self.tuned.push((layer, results.iter().map(|t| t.key.m_bucket).collect()));
        Ok(results)
    }
}

#[test]
fn a_moe_run_tunes_every_routing_at_every_t_and_the_engine_finds_the_results() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tuning.json");
    let mut db = TuningDb::default();
    let mut device = FakeMoeDevice { env: Environment::sample_h200(), tuned: Vec::new() };
    let request = TuneRequest::moe(&KIMI_K2_MOE, &[RoutingDist::Uniform, RoutingDist::Skewed]);
    let mut candidates = 0;
    let outcome = run::tune(&mut device, &mut db, &path, None, &request, &mut |p| {
        if let Progress::Tuning { candidates: c } = p {
            candidates = c;
        }
    })
    .unwrap();

    assert_eq!(candidates, 401, "the count `tune --help` states");
    assert_eq!(device.tuned, [(K2, T_BUCKETS.to_vec()), (skewed(), T_BUCKETS.to_vec())], "each layer set up once");
    assert_eq!(outcome.entries.len(), 18);
    assert!(outcome.failed.is_empty() && outcome.skipped.is_empty() && outcome.stale.is_empty());
    assert_eq!(TuningDb::open(&path).unwrap(), db);

    let find = |layer: &MoeShape, t| best_grouped(&db, &Environment::sample_h200(), &SM90, layer, (32, Dtype::Bf16), t);
    let (v, matched) = find(&K2, 3).unwrap();
    assert_eq!((v.bm, matched), (1, Match::Exact));
    assert_eq!(find(&K2, 1000).unwrap().1, Match::NearestM { bucket: 256 });
    assert!(find(&MoeShape { experts: 256, ..K2 }, 3).is_none(), "another layer");
}

#[test]
fn the_lookup_takes_the_nearest_fresh_bucket_of_its_routing_and_never_a_stale_or_unfit_entry() {
    let mut db = TuningDb::default();
    let key = |t, layer: &MoeShape| ProblemKey::moe(t, layer, 32, Dtype::Bf16, Arch(90));
    db.insert(entry(key(4, &K2), &variant(4)));
    db.insert(entry(key(64, &K2), &variant(16)));
    db.insert(entry(key(8, &skewed()), &variant(1)));
    // A GEMM of the gate-up shape is another problem.
    let gemm = ProblemKey::w4a16(8, K2.gate_up, 32, Dtype::Bf16, Arch(90));
    db.insert(Entry { variant: "w4a16_stream_bf16_g32_m4n64k128_w4_s4_sk1_f32acc".into(), ..entry(gemm, &variant(1)) });

    let find = |db: &TuningDb, env: &Environment, t| best_grouped(db, env, &SM90, &K2, (32, Dtype::Bf16), t);
    let env = Environment::sample_h200();
    assert_eq!(find(&db, &env, 8).map(|(v, m)| (v.bm, m)), Some((4, Match::NearestM { bucket: 4 })));
    assert_eq!(find(&db, &env, 32).map(|(v, m)| (v.bm, m)), Some((16, Match::NearestM { bucket: 64 })));
    assert_eq!(find(&db, &env, 64).map(|(v, m)| (v.bm, m)), Some((16, Match::Exact)));
    let skewed_hit = best_grouped(&db, &env, &SM90, &skewed(), (32, Dtype::Bf16), 8).unwrap();
    assert_eq!(skewed_hit.0.bm, 1);

    // Another driver: every entry stale, none used.
    let updated = Environment { driver: 13010, ..Environment::sample_h200() };
    assert!(find(&db, &updated, 8).is_none());
    // Another dtype's ask, and an entry whose variant does not parse, find nothing.
    assert!(best_grouped(&db, &env, &SM90, &K2, (32, Dtype::F16), 8).is_none());
    let mut broken = TuningDb::default();
    broken.insert(Entry { variant: "w4a16_grouped_gone".into(), ..entry(key(8, &K2), &variant(4)) });
    assert!(find(&broken, &env, 8).is_none());
}
