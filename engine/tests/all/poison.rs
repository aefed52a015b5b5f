//! Tiny models with one bad weight: what the finite checks of a forward are tested on (errors.rs on the
//! CPU, cuda_finite.rs on the GPU).

use std::path::Path;

use kdtree_engine::EngineError;
use kdtree_engine::tiny::TinySpec;
use kdtree_quant::{SafetensorsFile, Tensor, write_file};

/// Sets value `index` of tensor `tensor` (bf16 or f32) of the tiny model in `dir` to `value`.
pub fn poison(dir: &Path, tensor: &str, index: usize, value: f32) {
    let index_path = dir.join("model.safetensors.index.json");
    let map: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(index_path).unwrap()).unwrap();
    let path = dir.join(map["weight_map"][tensor].as_str().unwrap());
    let file = SafetensorsFile::open(&path).unwrap();
    let tensors: Vec<(String, Tensor)> = file
        .names()
        .unwrap()
        .into_iter()
        .map(|n| {
            let t = file.tensor(&n).unwrap();
            let mut data = t.data().to_vec();
            if n == tensor {
                match t.dtype() {
                    safetensors::Dtype::BF16 => {
                        let bits = half::bf16::from_f32(value).to_bits().to_le_bytes();
                        data[2 * index..2 * index + 2].copy_from_slice(&bits);
                    }
                    safetensors::Dtype::F32 => data[4 * index..4 * index + 4].copy_from_slice(&value.to_le_bytes()),
                    other => panic!("{tensor} is {other:?}"),
                }
            }
            (n, Tensor { dtype: t.dtype(), shape: t.shape().to_vec(), data })
        })
        .collect();
    drop(file);
    write_file(&path, &tensors).unwrap();
}

/// A tiny model whose routed experts are INT4 and all run for every token (top 8 of 8, one group), so
/// that a bad value in any expert reaches the output.
pub fn int4_all_experts() -> TinySpec {
    TinySpec { int4_experts: true, num_experts_per_tok: 8, n_group: 1, topk_group: 1, ..TinySpec::default() }
}

/// The (op, count, total) of a [`EngineError::NonFinite`]; any other error fails the test.
pub fn non_finite(e: &EngineError) -> (String, usize, usize) {
    match e {
        EngineError::NonFinite { op, count, total } => (op.clone(), *count, *total),
        e => panic!("not a NonFinite error: {e}"),
    }
}
