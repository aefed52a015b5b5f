//! On a GPU: the finite check of a forward on the CUDA backend against the CPU's. `argmax_checked`
//! counts exactly what the CPU counts, and a tiny model with one bad weight stops greedy and DDTree
//! decoding with the error the CPU backend gives, naming the same op. Run on a GPU machine:
//! `cargo test --release -p kdtree-engine --test cuda_finite -- --ignored`.

use crate::gpu_common::cuda;

use std::path::Path;
use std::sync::Arc;

use crate::poison::{int4_all_experts, non_finite, poison};
use kdtree_engine::cpu::{CpuBackend, CpuTensor};
use kdtree_engine::cuda::{CudaBackend, CudaTensor};
use kdtree_engine::registry::{Backend, KvStore};
use kdtree_engine::spec::{LookupDrafter, TreeLimits, ddtree_generate};
use kdtree_engine::tiny::{TinySpec, write_tiny_model};
use kdtree_engine::{EngineError, Model, greedy_generate};

#[test]
#[ignore = "needs a GPU"]
fn argmax_checked_counts_what_the_cpu_counts() {
    let gpu = cuda();
    // Rows of Kimi K2's vocabulary and of odd widths; NaN and both infinities sprinkled, a row all NaN.
    for (rows, cols) in [(1, 163_840), (5, 163_840), (3, 257), (130, 1001)] {
        let mut x = kdtree_quant::sample::symmetric(rows * cols, (rows * cols) as u64, 10.0);
        for (j, i) in (0..x.len()).step_by(4099).enumerate() {
            x[i] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][j % 3];
        }
        x[..cols].iter_mut().for_each(|v| *v = f32::NAN);
        let want = CpuBackend.argmax_checked(&CpuTensor { data: x.clone(), cols }).unwrap();
        let on_gpu = CudaTensor::new(gpu.stream().clone_htod(&x).unwrap(), rows, cols);
        assert_eq!(gpu.argmax_checked(&on_gpu).unwrap(), want, "{rows} x {cols}");
    }
}

/// The error of greedy decoding from the prompt 1, 2, 3 on `model`.
fn greedy_error<B: Backend>(model: &Model<B>) -> EngineError {
    greedy_generate(model, &[1, 2, 3], 4, &[]).expect_err("non-finite logits must be an error")
}

fn cases() -> Vec<(TinySpec, &'static str, usize, f32)> {
    vec![
        (TinySpec::default(), "model.embed_tokens.weight", 2 * 64 + 5, f32::NAN),
        (int4_all_experts(), "model.layers.1.mlp.experts.3.down_proj.weight_scale", 0, f32::INFINITY),
        (TinySpec::default(), "model.layers.2.self_attn.kv_a_layernorm.weight", 0, f32::NAN),
        (TinySpec::default(), "lm_head.weight", 9 * 64, f32::NAN),
    ]
}

fn poisoned(spec: &TinySpec, tensor: &str, index: usize, value: f32) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), spec).unwrap();
    poison(dir.path(), tensor, index, value);
    dir
}

fn on_gpu(dir: &Path) -> Model<CudaBackend> {
    Model::load_on(dir, Arc::new(cuda())).expect("loads on CUDA")
}

#[test]
#[ignore = "needs a GPU"]
fn a_bad_weight_is_named_as_on_the_cpu() {
    for (spec, tensor, index, value) in cases() {
        let dir = poisoned(&spec, tensor, index, value);
        let (cpu, gpu) = (non_finite(&greedy_error(&Model::load(dir.path()).unwrap())), on_gpu(dir.path()));
        let (op, count, total) = non_finite(&greedy_error(&gpu));
        // The same op, of the same size. The count too where one bad value reaches one column per row
        // through a plain copy, norm or GEMM; an INT4 expert's kernel may spread an infinity differently.
        assert_eq!((&op, total), (&cpu.0, cpu.2), "{tensor}");
        assert!(count > 0 && (tensor.contains("experts") || count == cpu.1), "{tensor}: {count} against {cpu:?}");
        // The failed forward left the cache empty: a forward on it starts at position 0 again.
        let mut cache = gpu.new_cache();
        assert!(gpu.forward(&mut cache, &[1, 2, 3], &[0, 1, 2], None).is_err());
        assert_eq!(cache.len(), 0);
    }
}

#[test]
#[ignore = "needs a GPU"]
fn ddtree_stops_on_the_same_error() {
    let (spec, tensor, index, value) = cases().swap_remove(1);
    let dir = poisoned(&spec, tensor, index, value);
    let model = on_gpu(dir.path());
    let mut drafter = LookupDrafter::new(2, model.config.vocab_size);
    let limits = TreeLimits { budget: 8, draft_len: 4 };
    let e = ddtree_generate(&model, &mut drafter, &[1, 2, 3], 6, limits, &[]).expect_err("an error");
    assert_eq!(non_finite(&e).0, "layer 1 moe");
}
