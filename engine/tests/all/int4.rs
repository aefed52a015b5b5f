//! The mixed INT4 checkpoint against the same checkpoint with every INT4 weight replaced by its
//! dequantized values stored as f32: the W4A16 reference GEMM and the dense linear share one
//! fixed-order dot product, so the logits agree bit for bit.

use std::path::Path;

use kdtree_engine::Model;
use kdtree_engine::tiny::{TinySpec, write_tiny_model};
use kdtree_quant::{SafetensorsFile, Tensor, write_file};
use safetensors::Dtype;

/// Writes `dst` as `src` with INT4 weights dequantized to f32, in one shard without an index.
fn dequantized_copy(src: &Path, dst: &Path) {
    let mut tensors = Vec::new();
    for shard in ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"] {
        let file = SafetensorsFile::open(&src.join(shard)).unwrap();
        for name in file.names().unwrap() {
            if let Some(module) = name.strip_suffix(".weight_packed") {
                let q = file.quantized_weight(module, None).unwrap();
                tensors.push((format!("{module}.weight"), Tensor::new(Dtype::F32, vec![q.n, q.k], &q.dequantize())));
            } else if !name.ends_with(".weight_scale") && !name.ends_with(".weight_shape") {
                let t = file.tensor(&name).unwrap();
                tensors.push((name, Tensor { dtype: t.dtype(), shape: t.shape().to_vec(), data: t.data().to_vec() }));
            }
        }
    }
    std::fs::create_dir_all(dst).unwrap();
    write_file(&dst.join("model.safetensors"), &tensors).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    config.as_object_mut().unwrap().remove("quantization_config");
    std::fs::write(dst.join("config.json"), config.to_string()).unwrap();
}

#[test]
fn int4_logits_equal_the_dequantized_f32_models_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    let (int4_dir, f32_dir) = (dir.path().join("int4"), dir.path().join("f32"));
    let spec = TinySpec { int4_experts: true, seed: 5, ..TinySpec::default() };
    write_tiny_model(&int4_dir, &spec).unwrap();
    dequantized_copy(&int4_dir, &f32_dir);

    let int4 = Model::load(&int4_dir).unwrap();
    let dense = Model::load(&f32_dir).unwrap();
    let prompt = [9u32, 250, 3, 77, 77, 1];
    let positions: Vec<usize> = (0..prompt.len()).collect();
    let a = int4.forward(&mut int4.new_cache(), &prompt, &positions, None).unwrap();
    let b = dense.forward(&mut dense.new_cache(), &prompt, &positions, None).unwrap();
    assert_eq!(a, b);

    // Only routed experts are INT4 (gate/up [32, 64] and down [64, 32], 40 + 40 bytes per row of
    // 64 or 32 with bf16 scales), never attention, shared experts or lm_head.
    let bytes = int4.weight_bytes();
    assert_eq!(bytes.expert, 2 * 32 * (64 / 2 + 2 * 2) + 64 * (32 / 2 + 2));
    assert_eq!(bytes.int4, bytes.expert * bytes.experts_per_layer * bytes.moe_layers);
    assert_eq!(dense.weight_bytes().int4, 0);
}
