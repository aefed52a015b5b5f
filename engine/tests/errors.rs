//! Bad model folders: each a clear error that names the file and the tensor or key.

use std::path::Path;

use kdtree_engine::tiny::{TinySpec, write_tiny_model};
use kdtree_engine::{EngineError, Model};
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
    edit_config(dir.path(), |c| c["quantization_config"] = serde_json::json!({"quant_method": "fp8", "fmt": "e4m3"}));
    let e = load_err(dir.path());
    assert!(
        matches!(&e, EngineError::UnknownQuantization { file, format, .. } if file.ends_with("config.json") && format.contains("fp8")),
        "{e}"
    );
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
