//! Host memory while loading: shards are mapped and each tensor's pages dropped once copied, and
//! bf16 weights stay bf16, so loading on the CPU peaks at about the checkpoint's size above the
//! process's baseline (the target is at most 1.25x). Measured in a child process (peak RSS is per
//! process), through `generate --json`, which reports it.

use std::process::Command;

use kdtree_engine::tiny::{TinySpec, write_model};

#[test]
fn loading_on_the_cpu_peaks_at_most_a_quarter_above_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    // Kimi K2's layout at a scale a test can load: ~110 MB, bf16 dense weights, INT4 experts.
    let spec = TinySpec {
        vocab_size: 16_384,
        hidden_size: 1024,
        num_attention_heads: 8,
        q_lora_rank: Some(256),
        kv_lora_rank: 128,
        qk_nope_head_dim: 64,
        qk_rope_head_dim: 32,
        v_head_dim: 64,
        intermediate_size: 2048,
        moe_intermediate_size: 512,
        num_experts_per_tok: 4,
        ..TinySpec::k2_slice(3, 16)
    };
    write_model(dir.path(), &spec, &|_| {}).unwrap();
    let checkpoint: u64 = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    let out = Command::new(env!("CARGO_BIN_EXE_kdtree-engine"))
        .args(["generate", "--backend", "cpu", "--prompt-ids", "1,2,3", "--max-new", "2", "--json", "--model"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (before, peak) = (report["peak_rss_before_load_bytes"].as_u64(), report["peak_rss_bytes"].as_u64());
    let (Some(before), Some(peak)) = (before, peak) else { panic!("no peak RSS reported: {report}") };
    let ratio = (peak - before) as f64 / checkpoint as f64;
    println!("checkpoint {checkpoint} bytes; peak RSS {peak} bytes, {before} before loading: {ratio:.2}x");
    assert!(ratio <= 1.25, "loading took {ratio:.2}x the checkpoint's size");
}

/// A prompt longer than the 8192 tokens one forward once took runs on the CPU in bounded memory: it
/// is prefilled in chunks, and no n x n mask exists anywhere (at 9000 tokens an f32 one alone would be
/// 324 MB). The process stays within 64 MB of its size after loading the tiny model.
#[test]
fn a_9000_token_prompt_runs_in_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let spec = TinySpec { num_hidden_layers: 2, max_position_embeddings: 16_384, ..TinySpec::default() };
    write_model(dir.path(), &spec, &|_| {}).unwrap();
    let prompt: Vec<String> = (0..9000u32).map(|i| ((i * 7919 + 13) % 256).to_string()).collect();
    let out = Command::new(env!("CARGO_BIN_EXE_kdtree-engine"))
        .args(["generate", "--backend", "cpu", "--max-new", "2", "--json", "--prompt-ids", &prompt.join(",")])
        .arg("--model")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["tokens"].as_array().map(Vec::len), Some(2), "{report}");
    let (before, peak) = (report["peak_rss_before_load_bytes"].as_u64(), report["peak_rss_bytes"].as_u64());
    let (Some(before), Some(peak)) = (before, peak) else { panic!("no peak RSS reported: {report}") };
    println!("9000-token prompt: peak RSS {peak} bytes, {before} before loading");
    assert!(peak - before < 64 << 20, "peak RSS grew by {} bytes", peak - before);
}
