//! A whole tuning run ([`run::tune`]) on a fake device: the plan, compile failures, the DB saved as
//! it goes, the progress told, and a deadline that leaves problems unstarted. No GPU needed.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use kdtree_jit::tune::bench::Timing;
use kdtree_jit::tune::db::{CompileFailure, Entry, TuningDb};
use kdtree_jit::tune::env::Environment;
use kdtree_jit::tune::error::Result;
use kdtree_jit::tune::key::{KIMI_K2_EXPERTS, ProblemKey, Shape};
use kdtree_jit::tune::peers::Peers;
use kdtree_jit::tune::prune::{Scope, prune};
use kdtree_jit::tune::run::{self, Progress, TuneOutcome, TuneRequest, Tuner};
use kdtree_jit::tune::search::{Rejection, SearchConfig};
use kdtree_jit::tune::session::{AtM, Tuned};
use kdtree_jit::w4a16::dense::DenseVariant;
use kdtree_jit::{Arch, Cache, Variant};
use kdtree_quant::Dtype;

const UP: Shape = Shape { n: 4096, k: 7168 };
const DOWN: Shape = Shape { n: 7168, k: 2048 };

/// An H200 that compiles every variant but `refuse`, finds a winner for every problem but
/// `no_winner`, and at `overrun` takes until `deadline` has passed.
struct FakeDevice {
    env: Environment,
    refuse: String,
    no_winner: Option<(Shape, u32)>,
    overrun: Option<((Shape, u32), Instant)>,
    /// The shapes asked to tune, each with the M buckets it did.
    tuned: Vec<(Shape, Vec<u32>)>,
}

impl FakeDevice {
    fn new(refuse: &str) -> FakeDevice {
        FakeDevice {
            env: Environment::sample_h200(),
            refuse: refuse.into(),
            no_winner: None,
            overrun: None,
            tuned: Vec::new(),
        }
    }
}

impl Tuner for FakeDevice {
    type Variant = DenseVariant;
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
        variants: &[DenseVariant],
        db: &mut TuningDb,
        _: Option<&Cache>,
        _: bool,
        progress: &(dyn Fn(usize) + Sync),
    ) -> Result<HashMap<String, ()>> {
        let mut kernels = HashMap::new();
        for (i, v) in variants.iter().enumerate() {
            if v.name() == self.refuse {
                let (arch, nvrtc, templates) = (Arch(90), self.env.nvrtc, self.env.templates.clone());
                db.record_compile_failure(CompileFailure { variant: v.name(), arch, nvrtc, templates, log: "".into() });
            } else {
                kernels.insert(v.name(), ());
            }
            progress(i + 1);
        }
        Ok(kernels)
    }

    fn tune_shape(
        &mut self,
        (shape, group_size, dtype): (Shape, u32, Dtype),
        work: &[AtM],
        kernels: &HashMap<String, ()>,
        _: &SearchConfig,
        proceed: &mut dyn FnMut() -> bool,
        progress: &mut dyn FnMut(),
    ) -> Result<Vec<Tuned>> {
        let mut results = Vec::new();
        for (m, candidates) in work {
            if !proceed() {
                break;
            }
            let candidates: Vec<&DenseVariant> =
                candidates.iter().filter(|v| kernels.contains_key(&v.name())).collect();
            candidates.iter().for_each(|_| progress());
            if let Some((at, deadline)) = self.overrun
                && at == (shape, *m)
            {
                std::thread::sleep(deadline.saturating_duration_since(Instant::now()) + Duration::from_millis(1));
            }
            let key = ProblemKey::w4a16(*m, shape, group_size, dtype, Arch(90));
            let rejected = vec![Rejection { variant: candidates[0].name(), reason: "wrong result".into() }];
            let entry = (self.no_winner != Some((shape, *m))).then(|| entry(&key, &self.env, candidates[1]));
            results.push(Tuned { key, entry, rejected });
        }
        self.tuned.push((shape, results.iter().map(|t| t.key.m_bucket).collect()));
        Ok(results)
    }
}

fn entry(key: &ProblemKey, env: &Environment, winner: &DenseVariant) -> Entry {
    let t = |us| Timing { median_us: us, p10_us: us, p90_us: us, reps: 100 };
    Entry {
        key: key.clone(),
        env: env.clone(),
        variant: winner.name(),
        m: key.m_bucket,
        timing: t(7.5),
        error: 1e-3,
        peers: Peers { cublas_bf16: Some(t(20.0)), cublas_f16: None, copy_gbps: 4200.0 },
        bytes: 1 << 24,
        timed: 3,
        rejected: Vec::new(),
        tuned_at_unix: 1_796_000_000,
    }
}

fn request(deadline: Option<Instant>) -> TuneRequest {
    TuneRequest { deadline, ..TuneRequest::grid(&[UP, DOWN], &[1, 2, 16], 32, Dtype::Bf16) }
}

/// Runs `request` on `device` with a DB at `path`, returning the outcome and the progress told.
fn tune(device: &mut FakeDevice, db: &mut TuningDb, path: &Path, request: &TuneRequest) -> (TuneOutcome, Vec<String>) {
    let mut told = Vec::new();
    let outcome = run::tune(device, db, path, None, request, &mut |p| {
        told.push(match p {
            Progress::Compiling { done, total } => format!("compiling {done}/{total}"),
            Progress::Compiled { total, refused } => format!("compiled {total} refused {refused}"),
            Progress::Tuning { candidates } => format!("tuning {candidates}"),
            Progress::Gated => "gated".into(),
            Progress::Tuned(t) => format!("tuned {} M={} {}", t.key.shape(), t.key.m_bucket, t.entry.is_some()),
        })
    })
    .unwrap();
    (outcome, told)
}

/// A variant that the plan of [`request`] holds for every one of its problems.
fn everywhere() -> String {
    let valid = DenseVariant::valid_on(Arch(90));
    let kept =
        |&(shape, m): &(Shape, u32)| prune(&valid, &Scope { m, shape, group_size: 32, dtype: Dtype::Bf16, sms: 132 });
    let problems = request(None).problems;
    let first = kept(&problems[0]);
    let v = first.iter().find(|v| problems.iter().all(|p| kept(p).contains(v))).expect("a variant for every problem");
    v.name()
}

#[test]
fn a_run_tunes_every_problem_saves_the_db_and_reports_failures_refusals_and_stale_entries() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tuning.json");
    let mut db = TuningDb::default();
    let mut elsewhere = Environment::sample_h200();
    elsewhere.device = "NVIDIA H100".into();
    db.insert(entry(&ProblemKey::w4a16(4, UP, 32, Dtype::Bf16, Arch(90)), &elsewhere, &DenseVariant::all()[0]));
    let mut device = FakeDevice::new(&everywhere());
    device.no_winner = Some((DOWN, 2));

    let (outcome, told) = tune(&mut device, &mut db, &path, &request(None));

    let tuned: Vec<(Shape, u32)> = outcome.entries.iter().map(|e| (e.key.shape(), e.m)).collect();
    assert_eq!(tuned, [(UP, 1), (UP, 2), (UP, 16), (DOWN, 1), (DOWN, 16)]);
    let failed: Vec<(Shape, u32)> = outcome.failed.iter().map(|f| (f.key.shape(), f.key.m_bucket)).collect();
    assert_eq!(failed, [(DOWN, 2)]);
    assert_eq!(outcome.failed[0].rejected.len(), 1);
    assert!(outcome.skipped.is_empty());
    assert_eq!(outcome.refused, 1);
    assert_eq!(outcome.stale.len(), 1);
    assert_eq!(outcome.stale[0].differences, ["device was NVIDIA H100, is NVIDIA H200"]);

    let saved = TuningDb::open(&path).unwrap();
    assert_eq!(saved, db, "the DB on disk is the one in memory");
    assert_eq!(saved.entries.len(), 6, "five winners and the stale entry, kept");
    assert!(saved.compile_failure(&device.refuse, Arch(90), &Environment::sample_h200()).is_some());

    // Compiling from 0 to its total, then gating as many candidates as were announced (less the
    // refused variant, announced with the rest), then each problem.
    assert!(told[0].starts_with("compiling 0/"), "{told:?}");
    let compiled = told.iter().position(|t| t.starts_with("compiled ")).unwrap();
    assert!(told[compiled].ends_with(" refused 1"));
    let total = told[compiled].split(' ').nth(1).unwrap();
    assert_eq!(told[compiled - 1], format!("compiling {total}/{total}"));
    let announced: usize = told.iter().find_map(|t| t.strip_prefix("tuning ")).unwrap().parse().unwrap();
    let gated = told.iter().filter(|t| *t == "gated").count();
    assert_eq!(gated + 6, announced, "every problem's candidates but the refused one, six problems");
    let problems: Vec<&String> = told.iter().filter(|t| t.starts_with("tuned ")).collect();
    assert_eq!(problems.len(), 6);
    assert_eq!(problems[4], "tuned 7168x2048 M=2 false");
}

#[test]
fn a_deadline_passed_during_a_shape_ends_it_there_and_skips_the_shapes_after() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tuning.json");
    let mut db = TuningDb::default();
    let mut device = FakeDevice::new("none");
    let deadline = Instant::now() + Duration::from_millis(500);
    device.overrun = Some(((UP, 2), deadline));

    let (outcome, told) = tune(&mut device, &mut db, &path, &request(Some(deadline)));

    assert!(Instant::now() > deadline);
    let tuned: Vec<(Shape, u32)> = outcome.entries.iter().map(|e| (e.key.shape(), e.m)).collect();
    assert_eq!(tuned, [(UP, 1), (UP, 2)], "the problem started before the deadline is finished");
    assert_eq!(outcome.skipped, [(UP, 16), (DOWN, 1), (DOWN, 2), (DOWN, 16)]);
    assert_eq!(device.tuned, [(UP, vec![1, 2])], "the shape after the deadline is not even set up");
    assert_eq!(TuningDb::open(&path).unwrap().entries, outcome.entries, "what was measured is saved");
    assert_eq!(told.iter().filter(|t| t.starts_with("tuned ")).count(), 2);
}

#[test]
fn a_deadline_already_passed_compiles_nothing_and_skips_everything() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tuning.json");
    let mut db = TuningDb::default();
    let mut device = FakeDevice::new("none");

    let (outcome, told) = tune(&mut device, &mut db, &path, &request(Some(Instant::now())));

    assert!(outcome.entries.is_empty() && told.is_empty());
    assert_eq!(outcome.skipped, request(None).problems);
    assert!(device.tuned.is_empty());
    assert!(!path.exists(), "nothing to save, nothing written");
}

#[test]
fn the_expert_preset_is_the_first_two_shapes_of_kimi_k2_and_plans_them_at_every_bucket() {
    use kdtree_jit::tune::key::{KIMI_K2, M_BUCKETS};
    assert_eq!(KIMI_K2_EXPERTS.shapes, &KIMI_K2.shapes[..2]);
    assert_eq!(KIMI_K2_EXPERTS.shapes, [UP, DOWN]);
    let request = TuneRequest::preset(&KIMI_K2_EXPERTS);
    let expected: Vec<(Shape, u32)> = [UP, DOWN].iter().flat_map(|&s| M_BUCKETS.map(|m| (s, m))).collect();
    assert_eq!(request.problems, expected);
    assert_eq!((request.group_size, request.dtype, request.deadline), (32, Dtype::Bf16, None));
}
