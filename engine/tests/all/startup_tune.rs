//! Tuning at startup: the W4A16 problems a checkpoint makes the CUDA backend plan, against the
//! tuning presets, and (on a GPU) tuned into an empty DB before the load plans from it.

use std::collections::BTreeSet;
use std::time::Duration;

use kdtree_engine::cuda::{CudaBackend, CudaOptions, Mode, MoeKernels, Source, missing};
use kdtree_engine::model::PlannedWeights;
use kdtree_engine::tiny::{Sharding, TinySpec, write_tiny_model};
use kdtree_engine::{Model, greedy_generate};
use kdtree_jit::tune::db::TuningDb;
use kdtree_jit::tune::env::Environment;
use kdtree_jit::tune::key::{KIMI_K2, KIMI_K2_EXPERTS, KIMI_K2_MOE, Shape};
use kdtree_jit::{Arch, Variant};

/// Kimi K2's routed experts (hidden 7168, expert intermediate 2048, group 32, bf16 scales) in a
/// model whose other weights are tiny, so it is written in a moment.
fn k2_experts() -> TinySpec {
    TinySpec {
        vocab_size: 64,
        num_attention_heads: 1,
        q_lora_rank: Some(32),
        kv_lora_rank: 32,
        qk_nope_head_dim: 16,
        qk_rope_head_dim: 16,
        v_head_dim: 16,
        intermediate_size: 64,
        num_experts_per_tok: 1,
        n_shared_experts: 0,
        max_position_embeddings: 64,
        rope_scaling: None,
        sharding: Sharding::Count(1),
        ..TinySpec::k2_slice(2, 1)
    }
}

#[test]
fn the_kimi_k2_presets_hold_the_shapes_the_engine_plans_for_k2s_experts() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), &k2_experts()).unwrap();
    let weights = PlannedWeights::read(dir.path(), None).unwrap();
    let env = Environment::sample_h200();
    let empty = TuningDb::default();
    let planned = missing(&weights, MoeKernels::PerExpert, Mode::Exact { m: 1 }, &empty, &env, Arch(90));
    let shapes: BTreeSet<Shape> = planned.w4a16.iter().map(|(s, _)| Shape { n: s.n as u32, k: s.k as u32 }).collect();
    // Gate and up run as one stacked [2 x 2048, 7168] weight, then down: not two 2048-row GEMMs.
    assert_eq!(shapes, KIMI_K2_EXPERTS.shapes.iter().copied().collect());
    assert!(shapes.iter().all(|s| KIMI_K2.shapes.contains(s)));
    for (s, _) in &planned.w4a16 {
        assert_eq!((s.group_size as u32, s.dtype), (KIMI_K2_EXPERTS.group_size, KIMI_K2_EXPERTS.dtype));
    }
    // The grouped MoE path (the default) runs none of them through per-shape plans.
    let grouped = missing(&weights, MoeKernels::default(), Mode::Fast, &empty, &env, Arch(90));
    assert!(grouped.w4a16.is_empty());
    // It tunes the grouped step instead: the kimi-k2-moe preset's layer at its largest T.
    let [(moe, tokens)] = grouped.moe[..] else { panic!("one MoE step: {grouped:?}") };
    assert_eq!((moe.layer.gate_up, moe.layer.down), (KIMI_K2_MOE.layer.gate_up, KIMI_K2_MOE.layer.down));
    assert_eq!((moe.group_size, moe.dtype, tokens), (KIMI_K2_MOE.group_size, KIMI_K2_MOE.dtype, 256));
}

/// A tiny model with INT4 routed experts (K a multiple of the kernels' tiles), and a folder for a DB.
fn int4_experts_and_an_empty_db() -> (tempfile::TempDir, tempfile::TempDir) {
    let model = tempfile::tempdir().unwrap();
    let spec = TinySpec { int4_experts: true, hidden_size: 128, moe_intermediate_size: 128, ..TinySpec::default() };
    write_tiny_model(model.path(), &spec).unwrap();
    (model, tempfile::tempdir().unwrap())
}

#[test]
#[ignore = "needs a GPU"]
fn an_empty_db_gains_the_models_shapes_at_startup_and_the_load_runs_them() {
    let (model, db_dir) = int4_experts_and_an_empty_db();
    let db_path = db_dir.path().join("tuning.json");
    // Per-expert MoE: the tiny model's only INT4 weights are its routed experts.
    let options =
        CudaOptions { tuning_db: db_path.clone(), moe: MoeKernels::PerExpert, ..crate::gpu_common::options() };
    let mut cuda = CudaBackend::open(&options).unwrap();
    let summary = cuda.tune_at_startup(model.path(), None, Duration::from_secs(120), &mut |_| {}).unwrap().unwrap();
    // The two INT4 expert shapes, then the five dense bf16 ones: [q_a; kv_a], q_b, o_proj, the
    // MLPs' [gate; up] (= the head's 256 x 128) and down.
    assert_eq!((summary.tuned, summary.skipped, summary.failed), (7, 0, 0), "{summary}");
    let saved = TuningDb::open(&db_path).unwrap();
    let of_op = |op: &str| -> BTreeSet<(u32, u32, u32)> {
        saved.entries.iter().filter(|e| e.key.op == op).map(|e| (e.key.n, e.key.k, e.key.m_bucket)).collect()
    };
    assert_eq!(of_op("w4a16"), BTreeSet::from([(256, 128, 1), (128, 128, 1)]));
    let dense = BTreeSet::from([(80, 128, 1), (128, 32, 1), (128, 64, 1), (256, 128, 1), (128, 128, 1)]);
    assert_eq!(of_op("dense16"), dense);
    // Nothing is left to tune, and the load plans every shape from the new entries.
    assert!(cuda.tune_at_startup(model.path(), None, Duration::from_secs(120), &mut |_| {}).unwrap().is_none());
    let model = Model::load_on(model.path(), std::sync::Arc::new(cuda)).unwrap();
    let plans = model.backend().plans();
    assert_eq!(plans.len(), 2);
    for (shape, plan) in plans {
        assert_eq!(plan.general.source, Source::Tuned { bucket: 1, nearest: false }, "{shape}");
    }
    // Each dense shape runs the streamed winner where it beat cuBLAS, cuBLAS elsewhere.
    let streamed = model.backend().streamed_plans();
    assert_eq!(streamed.iter().map(|(s, _)| (s.n as u32, s.k as u32, 1)).collect::<BTreeSet<_>>(), dense);
    for (shape, variant) in streamed {
        let e = saved
            .entries
            .iter()
            .find(|e| e.key.op == "dense16" && (e.key.n, e.key.k) == (shape.n as u32, shape.k as u32));
        let e = e.expect("an entry for every dense shape");
        let won = e.timing.median_us < e.peers.cublas_bf16.expect("cuBLAS timed beside").median_us;
        assert_eq!(variant.map(|v| v.name()), won.then(|| e.variant.clone()), "{shape}");
    }
    assert_eq!(greedy_generate(&model, &[1, 2, 3], 4, &[]).unwrap().len(), 4);
}

#[test]
#[ignore = "needs a GPU"]
fn the_grouped_moe_step_is_tuned_at_startup_once_and_the_load_runs() {
    let (model, db_dir) = int4_experts_and_an_empty_db();
    let db_path = db_dir.path().join("tuning.json");
    // Grouped MoE (the default), exact mode at M = 1.
    let mut cuda =
        CudaBackend::open(&CudaOptions { tuning_db: db_path.clone(), ..crate::gpu_common::options() }).unwrap();
    let summary = cuda.tune_at_startup(model.path(), None, Duration::from_secs(300), &mut |_| {}).unwrap().unwrap();
    // The MoE step at T = 1 and the five dense shapes; no per-shape INT4 problem.
    assert_eq!((summary.tuned, summary.skipped, summary.failed), (6, 0, 0), "{summary}");
    let saved = TuningDb::open(&db_path).unwrap();
    let moe: Vec<_> = saved.entries.iter().filter(|e| e.key.op == "w4a16_moe").collect();
    assert_eq!(moe.iter().map(|e| (e.key.n, e.key.k, e.key.m_bucket)).collect::<Vec<_>>(), [(256, 128, 1)]);
    assert!(cuda.tune_at_startup(model.path(), None, Duration::from_secs(300), &mut |_| {}).unwrap().is_none());
    let model = Model::load_on(model.path(), std::sync::Arc::new(cuda)).unwrap();
    assert_eq!(greedy_generate(&model, &[1, 2, 3], 4, &[]).unwrap().len(), 4);
}
