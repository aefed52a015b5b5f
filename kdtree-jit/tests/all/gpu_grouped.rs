//! Grouped W4A16 variants on a GPU against the CPU reference (each expert's rows by the per-expert
//! W4A16 reference), and against the stream variant of the same axes bit for bit. Routings as the
//! router draws them (uniform and skewed top-k), empty experts, one expert with every token, N and K
//! at and off tile edges; the gate-up form (X rows gathered by token) and the down form (rows in
//! sorted order); and the SiLU epilogue of the gate-up form against SwiGLU of the plain form's output.
//! Run on a GPU machine:
//! `cargo test --release -p kdtree-jit --test gpu_grouped -- --ignored --nocapture`.

use std::collections::HashSet;

use kdtree_jit::w4a16::accuracy::{bits_error, tolerance};
use kdtree_jit::w4a16::dense::DenseKernel;
use kdtree_jit::w4a16::grouped::{
    Alignment, Epilogue, GroupedKernel, W4a16Grouped, XRows, align, grouped_host, grouped_reference,
    grouped_silu_reference, interleave_gate_up, sample_routing,
};
use kdtree_jit::{Gpu, Target, Variant, compile_all};
use kdtree_quant::sample::Uniform;
use kdtree_quant::{Dtype, QuantizedWeight, Scales};

/// One routing and shape: `tokens` routed to `top_k` of `experts` ([`sample_routing`]'s skew and hot
/// expert), weights of `n` x `groups` groups of K.
#[derive(Clone, Copy, Debug)]
struct Case {
    name: &'static str,
    tokens: usize,
    experts: usize,
    top_k: usize,
    skew: f64,
    hot: Option<usize>,
    n: usize,
    groups: usize,
}

const fn case(
    name: &'static str,
    tokens: usize,
    experts: usize,
    top_k: usize,
    skew: f64,
    n: usize,
    groups: usize,
) -> Case {
    Case { name, tokens, experts, top_k, skew, hot: None, n, groups }
}

/// N: 64 (one column tile), 136 and 200 (partial last tiles), 520; K in groups: 1 (less than a stage),
/// 4, 13, 37 (not a multiple of a stage for any group size).
const CASES: [Case; 10] = [
    case("one token, K2-like top-8 of 384", 1, 384, 8, 0.0, 136, 13),
    case("3 tokens, top-2 of 4", 3, 4, 2, 0.0, 64, 4),
    case("16 tokens, uniform top-8 of 64", 16, 64, 8, 0.0, 200, 13),
    case("64 tokens, skewed top-8 of 64 (empty experts)", 64, 64, 8, 2.0, 136, 4),
    case("37 tokens, top-1 of 1: one expert takes all", 37, 1, 1, 0.0, 520, 37),
    case("64 tokens, skewed top-8 of 384", 64, 384, 8, 1.2, 64, 1),
    case("5 tokens, top-3 of 7", 5, 7, 3, 0.5, 200, 37),
    case("64 tokens, top-6 of 33, heavy skew", 64, 33, 6, 3.0, 72, 13),
    Case { hot: Some(3), ..case("every token on expert 3, top-4 of 16", 50, 16, 4, 0.0, 136, 4) },
    Case { hot: Some(0), ..case("64 tokens, top-1, all on expert 0 of 384", 64, 384, 1, 0.0, 200, 4) },
];

/// `v` rounded to `dtype`, as bits.
fn round_bits(dtype: Dtype, v: f32) -> u16 {
    match dtype {
        Dtype::F16 => half::f16::from_f32(v).to_bits(),
        Dtype::Bf16 => half::bf16::from_f32(v).to_bits(),
    }
}

/// X uniform in [-1, 1), rounded to `dtype`: (bits, f32 values).
fn activations(len: usize, dtype: Dtype, seed: u64) -> (Vec<u16>, Vec<f32>) {
    let bits: Vec<u16> = Uniform::new(seed).take(len).map(|u| round_bits(dtype, 2.0 * u - 1.0)).collect();
    let values = bits.iter().map(|&b| Scales { dtype, bits: vec![b] }.get(0)).collect();
    (bits, values)
}

/// q uniform in [-8, 7], scales uniform in [0.005, 0.025] (as `RandomGemm::random`), one weight per expert.
fn experts(count: usize, n: usize, k: usize, g: usize, dtype: Dtype, seed: u64) -> Vec<QuantizedWeight> {
    (0..count)
        .map(|e| {
            let mut u = Uniform::new(seed ^ (e as u64 + 1).wrapping_mul(0x9e37_79b9));
            let q: Vec<i8> = (0..n * k).map(|_| (u.next().unwrap() * 16.0) as i8 - 8).collect();
            let bits = (0..n * k / g).map(|_| round_bits(dtype, 0.005 + 0.02 * u.next().unwrap())).collect();
            QuantizedWeight::from_q(&q, n, k, g, Scales { dtype, bits }).expect("weight")
        })
        .collect()
}

/// What errors are relative to, as `RandomGemm::scale`: the largest reference output, or the size
/// of a sum of K products that does not cancel (largest row norm of X x largest column norm of W / sqrt(K)).
fn scale(x: &[f32], k: usize, ws: &[QuantizedWeight], reference: &[f32]) -> f32 {
    let norm = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>().sqrt();
    let x_norm = x.chunks_exact(k).map(norm).fold(0f32, f32::max);
    let w_norm =
        ws.iter().flat_map(|w| w.dequantize().chunks_exact(k).map(norm).collect::<Vec<_>>()).fold(0f32, f32::max);
    reference.iter().filter(|r| r.is_finite()).fold(x_norm * w_norm / (k as f32).sqrt(), |s, r| s.max(r.abs()))
}

/// The worst element of Y against the reference, with where it is: for the failure message.
fn worst(dtype: Dtype, y: &[u16], reference: &[f32], n: usize, a: &Alignment) -> String {
    let to_f32 = |b: u16| Scales { dtype, bits: vec![b] }.get(0);
    let (mut at, mut most) = (0, -1f32);
    for (i, (&b, &r)) in y.iter().zip(reference).enumerate() {
        let d = (to_f32(b) - r).abs();
        let d = if d.is_nan() { f32::INFINITY } else { d };
        if d > most {
            (at, most) = (i, d);
        }
    }
    let (row, col) = (at / n, at % n);
    let tile = a.tiles.iter().position(|&[_, s, r]| (s as usize..(s + r) as usize).contains(&row));
    format!(
        "worst at row {row} (expert {:?}, tile {tile:?}, assignment {}) column {col}: got {} want {}",
        a.expert_of(row),
        a.sorted[row],
        to_f32(y[at]),
        reference[at]
    )
}

/// Runs `c` in both forms (gate-up: X [tokens, K] gathered by token; down: X [assignments, K] in
/// sorted order); returns each form's relative error, or what went wrong.
fn run(gpu: &Gpu, kernel: &GroupedKernel, c: &Case, seed: u64) -> Result<[f64; 2], String> {
    let v = kernel.variant();
    let (g, dtype) = (v.group_size as usize, v.dtype);
    let (n, k) = (c.n, c.groups * g);
    let ids = sample_routing(c.tokens, c.experts, c.top_k, c.skew, c.hot, seed);
    let a = align(&ids, c.experts, v.bm as usize);
    let ws = experts(c.experts, n, k, g, dtype, seed);
    let mut errors = [0f64; 2];
    for (form, x_rows) in [(0, c.tokens), (1, ids.len())] {
        let (xb, xf) = activations(x_rows * k, dtype, seed + 7 * form as u64 + 1);
        let rows = if form == 0 { XRows::Gather { index: &a.sorted, div: c.top_k } } else { XRows::Identity };
        let reference = grouped_reference(&xf, k, rows, &ws, &a).map_err(|e| e.to_string())?;
        let y = grouped_host(gpu, kernel, Epilogue::Store, &xb, k, rows, &ws, &a).map_err(|e| e.to_string())?;
        let err = bits_error(dtype, &y, &reference, scale(&xf, k, &ws, &reference));
        let tolerance = tolerance(&v.stream());
        let what = if form == 0 { "gate-up (gathered rows)" } else { "down (sorted rows)" };
        if err.is_nan() || err > tolerance {
            return Err(format!(
                "{} / {} / {what}: {} tokens, {} experts ({} touched, {} tiles), {n} x {k}: error {err:.2e} > {tolerance:.2e}; {}",
                v.name(),
                c.name,
                c.tokens,
                c.experts,
                a.experts_touched,
                a.tiles.len(),
                worst(dtype, &y, &reference, n, &a)
            ));
        }
        errors[form] = err;
    }
    Ok(errors)
}

fn load(gpu: &Gpu, variants: &[W4a16Grouped]) -> Vec<GroupedKernel> {
    compile_all(variants, gpu.arch, None, |_| {})
        .into_iter()
        .map(|(v, c)| GroupedKernel::load(gpu, v, &c.expect("compiles")).expect("loads"))
        .collect()
}

/// Per (dtype, group size, bm) the first valid variant on this GPU, and the engine's default.
fn representatives(gpu: &Gpu) -> Vec<W4a16Grouped> {
    let target = Target { arch: gpu.arch };
    let mut seen = HashSet::new();
    let mut picked: Vec<W4a16Grouped> =
        W4a16Grouped::valid(&target).into_iter().filter(|v| seen.insert((v.dtype, v.group_size, v.bm))).collect();
    for dtype in [Dtype::Bf16, Dtype::F16] {
        let d = W4a16Grouped::default_for(dtype, 32, &target);
        if !picked.contains(&d) {
            picked.push(d);
        }
    }
    picked
}

#[test]
#[ignore = "needs a GPU"]
fn every_dtype_group_and_tile_height_matches_the_reference() {
    let gpu = Gpu::open(0).expect("a GPU");
    let kernels = load(&gpu, &representatives(&gpu));
    let mut failures = Vec::new();
    for kernel in &kernels {
        for (i, c) in CASES.iter().enumerate() {
            match run(&gpu, kernel, c, 100 + i as u64) {
                Ok([gu, down]) => {
                    println!("{:50} {:52} gate-up {gu:.2e} down {down:.2e}", kernel.variant().name(), c.name)
                }
                Err(e) => {
                    println!("FAIL {e}");
                    failures.push(e);
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

#[test]
#[ignore = "needs a GPU"]
fn every_valid_variant_matches_the_reference_on_two_routings() {
    let gpu = Gpu::open(0).expect("a GPU");
    let kernels = load(&gpu, &W4a16Grouped::valid(&Target { arch: gpu.arch }));
    let mut failures = Vec::new();
    for kernel in &kernels {
        for (i, c) in [CASES[3], CASES[6]].iter().enumerate() {
            if let Err(e) = run(&gpu, kernel, c, 200 + i as u64) {
                println!("FAIL {e}");
                failures.push(e);
            }
        }
    }
    println!("{} variants checked", kernels.len());
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// The grouped kernel's rows are the stream variant's (same axes, split-K 1) run per expert on that
/// expert's rows in blocks of bm, bit for bit: the same arithmetic, in the same order.
#[test]
#[ignore = "needs a GPU"]
fn rows_are_the_stream_variants_bit_for_bit() {
    let gpu = Gpu::open(0).expect("a GPU");
    let kernels = load(&gpu, &representatives(&gpu));
    let mut failures = Vec::new();
    for kernel in &kernels {
        let v = kernel.variant();
        let stream = v.stream();
        let compiled = kdtree_jit::compile_variant(&stream, gpu.arch, None).expect("compiles");
        let single = DenseKernel::load(&gpu, stream, &compiled).expect("loads");
        for (i, c) in [CASES[2], CASES[3], CASES[8]].iter().enumerate() {
            let (g, bm) = (v.group_size as usize, v.bm as usize);
            let (n, k) = (c.n, c.groups * g);
            let ids = sample_routing(c.tokens, c.experts, c.top_k, c.skew, c.hot, 300 + i as u64);
            let a = align(&ids, c.experts, bm);
            let ws = experts(c.experts, n, k, g, v.dtype, 300 + i as u64);
            let (xb, _) = activations(c.tokens * k, v.dtype, 400 + i as u64);
            let rows = XRows::Gather { index: &a.sorted, div: c.top_k };
            let y = grouped_host(&gpu, kernel, Epilogue::Store, &xb, k, rows, &ws, &a).expect("grouped runs");
            let mut want = vec![0u16; y.len()];
            for (e, w) in ws.iter().enumerate() {
                let (lo, hi) = (a.offsets[e] as usize, a.offsets[e + 1] as usize);
                for start in (lo..hi).step_by(bm) {
                    let end = (start + bm).min(hi);
                    let x: Vec<u16> =
                        (start..end).flat_map(|r| &xb[rows.of(r) * k..(rows.of(r) + 1) * k]).copied().collect();
                    let ys = single.gemm_host(&gpu, &x, end - start, w).expect("stream runs");
                    want[start * n..end * n].copy_from_slice(&ys);
                }
            }
            if let Some(at) = y.iter().zip(&want).position(|(a, b)| a != b) {
                let differ = y.iter().zip(&want).filter(|(a, b)| a != b).count();
                let msg = format!(
                    "{} / {}: {differ} of {} values differ from {}; first at row {} (expert {:?}) column {}: {:#06x} vs {:#06x}",
                    v.name(),
                    c.name,
                    y.len(),
                    stream.name(),
                    at / n,
                    a.expert_of(at / n),
                    at % n,
                    y[at],
                    want[at]
                );
                println!("FAIL {msg}");
                failures.push(msg);
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// The SiLU epilogue (weights interleaved) gives SwiGLU of the plain entry's gate-up output: each
/// element `silu(g) * u` of the stored (rounded) gate and up values, computed here on the CPU. The
/// GPU's expf and the CPU's may differ in the last f32 bit, which can move the final rounding by one
/// unit of the dtype, never more; kdtree-kernels' gpu_moe test checks the bits against the GPU chain.
/// The plain output itself is checked against the reference above; with it, this checks the fused
/// output against [`grouped_silu_reference`]'s arithmetic.
#[test]
#[ignore = "needs a GPU"]
fn the_silu_epilogue_is_swiglu_of_the_plain_gate_up_output() {
    let gpu = Gpu::open(0).expect("a GPU");
    let kernels = load(&gpu, &representatives(&gpu));
    let mut failures = Vec::new();
    for kernel in &kernels {
        let v = kernel.variant();
        let (g, dtype) = (v.group_size as usize, v.dtype);
        let to_f32 = |b: u16| Scales { dtype, bits: vec![b] }.get(0);
        for (i, c) in CASES.iter().enumerate() {
            let (n, k, inter) = (c.n, c.groups * g, c.n / 2);
            let ids = sample_routing(c.tokens, c.experts, c.top_k, c.skew, c.hot, 500 + i as u64);
            let a = align(&ids, c.experts, v.bm as usize);
            let ws = experts(c.experts, n, k, g, dtype, 500 + i as u64);
            let (xb, xf) = activations(c.tokens * k, dtype, 600 + i as u64);
            let rows = XRows::Gather { index: &a.sorted, div: c.top_k };
            let gu = grouped_host(&gpu, kernel, Epilogue::Store, &xb, k, rows, &ws, &a).expect("plain runs");
            let interleaved: Vec<QuantizedWeight> = ws.iter().map(|w| interleave_gate_up(w).expect("even")).collect();
            let act = grouped_host(&gpu, kernel, Epilogue::Silu, &xb, k, rows, &interleaved, &a).expect("fused runs");
            let reference = grouped_silu_reference(&xf, k, rows, &ws, &a, dtype).expect("reference");
            assert_eq!(act.len(), reference.len());
            let mut worst = (0, 0u16, 0u16);
            for r in 0..ids.len() {
                for f in 0..inter {
                    let (gate, up) = (to_f32(gu[r * n + f]), to_f32(gu[r * n + inter + f]));
                    let want = round_bits(dtype, gate / (1.0 + (-gate).exp()) * up);
                    let got = act[r * inter + f];
                    if want.abs_diff(got) > worst.1.abs_diff(worst.2) {
                        worst = (r * inter + f, got, want);
                    }
                }
            }
            let (at, got, want) = worst;
            if got.abs_diff(want) > 1 {
                let msg = format!(
                    "{} / {}: at row {} feature {}: {got:#06x} ({}), SwiGLU of the plain output {want:#06x} ({}), reference {}",
                    v.name(),
                    c.name,
                    at / inter,
                    at % inter,
                    to_f32(got),
                    to_f32(want),
                    reference[at]
                );
                println!("FAIL {msg}");
                failures.push(msg);
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// A tile table whose entries point past the experts or past Y must not make the kernel touch memory
/// outside its buffers: such entries are skipped, and the valid ones still computed.
#[test]
#[ignore = "needs a GPU"]
fn out_of_range_tiles_are_skipped() {
    let gpu = Gpu::open(0).expect("a GPU");
    let target = Target { arch: gpu.arch };
    let kernel = GroupedKernel::compile(&gpu, W4a16Grouped::default_for(Dtype::Bf16, 32, &target), None).unwrap();
    let (n, k) = (64, 64);
    // Four tokens, top-2, on experts 0 and 1 of 8: sorted rows 0..4 are expert 0's, 4..8 expert 1's;
    // room for 8 + 1 tiles, of which 2 are real.
    let ws = experts(8, n, k, 32, Dtype::Bf16, 9);
    let ids = [0u32, 1, 1, 0, 0, 1, 1, 0];
    let mut a = align(&ids, 8, 8);
    assert_eq!(a.tiles, [[0, 0, 4], [1, 4, 4]]);
    let good = a.tiles.clone();
    // Bogus entries after the good ones: an expert past the 8, a start past Y, rows past Y.
    a.tiles.extend([[9, 0, 2], [0, 99, 1], [1, 7, 200]]);
    let (xb, xf) = activations(ids.len() * k, Dtype::Bf16, 5);
    let y = grouped_host(&gpu, &kernel, Epilogue::Store, &xb, k, XRows::Identity, &ws, &a).expect("runs");
    a.tiles = good;
    let reference = grouped_reference(&xf, k, XRows::Identity, &ws, &a).unwrap();
    // The last bogus entry, clamped to row 7, recomputes it with expert 1, whose row it is anyway: every
    // row must still match.
    let err = bits_error(Dtype::Bf16, &y, &reference, scale(&xf, k, &ws, &reference));
    assert!(err <= tolerance(&kernel.variant().stream()), "error {err:.2e}");
}
