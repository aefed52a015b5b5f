//! The `kdtree-engine` binary on a tiny model, as a user runs it: bad requests are refused before
//! any weight is loaded, with an error naming the flag and the limit, and never a panic.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use kdtree_engine::tiny::{TinySpec, write_tiny_model};

fn tiny() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), &TinySpec::default()).unwrap();
    dir
}

fn generate(model: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kdtree-engine"))
        .args(["generate", "--backend", "cpu", "--model", model.to_str().unwrap(), "--prompt-ids", "1,2,3"])
        .args(args)
        .output()
        .unwrap()
}

/// Fails cleanly (exit 1, no panic, no abort), and returns stderr.
fn refused(model: &Path, args: &[&str]) -> String {
    let output = generate(model, args);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "{args:?} succeeded");
    assert!(matches!(output.status.code(), Some(1 | 2)), "{args:?}: {:?}\n{stderr}", output.status);
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    stderr
}

fn assert_says(stderr: &str, parts: &[&str]) {
    assert!(parts.iter().all(|p| stderr.contains(p)), "{stderr}\nshould say {parts:?}");
}

#[test]
fn max_new_beyond_the_context_is_refused_before_any_work() {
    let model = tiny();
    for max_new in ["18446744073709551615", "511"] {
        let stderr = refused(model.path(), &["--max-new", max_new]);
        assert_says(
            &stderr,
            &["3 prompt tokens", max_new, "512 positions", "`max_position_embeddings` in config.json"],
        );
    }
    let stderr = refused(model.path(), &["--max-new", "600", "--spec", "ddtree"]);
    assert_says(&stderr, &["max_position_embeddings"]);
    // The whole context: the last of 510 new tokens is never fed back, so positions 0..=511 do.
    let output = generate(model.path(), &["--max-new", "510", "--json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let out: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(out["tokens"].as_array().unwrap().len(), 510);
}

#[test]
fn make_tiny_writes_a_kimi_k25_layout_that_generate_runs_saying_what_it_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("k25");
    let made = Command::new(env!("CARGO_BIN_EXE_kdtree-engine"))
        .args(["make-tiny", "--int4", "--layout", "kimi-k25", "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let output = generate(&out, &["--max-new", "4"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_says(&stderr, &["skipped 5 tensors", "outside the text model (vision tower, projector): not read"]);
}

#[test]
fn max_new_zero_is_refused_and_rates_are_never_absurd() {
    let model = tiny();
    assert_says(&refused(model.path(), &["--max-new", "0"]), &["--max-new", "at least 1"]);
    let output = generate(model.path(), &["--max-new", "1", "--json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let out: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    // One new token comes from the prefill: no decode step was timed, so no decode rate.
    assert_eq!(out["decode_tokens_per_s"], 0.0);
    assert!(out["prefill_tokens_per_s"].as_f64().unwrap() < 1e12, "{out}");
}

#[test]
fn token_ids_outside_the_vocabulary_are_refused() {
    let model = tiny();
    assert_says(&refused(model.path(), &["--stop", "256"]), &["--stop is 256", "vocabulary of 256", "vocab_size"]);
    let output = generate(model.path(), &["--stop", "255", "--max-new", "2"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let output = Command::new(env!("CARGO_BIN_EXE_kdtree-engine"))
        .args(["generate", "--backend", "cpu", "--model", model.path().to_str().unwrap(), "--prompt-ids", "1,999"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert_says(&String::from_utf8_lossy(&output.stderr), &["--prompt-ids token is 999"]);
    let stderr = refused(model.path(), &["--spec", "ddtree", "--drafter", "block", "--mask-token", "256"]);
    assert_says(&stderr, &["--mask-token is 256"]);
}

#[test]
fn speculative_options_need_spec() {
    let model = tiny();
    for option in
        [["--budget", "8"], ["--draft-len", "4"], ["--drafter", "model"], ["--ngram", "2"], ["--mask-token", "3"]]
    {
        let stderr = refused(model.path(), &option);
        assert_says(&stderr, &[option[0], "--spec"]);
    }
}

#[test]
fn budget_and_draft_length_are_bounded() {
    let model = tiny();
    let stderr = refused(model.path(), &["--spec", "ddtree", "--drafter", "model", "--budget", "100000"]);
    assert_says(&stderr, &["--budget is 100000", "at most 1024"]);
    let stderr = refused(model.path(), &["--spec", "ddtree", "--budget", "100000", "--draft-len", "64"]);
    assert_says(&stderr, &["--budget is 100000"]);
    let stderr = refused(model.path(), &["--spec", "ddtree", "--draft-len", "100000"]);
    assert_says(&stderr, &["--draft-len is 100000", "at most 128"]);
    let output =
        generate(model.path(), &["--spec", "ddtree", "--budget", "1024", "--draft-len", "4", "--max-new", "6"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

#[test]
fn chain_and_cost_aware_ddtree_with_the_noisy_oracle_equal_greedy() {
    let model = tiny();
    let chain = generate(
        model.path(),
        &["--spec", "chain", "--drafter", "noisy-oracle", "--draft-len", "3", "--max-new", "12"],
    );
    let stdout = String::from_utf8_lossy(&chain.stdout);
    assert!(chain.status.success(), "{}", String::from_utf8_lossy(&chain.stderr));
    assert_says(&stdout, &["chain L=3 drafter=noisyoracle", "identical to greedy: yes"]);
    let cost = model.path().join("cost.json");
    std::fs::write(&cost, r#"{"device": "cpu", "model": "tiny", "points": [[1, 100.0], [16, 160.0]]}"#).unwrap();
    let args =
        ["--spec", "ddtree", "--drafter", "noisy-oracle", "--oracle-p", "0.9", "--max-new", "12", "--cost-model"];
    let aware = generate(model.path(), &[&args[..], &[cost.to_str().unwrap()]].concat());
    assert!(aware.status.success(), "{}", String::from_utf8_lossy(&aware.stderr));
    assert_says(&String::from_utf8_lossy(&aware.stdout), &["ddtree-cost B<=32 L=8", "identical to greedy: yes"]);
    std::fs::write(&cost, r#"{"device": "cpu", "model": "tiny", "points": [[4, 1.0], [2, 1.0]]}"#).unwrap();
    let stderr = refused(model.path(), &["--spec", "ddtree", "--cost-model", cost.to_str().unwrap()]);
    assert_says(&stderr, &["cost.json", "T must ascend"]);
    let stderr = refused(model.path(), &["--spec", "chain", "--cost-model", cost.to_str().unwrap()]);
    assert_says(&stderr, &["not a chain"]);
}

#[test]
fn a_grouped_variant_is_named_in_full_or_refused() {
    let model = tiny();
    let stderr = refused(model.path(), &["--grouped-variant", "w4a16_grouped_bf16_g32_m3n64k128_w4_s4_f32acc"]);
    assert_says(&stderr, &["is not a grouped W4A16 variant"]);
    let stderr = refused(
        model.path(),
        &["--per-expert-moe", "--grouped-variant", "w4a16_grouped_bf16_g32_m8n64k128_w4_s4_f32acc"],
    );
    assert_says(&stderr, &["cannot be used with"]);
}

#[test]
fn the_noisy_oracles_options_with_another_drafter_are_refused_not_ignored() {
    let model = tiny();
    for (args, option, drafter) in [
        (&["--spec", "ddtree", "--oracle-p", "0.9"][..], "--oracle-p", "lookup"),
        (&["--spec", "chain", "--drafter", "model", "--oracle-seed", "3"], "--oracle-seed", "model"),
    ] {
        let stderr = refused(model.path(), args);
        assert_says(&stderr, &[&format!("{option} sets the noisy oracle, and --drafter {drafter} does not read it")]);
    }
    let output = generate(model.path(), &["--spec", "ddtree", "--drafter", "noisy-oracle", "--oracle-p", "0.9"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

#[test]
fn a_config_json_with_a_byte_order_mark_is_read() {
    let model = tiny();
    let config = model.path().join("config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("\u{feff}{text}")).unwrap();
    let output = generate(model.path(), &["--max-new", "2"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

#[test]
fn bench_refuses_an_oracle_p_outside_zero_to_one_before_opening_a_gpu() {
    let model = tiny();
    let output = Command::new(env!("CARGO_BIN_EXE_kdtree-engine"))
        .args([
            "bench",
            "--backend",
            "cpu",
            "--model",
            model.path().to_str().unwrap(),
            "--spec",
            "--oracle-p",
            "0.5,1.5",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_says(&stderr, &["--oracle-p 1.5 is not a probability"]);
    assert!(!stderr.contains("panicked") && !stderr.contains("GPU"), "{stderr}");
}

#[test]
fn tune_budget_takes_seconds_is_documented_and_the_cpu_ignores_it() {
    let model = tiny();
    for (bad, says) in [("-1", "a budget is 0 or more"), ("inf", "a budget is 0 or more"), ("soon", "not a number")] {
        let stderr = refused(model.path(), &["--tune-budget", bad]);
        assert_says(&stderr, &["--tune-budget", bad, says]);
    }
    for budget in ["0", "0.5"] {
        let output = generate(model.path(), &["--max-new", "1", "--tune-budget", budget]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success() && !stderr.contains("startup tuning"), "{budget}: {stderr}");
    }
    let help = Command::new(env!("CARGO_BIN_EXE_kdtree-engine")).args(["generate", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout).split_whitespace().collect::<Vec<_>>().join(" ");
    assert_says(&help, &["--tune-budget <SECONDS>", "[default: 60]", "only on what it lacks", "0: no tuning"]);
    let help = Command::new(env!("CARGO_BIN_EXE_kdtree-engine")).args(["bench", "--help"]).output().unwrap();
    assert_says(&String::from_utf8_lossy(&help.stdout), &["--tune-budget <SECONDS>"]);
}

#[test]
fn cuda_asked_for_but_not_usable_is_an_error_naming_the_flag() {
    let model = tiny();
    // No machine has a GPU 99, so this fails with or without a GPU: the library says why, the CLI names the flag.
    let output = Command::new(env!("CARGO_BIN_EXE_kdtree-engine"))
        .args(["generate", "--backend", "cuda", "--gpu", "99", "--model", model.path().to_str().unwrap()])
        .args(["--prompt-ids", "1,2,3", "--tune-budget", "0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.code() == Some(1) && !stderr.contains("panicked"), "{:?}: {stderr}", output.status);
    assert_says(&stderr, &["--backend cuda", "the CUDA backend cannot run here: "]);
}

/// `kdtree-engine` with `args` and stdout on a full disk (/dev/full).
fn to_full_disk(args: &[&str]) -> Output {
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    Command::new(env!("CARGO_BIN_EXE_kdtree-engine")).args(args).stdout(full).output().unwrap()
}

/// `kdtree-engine` with `args` and stdout a pipe whose reader is gone before anything is written
/// (`kdtree-engine ... | head -c1`, `head` having read its byte).
fn to_closed_pipe(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kdtree-engine"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    child.wait_with_output().unwrap()
}

/// Every command that prints to stdout: generate (text, --json, --spec in both), make-model's dry
/// run (both) and make-tiny.
fn printing_commands(model: &Path, out: &Path) -> Vec<Vec<String>> {
    let generate = ["generate", "--backend", "cpu", "--model", model.to_str().unwrap(), "--prompt-ids", "1,2,3"];
    let make_model = ["make-model", "--dry-run", "--out", out.to_str().unwrap()];
    let make_drafter =
        ["make-drafter", "--dry-run", "--target", model.to_str().unwrap(), "--out", out.to_str().unwrap()];
    let runs: [(&[&str], &[&str]); 9] = [
        (&generate, &["--max-new", "2"]),
        (&generate, &["--max-new", "2", "--json"]),
        (&generate, &["--max-new", "4", "--spec", "ddtree"]),
        (&generate, &["--max-new", "4", "--spec", "ddtree", "--json"]),
        (&make_model, &[]),
        (&make_model, &["--json"]),
        (&make_drafter, &[]),
        (&make_drafter, &["--json"]),
        (&["make-tiny", "--out", out.to_str().unwrap()], &[]),
    ];
    runs.iter().map(|(base, extra)| base.iter().chain(*extra).map(|a| a.to_string()).collect()).collect()
}

#[test]
fn a_full_stdout_is_an_error_naming_stdout() {
    let model = tiny();
    let out = tempfile::tempdir().unwrap();
    for args in printing_commands(model.path(), &out.path().join("m")) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = to_full_disk(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_says(&stderr, &["writing to stdout", "No space left on device"]);
    }
}

#[test]
#[ignore = "needs a GPU"]
fn bench_on_a_full_or_closed_stdout_fails_naming_it_or_ends_quietly() {
    let model = tiny();
    let model = model.path().to_str().unwrap();
    for json in [&[][..], &["--json"]] {
        let args: Vec<&str> = ["bench", "--model", model, "--max-t", "2", "--reps", "1", "--generate", "2"]
            .into_iter()
            .chain(json.iter().copied())
            .collect();
        let output = to_full_disk(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert_says(&stderr, &["writing to stdout", "No space left on device"]);
        let output = to_closed_pipe(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{args:?}: {:?}\n{stderr}", output.status);
        assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{args:?}: {stderr}");
    }
}

#[test]
fn a_closed_stdout_ends_quietly() {
    let model = tiny();
    let out = tempfile::tempdir().unwrap();
    for args in printing_commands(model.path(), &out.path().join("m")) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = to_closed_pipe(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{args:?}: {:?}\n{stderr}", output.status);
        assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{args:?}: {stderr}");
    }
}

/// A tiny model with the fixture tokenizer (its 676 ids), for `generate --prompt`.
fn tiny_with_tokenizer() -> tempfile::TempDir {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/text/kimi");
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&fixture).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    write_tiny_model(dir.path(), &TinySpec { vocab_size: 676, ..TinySpec::default() }).unwrap();
    dir
}

#[test]
fn text_streamed_to_a_closed_stdout_ends_quietly_and_to_a_full_one_names_stdout() {
    let model = tiny_with_tokenizer();
    let generate = ["generate", "--backend", "cpu", "--model", model.path().to_str().unwrap(), "--prompt", "Hello"];
    let args: Vec<&str> = generate.into_iter().chain(["--max-new", "8", "--ignore-eos"]).collect();
    // The answer streams as text, a token at a time, before the closing newline.
    let output = Command::new(env!("CARGO_BIN_EXE_kdtree-engine")).args(&args).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{stderr}");
    assert!(!stdout.trim().is_empty(), "no text streamed: {stdout:?}\n{stderr}");

    let output = to_closed_pipe(&args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{args:?}: {:?}\n{stderr}", output.status);
    assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{args:?}: {stderr}");

    let output = to_full_disk(&args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    assert_says(&stderr, &["stdout", "No space left on device"]);
}

/// `generate` on `model` with `args`, killed after 60 s: a FIFO opened for reading blocks until a
/// writer comes, so a regression fails here rather than hanging the test run.
fn generate_within_a_minute(model: &Path, args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kdtree-engine"))
        .args(["generate", "--backend", "cpu", "--model", model.to_str().unwrap(), "--prompt-ids", "1,2,3"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("{args:?} still running after 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Replaces `path` with a FIFO that nobody writes.
fn fifo(path: &Path) {
    let _ = std::fs::remove_file(path);
    let status = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success(), "mkfifo {}", path.display());
}

/// Fails cleanly within the minute, and returns stderr.
fn refused_within_a_minute(model: &Path, args: &[&str]) -> String {
    let output = generate_within_a_minute(model, args);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    stderr
}

#[test]
fn a_fifo_as_any_input_is_refused_not_waited_on() {
    for file in ["config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors"] {
        let model = tiny();
        fifo(&model.path().join(file));
        let stderr = refused_within_a_minute(model.path(), &[]);
        assert_says(&stderr, &[file, "is a FIFO (named pipe), not a regular file"]);
    }
    // Without an index every *.safetensors of the folder is a shard.
    let model = tiny();
    std::fs::remove_file(model.path().join("model.safetensors.index.json")).unwrap();
    fifo(&model.path().join("extra.safetensors"));
    assert_says(&refused_within_a_minute(model.path(), &[]), &["extra.safetensors", "is a FIFO"]);
    let model = tiny();
    let cost = model.path().join("cost.json");
    fifo(&cost);
    let stderr = refused_within_a_minute(model.path(), &["--spec", "ddtree", "--cost-model", cost.to_str().unwrap()]);
    assert_says(&stderr, &["cost.json", "is a FIFO"]);
    // A folder where a shard should be is no better.
    let model = tiny();
    let shard = model.path().join("model-00002-of-00002.safetensors");
    std::fs::remove_file(&shard).unwrap();
    std::fs::create_dir(&shard).unwrap();
    assert_says(&refused_within_a_minute(model.path(), &[]), &["model-00002-of-00002", "is a directory"]);
}

#[test]
fn endless_and_oversized_json_inputs_fail_before_being_read() {
    // A device is not a regular file: refused unread.
    let model = tiny();
    let index = model.path().join("model.safetensors.index.json");
    std::fs::remove_file(&index).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &index).unwrap();
    assert_says(&refused_within_a_minute(model.path(), &[]), &["model.safetensors.index.json", "is a device"]);
    let model = tiny();
    let stderr = refused_within_a_minute(model.path(), &["--spec", "ddtree", "--cost-model", "/dev/zero"]);
    assert_says(&stderr, &["/dev/zero", "is a device"]);
    // A (sparse) regular file beyond the cap: refused by its size, unread.
    let model = tiny();
    let big = |path: &Path, bytes: u64| std::fs::File::create(path).unwrap().set_len(bytes).unwrap();
    let cost = model.path().join("cost.json");
    big(&cost, (1 << 20) + 1);
    let stderr = refused_within_a_minute(model.path(), &["--spec", "ddtree", "--cost-model", cost.to_str().unwrap()]);
    assert_says(&stderr, &["cost.json is larger than 1048576 bytes, more than a cost model may be"]);
    big(&model.path().join("model.safetensors.index.json"), 1 << 30);
    let stderr = refused_within_a_minute(model.path(), &[]);
    assert_says(&stderr, &["model.safetensors.index.json is larger than 268435456 bytes"]);
    big(&model.path().join("config.json"), 1 << 30);
    let stderr = refused_within_a_minute(model.path(), &[]);
    assert_says(&stderr, &["config.json is larger than 16777216 bytes, more than a config.json may be"]);
}

#[test]
fn generate_drafts_with_a_dflash_folder_and_refuses_it_half_given() {
    let model = tiny();
    let drafter = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/dflash/drafter");
    let drafter = drafter.to_str().unwrap();
    let output = generate(
        model.path(),
        &["--spec", "ddtree", "--drafter", "dflash", "--draft-model", drafter, "--budget", "8", "--max-new", "12"],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_says(&stdout, &["ddtree B=8 L=8 drafter=dflash", "identical to greedy: yes"]);
    let stderr = refused(model.path(), &["--spec", "ddtree", "--drafter", "dflash"]);
    assert_says(&stderr, &["--drafter dflash needs --draft-model"]);
    let stderr = refused(
        model.path(),
        &["--spec", "ddtree", "--drafter", "dflash", "--draft-model", drafter, "--mask-token", "3"],
    );
    assert_says(&stderr, &["drop --mask-token"]);
    // A target the drafter does not fit: its config names the key.
    let other = tempfile::tempdir().unwrap();
    write_tiny_model(other.path(), &TinySpec { hidden_size: 32, ..TinySpec::default() }).unwrap();
    let stderr = refused(other.path(), &["--spec", "ddtree", "--drafter", "dflash", "--draft-model", drafter]);
    assert_says(&stderr, &["hidden_size", "the target's is 32"]);
}
