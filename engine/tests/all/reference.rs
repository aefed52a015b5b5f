//! The engine against an independent NumPy float64 transcription of transformers' DeepSeek-V3
//! (`tests/reference/deepseek_v3_numpy.py`), on tiny checkpoints: the fixtures hold its logits
//! and the command that made them.

use kdtree_engine::Model;
use kdtree_engine::registry::KvDtype;
use kdtree_engine::tiny::{TinySpec, write_tiny_model};

#[derive(serde::Deserialize)]
struct Fixture {
    seed: u64,
    int4: bool,
    #[serde(default)]
    q_proj: bool,
    #[serde(default)]
    rope_half_split: bool,
    prompt: Vec<u32>,
    logits: Vec<Vec<f64>>,
}

/// The bound on the largest logit difference, as a share of the logits' scale, by KV dtype. f32:
/// f32 activations and accumulation against float64 throughout; the differences measured 5e-7 of
/// the logits' scale, and 1e-4 leaves room yet catches structural slips (rotating half-split instead
/// of interleaved pairs moves the logits by 0.7 of their scale). bf16: each cached entry and each
/// absorbed query is rounded to bf16 (2^-9 relative), through two layers; measured 3.8e-3 to 4.9e-3.
fn bound(kv: KvDtype) -> f64 {
    match kv {
        KvDtype::F32 => 1e-4,
        KvDtype::Bf16 => 1e-2,
        KvDtype::Fp8 => unreachable!("an FP8 cache is checked against a bf16 one (kv_dtype.rs)"),
    }
}

fn check(json: &str) {
    for kv in [KvDtype::F32, KvDtype::Bf16] {
        check_with(json, kv);
    }
}

fn check_with(json: &str, kv: KvDtype) {
    let f: Fixture = serde_json::from_str(json).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let spec = TinySpec {
        seed: f.seed,
        int4_experts: f.int4,
        q_lora_rank: if f.q_proj { None } else { TinySpec::default().q_lora_rank },
        rope_interleave: !f.rope_half_split,
        ..TinySpec::default()
    };
    write_tiny_model(dir.path(), &spec).unwrap();
    let mut model = Model::load(dir.path()).unwrap();
    model.set_kv_dtype(kv).unwrap();
    let positions: Vec<usize> = (0..f.prompt.len()).collect();
    let ours = model.forward(&mut model.new_cache(), &f.prompt, &positions, None).unwrap();
    let vocab = model.config.vocab_size;
    let scale = f.logits.iter().flatten().fold(0f64, |m, v| m.max(v.abs()));
    let mut worst = 0f64;
    for (t, row) in f.logits.iter().enumerate() {
        for (j, &expect) in row.iter().enumerate() {
            worst = worst.max((ours[t * vocab + j] as f64 - expect).abs() / scale);
        }
    }
    assert!(worst < bound(kv), "{kv:?} cache: largest difference {worst:e} of the logits' scale {scale}");
}

#[test]
fn bf16_model_matches_the_numpy_reference() {
    check(include_str!("../fixtures/numpy_reference_bf16.json"));
}

#[test]
fn int4_model_matches_the_numpy_reference() {
    check(include_str!("../fixtures/numpy_reference_int4.json"));
}

#[test]
fn q_proj_and_half_split_rope_model_matches_the_numpy_reference() {
    check(include_str!("../fixtures/numpy_reference_qproj_halfsplit.json"));
}
