//! A DFlash drafter's round at Kimi-K2.5-DFlash's size, prepared on the CPU: `make-drafter` writes a
//! random drafter folder that the engine's loader takes and that drafts for its target (tiny here,
//! K2-sized on the GPU machine), with clear errors for options that cannot make one; and `bench --spec
//! --drafter dflash` times its round beside the target's verify forward, counts it in the cost model
//! and prints both (the library parts here on the CPU, the command itself `--ignored` on a GPU).

use std::path::Path;
use std::process::{Command, Output};

use kdtree_engine::spec::{
    CostModel, DflashDrafter, DflashModel, Drafter, Method, TreeLimits, round, speculative_generate, sweep,
};
use kdtree_engine::tiny::{DrafterSpec, Sharding, TinySpec, write_drafter, write_tiny_model};
use kdtree_engine::{Config, Model, greedy_generate};

/// The tiny target (hidden 64, vocabulary 256, 3 layers).
fn tiny() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), &TinySpec::default()).unwrap();
    dir
}

/// A drafter of the K2.5 layout scaled down to the tiny target: 2 layers of 4 query and 2 key/value
/// heads of 16, MLP 96, block 4, in shards of at most 64 KiB.
fn small() -> DrafterSpec {
    DrafterSpec {
        seed: 3,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 16,
        intermediate_size: 96,
        block_size: 4,
        sharding: Sharding::MaxBytes(64 << 10),
        ..DrafterSpec::k2_5()
    }
}

/// The small drafter's options of `make-drafter`.
const SMALL: [&str; 10] =
    ["--layers", "2", "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--intermediate", "96"];

fn engine(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kdtree-engine")).args(args).output().unwrap()
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn assert_says(text: &str, parts: &[&str]) {
    assert!(parts.iter().all(|p| text.contains(p)), "{text}\nshould say {parts:?}");
}

#[test]
fn a_generated_drafter_loads_and_drafts_greedy_exact_for_its_target() {
    let target_dir = tiny();
    let target = Model::load(target_dir.path()).unwrap();
    let out = tempfile::tempdir().unwrap();
    let summary = write_drafter(out.path(), &small(), &target.config, &|_| {}).unwrap();
    assert!(summary.shards.len() > 1, "{summary:?}");
    assert_eq!(summary, small().summary(&target.config).unwrap());
    let drafter = DflashModel::load(out.path(), &target).unwrap();
    let c = &drafter.config;
    // The reference's layer ids for 3 target layers and 2 drafter layers ([1, 0]), the target's last
    // id as the mask.
    assert_eq!((c.target_layer_ids.as_slice(), c.mask_token_id, c.block_size), (&[1, 0][..], 255, 4));
    let prompt = [5u32, 17, 42, 9, 200, 31];
    let greedy = greedy_generate(&target, &prompt, 12, &[]).unwrap();
    for method in [Method::Tree(TreeLimits { budget: 6, draft_len: 3 }), Method::Chain { len: 3 }] {
        let mut dflash = DflashDrafter::new(&drafter, &target).unwrap();
        let (tokens, stats) = speculative_generate(&target, &mut dflash, &prompt, 12, &method, &[]).unwrap();
        assert_eq!(tokens, greedy, "{}", method.label());
        assert!(stats.tree_sizes.iter().any(|&n| n > 0), "{}: nothing drafted", method.label());
    }
}

#[test]
fn make_drafter_writes_a_folder_that_generate_drafts_with() {
    let target = tiny();
    let out = tempfile::tempdir().unwrap();
    let drafter = out.path().join("drafter");
    let args = ["make-drafter", "--target", path(target.path()), "--out", path(&drafter), "--block-size", "4"];
    let made = engine(&[&args[..], &SMALL, &["--json"]].concat());
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let report: serde_json::Value = serde_json::from_slice(&made.stdout).unwrap();
    assert_eq!((report["written"].as_bool(), report["hidden_size"].as_u64()), (Some(true), Some(64)));
    let files: u64 = report["shards"].as_array().unwrap().iter().map(|s| s["bytes"].as_u64().unwrap()).sum();
    assert_eq!(report["total_bytes"].as_u64(), Some(files));
    let generate = engine(&[
        "generate",
        "--backend",
        "cpu",
        "--model",
        path(target.path()),
        "--prompt-ids",
        "1,2,3",
        "--max-new",
        "8",
        "--spec",
        "ddtree",
        "--drafter",
        "dflash",
        "--draft-model",
        path(&drafter),
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&generate.stderr);
    assert!(generate.status.success(), "{stderr}");
    let run: serde_json::Value = serde_json::from_slice(&generate.stdout).unwrap();
    assert_eq!(run["identical"].as_bool(), Some(true), "{run}");
}

#[test]
fn a_dry_run_prints_the_k2_5_sizes_for_a_61_layer_target_and_writes_nothing() {
    // A config alone is enough: the target's weights are not read.
    let target = tempfile::tempdir().unwrap();
    let config = serde_json::to_string(&TinySpec::k2_slice(61, 384).config_json()).unwrap();
    std::fs::write(target.path().join("config.json"), config).unwrap();
    let out = target.path().join("drafter");
    let dry = engine(&["make-drafter", "--dry-run", "--json", "--target", path(target.path()), "--out", path(&out)]);
    assert!(dry.status.success(), "{}", String::from_utf8_lossy(&dry.stderr));
    let report: serde_json::Value = serde_json::from_slice(&dry.stdout).unwrap();
    assert_eq!(report["written"].as_bool(), Some(false));
    assert_eq!(report["target_layer_ids"], serde_json::json!([1, 12, 24, 35, 47, 58]));
    assert_eq!((report["mask_token_id"].as_u64(), report["block_size"].as_u64()), (Some(163_838), Some(8)));
    let total = report["total_bytes"].as_u64().unwrap() as f64;
    assert!((6.9e9..7.0e9).contains(&total), "{report}");
    assert!(!out.exists(), "a dry run wrote {}", out.display());
    let table = engine(&["make-drafter", "--dry-run", "--target", path(target.path()), "--out", path(&out)]);
    assert_says(&String::from_utf8_lossy(&table.stdout), &["would write a DFlash drafter", "6.96 GB"]);
}

#[test]
fn options_that_cannot_make_a_drafter_for_the_target_are_refused_by_name() {
    let target = tiny();
    let out = tempfile::tempdir().unwrap();
    let base = ["make-drafter", "--target", path(target.path()), "--out", path(out.path())];
    let cases: [(&[&str], &[&str]); 7] = [
        (&["--kv-heads", "3"], &["num_key_value_heads", "3 does not divide num_attention_heads 4"]),
        (&["--target-layer-ids", "0,3"], &["target_layer_ids", "names layer 3, the target has 3 layers"]),
        (&["--mask-token", "256"], &["mask_token_id", "outside the target's vocabulary of 256"]),
        (&["--head-dim", "15"], &["head_dim", "even"]),
        (&["--block-size", "1"], &["--block-size", "a block holds the bonus token and a mask"]),
        (&["--layers", "0"], &["--layers", "too few"]),
        (&["--shard-size", "0"], &["--shard-size", "at least one byte"]),
    ];
    for (extra, says) in cases {
        // The small drafter's options, less the one the case sets.
        let small = SMALL.chunks(2).filter(|pair| pair[0] != extra[0]).flatten().copied();
        let args: Vec<&str> = base.iter().copied().chain(small).chain(extra.iter().copied()).collect();
        let output = engine(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(matches!(output.status.code(), Some(1 | 2)) && !stderr.contains("panicked"), "{extra:?}: {stderr}");
        assert_says(&stderr, says);
    }
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0, "a refused run wrote files");
    let missing = engine(&["make-drafter", "--target", "/nonexistent/k2", "--out", path(out.path())]);
    assert_says(&String::from_utf8_lossy(&missing.stderr), &["--target /nonexistent/k2", "config.json"]);
}

#[test]
fn a_round_is_timed_beside_the_verify_forward_and_counted_by_the_cost_model() {
    let target_dir = tiny();
    let target = Model::load(target_dir.path()).unwrap();
    let out = tempfile::tempdir().unwrap();
    write_drafter(out.path(), &small(), &target.config, &|_| {}).unwrap();
    let drafter = DflashModel::load(out.path(), &target).unwrap();
    let prompt = [5u32, 17, 42, 9, 200, 31];
    let mut dflash = DflashDrafter::new(&drafter, &target).unwrap();
    // Deeper than the block: a round drafts block_size - 1 = 3 positions.
    let timing = round::time_rounds(&target, &mut dflash, "dflash", &prompt, (8, 4), 3).unwrap();
    assert_eq!((timing.context, timing.depths, timing.top_k, timing.reps), (6, 3, 4, 3));
    assert!(timing.p10_us <= timing.median_us && timing.median_us <= timing.p90_us && timing.median_us > 0.0);
    let forward = round::time_forward(&target, &drafter, &prompt, 3).unwrap();
    assert!(forward > 0.0 && timing.forward_median_us.is_none());
    let timing = round::RoundTiming { forward_median_us: Some(forward), ..timing };
    let base = CostModel::new("cpu".into(), "tiny".into(), vec![(1, 100.0), (4, 150.0), (8, 200.0)]).unwrap();
    let cost = base.with_draft_us(50.0).unwrap();
    let beside = round::beside_verify(&cost, 50.0);
    assert_eq!(
        beside.iter().map(|b| (b.t, b.round_share)).collect::<Vec<_>>(),
        [(1, 0.5), (4, 50.0 / 150.0), (8, 0.25)]
    );
    let estimates = round::estimates(&cost, &[3.0], 4);
    assert_eq!((estimates[0].speedup, estimates[0].speedup_free_drafter), (1.5, 2.0));
    let text = round::table(&timing, &beside, &estimates);
    assert_says(&text, &["dflash drafter round after 6 tokens", "the forward to logits", "round / verify", "33.3%"]);
    assert_says(&text, &["1.50x", "2.00x"]);
    let json = serde_json::to_value((&timing, &beside, &estimates)).unwrap();
    assert!(json[0]["median_us"].is_f64() && json[1][0]["round_share"].is_f64() && json[2][0]["speedup"].is_f64());

    // The comparison with the drafter: greedy, the block's chain, DDTree and cost-aware DDTree, every
    // output greedy's, each estimated by the cost model with the drafter's round.
    let methods = sweep::drafter_methods(8, timing.depths, Some(&cost));
    let make = || Ok(Box::new(DflashDrafter::new(&drafter, &target)?) as Box<dyn Drafter<_> + '_>);
    let mut rows = sweep::compare_drafter(&target, &prompt, 10, &methods, "dflash", make, |_| {}).unwrap();
    sweep::estimate(&mut rows, &cost);
    let labels: Vec<&str> = rows.iter().map(|r| r.method.as_str()).collect();
    assert_eq!(labels, ["greedy", "chain L=3", "ddtree B=8 L=3", "ddtree-cost B<=8 L=3"]);
    assert!(rows.iter().all(|r| r.identical), "{}", sweep::table(&rows));
    assert_eq!((rows[0].drafter.as_str(), rows[0].estimated_speedup), ("-", None));
    for r in &rows[1..] {
        assert_eq!((r.drafter.as_str(), r.p), ("dflash", None));
        let expect = cost.speedup(r.tau, r.mean_tree_size.round() as usize + 1);
        assert_eq!(r.estimated_speedup, Some(expect), "{}", r.method);
    }
    assert_says(&sweep::table(&rows), &["drafter", "estimated", "dflash"]);
}

#[test]
fn bench_refuses_dflash_options_that_do_not_go_together_before_opening_a_gpu() {
    let target = tiny();
    let out = tempfile::tempdir().unwrap();
    // A drafter for another target: hidden 32, not the tiny target's 64.
    let other = tempfile::tempdir().unwrap();
    write_tiny_model(other.path(), &TinySpec { hidden_size: 32, ..TinySpec::default() }).unwrap();
    let other_config = Config::load(&other.path().join("config.json")).unwrap();
    write_drafter(out.path(), &small(), &other_config, &|_| {}).unwrap();
    let bench = ["bench", "--backend", "cpu", "--model", path(target.path()), "--spec"];
    let cases: [(&[&str], &[&str]); 5] = [
        (&["--drafter", "dflash"], &["--drafter dflash needs --draft-model"]),
        (&["--draft-model", path(out.path())], &["--draft-model", "pass --drafter dflash"]),
        (
            &["--drafter", "dflash", "--draft-model", path(out.path()), "--oracle-p", "0.5"],
            &["--oracle-p", "does not read it"],
        ),
        (&["--drafter", "dflash", "--draft-model", path(out.path())], &["--draft-model", "hidden_size", "is 32"]),
        (
            &["--drafter", "dflash", "--draft-model", path(out.path()), "--assume-tau", "0.5"],
            &["--assume-tau 0.5", "at least 1"],
        ),
    ];
    for (extra, says) in cases {
        let output = engine(&[&bench[..], extra].concat());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{extra:?}: {stderr}");
        assert!(!stderr.contains("panicked") && !stderr.contains("GPU"), "{extra:?}: {stderr}");
        assert_says(&stderr, says);
    }
}

#[test]
#[ignore = "needs a GPU"]
fn bench_times_a_dflash_round_beside_the_verify_forward() {
    let target = tiny();
    let out = tempfile::tempdir().unwrap();
    let config = Config::load(&target.path().join("config.json")).unwrap();
    write_drafter(out.path(), &small(), &config, &|_| {}).unwrap();
    let cost_path = out.path().join("cost.json");
    let output = engine(&[
        "bench",
        "--model",
        path(target.path()),
        "--max-t",
        "8",
        "--reps",
        "2",
        "--generate",
        "0",
        "--spec",
        "--spec-tokens",
        "8",
        "--spec-budget",
        "4",
        "--drafter",
        "dflash",
        "--draft-model",
        path(out.path()),
        "--assume-tau",
        "2.5",
        "--save-cost",
        path(&cost_path),
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let round = &report["draft_round"];
    let median = round["timing"]["median_us"].as_f64().unwrap();
    assert!(median > 0.0 && round["timing"]["depths"].as_u64() == Some(3), "{round}");
    assert!(round["timing"]["forward_median_us"].as_f64().is_some_and(|f| f > 0.0), "{round}");
    assert!(round["beside_verify"].as_array().unwrap().iter().all(|b| b["round_share"].as_f64().unwrap() > 0.0));
    assert_eq!(round["estimates"][0]["t"].as_u64(), Some(4));
    let rows = report["spec"].as_array().unwrap();
    assert!(rows.iter().all(|r| r["identical"].as_bool() == Some(true)), "{rows:?}");
    assert!(rows[1..].iter().all(|r| r["drafter"] == "dflash" && r["estimated_speedup"].is_f64()), "{rows:?}");
    assert_eq!(CostModel::load(&cost_path).unwrap().draft_us, median);
}
