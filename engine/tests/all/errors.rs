//! Bad model folders: each a clear error that names the file and the tensor or key, or, for weights
//! that hold NaN or infinities, the first op of the forward whose output is not finite.

use std::path::Path;

use crate::poison::{int4_all_experts, non_finite, poison};
use kdtree_engine::registry::KvStore;
use kdtree_engine::tiny::{TinySpec, write_tiny_model};
use kdtree_engine::{EngineError, Model, greedy_generate};
use kdtree_quant::{SafetensorsFile, Tensor, write_file};

const SHARD2: &str = "model-00002-of-00002.safetensors";

fn tiny(spec: &TinySpec) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), spec).unwrap();
    dir
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(path, config.to_string()).unwrap();
}

fn load_err(dir: &Path) -> EngineError {
    Model::load(dir).unwrap_err()
}

#[test]
fn a_missing_tensor_is_named_with_the_shards() {
    let dir = tiny(&TinySpec::default());
    let path = dir.path().join(SHARD2);
    let file = SafetensorsFile::open(&path).unwrap();
    let kept: Vec<(String, Tensor)> = file
        .names()
        .unwrap()
        .into_iter()
        .filter(|n| n != "model.norm.weight")
        .map(|n| {
            let t = file.tensor(&n).unwrap();
            (n, Tensor { dtype: t.dtype(), shape: t.shape().to_vec(), data: t.data().to_vec() })
        })
        .collect();
    write_file(&path, &kept).unwrap();
    // The index still lists it: the index is wrong, and says where it looked.
    let e = load_err(dir.path());
    assert!(matches!(&e, EngineError::Config { key, .. } if key == "weight_map.model.norm.weight"), "{e}");
    // Gone from the index too: the tensor is missing, named with the shards searched.
    edit_index(dir.path(), |map| {
        map.remove("model.norm.weight");
    });
    let e = load_err(dir.path());
    assert!(
        matches!(&e, EngineError::MissingTensor { tensor, file } if tensor == "model.norm.weight" && file.contains(SHARD2)),
        "{e}"
    );
}

#[test]
fn a_shape_that_disagrees_with_the_config_names_file_tensor_and_both_shapes() {
    let dir = tiny(&TinySpec::default());
    edit_config(dir.path(), |c| c["intermediate_size"] = 96.into());
    let e = load_err(dir.path());
    let msg = e.to_string();
    assert!(
        matches!(&e, EngineError::ShapeMismatch { tensor, expected, actual, .. }
            if tensor == "model.layers.0.mlp.gate_proj.weight" && expected == &[96, 64] && actual == &[128, 64]),
        "{msg}"
    );
    assert!(msg.contains(".safetensors"), "{msg}");
}

#[test]
fn an_unknown_model_type_names_config_json() {
    let dir = tiny(&TinySpec::default());
    edit_config(dir.path(), |c| c["model_type"] = "llama".into());
    let e = load_err(dir.path());
    assert!(
        matches!(&e, EngineError::UnknownModelType { file, model_type } if file.ends_with("config.json") && model_type == "llama")
    );
}

#[test]
fn an_unknown_quantization_format_is_refused() {
    let dir = tiny(&TinySpec::default());
    edit_config(dir.path(), |c| c["quantization_config"] = serde_json::json!({"quant_method": "awq", "bits": 4}));
    let e = load_err(dir.path());
    assert!(
        matches!(&e, EngineError::UnknownQuantization { file, format, .. } if file.ends_with("config.json") && format.contains("awq")),
        "{e}"
    );
}

#[test]
fn an_fp8_checkpoint_is_refused_as_not_supported_yet() {
    let dir = tiny(&TinySpec::default());
    edit_config(dir.path(), |c| {
        c["quantization_config"] =
            serde_json::json!({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]})
    });
    let e = load_err(dir.path());
    assert!(matches!(&e, EngineError::Fp8Weights { file } if file.ends_with("config.json")), "{e}");
}

#[test]
fn a_config_that_calls_dense_weights_int4_is_refused() {
    let dir = tiny(&TinySpec::default());
    let int4 = TinySpec { int4_experts: true, ..TinySpec::default() }.config_json();
    edit_config(dir.path(), |c| c["quantization_config"] = int4["quantization_config"].clone());
    let e = load_err(dir.path());
    assert!(
        matches!(&e, EngineError::QuantizationMismatch { tensor, stored: "dense", .. }
            if tensor == "model.layers.1.mlp.experts.0.gate_proj.weight"),
        "{e}"
    );
}

#[test]
fn a_truncated_shard_names_the_file() {
    let dir = tiny(&TinySpec { int4_experts: true, ..TinySpec::default() });
    let path = dir.path().join(SHARD2);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let e = load_err(dir.path());
    assert!(matches!(&e, EngineError::TruncatedShard { file, .. } if file.ends_with(SHARD2)), "{e}");
}

fn edit_index(dir: &Path, edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) {
    let path = dir.join("model.safetensors.index.json");
    let mut index: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(index["weight_map"].as_object_mut().unwrap());
    std::fs::write(path, index.to_string()).unwrap();
}

#[test]
fn an_index_that_names_the_wrong_shard_or_none_is_refused() {
    let dir = tiny(&TinySpec::default());
    edit_index(dir.path(), |map| {
        map.insert("model.norm.weight".into(), "model-00001-of-00002.safetensors".into());
    });
    let e = load_err(dir.path());
    assert!(matches!(&e, EngineError::Config { key, .. } if key == "weight_map.model.norm.weight"), "{e}");
    assert!(e.to_string().contains(SHARD2), "{e}");
    edit_index(dir.path(), |map| map.clear());
    let e = load_err(dir.path());
    assert!(
        matches!(&e, EngineError::Config { key, reason, .. } if key == "weight_map" && reason.contains("empty")),
        "{e}"
    );
}

#[test]
fn a_checkpoint_with_more_layers_than_the_config_is_refused() {
    let dir = tiny(&TinySpec::default());
    edit_config(dir.path(), |c| c["num_hidden_layers"] = 2.into());
    let e = load_err(dir.path());
    assert!(e.to_string().contains("num_hidden_layers"), "{e}");
}

#[test]
fn a_nan_in_an_embedding_row_is_an_error_naming_the_embedding() {
    let dir = tiny(&TinySpec::default());
    // Row 2 (a prompt token), column 5; the hidden size is 64.
    poison(dir.path(), "model.embed_tokens.weight", 2 * 64 + 5, f32::NAN);
    let model = Model::load(dir.path()).unwrap();
    let e = greedy_generate(&model, &[1, 2, 3], 4, &[]).unwrap_err();
    assert_eq!(non_finite(&e), ("embedding".into(), 1, 3 * 64));
    assert!(e.to_string().starts_with("embedding: 1 of 192 values are not finite"), "{e}");
    // The logits' forward checks too, and leaves the cache as it was; tokens that never read the row
    // are unaffected.
    let mut cache = model.new_cache();
    model.forward(&mut cache, &[1, 3], &[0, 1], None).unwrap();
    let e = model.forward(&mut cache, &[2], &[2], None).unwrap_err();
    assert_eq!(non_finite(&e), ("embedding".into(), 1, 64));
    assert_eq!(cache.len(), 2);
    assert_eq!(model.forward(&mut cache, &[4], &[2], None).unwrap().len(), 256);
}

#[test]
fn an_infinite_int4_scale_is_an_error_naming_the_moe_layer() {
    let dir = tiny(&int4_all_experts());
    let clean = greedy_generate(&Model::load(dir.path()).unwrap(), &[1, 2, 3], 4, &[]).unwrap();
    // Output row 0 of expert 3's down_proj ([64, 32], one group of 32 per row): column 0 of every
    // token's routed sum in layer 1, the first MoE layer.
    poison(dir.path(), "model.layers.1.mlp.experts.3.down_proj.weight_scale", 0, f32::INFINITY);
    let model = Model::load(dir.path()).unwrap();
    let e = greedy_generate(&model, &[1, 2, 3], 4, &[]).unwrap_err();
    assert_eq!(non_finite(&e), ("layer 1 moe".into(), 3, 3 * 64));
    assert!(e.to_string().starts_with("layer 1 moe: 3 of 192 values are not finite"), "{e}");
    assert_eq!(clean.len(), 4);
}

#[test]
fn the_first_op_that_is_not_finite_is_named_wherever_it_is() {
    // (tensor, value index, the op named, its non-finite values for the 3-token prompt, of how many)
    let cases = [
        ("model.layers.0.post_attention_layernorm.weight", 7, "layer 0 post_attention_layernorm", 3, 3 * 64),
        ("model.layers.0.mlp.down_proj.weight", 64 * 5, "layer 0 mlp.down_proj", 3, 3 * 64),
        ("model.layers.2.self_attn.kv_a_layernorm.weight", 0, "layer 2 self_attn.kv_a_layernorm", 3, 3 * 32),
        ("model.layers.1.self_attn.q_a_proj.weight", 0, "layer 1 self_attn.q_a_proj", 3, 3 * 32),
        ("model.norm.weight", 63, "norm", 3, 3 * 64),
        ("lm_head.weight", 9 * 64, "lm_head", 3, 3 * 256),
    ];
    for (tensor, index, op, count, total) in cases {
        let dir = tiny(&TinySpec::default());
        poison(dir.path(), tensor, index, f32::NAN);
        let model = Model::load(dir.path()).unwrap();
        let e = greedy_generate(&model, &[1, 2, 3], 2, &[]).unwrap_err();
        assert_eq!(non_finite(&e), (op.to_owned(), count, total), "{tensor}: {e}");
    }
}

#[test]
fn generate_stops_on_non_finite_logits_with_an_error_naming_the_op() {
    let run = |dir: &Path, extra: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_kdtree-engine"))
            .args(["generate", "--backend", "cpu", "--model", dir.to_str().unwrap(), "--prompt-ids", "1,2,3"])
            .args(extra)
            .output()
            .unwrap();
        (
            output.status,
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let nan_row = tiny(&TinySpec::default());
    poison(nan_row.path(), "model.embed_tokens.weight", 2 * 64, f32::NAN);
    let inf_scale = tiny(&int4_all_experts());
    poison(inf_scale.path(), "model.layers.1.mlp.experts.3.down_proj.weight_scale", 0, f32::INFINITY);
    for (dir, says) in [(&nan_row, "embedding: 1 of 192"), (&inf_scale, "layer 1 moe: 3 of 192")] {
        for extra in [&[][..], &["--spec", "ddtree"]] {
            let (status, stdout, stderr) = run(dir.path(), extra);
            assert_eq!(status.code(), Some(1), "{extra:?}: {stdout}{stderr}");
            assert!(stderr.contains(says) && stderr.contains("not finite"), "{extra:?}: {stderr}");
            assert!(!stdout.contains("tokens:") && !stderr.contains("panicked"), "{extra:?}: {stdout}{stderr}");
        }
    }
    // The same models before the edit generate as ever.
    let (status, stdout, stderr) = run(tiny(&int4_all_experts()).path(), &["--spec", "ddtree"]);
    assert!(status.success() && stdout.contains("identical to greedy: yes"), "{stdout}{stderr}");
}

#[test]
fn a_tensor_in_two_shards_is_refused_naming_both_with_or_without_an_index() {
    const SHARD1: &str = "model-00001-of-00002.safetensors";
    let dir = tiny(&TinySpec::default());
    // model.norm.weight, which the second shard holds, copied into the first too.
    let norm = SafetensorsFile::open(&dir.path().join(SHARD2)).unwrap().tensor("model.norm.weight").map(|t| Tensor {
        dtype: t.dtype(),
        shape: t.shape().to_vec(),
        data: t.data().to_vec(),
    });
    let first = dir.path().join(SHARD1);
    let file = SafetensorsFile::open(&first).unwrap();
    let mut tensors: Vec<(String, Tensor)> = file
        .names()
        .unwrap()
        .into_iter()
        .map(|n| {
            let t = file.tensor(&n).unwrap();
            (n, Tensor { dtype: t.dtype(), shape: t.shape().to_vec(), data: t.data().to_vec() })
        })
        .collect();
    drop(file);
    tensors.push(("model.norm.weight".into(), norm.unwrap()));
    write_file(&first, &tensors).unwrap();
    for index in [true, false] {
        if !index {
            std::fs::remove_file(dir.path().join("model.safetensors.index.json")).unwrap();
        }
        let e = load_err(dir.path());
        let m = e.to_string();
        assert!(matches!(&e, EngineError::DuplicateTensor { tensor, .. } if tensor == "model.norm.weight"), "{m}");
        assert!(m.contains(SHARD1) && m.contains(SHARD2), "{index}: {m}");
    }
}

#[test]
fn shared_experts_the_config_says_are_absent_are_refused_not_ignored() {
    let dir = tiny(&TinySpec::default());
    edit_config(dir.path(), |c| c["n_shared_experts"] = 0.into());
    let e = load_err(dir.path());
    let m = e.to_string();
    assert!(matches!(&e, EngineError::Config { key, .. } if key == "n_shared_experts"), "{m}");
    assert!(m.contains("config.json") && m.contains("model.layers.1.mlp.shared_experts."), "{m}");
}

/// Rewrites the headers of the shards so that the tensors `which` picks say `dtype` (of the same
/// width): the bytes stay what they were.
fn relabel(dir: &Path, which: impl Fn(&str) -> bool, dtype: safetensors::Dtype) {
    for shard in ["model-00001-of-00002.safetensors", SHARD2] {
        let path = dir.join(shard);
        let file = SafetensorsFile::open(&path).unwrap();
        let tensors: Vec<(String, Tensor)> = file
            .names()
            .unwrap()
            .into_iter()
            .map(|n| {
                let t = file.tensor(&n).unwrap();
                let dtype = if which(&n) { dtype } else { t.dtype() };
                (n, Tensor { dtype, shape: t.shape().to_vec(), data: t.data().to_vec() })
            })
            .collect();
        drop(file);
        write_file(&path, &tensors).unwrap();
    }
}

#[test]
fn a_bf16_tensor_relabelled_f16_is_refused_naming_it_and_why() {
    let dir = tiny(&TinySpec::default());
    relabel(dir.path(), |n| n == "model.norm.weight", safetensors::Dtype::F16);
    let e = load_err(dir.path());
    let message = e.to_string();
    assert!(
        matches!(&e, EngineError::MixedFloatDtypes { file, tensor, dtype, expected, .. }
            if file.ends_with(SHARD2) && tensor == "model.norm.weight" && dtype == "F16" && expected == "BF16"),
        "{message}"
    );
    assert!(message.contains("config.json declares torch_dtype bfloat16"), "{message}");
    // Without a declared dtype, the mix itself is refused.
    edit_config(dir.path(), |c| drop(c.as_object_mut().unwrap().remove("torch_dtype")));
    let message = load_err(dir.path()).to_string();
    assert!(
        message.contains("tensor model.norm.weight is F16, but BF16 is expected") && message.contains("is BF16)"),
        "{message}"
    );
    // Declared float16 over bf16 tensors: the first is refused.
    let dir = tiny(&TinySpec::default());
    edit_config(dir.path(), |c| c["torch_dtype"] = "float16".into());
    let message = load_err(dir.path()).to_string();
    assert!(message.contains("is BF16, but F16 is expected (") && message.contains("torch_dtype float16"), "{message}");
}

#[test]
fn int4_scales_may_have_their_own_16_bit_type_but_only_one() {
    let int4 = TinySpec { int4_experts: true, ..TinySpec::default() };
    let dir = tiny(&int4);
    relabel(dir.path(), |n| n.ends_with(".weight_scale"), safetensors::Dtype::F16);
    Model::load(dir.path()).unwrap();
    let dir = tiny(&int4);
    relabel(dir.path(), |n| n == "model.layers.1.mlp.experts.3.up_proj.weight_scale", safetensors::Dtype::F16);
    let message = load_err(dir.path()).to_string();
    assert!(message.contains("tensor model.layers.1.mlp.experts.3.up_proj.weight_scale is F16, but BF16"), "{message}");
    assert!(message.contains(".weight_scale in ") && message.contains("is BF16)"), "{message}");
}
