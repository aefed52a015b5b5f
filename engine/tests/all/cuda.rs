//! On a GPU: the CUDA backend against the CPU reference, and the batch invariance DDTree's greedy
//! exactness rests on, at the kernel and at the model level. Run on a GPU machine:
//! `cargo test --release -p kdtree-engine --test cuda -- --ignored --nocapture`, with NVRTC found
//! through `KDTREE_NVRTC_DIR=<CUDA>/targets/x86_64-linux/lib` or the loader path.

use std::path::Path;
use std::sync::Arc;

use crate::ddtree_common::{Script, Scripted, assert_exact, greedy_text};
use kdtree_engine::cpu::CpuBackend;
use kdtree_engine::cuda::{CudaBackend, CudaOptions, Mode, WeightShape, default_variant};
use kdtree_engine::registry::{Backend, KvDtype, KvStore};
use kdtree_engine::spec::{LookupDrafter, TreeLimits};
use kdtree_engine::tiny::{TinySpec, write_tiny_model};
use kdtree_engine::{Model, TreeMask, greedy_generate};
use kdtree_jit::dense16::Dense16;
use kdtree_jit::mla::widen::WIDE_ROWS;
use kdtree_jit::tune::bench::Timing;
use kdtree_jit::tune::db::{Entry, TuningDb};
use kdtree_jit::tune::env::Environment;
use kdtree_jit::tune::key::{ProblemKey, Shape};
use kdtree_jit::tune::peers::Peers;
use kdtree_jit::w4a16::dense::DenseKernel;
use kdtree_jit::w4a16::{Acc, Algo, RandomGemm, W4a16};
use kdtree_jit::{Arch, Gpu, Target, Variant, compile_variant};
use kdtree_quant::Dtype;
use kdtree_quant::compare::Measure;

/// The tiny model's INT4 expert shapes: gate and up stacked [64, 64] and down [64, 32], group 32,
/// bf16 scales.
const GATE_UP: WeightShape = WeightShape { n: 64, k: 64, group_size: 32, dtype: Dtype::Bf16 };
const DOWN: WeightShape = WeightShape { n: 64, k: 32, group_size: 32, dtype: Dtype::Bf16 };

/// Split-K variants for the expert shapes, so the DB path and the split-K reduction both run.
fn split_k(shape: &WeightShape, bm: u32, bk: u32, warps: u32) -> W4a16 {
    W4a16 { bm, bk, warps, split_k: 4, ..default_variant(shape) }
}

fn tuned() -> [(WeightShape, u32, W4a16); 3] {
    [
        (GATE_UP, 16, split_k(&GATE_UP, 32, 256, 8)),
        (DOWN, 16, split_k(&DOWN, 16, 128, 4)),
        // M = 1 only, for fast mode: a gemv variant.
        (GATE_UP, 1, W4a16 { algo: Algo::Gemv, bm: 1, stages: 1, ..split_k(&GATE_UP, 1, 128, 4) }),
    ]
}

/// The tiny model's dense weight shapes (N, K): q_a and kv_a (stacked), q_b, o_proj, the dense MLP's
/// gate and up (stacked, the shape of the LM head and the embedding too) and down, the shared
/// expert's.
const DENSE: [(u32, u32); 6] = [(80, 64), (128, 32), (64, 64), (256, 64), (64, 128), (64, 32)];

/// Streamed variants for the dense shapes, tuned (in the DB) faster than cuBLAS: exact mode's at M
/// bucket 16 runs in blocks of 8 rows with split-K; fast mode's at M = 1.
fn streamed() -> [(u32, Dense16); 2] {
    let v = Dense16 { rows: 8, warps: 4, unroll: 1, stages: 3, split_k: 2, ..Dense16::default_for(Dtype::Bf16) };
    [(16, v), (1, Dense16 { warps: 8, unroll: 2, stages: 2, split_k: 1, ..v })]
}

/// The variants whose rows are checked for independence, on a [M, 416] x [200, 416]ᵀ product.
fn row_test_variants() -> Vec<W4a16> {
    let base = default_variant(&WeightShape { n: 200, k: 13 * 32, group_size: 32, dtype: Dtype::Bf16 });
    let f16 = W4a16 { dtype: Dtype::F16, ..base };
    vec![
        base,
        W4a16 { bm: 32, bk: 256, warps: 8, split_k: 4, ..base },
        W4a16 { bm: 64, ..base },
        W4a16 { acc: Acc::F16, ..f16 },
        W4a16 { algo: Algo::Gemv, bm: 4, stages: 1, split_k: 4, ..base },
        W4a16 { algo: Algo::Stream, bm: 16, stages: 2, split_k: 2, ..base },
        W4a16 { algo: Algo::Stream, bm: 4, ..base },
    ]
}

/// Runs without a GPU, so that a change of the validity rule shows here rather than on the GPU.
#[test]
fn the_variants_these_tests_run_are_valid_on_sm_90() {
    let target = Target { arch: Arch(90) };
    for v in tuned().map(|(_, _, v)| v).into_iter().chain(row_test_variants()) {
        assert_eq!(v.check(&target), Ok(()), "{}", v.name());
    }
    for (_, v) in streamed() {
        assert_eq!(v.check(&target), Ok(()), "{}", v.name());
    }
}

/// A tuning DB, fresh for this GPU, holding [`tuned`] and [`streamed`] for every [`DENSE`] shape.
fn write_db(path: &Path) {
    let gpu = Gpu::open(0).expect("a GPU");
    let env = Environment::detect(&gpu).expect("environment");
    let timing = Timing { median_us: 1.0, p10_us: 1.0, p90_us: 1.0, reps: 1 };
    let cublas = Timing { median_us: 2.0, ..timing };
    let dense = DENSE.into_iter().flat_map(|(n, k)| streamed().map(|(bucket, v)| (Shape { n, k }, bucket, v)));
    let dense: Vec<Entry> = dense
        .map(|(shape, bucket, v)| Entry {
            key: ProblemKey::dense16(bucket, shape, Dtype::Bf16, gpu.arch),
            env: env.clone(),
            variant: v.name(),
            m: bucket,
            timing,
            error: 0.0,
            peers: Peers { cublas_bf16: Some(cublas), cublas_f16: None, copy_gbps: 0.0 },
            bytes: 0,
            timed: 1,
            rejected: Vec::new(),
            tuned_at_unix: 0,
        })
        .collect();
    let entries = tuned().map(|(s, bucket, v)| Entry {
        key: ProblemKey::w4a16(bucket, Shape { n: s.n as u32, k: s.k as u32 }, 32, s.dtype, gpu.arch),
        env: env.clone(),
        variant: v.name(),
        m: bucket,
        timing,
        error: 0.0,
        peers: Peers { cublas_bf16: None, cublas_f16: None, copy_gbps: 0.0 },
        bytes: 0,
        timed: 1,
        rejected: Vec::new(),
        tuned_at_unix: 0,
    });
    let entries = entries.into_iter().chain(dense).collect();
    TuningDb { entries, ..TuningDb::default() }.save(path).expect("DB written");
}

type OnGpu = Model<CudaBackend>;

struct Fixture {
    _dir: tempfile::TempDir,
    cpu: Model<CpuBackend>,
    /// Default variants (no DB).
    cuda: OnGpu,
    /// Exact mode with the split-K DB (and streamed dense linears).
    tuned: OnGpu,
    /// Fast mode with the same DB.
    fast: OnGpu,
}

fn on_gpu(model_dir: &Path, tuning_db: &Path, mode: Mode) -> OnGpu {
    let cuda = CudaBackend::open(&CudaOptions { tuning_db: tuning_db.into(), mode, ..crate::gpu_common::options() })
        .expect("CUDA");
    Model::load_on(model_dir, Arc::new(cuda)).expect("loads on CUDA")
}

/// The tiny INT4 model (3 layers: dense, then two MoE) on the CPU and on the GPU three ways.
fn fixture() -> Fixture {
    fixture_of(&TinySpec { int4_experts: true, seed: 11, ..TinySpec::default() })
}

fn fixture_of(spec: &TinySpec) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let model_dir = dir.path().join("model");
    write_tiny_model(&model_dir, spec).unwrap();
    let db = dir.path().join("tuning.json");
    write_db(&db);
    let exact = Mode::Exact { m: 16 };
    Fixture {
        cpu: Model::load(&model_dir).unwrap(),
        cuda: on_gpu(&model_dir, &dir.path().join("missing.json"), exact),
        tuned: on_gpu(&model_dir, &db, exact),
        fast: on_gpu(&model_dir, &db, Mode::Fast),
        _dir: dir,
    }
}

fn prefill<B: Backend>(model: &Model<B>, prompt: &[u32]) -> (B::Cache, Vec<f32>) {
    let mut cache = model.new_cache();
    let positions: Vec<usize> = (0..prompt.len()).collect();
    let logits = model.forward(&mut cache, prompt, &positions, None).unwrap();
    (cache, logits)
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// How far the CUDA backend's logits may be from the CPU's, relative to the largest logit
/// ([`MEASURE`], the workspace's one measure, norm-wise without a floor). On the
/// GPU every linear rounds its input to bf16 (eps / 2), and the INT4 ones their output too; about
/// ten roundings of eps / 2 lie between the embedding and the logits along the longest chain (q,
/// kv, o, gate/up, down in each layer, diluted by the residual stream, which stays f32): 8 eps bounds
/// it with room to spare, and is still far below a wrong op's error (O(1) of the logits' scale).
const TOLERANCE: f64 = 8.0 * 0.0078125;

const MEASURE: Measure = Measure::whole(0.0);

#[test]
#[ignore = "needs a GPU"]
fn cuda_logits_match_the_cpu_backend_within_bf16_rounding() {
    // One MoE layer after the dense one, so that a rounding difference before the router is unlikely
    // to flip a near-tie in routing (which would move a logit by far more than rounding does).
    let f = fixture_of(&TinySpec { int4_experts: true, seed: 11, num_hidden_layers: 2, ..TinySpec::default() });
    let prompt = [9u32, 250, 3, 77, 77, 1, 40, 41, 42, 43, 9, 250, 3, 77, 77, 1, 5, 6];
    let (_, reference) = prefill(&f.cpu, &prompt);
    for (name, model) in [("default variants", &f.cuda), ("tuned split-K", &f.tuned), ("fast", &f.fast)] {
        let shapes: Vec<WeightShape> = model.backend().plans().into_iter().map(|(s, _)| s).collect();
        // The INT4 experts run grouped (one w4a16_grouped launch per projection and layer), outside the
        // per-shape W4A16 plans, which only the INT4 linears would need; the tiny models have none.
        assert!(shapes.is_empty(), "no per-shape plans for grouped experts: {shapes:?}");
        // Every dense shape runs streamed with the DB, on cuBLAS without.
        let plans = model.backend().streamed_plans();
        assert_eq!(plans.len(), DENSE.len(), "{name}: {plans:?}");
        for (shape, variant) in plans {
            assert!(DENSE.contains(&(shape.n as u32, shape.k as u32)), "{name}: {shape}");
            assert_eq!(variant.is_some(), name != "default variants", "{name}: {shape}");
        }
        let (_, logits) = prefill(model, &prompt);
        let err = MEASURE.error(&logits, &reference);
        println!("{name}: CUDA vs CPU logits, max |diff| / max |logit| = {err:.2e} (tolerance {TOLERANCE:.2e})");
        assert!(err <= TOLERANCE, "{name}: {err:.3e}");
    }
}

/// Greedy tokens on CUDA equal the CPU's, or part at a near tie: the two backends sum in different
/// orders (cuBLAS, the tensor-core MLA kernel), so where the CPU's two best logits lie closer than
/// the backends' logits differ, no order is more right than the other. At the first differing
/// token, both backends' logits for the shared prefix must agree within [`TOLERANCE`], and the CPU's
/// margin between the two chosen tokens must lie within twice their measured difference: a parting
/// that rounding does not explain fails.
#[test]
#[ignore = "needs a GPU"]
fn cuda_greedy_tokens_equal_the_cpu_backends_on_the_tiny_models() {
    let specs = [
        TinySpec { int4_experts: true, seed: 3, ..TinySpec::default() },
        TinySpec { seed: 4, ..TinySpec::default() },
        TinySpec { seed: 5, q_lora_rank: None, rope_interleave: false, ..TinySpec::default() },
    ];
    for spec in &specs {
        let f = fixture_of(spec);
        let prompt = [5u32, 6, 7, 8, 9, 5, 6, 7];
        let cpu = greedy_generate(&f.cpu, &prompt, 16, &[]).unwrap();
        let gpu = greedy_generate(&f.cuda, &prompt, 16, &[]).unwrap();
        println!("seed {}: cpu {cpu:?}\n        gpu {gpu:?}", spec.seed);
        let Some(k) = cpu.iter().zip(&gpu).position(|(c, g)| c != g) else {
            assert_eq!(gpu, cpu, "seed {}", spec.seed);
            continue;
        };
        let prefix = [&prompt[..], &cpu[..k]].concat();
        let last = |logits: Vec<f32>| logits[logits.len() - f.cpu.config.vocab_size..].to_vec();
        let (c, g) = (last(prefill(&f.cpu, &prefix).1), last(prefill(&f.cuda, &prefix).1));
        let whole = c.iter().fold(0f32, |m, x| m.max(x.abs()));
        let diff = c.iter().zip(&g).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        let margin = c[cpu[k] as usize] - c[gpu[k] as usize];
        println!(
            "seed {}: parts at token {k}: CPU margin {margin:.3e}, logits differ by {diff:.3e} (max |logit| {whole:.3e})",
            spec.seed
        );
        assert!(f64::from(diff / whole) <= TOLERANCE, "seed {}: logits differ by {diff:.3e} of {whole:.3e}", spec.seed);
        assert!(
            margin <= 2.0 * diff,
            "seed {}: token {k} parts with a margin of {margin:.3e}, beyond rounding",
            spec.seed
        );
    }
}

/// A binary tree of `n` nodes after the prompt: node i's parent is (i - 1) / 2.
fn binary_tree(n: usize) -> (Vec<Option<usize>>, Vec<usize>) {
    let parents: Vec<Option<usize>> = (0..n).map(|i| (i > 0).then(|| (i - 1) / 2)).collect();
    let mut depths = vec![0; n];
    for i in 1..n {
        depths[i] = depths[(i - 1) / 2] + 1;
    }
    (parents, depths)
}

#[test]
#[ignore = "needs a GPU"]
fn tree_forward_equals_sequential_forward_bitwise_on_cuda() {
    let f = fixture();
    let vocab = f.tuned.config.vocab_size;
    let prompt = [3u32, 1, 4, 1, 5, 9, 2];
    let n = 40; // more rows than one 32-row tile, spread over the experts
    let (parents, depths) = binary_tree(n);
    let tokens: Vec<u32> = (0..n as u32).map(|i| (i * 37 + 11) % vocab as u32).collect();
    for model in [&f.cuda, &f.tuned] {
        let (mut cache, _) = prefill(model, &prompt);
        let positions: Vec<usize> = depths.iter().map(|d| prompt.len() + d).collect();
        let logits = model.forward(&mut cache, &tokens, &positions, Some(&TreeMask::from_parents(&parents))).unwrap();
        for row in 0..n {
            let mut path = vec![row];
            while let Some(p) = parents[*path.last().unwrap()] {
                path.push(p);
            }
            let (mut cache, _) = prefill(model, &prompt);
            let mut alone = Vec::new();
            for &node in path.iter().rev() {
                let position = cache.len();
                alone = model.forward(&mut cache, &[tokens[node]], &[position], None).unwrap();
            }
            assert_eq!(bits(&logits[row * vocab..(row + 1) * vocab]), bits(&alone), "row {row}");
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn compaction_on_the_gpu_keeps_the_accepted_path() {
    // A tree forward, then compaction to one path: the next forward equals a forward after the path alone.
    let f = fixture();
    let prompt = [3u32, 1, 4];
    let parents = [None, Some(0), Some(0), Some(2)];
    let tokens = [10u32, 20, 30, 40];
    let (mut tree, _) = prefill(&f.tuned, &prompt);
    f.tuned.forward(&mut tree, &tokens, &[3, 4, 4, 5], Some(&TreeMask::from_parents(&parents))).unwrap();
    tree.compact(3, &[0, 2, 3]).unwrap();
    assert_eq!(tree.len(), 6);
    assert!(tree.compact(3, &[1, 0]).is_err(), "keep must ascend");
    let (mut path, _) = prefill(&f.tuned, &[3, 1, 4, 10, 30, 40]);
    let a = f.tuned.forward(&mut tree, &[50], &[6], None).unwrap();
    let b = f.tuned.forward(&mut path, &[50], &[6], None).unwrap();
    assert_eq!(bits(&a), bits(&b));
}

#[test]
#[ignore = "needs a GPU"]
fn ddtree_equals_greedy_token_for_token_on_cuda() {
    let f = fixture();
    let vocab = f.tuned.config.vocab_size;
    let prompts: [&[u32]; 3] = [&[1, 2, 3, 1, 2, 3, 1, 2], &[200, 7], &[5, 5, 5, 5, 9, 9, 9]];
    for model in [&f.cuda, &f.tuned] {
        for (i, prompt) in prompts.iter().enumerate() {
            let text = greedy_text(model, prompt, 24);
            for limits in [TreeLimits { budget: 8, draft_len: 4 }, TreeLimits { budget: 40, draft_len: 8 }] {
                let stats = assert_exact(model, &mut LookupDrafter::new(3, vocab), prompt, 24, limits, None);
                println!("prompt {i} {limits:?} lookup: tau {:.2}", stats.tau());
                let script = Script::Random { seed: i as u64 + 1 };
                assert_exact(model, &mut Scripted::new(text.clone(), vocab, script), prompt, 24, limits, None);
                let oracle = assert_exact(
                    model,
                    &mut Scripted::new(text.clone(), vocab, Script::Oracle),
                    prompt,
                    24,
                    limits,
                    None,
                );
                assert!(oracle.tau() > 1.0, "the oracle's drafts are accepted");
            }
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn w4a16_kernels_compute_each_row_independently_of_the_others_bitwise() {
    let gpu = Gpu::open(0).expect("a GPU");
    for v in row_test_variants() {
        let compiled = compile_variant(&v, gpu.arch, None).expect("compiles");
        let kernel = DenseKernel::load(&gpu, v, &compiled).expect("loads");
        let (n, k) = (200, 13 * 32);
        let m = if v.algo.has_row_limit() { v.bm as usize } else { 37 };
        let p = RandomGemm::random(m, n, k, 32, v.dtype, 5).expect("problem");
        let all = kernel.gemm_host(&gpu, &p.x, m, &p.w).expect("runs");
        let rows = |from: usize, to: usize| kernel.gemm_host(&gpu, &p.x[from * k..to * k], to - from, &p.w).unwrap();
        for r in 0..m {
            assert_eq!(rows(r, r + 1), all[r * n..(r + 1) * n], "{}: row {r} alone", v.name());
        }
        let (a, b) = (1, m.min(22));
        assert_eq!(rows(a, b), all[a * n..b * n], "{}: rows {a}..{b}", v.name());
        println!("{}: rows of M = {m} equal to the same rows alone and in a batch of {}", v.name(), b - a);
    }
}

/// An FP8 cache on CUDA: decoding stays exact where exactness is defined, DDTree equal to greedy
/// token for token, and a compacted cache (entries gathered and quantized again) continuing like the
/// accepted path alone; after a prompt that fills more than one page. Its logits against the CPU's
/// FP8 cache are printed beside the bf16 cache's, not bounded: the kernels' bits are checked in
/// kdtree-jit (an FP8 variant equals its bf16 twin; append writes the CPU quantizer's bytes), but a
/// latent that differs in its last bits between the backends can round to the other e4m3 code (a
/// step of 2^-3, against bf16's 2^-8), and the tiny models amplify that: their logits move by half
/// their scale under FP8's rounding alone (CPU, FP8 against bf16).
#[test]
#[ignore = "needs a GPU (sm_89 or later: e4m3)"]
fn an_fp8_cache_on_cuda_decodes_exactly() {
    let Fixture { mut cpu, mut tuned, _dir, .. } = fixture();
    let vocab = cpu.config.vocab_size;
    let prompt: Vec<u32> = (0..150u32).map(|i| (i * 37 + 5) % vocab as u32).collect();
    let (_, cpu_bf16) = prefill(&cpu, &prompt);
    let (_, gpu_bf16) = prefill(&tuned, &prompt);
    let bf16_bytes = tuned.heads().kv_bytes_per_token(tuned.config.num_hidden_layers);
    cpu.set_kv_dtype(KvDtype::Fp8).unwrap();
    tuned.set_kv_dtype(KvDtype::Fp8).unwrap();
    let fp8_bytes = tuned.heads().kv_bytes_per_token(tuned.config.num_hidden_layers);
    assert!(fp8_bytes < bf16_bytes, "{fp8_bytes} vs {bf16_bytes}");
    let (_, cpu_fp8) = prefill(&cpu, &prompt);
    let (_, gpu_fp8) = prefill(&tuned, &prompt);
    assert!(gpu_fp8.iter().all(|x| x.is_finite()));
    assert_ne!(bits(&gpu_fp8), bits(&gpu_bf16), "the FP8 cache is in use");
    println!(
        "logits over 150 tokens, of the largest: CUDA vs CPU {:.2e} (bf16 cache), {:.2e} (fp8); fp8 vs bf16 {:.2e} (CPU), {:.2e} (CUDA)",
        MEASURE.error(&gpu_bf16, &cpu_bf16),
        MEASURE.error(&gpu_fp8, &cpu_fp8),
        MEASURE.error(&cpu_fp8, &cpu_bf16),
        MEASURE.error(&gpu_fp8, &gpu_bf16)
    );

    let text = greedy_text(&tuned, &prompt[..40], 40);
    let limits = TreeLimits { budget: 16, draft_len: 6 };
    assert_exact(&tuned, &mut LookupDrafter::new(3, vocab), &prompt[..40], 40, limits, None);
    let oracle = assert_exact(&tuned, &mut Scripted::new(text, vocab, Script::Oracle), &prompt[..40], 40, limits, None);
    assert!(oracle.tau() > 1.0, "the oracle's drafts are accepted");

    let (mut tree, _) = prefill(&tuned, &prompt[..70]);
    tuned
        .forward(
            &mut tree,
            &[10, 20, 30, 40],
            &[70, 71, 71, 72],
            Some(&TreeMask::from_parents(&[None, Some(0), Some(0), Some(2)])),
        )
        .unwrap();
    tree.compact(70, &[0, 2, 3]).unwrap();
    let (mut path, _) = prefill(&tuned, &[&prompt[..70], &[10, 30, 40]].concat());
    let a = tuned.forward(&mut tree, &[50], &[73], None).unwrap();
    let b = tuned.forward(&mut path, &[50], &[73], None).unwrap();
    assert_eq!(bits(&a), bits(&b));

    // A forward of WIDE_ROWS rows or more widens each layer to bf16 once and runs the FP8 variant's
    // bf16 twin over it; with the widening off every forward runs the FP8 variant. Both give the
    // same bits, for a prompt, a tree and a row after them (forwards of the same sizes on both, so
    // that every other kernel is the same too).
    let options = CudaOptions {
        tuning_db: _dir.path().join("tuning.json"),
        mode: Mode::Exact { m: 16 },
        fp8_widen: false,
        ..crate::gpu_common::options()
    };
    let mut plain = Model::load_on(&_dir.path().join("model"), Arc::new(CudaBackend::open(&options).unwrap())).unwrap();
    plain.set_kv_dtype(KvDtype::Fp8).unwrap();
    let rows = 150;
    let long: Vec<u32> = (0..rows as u32).map(|i| (i * 53 + 11) % vocab as u32).collect();
    let ((mut wide, a), (mut narrow, b)) = (prefill(&tuned, &long), prefill(&plain, &long));
    assert_eq!(bits(&a), bits(&b), "a prompt of {rows} rows");
    let parents: Vec<Option<usize>> = (0..WIDE_ROWS + 3).map(|i| i.checked_sub(1).map(|p| p / 2)).collect();
    let mask = TreeMask::from_parents(&parents);
    let tokens: Vec<u32> = (0..parents.len() as u32).map(|i| 3 + i).collect();
    let positions: Vec<usize> = (0..parents.len()).map(|i| rows + (i + 1).ilog2() as usize).collect();
    let a = tuned.forward(&mut wide, &tokens, &positions, Some(&mask)).unwrap();
    let b = plain.forward(&mut narrow, &tokens, &positions, Some(&mask)).unwrap();
    assert_eq!(bits(&a), bits(&b), "a tree of {} rows", tokens.len());
    wide.truncate(rows);
    narrow.truncate(rows);
    let a = tuned.forward(&mut wide, &[7], &[rows], None).unwrap();
    let b = plain.forward(&mut narrow, &[7], &[rows], None).unwrap();
    assert_eq!(bits(&a), bits(&b), "the next row");
}
