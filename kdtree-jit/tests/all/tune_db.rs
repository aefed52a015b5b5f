//! The tuning DB without a GPU: staleness, the nearest-M fallback, compile failures, the JSON
//! round trip and corrupt files.

use kdtree_jit::Arch;
use kdtree_jit::tune::bench::Timing;
use kdtree_jit::tune::db::{CompileFailure, Entry, Match, TuningDb};
use kdtree_jit::tune::env::Environment;
use kdtree_jit::tune::error::TuneError;
use kdtree_jit::tune::key::{ProblemKey, Shape};
use kdtree_jit::tune::peers::Peers;
use kdtree_jit::tune::search::Rejection;
use kdtree_quant::Dtype;

const SHAPE: Shape = Shape { n: 4096, k: 7168 };

fn key(m: u32) -> ProblemKey {
    ProblemKey::w4a16(m, SHAPE, 32, Dtype::Bf16, Arch(90))
}

fn entry(key: ProblemKey, env: Environment, variant: &str) -> Entry {
    let t = |us| Timing { median_us: us, p10_us: us * 0.98, p90_us: us * 1.03, reps: 100 };
    Entry {
        m: key.m_bucket,
        key,
        env,
        variant: variant.into(),
        timing: t(7.5),
        error: 2.5e-3,
        peers: Peers { cublas_bf16: Some(t(27.0)), cublas_f16: None, copy_gbps: 4226.0 },
        bytes: 15_597_568,
        timed: 12,
        rejected: vec![Rejection { variant: "w4a16_bad".into(), reason: "wrong result".into() }],
        tuned_at_unix: 1_796_000_000,
    }
}

fn db_with(entries: impl IntoIterator<Item = Entry>) -> TuningDb {
    let mut db = TuningDb::default();
    entries.into_iter().for_each(|e| db.insert(e));
    db
}

#[test]
fn an_entry_from_another_environment_is_never_used_and_is_reported_stale() {
    type Change = fn(&mut Environment);
    let changes: [(&str, Change); 5] = [
        ("device", |e| e.device = "NVIDIA H100 80GB HBM3".into()),
        ("compute capability", |e| e.compute_capability = (12, 0)),
        ("driver", |e| e.driver = 12080),
        ("NVRTC", |e| e.nvrtc = (13, 1)),
        ("templates hash", |e| e.templates.replace_range(60.., "cd")),
    ];
    for (field, change) in changes {
        let mut other = Environment::sample_h200();
        change(&mut other);
        let db = db_with([entry(key(16), other, "w4a16_old")]);
        assert!(db.best_variant(&key(16), &Environment::sample_h200()).is_none(), "{field}: a stale entry was used");
        let lookup = db.lookup(&key(16), &Environment::sample_h200(), |_| true);
        assert!(lookup.hit.is_none());
        assert_eq!(lookup.stale.len(), 1, "{field}");
        let fields: Vec<&str> = lookup.stale[0].differences.iter().map(|d| d.field).collect();
        assert_eq!(fields, [field]);
    }
}

#[test]
fn a_stale_entry_is_reported_even_when_a_fresh_one_is_used() {
    let mut h100 = Environment::sample_h200();
    h100.device = "NVIDIA H100 80GB HBM3".into();
    let db = db_with([entry(key(16), h100, "w4a16_h100"), entry(key(16), Environment::sample_h200(), "w4a16_h200")]);
    assert_eq!(db.entries.len(), 2, "one DB serves several devices");
    let lookup = db.lookup(&key(16), &Environment::sample_h200(), |_| true);
    assert_eq!(lookup.hit.unwrap().entry.variant, "w4a16_h200");
    assert_eq!(lookup.stale.len(), 1);
    assert_eq!(lookup.stale[0].entry.variant, "w4a16_h100");
}

#[test]
fn a_missing_m_bucket_falls_back_to_the_nearest_fresh_one() {
    let mut stale_env = Environment::sample_h200();
    stale_env.nvrtc = (12, 9);
    let db = db_with([
        entry(key(1), Environment::sample_h200(), "v1"),
        entry(key(16), Environment::sample_h200(), "v16"),
        entry(key(128), Environment::sample_h200(), "v128"),
        // Nearer than any fresh entry for M = 32, but stale.
        entry(key(32), stale_env, "v32_stale"),
        // Another problem entirely: never a fallback.
        entry(
            ProblemKey::w4a16(64, Shape { n: 7168, k: 2048 }, 32, Dtype::Bf16, Arch(90)),
            Environment::sample_h200(),
            "other_shape",
        ),
        entry(ProblemKey::w4a16(64, SHAPE, 64, Dtype::Bf16, Arch(90)), Environment::sample_h200(), "other_group"),
    ]);
    let pick = |m| {
        let hit = db.lookup(&key(m), &Environment::sample_h200(), |_| true).hit.unwrap();
        (hit.entry.variant.as_str(), hit.matched)
    };
    assert_eq!(pick(16), ("v16", Match::Exact));
    assert_eq!(pick(2), ("v1", Match::NearestM { bucket: 1 }));
    // M = 3 is in bucket 4, as far from 1 as from 16 in log2: the larger bucket wins the tie.
    assert_eq!(pick(3), ("v16", Match::NearestM { bucket: 16 }));
    assert_eq!(pick(32), ("v16", Match::NearestM { bucket: 16 }));
    assert_eq!(pick(64), ("v128", Match::NearestM { bucket: 128 }));
    assert_eq!(pick(1000), ("v128", Match::NearestM { bucket: 128 }));
    // A caller may refuse entries (a GEMV variant cannot serve M = 64): the next nearest is taken.
    let hit = db.lookup(&key(64), &Environment::sample_h200(), |e| e.variant != "v128").hit.unwrap();
    assert_eq!(hit.entry.variant, "v16");
    // Nothing for another arch.
    assert!(
        db.best_variant(&ProblemKey::w4a16(16, SHAPE, 32, Dtype::Bf16, Arch(120)), &Environment::sample_h200())
            .is_none()
    );
}

#[test]
fn the_db_round_trips_through_json() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested").join("tuning.json");
    let mut db =
        db_with([entry(key(1), Environment::sample_h200(), "v1"), entry(key(128), Environment::sample_h200(), "v128")]);
    db.record_compile_failure(CompileFailure {
        variant: "w4a16_huge".into(),
        arch: Arch(90),
        nvrtc: (13, 0),
        templates: Environment::sample_h200().templates,
        log: "error: too many resources requested".into(),
    });
    db.save(&path).unwrap();
    assert_eq!(TuningDb::open(&path).unwrap(), db);
    // Saving again over the file works, and a missing file is an empty DB.
    db.save(&path).unwrap();
    assert_eq!(TuningDb::open(&dir.path().join("absent.json")).unwrap(), TuningDb::default());
}

#[test]
fn a_corrupt_db_file_is_a_clear_error_and_stays_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let good = {
        let path = dir.path().join("good.json");
        db_with([entry(key(8), Environment::sample_h200(), "v8")]).save(&path).unwrap();
        std::fs::read_to_string(&path).unwrap()
    };
    let cases = [
        ("truncated", good[..good.len() / 2].to_owned(), "not JSON"),
        ("binary", "\u{0}\u{1}garbage".to_owned(), "not JSON"),
        ("other format", good.replace("\"format\": 1", "\"format\": 99"), "format version 99"),
        ("not a DB", "{\"entries\": []}".to_owned(), "no format version"),
        ("wrong field type", good.replace("\"m\": 8", "\"m\": \"eight\""), "unexpected content"),
        ("bucket 0", good.replace("\"m_bucket\": 8", "\"m_bucket\": 0"), "M bucket 0 is not a power of two"),
        ("bucket 12", good.replace("\"m_bucket\": 8", "\"m_bucket\": 12"), "M bucket 12 is not a power of two"),
    ];
    for (what, text, expected) in cases {
        let path = dir.path().join(format!("{}.json", what.replace(' ', "_")));
        std::fs::write(&path, &text).unwrap();
        let err = TuningDb::open(&path).unwrap_err();
        let message = err.to_string();
        assert!(matches!(err, TuneError::CorruptDb { .. }), "{what}: {message}");
        assert!(message.contains(expected), "{what}: {message}");
        assert!(message.contains(&path.display().to_string()), "{what}: the message names the file");
        // The CLI names its own flag for another file (`kdtree-jit --db`, `kdtree-engine --tuning-db`).
        assert!(message.contains("left as it is") && !message.contains("--"), "{what}: {message}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text, "{what}: the file was changed");
    }
}

#[test]
fn a_compile_failure_is_remembered_for_the_same_build_only() {
    let mut db = TuningDb::default();
    let failure = CompileFailure {
        variant: "w4a16_x".into(),
        arch: Arch(90),
        nvrtc: (13, 0),
        templates: Environment::sample_h200().templates,
        log: "ptxas error".into(),
    };
    db.record_compile_failure(failure.clone());
    db.record_compile_failure(failure);
    assert_eq!(db.compile_failures.len(), 1, "recording twice keeps one");
    assert!(db.compile_failure("w4a16_x", Arch(90), &Environment::sample_h200()).is_some());
    assert!(db.compile_failure("w4a16_x", Arch(120), &Environment::sample_h200()).is_none());
    let mut new_nvrtc = Environment::sample_h200();
    new_nvrtc.nvrtc = (13, 1);
    assert!(db.compile_failure("w4a16_x", Arch(90), &new_nvrtc).is_none(), "a new compiler gets another try");
    let mut edited = Environment::sample_h200();
    edited.templates = "ef".repeat(32);
    assert!(db.compile_failure("w4a16_x", Arch(90), &edited).is_none(), "edited templates get another try");
}

#[test]
fn retuning_replaces_the_same_problem_on_the_same_device() {
    let mut old_driver = Environment::sample_h200();
    old_driver.driver = 12080;
    let db = db_with([entry(key(4), old_driver, "first"), entry(key(4), Environment::sample_h200(), "second")]);
    assert_eq!(db.entries.len(), 1);
    assert_eq!(db.best_variant(&key(4), &Environment::sample_h200()).unwrap().variant, "second");
}

#[test]
fn two_tuners_saving_one_db_keep_each_others_entries() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tuning.json");
    // Both open the DB before either saves, as two tuners started together do.
    let (mut first, mut second) = (TuningDb::open(&path).unwrap(), TuningDb::open(&path).unwrap());
    first.insert(entry(key(1), Environment::sample_h200(), "first"));
    second.insert(entry(key(8), Environment::sample_h200(), "second"));
    let failure = |variant: &str| CompileFailure {
        variant: variant.into(),
        arch: Arch(90),
        nvrtc: (13, 0),
        templates: Environment::sample_h200().templates,
        log: "ptxas error".into(),
    };
    first.record_compile_failure(failure("w4a16_a"));
    second.record_compile_failure(failure("w4a16_b"));
    first.save(&path).unwrap();
    second.save(&path).unwrap();
    let db = TuningDb::open(&path).unwrap();
    assert_eq!(
        db.best_variant(&key(1), &Environment::sample_h200()).unwrap().variant,
        "first",
        "the first tuner's entry survives"
    );
    assert_eq!(db.best_variant(&key(8), &Environment::sample_h200()).unwrap().variant, "second");
    assert_eq!(db.compile_failures.len(), 2);
    // A tuner that retuned one problem on the same device replaces the file's entry of it only; an
    // older result of it (a copy read before) does not.
    let mut retuned = entry(key(1), Environment::sample_h200(), "third");
    retuned.tuned_at_unix += 60;
    TuningDb { entries: vec![retuned], ..TuningDb::default() }.save(&path).unwrap();
    let db = TuningDb::open(&path).unwrap();
    assert_eq!(
        (db.entries.len(), db.best_variant(&key(1), &Environment::sample_h200()).unwrap().variant.as_str()),
        (2, "third")
    );
    first.save(&path).unwrap();
    assert_eq!(
        TuningDb::open(&path).unwrap().best_variant(&key(1), &Environment::sample_h200()).unwrap().variant,
        "third"
    );
}

#[test]
fn concurrent_saves_lose_nothing_and_leave_no_temporary_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tuning.json");
    // What the old fixed temporary name was: a stray file or folder there must not matter.
    std::fs::create_dir(dir.path().join("tuning.json.tmp")).unwrap();
    std::thread::scope(|s| {
        for m in [1u32, 2, 4, 8, 16, 32, 64, 128] {
            let path = &path;
            s.spawn(move || {
                for round in 0..5 {
                    let mut db = TuningDb::open(path).unwrap();
                    let mut tuned = entry(key(m), Environment::sample_h200(), &format!("v{m}_{round}"));
                    tuned.tuned_at_unix += round;
                    db.insert(tuned);
                    db.save(path).unwrap();
                }
            });
        }
    });
    let db = TuningDb::open(&path).unwrap();
    let variants: Vec<&str> = db.entries.iter().map(|e| e.variant.as_str()).collect();
    assert_eq!(variants, ["v1_4", "v2_4", "v4_4", "v8_4", "v16_4", "v32_4", "v64_4", "v128_4"]);
    let mut names: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(names, ["tuning.json", "tuning.json.lock", "tuning.json.tmp"]);
}

#[test]
fn a_hand_made_key_of_bucket_zero_finds_the_nearest_bucket_without_a_panic() {
    let db =
        db_with([entry(key(1), Environment::sample_h200(), "v1"), entry(key(64), Environment::sample_h200(), "v64")]);
    let mut zero = key(1);
    zero.m_bucket = 0;
    assert_eq!(db.best_variant(&zero, &Environment::sample_h200()).unwrap().variant, "v1");
}

/// An MLA entry is its own problem: saved and read back, found for its head sizes only (never for a
/// GEMM of the same numbers, nor by the nearest-M fallback of another shape), and turned back into
/// the variant the engine loads; a name that is no valid variant on the arch is not used.
#[test]
fn an_mla_entry_round_trips_and_is_found_for_its_heads_only() {
    use kdtree_jit::Variant;
    use kdtree_jit::mla::{MlaDecode, MlaKv, MlaShape};
    use kdtree_jit::tune::key::MlaKey;
    use kdtree_jit::tune::mla::tuned_variant;
    let k2 = MlaKey { heads: 64, latent: 512, rope: 64, kv: MlaKv::Bf16 };
    let mla = ProblemKey::mla(k2, Arch(90));
    assert_eq!(mla.to_string(), "mla 64 heads, latent 512 + rope 64, bf16 cache");
    // A bf16 key reads and writes as the keys written before the FP8 cache: no `kv` field.
    assert!(!serde_json::to_string(&mla).unwrap().contains("kv"));
    let fp8 = ProblemKey::mla(MlaKey { kv: MlaKv::Fp8, ..k2 }, Arch(90));
    let db = db_with([
        entry(mla.clone(), Environment::sample_h200(), "mla_decode_mma_h32n32_s2_x32"),
        entry(fp8.clone(), Environment::sample_h200(), "mla_decode_mma_fp8_h64n32_s4_x64"),
        entry(key(1), Environment::sample_h200(), "w4a16_x"),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tuning.json");
    db.save(&path).unwrap();
    let db = TuningDb::open(&path).unwrap();
    assert_eq!(db.best_variant(&mla, &Environment::sample_h200()).unwrap().variant, "mla_decode_mma_h32n32_s2_x32");
    let gemm = ProblemKey::w4a16(1, Shape { n: 64, k: 576 }, 0, Dtype::Bf16, Arch(90));
    assert!(db.best_variant(&gemm, &Environment::sample_h200()).is_none());
    let other = ProblemKey::mla(MlaKey { heads: 16, ..k2 }, Arch(90));
    assert!(db.best_variant(&other, &Environment::sample_h200()).is_none());

    let shape = MlaShape { heads: 64, nope: 128, rope: 64, v: 128, latent: 512, scale: 0.1 };
    let env = Environment::sample_h200();
    assert_eq!(
        tuned_variant(&db, &env, Arch(90), &shape, MlaKv::Bf16),
        MlaDecode::from_name("mla_decode_mma_h32n32_s2_x32")
    );
    // Each cache finds its own entry.
    assert_eq!(
        tuned_variant(&db, &env, Arch(90), &shape, MlaKv::Fp8),
        MlaDecode::from_name("mla_decode_mma_fp8_h64n32_s4_x64")
    );
    assert_eq!(tuned_variant(&db, &env, Arch(90), &MlaShape { heads: 16, ..shape }, MlaKv::Bf16), None);
    // 64 heads with two 64-entry stages needs more shared memory than sm_90 has: never loaded; nor
    // is a variant of the other cache's kind filed under a key.
    let db = db_with([
        entry(mla, env.clone(), "mla_decode_mma_h64n64_s2_x32"),
        entry(fp8, env.clone(), "mla_decode_mma_h64n32_s2_x32"),
    ]);
    assert_eq!(tuned_variant(&db, &env, Arch(90), &shape, MlaKv::Bf16), None);
    assert_eq!(tuned_variant(&db, &env, Arch(90), &shape, MlaKv::Fp8), None);
}
