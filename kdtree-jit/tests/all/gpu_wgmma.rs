//! The wgmma family (sm_90a) on a Hopper GPU: every variant against the CPU reference, on odd shapes
//! and on Kimi K2's, and batch invariance (a row's bits do not depend on M). Its speed against the
//! other families and cuBLAS is the tuner's to measure (`kdtree-jit tune --preset kimi-k2`). Run on
//! the H200: `cargo test --release -p kdtree-jit --test gpu_wgmma -- --ignored --nocapture --test-threads 1`.

use kdtree_jit::w4a16::accuracy::bits_error;
use kdtree_jit::w4a16::dense::{DenseFamily, DenseKernel};
use kdtree_jit::w4a16::wgmma::W4a16Wgmma;
use kdtree_jit::w4a16::{GemmBuffers, RandomGemm};
use kdtree_jit::{Cache, Gpu, Target, Variant, compile_all};
use kdtree_quant::Dtype;

/// Kimi K2's projections (N x K): gate-up and down of the dense MLP / shared experts, and two more.
const K2: [(usize, usize); 4] = [(18432, 7168), (7168, 18432), (4096, 7168), (7168, 2048)];

/// The cubin cache of the machine (`KDTREE_CACHE_DIR`), shared by the tests of one run.
fn cache() -> Cache {
    Cache::open(&Cache::default_dir()).expect("a cubin cache")
}

/// Every valid wgmma variant for the GPU (compiled for its sm_90a target) that `keep` keeps, loaded.
fn wgmma_kernels(gpu: &Gpu, keep: impl Fn(&W4a16Wgmma) -> bool) -> Vec<DenseKernel> {
    let arch = gpu.arch.specific();
    let valid: Vec<W4a16Wgmma> = W4a16Wgmma::valid(&Target { arch }).into_iter().filter(keep).collect();
    assert!(!valid.is_empty(), "no wgmma variant for {arch}");
    compile_all(&valid, arch, Some(&cache()), |_| {})
        .into_iter()
        .map(|(v, c)| DenseKernel::load(gpu, v, &c.expect("compiles")).expect("loads"))
        .collect()
}

/// Y of `kernel` for the first `m` rows of `p` on device buffers uploaded once, Y poisoned with NaN
/// first so that an element the kernel does not write fails.
struct Device {
    x: cudarc::driver::CudaSlice<u16>,
    packed: cudarc::driver::CudaSlice<u32>,
    scales: cudarc::driver::CudaSlice<u16>,
    y: cudarc::driver::CudaSlice<u16>,
    /// Sized for the largest split-K of `kernels`, zeroed before each run: the counters grow with M.
    workspace: cudarc::driver::CudaSlice<f32>,
}

impl Device {
    fn upload(gpu: &Gpu, kernels: &[DenseKernel], p: &RandomGemm) -> Device {
        let d = kernels[0].variant().repack(&p.w).expect("repacks");
        let s = &gpu.stream;
        let ws = kernels.iter().map(|c| c.variant().workspace_len(p.m, p.w.n)).max().unwrap_or(0);
        Device {
            x: s.clone_htod(&p.x).unwrap(),
            packed: s.clone_htod(&d.packed).unwrap(),
            scales: s.clone_htod(&d.scales).unwrap(),
            y: s.alloc_zeros(p.m * p.w.n).unwrap(),
            workspace: s.alloc_zeros(ws.max(1)).unwrap(),
        }
    }

    fn launch(&mut self, gpu: &Gpu, kernel: &DenseKernel, m: usize, n: usize, k: usize) {
        let b = GemmBuffers {
            x: self.x.slice(..m * k),
            packed: &self.packed,
            scales: &self.scales,
            y: self.y.slice_mut(..m * n),
            workspace: &mut self.workspace,
        };
        kernel.launch(gpu, m, n, k, b).expect("launches");
    }

    fn run(&mut self, gpu: &Gpu, kernel: &DenseKernel, m: usize, n: usize, k: usize) -> Vec<u16> {
        gpu.stream.memcpy_htod(&vec![u16::MAX; m * n], &mut self.y.slice_mut(..m * n)).unwrap();
        gpu.stream.memset_zeros(&mut self.workspace).unwrap();
        self.launch(gpu, kernel, m, n, k);
        gpu.stream.clone_dtoh(&self.y.slice(..m * n)).unwrap()
    }
}

/// Checks every kernel on the first `m` rows of `p` for each m of `ms`; returns the failures. A
/// kernel's rows must also be the same bits at every m (batch invariance, which exact mode needs).
fn check(gpu: &Gpu, kernels: &[DenseKernel], p: &RandomGemm, ms: &[usize]) -> Vec<String> {
    let (n, k) = (p.w.n, p.w.k);
    let mut device = Device::upload(gpu, kernels, p);
    let mut failures = Vec::new();
    for kernel in kernels {
        let v = kernel.variant();
        let mut widest: Option<Vec<u16>> = None;
        for &m in ms.iter().rev() {
            let y = device.run(gpu, kernel, m, n, k);
            let err = bits_error(v.dtype(), &y, &p.reference[..m * n], p.scale);
            let tolerance = v.tolerance();
            println!("{:55} m={m:4} n={n:5} k={k:5} error {err:.2e}", v.name());
            if err.is_nan() || err > tolerance {
                failures.push(format!("{} at {m}x{n}x{k}: {err:.2e} > {tolerance:.2e}", v.name()));
            }
            match &widest {
                Some(wide) if wide[..m * n] != y[..] => {
                    failures.push(format!("{} at {m}x{n}x{k}: rows differ from the same rows at a larger M", v.name()))
                }
                Some(_) => {}
                None => widest = Some(y),
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
        for g in [32usize, 64, 128] {
            let of: Vec<DenseKernel> = kernels
                .iter()
                .filter(|c| c.variant().dtype() == dtype && c.variant().group_size() == g)
                .cloned()
                .collect();
            for (i, &(m, n, groups)) in shapes.iter().enumerate() {
                let p = RandomGemm::random(m, n, groups * g, g, dtype, i as u64).expect("problem");
                // A few M up to the problem's: the rows of each must be the same bits.
                let mut ms = vec![1, m.div_ceil(2), m];
                ms.dedup();
                failures.extend(check(&gpu, &of, &p, &ms));
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
