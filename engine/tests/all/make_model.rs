//! Generated Kimi K2-shaped checkpoints: the same bytes for the same seed, shards that are what
//! the safetensors crate itself would write, a model the engine loads and runs, a router that
//! spreads tokens, and the sizes of the default benchmark slice.

use std::collections::HashMap;
use std::path::Path;

use kdtree_engine::ops::cpu::route;
use kdtree_engine::tiny::{Sharding, TinySpec, write_model};
use kdtree_engine::{Config, Model};
use kdtree_quant::SafetensorsFile;

/// A K2 slice with every dimension scaled down, a few shards of at most 48 KiB.
fn scaled_down(seed: u64) -> TinySpec {
    TinySpec {
        seed,
        vocab_size: 512,
        hidden_size: 64,
        num_attention_heads: 4,
        q_lora_rank: Some(48),
        kv_lora_rank: 32,
        qk_nope_head_dim: 16,
        qk_rope_head_dim: 8,
        v_head_dim: 16,
        intermediate_size: 192,
        moe_intermediate_size: 32,
        max_position_embeddings: 64,
        sharding: Sharding::MaxBytes(48 << 10),
        ..TinySpec::k2_slice(3, 16)
    }
}

/// Every file of `dir` by name.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap())
        })
        .collect();
    out.sort();
    out
}

#[test]
fn the_same_seed_writes_the_same_bytes_and_another_seed_other_weights() {
    let root = tempfile::tempdir().unwrap();
    let [a, b, c] = ["a", "b", "c"].map(|d| root.path().join(d));
    let summary = write_model(&a, &scaled_down(1), &|_| {}).unwrap();
    write_model(&b, &scaled_down(1), &|_| {}).unwrap();
    write_model(&c, &scaled_down(2), &|_| {}).unwrap();
    let (fa, fb, fc) = (files(&a), files(&b), files(&c));
    assert_eq!(fa, fb);
    assert_eq!(summary, scaled_down(1).summary().unwrap());
    assert!(summary.shards.len() > 2, "{summary:?}");
    // Same names and sizes, other values.
    assert_eq!(
        fa.iter().map(|(n, d)| (n, d.len())).collect::<Vec<_>>(),
        fc.iter().map(|(n, d)| (n, d.len())).collect::<Vec<_>>()
    );
    for ((name, x), (_, y)) in fa.iter().zip(&fc) {
        assert_eq!(x == y, !name.ends_with(".safetensors"), "{name}");
    }
    for shard in &summary.shards {
        assert_eq!(std::fs::metadata(a.join(&shard.name)).unwrap().len(), shard.bytes);
    }
}

#[test]
fn shards_are_what_the_safetensors_crate_writes_and_int4_weights_stay_in_one() {
    let dir = tempfile::tempdir().unwrap();
    let summary = write_model(dir.path(), &scaled_down(3), &|_| {}).unwrap();
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("model.safetensors.index.json")).unwrap())
            .unwrap();
    let map = index["weight_map"].as_object().unwrap();
    let mut total = 0;
    for shard in &summary.shards {
        let path = dir.path().join(&shard.name);
        let file = SafetensorsFile::open(&path).unwrap();
        let names = file.names().unwrap();
        assert_eq!(names.len(), shard.tensors);
        for name in &names {
            assert_eq!(map[name], shard.name.as_str(), "{name}");
            if let Some(module) = name.strip_suffix(".weight_packed") {
                assert!(
                    names.contains(&format!("{module}.weight_scale"))
                        && names.contains(&format!("{module}.weight_shape"))
                );
            }
        }
        total += names.iter().map(|n| file.tensor(n).unwrap().data().len() as u64).sum::<u64>();
        let format = HashMap::from([("format".to_owned(), "pt".to_owned())]);
        let views: Vec<(String, _)> = names.iter().map(|n| (n.clone(), file.tensor(n).unwrap())).collect();
        let again = safetensors::serialize(views, Some(format)).unwrap();
        assert!(again == std::fs::read(&path).unwrap(), "{} differs from safetensors' own serialization", shard.name);
    }
    assert_eq!(index["metadata"]["total_size"], total);
    assert_eq!(total, summary.tensor_bytes());
}

#[test]
fn the_engine_loads_the_scaled_down_slice_and_its_logits_are_finite() {
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path(), &scaled_down(4), &|_| {}).unwrap();
    let model = Model::load(dir.path()).unwrap();
    let c = &model.config;
    assert_eq!((c.n_routed_experts, c.num_experts_per_tok, c.n_group, c.topk_group), (16, 8, 1, 1));
    assert_eq!(c.quant_group("model.layers.2.mlp.experts.15.down_proj"), Some(32));
    let prompt = [1u32, 500, 77, 3, 3, 260, 9, 411];
    let positions: Vec<usize> = (0..prompt.len()).collect();
    let logits = model.forward(&mut model.new_cache(), &prompt, &positions, None).unwrap();
    assert_eq!(logits.len(), prompt.len() * 512);
    assert!(logits.iter().all(|v| v.is_finite()));
    // Unit-variance weights keep the logits O(1): neither vanishing nor blowing up through the layers.
    let rms = (logits.iter().map(|v| v * v).sum::<f32>() / logits.len() as f32).sqrt();
    assert!((0.1..10.0).contains(&rms), "logits RMS {rms}");
}

/// Hidden states reach the router RMS-normalised: unit-RMS inputs, as many tokens as a long
/// prefill, go to every expert about equally often.
#[test]
fn the_router_spreads_tokens_over_the_experts() {
    let dir = tempfile::tempdir().unwrap();
    let spec = TinySpec { sharding: Sharding::Count(1), ..scaled_down(5) };
    write_model(dir.path(), &spec, &|_| {}).unwrap();
    let file = SafetensorsFile::open(&dir.path().join("model-00001-of-00001.safetensors")).unwrap();
    let read = |name: &str| -> Vec<f32> {
        let t = file.tensor(name).unwrap();
        match t.dtype() {
            safetensors::Dtype::BF16 => {
                t.data().chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect()
            }
            _ => bytemuck::pod_collect_to_vec(t.data()),
        }
    };
    let (h, e) = (spec.hidden_size, spec.n_routed_experts);
    let gate = read("model.layers.1.mlp.gate.weight");
    let bias = read("model.layers.1.mlp.gate.e_score_correction_bias");
    let config = Config::parse("config.json", &spec.config_json()).unwrap();
    let routing = config.routing();
    let tokens = 1024;
    let x = kdtree_quant::sample::symmetric(tokens * h, 9, 3f32.sqrt());
    let mut counts = vec![0usize; e];
    for row in x.chunks_exact(h) {
        let logits: Vec<f32> = gate.chunks_exact(h).map(|g| g.iter().zip(row).map(|(a, b)| a * b).sum()).collect();
        for (expert, _) in route(&logits, &bias, &routing) {
            counts[expert] += 1;
        }
    }
    let mean = (tokens * spec.num_experts_per_tok / e) as f32;
    assert!(counts.iter().all(|&n| (0.6 * mean..1.4 * mean).contains(&(n as f32))), "{counts:?}, mean {mean}");
}

#[test]
fn the_default_slice_has_kimi_k2s_dimensions_and_sizes() {
    let spec = TinySpec::k2_slice(3, 64);
    let c = Config::parse("config.json", &spec.config_json()).unwrap();
    assert_eq!((c.hidden_size, c.vocab_size, c.num_attention_heads, c.q_lora_rank), (7168, 163_840, 64, Some(1536)));
    assert_eq!((c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim), (512, 128, 64, 128));
    assert_eq!((c.intermediate_size, c.moe_intermediate_size, c.num_experts_per_tok), (18_432, 2048, 8));
    assert_eq!((c.n_group, c.topk_group, c.n_shared_experts, c.routed_scaling_factor), (1, 1, 1, 2.827));
    assert_eq!((c.rope_theta, c.max_position_embeddings), (50000.0, 4096));
    let y = c.rope_scaling.as_ref().unwrap();
    assert_eq!((y.factor, y.original_max_position_embeddings, y.beta_fast, y.beta_slow), (32.0, 4096, 1.0, 1.0));
    assert!(!c.is_moe_layer(0) && c.is_moe_layer(1) && c.is_moe_layer(2));
    assert_eq!(c.quant_group("model.layers.1.mlp.experts.63.up_proj"), Some(32));
    assert_eq!(c.quant_group("model.layers.1.mlp.shared_experts.up_proj"), None);

    let s = spec.summary().unwrap();
    let (h, inter) = (7168u64, 2048u64);
    // Per expert: three [2048, 7168]-sized weights of 4 bits, a bf16 scale per 32, and the two shapes.
    let expert = 3 * (h * inter / 2 + h * inter / 32 * 2 + 16);
    assert_eq!(s.int4_bytes, 2 * 64 * expert);
    let attention = 2 * (1536 * h + 64 * 192 * 1536 + 576 * h + 64 * 256 * 512 + h * 64 * 128 + 2 * h + 1536 + 512);
    let moe_bf16 = 2 * (64 * h + 3 * h * inter);
    let bf16 = 2 * 2 * 163_840 * h + 3 * attention + 2 * 3 * 18_432 * h + 2 * moe_bf16 + 2 * h;
    assert_eq!(s.bf16_bytes, bf16);
    assert_eq!(s.f32_bytes, 2 * 64 * 4);
    assert!((9.4e9..9.6e9).contains(&(s.total_bytes() as f64)), "{}", s.total_bytes());
    // Shards of at most 4 GiB of tensors.
    assert!(s.shards.len() == 3 && s.shards.iter().all(|f| f.bytes < (4 << 30) + (1 << 20)), "{:?}", s.shards);
}

#[test]
fn the_cli_prints_the_sizes_of_a_dry_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kdtree-engine"))
        .args(["make-model", "--layers", "4", "--experts", "384", "--dry-run", "--json", "--out"])
        .arg(dir.path().join("k2"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let expect = TinySpec::k2_slice(4, 384).summary().unwrap();
    assert_eq!(v["total_bytes"], expect.total_bytes());
    assert_eq!(v["int4_bytes"], expect.int4_bytes);
    assert!(!dir.path().join("k2").exists(), "a dry run writes nothing");
}

#[test]
fn a_spec_the_engine_could_not_load_is_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kdtree-engine"))
        .args(["make-model", "--experts", "4", "--out"])
        .arg(dir.path().join("k2"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("num_experts_per_tok"), "{stderr}");
    assert!(!dir.path().join("k2").exists());
    let odd = TinySpec { moe_intermediate_size: 48, ..scaled_down(0) };
    assert!(write_model(&dir.path().join("odd"), &odd, &|_| {}).is_err());
    assert!(!dir.path().join("odd").exists());
}

/// `make-model --dry-run` with `args`, killed after 60 s (a plan made from a declared size without a
/// bound takes gigabytes and minutes before it aborts).
fn dry_run(args: &[&str]) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kdtree-engine"))
        .args(["make-model", "--dry-run", "--json", "--out"])
        .arg(dir.path().join("k2"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > std::time::Duration::from_secs(60) {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("{args:?} still running after 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn layer_and_expert_counts_are_bounded_before_anything_is_planned() {
    let max = u64::MAX.to_string();
    for (args, code, says) in [
        (&["--experts", "0"][..], 2, &["--experts", "0 is too few", "routed to 8 experts", "at least 8"][..]),
        (&["--layers", "0"], 2, &["--layers", "0 is too few", "at least 1"]),
        (&["--layers", "1000000"], 1, &["--layers 1000000 --experts 64", "more than 1048576 tensors"]),
        (&["--layers", "1048576", "--experts", "8"], 1, &["more than 1048576 tensors"]),
        (&["--layers", &max], 1, &["num_hidden_layers", "must be in 1..=1048576"]),
        (&["--experts", &max], 1, &["n_routed_experts", "must be in 0..=1048576"]),
        (&["--layers", "1048576", "--experts", "1048576"], 1, &["more than 1048576 tensors"]),
    ] {
        let out = dry_run(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(says.iter().all(|s| stderr.contains(s)) && !stderr.contains("panicked"), "{args:?}: {stderr}");
    }
    // Kimi K2 itself is well within the bound.
    let out = dry_run(&["--layers", "61", "--experts", "384"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// `make-model` of the smallest slice into `out`, under a file size limit of a few MB, as on a nearly
/// full disk: a write beyond it fails (EFBIG, with SIGXFSZ ignored) the way one on a full disk does.
fn make_model_on_a_full_disk(out: &Path) -> std::process::Output {
    std::process::Command::new("sh")
        .args(["-c", "ulimit -f 4096 && trap '' XFSZ && exec \"$0\" \"$@\""])
        .arg(env!("CARGO_BIN_EXE_kdtree-engine"))
        .args(["make-model", "--layers", "1", "--experts", "8", "--out"])
        .arg(out)
        .output()
        .unwrap()
}

#[test]
fn a_failed_run_removes_what_it_wrote_and_replaces_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("k2/slice");
    let output = make_model_on_a_full_disk(&out);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("--out {}", out.display())) && stderr.contains("File too large"), "{stderr}");
    assert!(!dir.path().join("k2").exists(), "the folders it made are gone with their files");

    // Over an earlier model: its files stay as they were, and no partial file is left beside them.
    let old = dir.path().join("old");
    std::fs::create_dir(&old).unwrap();
    std::fs::write(old.join("config.json"), "the earlier model's").unwrap();
    assert_eq!(make_model_on_a_full_disk(&old).status.code(), Some(1));
    let left: Vec<_> = std::fs::read_dir(&old).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["config.json"]);
    assert_eq!(std::fs::read_to_string(old.join("config.json")).unwrap(), "the earlier model's");
}

#[test]
fn an_out_that_is_a_file_is_refused_saying_what_out_must_be() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("model.bin");
    std::fs::write(&file, "").unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_kdtree-engine"))
        .args(["make-model", "--layers", "1", "--experts", "8", "--out"])
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let says =
        format!("--out {0}: writing the model\n\nCaused by:\n    {0} exists and is not a folder", file.display());
    assert!(stderr.contains(&says) && stderr.contains("a folder of config.json and safetensors shards"), "{stderr}");
    assert!(!stderr.contains("os error"), "{stderr}");
}
