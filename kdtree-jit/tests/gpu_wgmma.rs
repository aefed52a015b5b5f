//! The wgmma family (sm_90a) on a Hopper GPU: every variant against the CPU reference, on odd shapes
//! and on Kimi K2's, and a timing table against today's best `mma`-family variant and cuBLAS bf16,
//! measured in the same run. Run on the H200:
//! `cargo test --release -p kdtree-jit --test gpu_wgmma -- --ignored --nocapture --test-threads 1`.

use std::collections::HashMap;

use cudarc::cublas::CudaBlas;
use cudarc::driver::sys::CUdevice_attribute;
use kdtree_jit::cublas::{self, GemmType};
use kdtree_jit::tune::bench::{BenchConfig, measure};
use kdtree_jit::tune::clock::CudaClock;
use kdtree_jit::tune::flush::{FlushMode, Flusher};
use kdtree_jit::w4a16::accuracy::{bits_error, tolerance_for};
use kdtree_jit::w4a16::wgmma::{self, W4a16Wgmma, WgmmaBuffers, WgmmaKernel};
use kdtree_jit::w4a16::{self, Acc, GemmBuffers, RandomGemm, W4a16, W4a16Kernel};
use kdtree_jit::{Cache, Gpu, Target, Variant, compile_all};
use kdtree_quant::Dtype;

/// Kimi K2's projections (N x K): gate-up and down of the dense MLP / shared experts, and two more.
const K2: [(usize, usize); 4] = [(18432, 7168), (7168, 18432), (4096, 7168), (7168, 2048)];
/// The M the family is for; the correctness test adds odd ones.
const MS: [usize; 5] = [16, 32, 64, 128, 256];

/// The cubin cache of the machine (`KDTREE_CACHE_DIR`), shared by the tests of one run.
fn cache() -> Cache {
    Cache::open(&Cache::default_dir()).expect("a cubin cache")
}

/// Every valid wgmma variant for the GPU (compiled for its sm_90a target) that `keep` keeps, loaded.
fn wgmma_kernels(gpu: &Gpu, keep: impl Fn(&W4a16Wgmma) -> bool) -> Vec<WgmmaKernel> {
    let arch = gpu.arch.specific();
    let valid: Vec<W4a16Wgmma> = W4a16Wgmma::valid(&Target { arch }).into_iter().filter(keep).collect();
    assert!(!valid.is_empty(), "no wgmma variant for {arch}");
    compile_all(&valid, arch, Some(&cache()), |_| {})
        .into_iter()
        .map(|(v, c)| WgmmaKernel::load(gpu, v, &c.expect("compiles")).expect("loads"))
        .collect()
}

/// Y of `kernel` for the first `m` rows of `p` on device buffers uploaded once, Y poisoned with NaN
/// first so that an element the kernel does not write fails.
struct Device {
    x: cudarc::driver::CudaSlice<u16>,
    packed: cudarc::driver::CudaSlice<u32>,
    scales: cudarc::driver::CudaSlice<u16>,
    y: cudarc::driver::CudaSlice<u16>,
}

impl Device {
    fn upload(gpu: &Gpu, v: &W4a16Wgmma, x: &[u16], p: &RandomGemm, m_max: usize) -> Device {
        let d = wgmma::repack(v, &p.w).expect("repacks");
        let s = &gpu.stream;
        Device {
            x: s.clone_htod(x).unwrap(),
            packed: s.clone_htod(&d.packed).unwrap(),
            scales: s.clone_htod(&d.scales).unwrap(),
            y: s.alloc_zeros(m_max * p.w.n).unwrap(),
        }
    }

    fn launch(&mut self, gpu: &Gpu, kernel: &WgmmaKernel, m: usize, n: usize, k: usize) {
        let b = WgmmaBuffers {
            x: self.x.slice(..m * k),
            packed: &self.packed,
            scales: &self.scales,
            y: self.y.slice_mut(..m * n),
        };
        kernel.launch(gpu, m, n, k, b).expect("launches");
    }

    fn run(&mut self, gpu: &Gpu, kernel: &WgmmaKernel, m: usize, n: usize, k: usize) -> Vec<u16> {
        gpu.stream.memcpy_htod(&vec![u16::MAX; m * n], &mut self.y.slice_mut(..m * n)).unwrap();
        self.launch(gpu, kernel, m, n, k);
        gpu.stream.clone_dtoh(&self.y.slice(..m * n)).unwrap()
    }
}

/// Checks every kernel on the first `m` rows of `p` for each m of `ms`; returns the failures.
fn check(gpu: &Gpu, kernels: &[WgmmaKernel], p: &RandomGemm, ms: &[usize]) -> Vec<String> {
    let (n, k) = (p.w.n, p.w.k);
    let mut device = Device::upload(gpu, kernels[0].variant(), &p.x, p, p.m);
    let mut failures = Vec::new();
    for kernel in kernels {
        let v = kernel.variant();
        for &m in ms {
            let y = device.run(gpu, kernel, m, n, k);
            let err = bits_error(v.dtype, &y, &p.reference[..m * n], p.scale);
            let tolerance = tolerance_for(v.dtype, v.acc);
            println!("{:50} m={m:4} n={n:5} k={k:5} error {err:.2e}", v.name());
            if err.is_nan() || err > tolerance {
                failures.push(format!("{} at {m}x{n}x{k}: {err:.2e} > {tolerance:.2e}", v.name()));
            }
        }
    }
    failures
}

#[test]
#[ignore = "needs a GPU"]
fn every_variant_matches_the_reference_on_odd_shapes() {
    let gpu = Gpu::open(0).expect("a GPU");
    let kernels = wgmma_kernels(&gpu, |_| true);
    // (M, N, K in groups): N off the 64- and 128-feature tiles, M off every token tile, K not a
    // multiple of 64 (group 32) nor of any bk.
    let shapes = [(1, 200, 13), (37, 520, 16), (130, 136, 7), (256, 328, 5), (300, 72, 3)];
    let mut failures = Vec::new();
    for dtype in [Dtype::F16, Dtype::Bf16] {
        for g in [32, 64, 128] {
            let of: Vec<WgmmaKernel> =
                kernels.iter().filter(|c| c.variant().dtype == dtype && c.variant().group_size == g).cloned().collect();
            for (i, &(m, n, groups)) in shapes.iter().enumerate() {
                let p = RandomGemm::random(m, n, groups * g as usize, g as usize, dtype, i as u64).expect("problem");
                failures.extend(check(&gpu, &of, &p, &[m]));
            }
        }
    }
    assert_eq!(kernels.len(), W4a16Wgmma::valid(&Target { arch: gpu.arch.specific() }).len());
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
#[ignore = "needs a GPU"]
fn every_bf16_group_32_variant_matches_the_reference_on_k2_shapes() {
    let gpu = Gpu::open(0).expect("a GPU");
    let kernels = wgmma_kernels(&gpu, |v| v.dtype == Dtype::Bf16 && v.group_size == 32);
    // One 256-row problem per shape: the reference is batch-invariant, so its first m rows are M = m's.
    let ms = [1, 16, 32, 64, 100, 128, 200, 256];
    let mut failures = Vec::new();
    for (i, &(n, k)) in K2.iter().enumerate() {
        let p = RandomGemm::random(256, n, k, 32, Dtype::Bf16, 100 + i as u64).expect("problem");
        failures.extend(check(&gpu, &kernels, &p, &ms));
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// One cell of the table: the fastest variant's median and name.
type Best = Option<(f64, String)>;

fn faster(best: &mut Best, us: f64, name: String) {
    if best.as_ref().is_none_or(|(b, _)| us < *b) {
        *best = Some((us, name));
    }
}

#[test]
#[ignore = "needs a GPU"]
fn k2_timing_table_against_mma_and_cublas() {
    let gpu = Gpu::open(0).expect("a GPU");
    let sms = gpu.ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).unwrap() as u32;
    let mut clock = CudaClock::new(gpu.stream.clone());
    let mut flusher = Flusher::new(&gpu, FlushMode::Read, sms).expect("flusher");
    let blas = CudaBlas::new(gpu.stream.clone()).expect("cuBLAS");
    let cfg = BenchConfig { warmup: 3, reps: 40, batch: 10, give_up: 1.3 };
    let wgmma = wgmma_kernels(&gpu, |v| v.dtype == Dtype::Bf16 && v.group_size == 32);
    // Today's kernels for K2's format: every valid W4A16 point of bf16, group 32, f32 sums.
    let today: Vec<W4a16> = W4a16::valid(&Target { arch: gpu.arch })
        .into_iter()
        .filter(|v| v.dtype == Dtype::Bf16 && v.group_size == 32 && v.acc == Acc::F32)
        .collect();
    let today: Vec<W4a16Kernel> = compile_all(&today, gpu.arch, Some(&cache()), |_| {})
        .into_iter()
        .map(|(v, c)| W4a16Kernel::load(&gpu, v, &c.expect("compiles")).expect("loads"))
        .collect();
    let m_max = MS[MS.len() - 1];
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for (i, &(n, k)) in K2.iter().enumerate() {
        // One row of X and its reference, repeated m_max times: every row of Y must be the reference's.
        let p = RandomGemm::random(1, n, k, 32, Dtype::Bf16, 200 + i as u64).expect("problem");
        let x: Vec<u16> = p.x.iter().copied().cycle().take(m_max * k).collect();
        let mut device = Device::upload(&gpu, wgmma[0].variant(), &x, &p, m_max);
        let d = w4a16::repack(today[0].variant(), &p.w).expect("repacks");
        let s = &gpu.stream;
        let (packed, scales) = (s.clone_htod(&d.packed).unwrap(), s.clone_htod(&d.scales).unwrap());
        let ws_len = today.iter().map(|t| w4a16::workspace_len(t.variant(), m_max, n)).max().unwrap_or(0);
        let mut workspace = s.alloc_zeros::<f32>(ws_len.max(1)).unwrap();
        let mut y = s.alloc_zeros::<u16>(m_max * n).unwrap();
        let dense: Vec<u16> = p.w.dequantize().iter().map(|&v| half::bf16::from_f32(v).to_bits()).collect();
        let dense = s.clone_htod(&dense).unwrap();
        for &m in &MS {
            let flush = |f: &mut Flusher| f.flush(&gpu.stream);
            let mut best_wgmma: Best = None;
            for kernel in &wgmma {
                let known = best_wgmma.as_ref().map(|b| b.0);
                let t = measure(
                    &mut clock,
                    &cfg,
                    known,
                    || flush(&mut flusher),
                    || {
                        device.launch(&gpu, kernel, m, n, k);
                        Ok(())
                    },
                )
                .expect("times");
                faster(&mut best_wgmma, t.median_us, kernel.variant().name());
            }
            let mut best_today: Best = None;
            for kernel in today.iter().filter(|t| w4a16::supports(t.variant(), m, n, k)) {
                s.memset_zeros(&mut workspace).unwrap();
                let known = best_today.as_ref().map(|b| b.0);
                let t = measure(
                    &mut clock,
                    &cfg,
                    known,
                    || flush(&mut flusher),
                    || {
                        let b = GemmBuffers {
                            x: device.x.slice(..m * k),
                            packed: &packed,
                            scales: &scales,
                            y: y.slice_mut(..m * n),
                            workspace: &mut workspace,
                        };
                        Ok(kernel.launch(&gpu, m, n, k, b)?)
                    },
                )
                .expect("times");
                faster(&mut best_today, t.median_us, kernel.variant().name());
            }
            let types = (GemmType::Bf16, GemmType::Bf16);
            let cublas_us = measure(
                &mut clock,
                &BenchConfig::FINAL,
                None,
                || flush(&mut flusher),
                || {
                    let (xv, wv) = (device.x.slice(..m * k), dense.slice(..));
                    Ok(cublas::gemm(&blas, s, types, (m, n, k), &xv, &wv, &mut y.slice_mut(..m * n))?)
                },
            )
            .expect("times")
            .median_us;
            // The winner's output, every row against the reference row.
            let (Some((wg_us, wg_name)), Some((mma_us, mma_name))) = (best_wgmma, best_today) else {
                panic!("{n}x{k} m={m}: a family had no variant")
            };
            let winner = wgmma.iter().find(|w| w.variant().name() == wg_name).unwrap();
            let out = device.run(&gpu, winner, m, n, k);
            let reference: Vec<f32> = p.reference.iter().copied().cycle().take(m * n).collect();
            let err = bits_error(Dtype::Bf16, &out, &reference, p.scale);
            if err.is_nan() || err > tolerance_for(Dtype::Bf16, Acc::F32) {
                failures.push(format!("{wg_name} at {m}x{n}x{k}: error {err:.2e}"));
            }
            assert!(wg_us > 0.0 && mma_us > 0.0 && cublas_us > 0.0, "{wg_us} {mma_us} {cublas_us}");
            rows.push((n, k, m, wg_us, wg_name, mma_us, mma_name, cublas_us));
        }
    }
    println!("\n| N x K | M | wgmma µs | best wgmma | mma-family µs | best today | cuBLAS bf16 µs | wgmma / cuBLAS |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut by_shape: HashMap<(usize, usize), usize> = HashMap::new();
    for (n, k, m, wg_us, wg_name, mma_us, mma_name, cublas_us) in &rows {
        *by_shape.entry((*n, *k)).or_default() += 1;
        println!(
            "| {n} x {k} | {m} | {wg_us:.1} | `{wg_name}` | {mma_us:.1} | `{mma_name}` | {cublas_us:.1} | {:.2} |",
            wg_us / cublas_us
        );
    }
    assert_eq!(by_shape.len(), K2.len());
    assert!(by_shape.values().all(|&c| c == MS.len()));
    assert!(failures.is_empty(), "{failures:#?}");
}
