//! The compute dtype (issue 28, dtype fidelity): an f32 checkpoint computes in f32 by default on every
//! backend, and its greedy tokens equal those of an independent float64 transcription of
//! transformers' DeepSeek-V3 (`fixtures/numpy_greedy_f32.json`, the command that made it inside);
//! `--dtype` chooses otherwise and says so. On the CPU here, on CUDA where a GPU is (`#[ignore]`d).

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use crate::ddtree_common::{Script, Scripted, assert_exact, greedy_text};
use kdtree_engine::cuda::CudaBackend;
use kdtree_engine::registry::{Backend, ComputeDtype, KvDtype};
use kdtree_engine::spec::TreeLimits;
use kdtree_engine::tiny::{TinySpec, write_tiny_model};
use kdtree_engine::{EngineError, Model, greedy_generate};

#[derive(serde::Deserialize)]
struct Fixture {
    new_tokens: usize,
    cases: Vec<Case>,
}

#[derive(serde::Deserialize)]
struct Case {
    seed: u64,
    q_proj: bool,
    rope_half_split: bool,
    prompt: Vec<u32>,
    tokens: Vec<u32>,
}

fn fixture() -> Fixture {
    serde_json::from_str(include_str!("../fixtures/numpy_greedy_f32.json")).unwrap()
}

/// The tiny f32 checkpoint of a case, as `make-tiny --f32` writes it.
fn f32_spec(case: &Case) -> TinySpec {
    TinySpec {
        seed: case.seed,
        f32_weights: true,
        q_lora_rank: if case.q_proj { None } else { TinySpec::default().q_lora_rank },
        rope_interleave: !case.rope_half_split,
        ..TinySpec::default()
    }
}

fn written(spec: &TinySpec) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), spec).unwrap();
    dir
}

/// How many of the fixture's cases `load` gives the reference's greedy tokens for; prints each.
fn agreement<B: Backend>(what: &str, load: impl Fn(&Path) -> Model<B>) -> (usize, usize) {
    let f = fixture();
    let mut agree = 0;
    for case in &f.cases {
        let dir = written(&f32_spec(case));
        let model = load(dir.path());
        let ours = greedy_generate(&model, &case.prompt, f.new_tokens, &[]).unwrap();
        let first = ours.iter().zip(&case.tokens).position(|(a, b)| a != b);
        println!("{what}: seed {} prompt {:?}: first difference at {first:?}", case.seed, case.prompt);
        agree += usize::from(first.is_none() && ours.len() == case.tokens.len());
    }
    println!("{what}: {agree} of {} agree with the reference", f.cases.len());
    (agree, f.cases.len())
}

#[test]
fn an_f32_checkpoint_computes_in_f32_on_the_cpu_and_agrees_with_the_reference_greedily() {
    let (agree, total) = agreement("cpu f32", |dir| {
        let model = Model::load(dir).unwrap();
        let d = model.dtypes();
        assert_eq!((d.compute, d.checkpoint, d.chosen), (ComputeDtype::F32, ComputeDtype::F32, false));
        assert_eq!(model.heads().kv, KvDtype::F32);
        model
    });
    assert_eq!(agree, total);
}

#[test]
fn the_f32_fixture_tells_the_dtypes_apart() {
    // Computed in bf16 (weights rounded at load, a bf16 cache), some greedy continuations part from
    // the reference's: agreement on every case is evidence of f32 arithmetic, not of luck.
    let (agree, total) = agreement("cpu --dtype bf16", |dir| {
        let model = Model::load_as(dir, Arc::new(kdtree_engine::cpu::CpuBackend), Some(ComputeDtype::Bf16)).unwrap();
        assert_eq!(model.dtypes().to_string(), "bf16 (asked for; the checkpoint is f32)");
        assert_eq!(model.heads().kv, KvDtype::Bf16);
        model
    });
    assert!(agree < total, "bf16 arithmetic agreed on all {total}");
}

#[test]
fn a_bf16_checkpoint_widened_to_f32_computes_what_its_own_weights_give() {
    // bf16 widens to f32 exactly: --dtype f32 changes only the cache's dtype, which the default
    // load with an f32 cache matches bit for bit.
    let dir = written(&TinySpec { seed: 5, ..TinySpec::default() });
    let mut native = Model::load(dir.path()).unwrap();
    assert_eq!(native.dtypes().to_string(), "bf16 (the checkpoint's)");
    assert_eq!(native.heads().kv, KvDtype::Bf16);
    native.set_kv_dtype(KvDtype::F32).unwrap();
    let wide = Model::load_as(dir.path(), Arc::new(kdtree_engine::cpu::CpuBackend), Some(ComputeDtype::F32)).unwrap();
    assert_eq!(wide.heads().kv, KvDtype::F32);
    let prompt = [5u32, 9, 200, 31];
    let positions: Vec<usize> = (0..prompt.len()).collect();
    let a = native.forward(&mut native.new_cache(), &prompt, &positions, None).unwrap();
    let b = wide.forward(&mut wide.new_cache(), &prompt, &positions, None).unwrap();
    assert_eq!(a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), b.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
}

fn generate(model: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kdtree-engine"))
        .args(["generate", "--backend", "cpu", "--model", model.to_str().unwrap(), "--prompt-ids", "1,2,3"])
        .args(["--max-new", "4"])
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn generate_states_the_compute_dtype_and_dtype_chooses_it() {
    let f32_model = written(&TinySpec { f32_weights: true, ..TinySpec::default() });
    let says = |args: &[&str], parts: &[&str]| {
        let output = generate(f32_model.path(), args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{args:?}: {stderr}");
        assert!(parts.iter().all(|p| stderr.contains(p)), "{args:?}: {stderr}\nshould say {parts:?}");
    };
    says(&[], &["compute dtype: f32 (the checkpoint's)", "KV cache: MLA latent in f32"]);
    says(&["--dtype", "bf16"], &["compute dtype: bf16 (asked for; the checkpoint is f32)", "MLA latent in bf16"]);
    says(
        &["--dtype", "f16", "--kv-dtype", "f32"],
        &["compute dtype: f16 (asked for; the checkpoint is f32)", "in f32"],
    );
    says(&["--dtype", "f32"], &["compute dtype: f32 (the checkpoint's)"]);
    // fp8: 32 e4m3 codes and a scale byte padded to 48 bytes, 16 bf16 rope values: 80 bytes a layer.
    says(&["--dtype", "bf16", "--kv-dtype", "fp8"], &["MLA latent in fp8, 80 bytes a token a layer"]);
    // The CUDA widening's room is not the cache's entries: the line is the same without it.
    says(&["--dtype", "bf16", "--kv-dtype", "fp8", "--no-fp8-widen"], &["MLA latent in fp8, 80 bytes a token a layer"]);
    let output = generate(f32_model.path(), &["--kv-dtype", "fp8", "--mla-variant", "mla_decode_mma_h64n32_s2_x64"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("reads a bf16 cache, the model's is fp8"), "{stderr}");

    let output = generate(f32_model.path(), &["--dtype", "bf16", "--json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let out: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(out["dtype"], serde_json::json!({"compute": "bf16", "checkpoint": "f32", "chosen": true}));
    assert_eq!(out["kv_dtype"], "bf16");

    // Not a dtype: clap names the flag and the ones there are, before anything loads.
    let output = generate(f32_model.path(), &["--dtype", "f64"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--dtype") && stderr.contains("[possible values: bf16, f16, f32]"), "{stderr}");
}

#[test]
fn make_tiny_writes_an_f32_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("f32");
    let made = Command::new(env!("CARGO_BIN_EXE_kdtree-engine"))
        .args(["make-tiny", "--f32", "--seed", "1", "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    assert!(String::from_utf8_lossy(&made.stdout).contains("tiny f32 model (seed 1)"));
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["torch_dtype"], "float32");
    assert_eq!(Model::load(&out).unwrap().dtypes().checkpoint, ComputeDtype::F32);
}

// On a GPU.

fn on_cuda(dir: &Path, dtype: Option<ComputeDtype>) -> Model<CudaBackend> {
    Model::load_as(dir, Arc::new(crate::gpu_common::cuda()), dtype).expect("loads on CUDA")
}

#[test]
#[ignore = "needs a CUDA GPU: the f32 path on CUDA (f32 GEMMs with no TF32, the f32 MLA family)"]
fn an_f32_checkpoint_computes_in_f32_on_cuda_and_agrees_with_the_reference_greedily() {
    let (agree, total) = agreement("cuda f32", |dir| {
        let model = on_cuda(dir, None);
        assert_eq!(model.dtypes().compute, ComputeDtype::F32);
        assert_eq!(model.heads().kv, KvDtype::F32);
        model
    });
    assert_eq!(agree, total, "CUDA's f32 greedy tokens part from the reference's");
}

#[test]
#[ignore = "needs a CUDA GPU: the f32 path on CUDA against the CPU's"]
fn cuda_f32_logits_follow_the_cpus_closely_and_ddtree_equals_greedy() {
    let f = fixture();
    let case = &f.cases[0];
    let dir = written(&f32_spec(case));
    let (cpu, gpu) = (Model::load(dir.path()).unwrap(), on_cuda(dir.path(), None));
    let positions: Vec<usize> = (0..case.prompt.len()).collect();
    let a = cpu.forward(&mut cpu.new_cache(), &case.prompt, &positions, None).unwrap();
    let b = gpu.forward(&mut gpu.new_cache(), &case.prompt, &positions, None).unwrap();
    // f32 throughout, summed in other orders: the numpy reference fixtures measure the CPU within 5e-7
    // of the logits' scale, so 1e-5 leaves room for the GPU's orders yet catches any bf16 rounding
    // (2^-9 relative, measured 4e-3 of the scale through two layers).
    let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
    let worst = a.iter().zip(&b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale;
    println!("largest |cuda - cpu| / scale: {worst:e}");
    assert!(worst < 1e-5, "{worst:e}");
    // Tree forwards (masks, compaction of the f32 cache) give greedy decoding's tokens.
    let vocab = gpu.config.vocab_size;
    let text = greedy_text(&gpu, &case.prompt, 24);
    for limits in [TreeLimits { budget: 8, draft_len: 4 }, TreeLimits { budget: 40, draft_len: 8 }] {
        assert_exact(
            &gpu,
            &mut Scripted::new(text.clone(), vocab, Script::Random { seed: 3 }),
            &case.prompt,
            24,
            limits,
            None,
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: which dtypes CUDA computes in"]
fn cuda_refuses_f16_compute_and_keeps_a_bf16_checkpoint_in_bf16() {
    let dir = written(&TinySpec { seed: 5, ..TinySpec::default() });
    let err = Model::load_as(dir.path(), Arc::new(crate::gpu_common::cuda()), Some(ComputeDtype::F16)).unwrap_err();
    // What is accepted, and no flag: the CLI names --dtype (cli::name_the_flag).
    let message = err.to_string();
    assert!(message.contains("cannot compute in f16") && message.contains("bf16 or f32"), "{message}");
    assert!(!message.contains("--") && matches!(err, EngineError::ComputeDtype { .. }), "{message}");
    // A bf16 checkpoint loads as it always has: bf16 weights, a bf16 cache, the f32 cache refused.
    let mut model = on_cuda(dir.path(), None);
    assert_eq!((model.dtypes().compute, model.heads().kv), (ComputeDtype::Bf16, KvDtype::Bf16));
    assert!(model.set_kv_dtype(KvDtype::F32).is_err());
    // --dtype bf16 on a bf16 checkpoint is the default, bit for bit.
    let chosen = on_cuda(dir.path(), Some(ComputeDtype::Bf16));
    let prompt = [5u32, 9, 200, 31];
    let positions: Vec<usize> = (0..prompt.len()).collect();
    let a = model.forward(&mut model.new_cache(), &prompt, &positions, None).unwrap();
    let b = chosen.forward(&mut chosen.new_cache(), &prompt, &positions, None).unwrap();
    assert_eq!(a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), b.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    // An f32 checkpoint computed in bf16 on CUDA: a bf16 cache, and the f32 one refused.
    let f32_dir = written(&TinySpec { f32_weights: true, ..TinySpec::default() });
    let mut bf16 = on_cuda(f32_dir.path(), Some(ComputeDtype::Bf16));
    assert_eq!(bf16.heads().kv, KvDtype::Bf16);
    assert!(greedy_generate(&bf16, &[1, 2, 3], 8, &[]).is_ok());
    assert!(bf16.set_kv_dtype(KvDtype::F32).is_err());
}

#[test]
fn an_fp8_cache_needs_whole_scale_groups_and_changes_nothing_when_refused() {
    let odd = written(&TinySpec { kv_lora_rank: 48, ..TinySpec::default() });
    let mut model = Model::load(odd.path()).unwrap();
    let err = model.set_kv_dtype(KvDtype::Fp8).unwrap_err().to_string();
    assert!(err.contains("kv_lora_rank 48 is not a multiple of its scale groups of 32"), "{err}");
    assert_eq!(model.heads().kv, KvDtype::Bf16);
    let fine = written(&TinySpec::default());
    let mut model = Model::load(fine.path()).unwrap();
    model.set_kv_dtype(KvDtype::Fp8).unwrap();
    assert_eq!((model.heads().kv, model.heads().kv_bytes_per_token(2)), (KvDtype::Fp8, 160));
    assert!(greedy_generate(&model, &[1, 2, 3], 8, &[]).is_ok());
}
