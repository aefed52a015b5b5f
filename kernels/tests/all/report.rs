//! One run at Kimi K2's sizes (hidden 7168, vocabulary 163840): each kernel's max error against the CPU
//! op, and for RMSNorm and argmax the bandwidth they reach as a fraction of a device-to-device copy's,
//! measured in the same run, both with the tuner's harness (kdtree-jit's `tune`: CUDA events, the L2
//! evicted by a read before each rep, the median of the reps). Prints a table; run with
//! `--ignored --nocapture report::`.

use crate::common::{gpu, kernels, max_error};
use cudarc::driver::sys::CUdevice_attribute;
use kdtree_engine::ops::cpu;
use kdtree_engine::registry::RopeTable;
use kdtree_jit::Gpu;
use kdtree_jit::tune::bench::{BenchConfig, measure};
use kdtree_jit::tune::clock::CudaClock;
use kdtree_jit::tune::flush::{FlushMode, Flusher};
use kdtree_jit::tune::peers;

const HIDDEN: usize = 7168;
const VOCAB: usize = 163840;
const REPS: usize = 30;

fn values(len: usize, scale: f32) -> Vec<f32> {
    (0..len).map(|i| ((i.wrapping_mul(2654435761) % 100_003) as f32 / 100_003.0 * 2.0 - 1.0) * scale).collect()
}

/// Three untimed runs, then REPS timed ones.
const TIMING: BenchConfig = BenchConfig { warmup: 3, reps: REPS as u32, batch: 10, give_up: f64::INFINITY };

/// The tuner's clock and L2 flush on the kernels' GPU.
struct Harness {
    gpu: &'static Gpu,
    clock: CudaClock,
    flusher: Flusher,
}

impl Harness {
    fn new(gpu: &'static Gpu) -> Harness {
        let sms =
            gpu.ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).unwrap().max(1) as u32;
        let flusher = Flusher::new(gpu, FlushMode::Read, sms).unwrap();
        Harness { gpu, clock: CudaClock::new(gpu.stream.clone()), flusher }
    }

    /// Median time in ms of `f` over REPS runs after a warm-up, the L2 evicted before each.
    fn median_ms(&mut self, mut f: impl FnMut()) -> f64 {
        let Harness { gpu, clock, flusher } = self;
        let flush = || flusher.flush(&gpu.stream);
        let run = || {
            f();
            Ok(())
        };
        measure(clock, &TIMING, None, flush, run).unwrap().median_us / 1e3
    }
}

struct Row {
    kernel: &'static str,
    shape: String,
    max_error: f64,
    /// (median ms, bytes moved, fraction of copy bandwidth)
    speed: Option<(f64, usize, f64)>,
}

#[test]
#[ignore = "needs a GPU"]
fn kernels_at_kimi_k2_sizes() {
    let k = kernels();
    let s = k.stream();
    let mut harness = Harness::new(gpu());
    // The tuner's copy peer: a 1 GiB device-to-device copy, read plus write bytes.
    let copy_gbs = peers::copy_bandwidth(s, &mut harness.clock).unwrap();
    let fraction = |ms: f64, bytes: usize| bytes as f64 / ms / 1e6 / copy_gbs;
    let mut rows = Vec::new();

    for n_rows in [128, 4096] {
        let (x, w) = (values(n_rows * HIDDEN, 3.0), values(HIDDEN, 1.5));
        let mut want = vec![0.0; x.len()];
        cpu::rmsnorm(&x, &w, 1e-6, &mut want);
        let (dx, dw) = (s.clone_htod(&x).unwrap(), s.clone_htod(&w).unwrap());
        let mut out = s.alloc_zeros::<f32>(x.len()).unwrap();
        let ms = harness.median_ms(|| kdtree_kernels::rmsnorm(k, &dx, &dw, 1e-6, &mut out, None).unwrap());
        let bytes = 2 * x.len() * 4 + HIDDEN * 4;
        let got = s.clone_dtoh(&out).unwrap();
        rows.push(Row {
            kernel: "rmsnorm",
            shape: format!("{n_rows} x {HIDDEN}"),
            max_error: max_error(&got, &want),
            speed: Some((ms, bytes, fraction(ms, bytes))),
        });
    }

    for n_rows in [1, 128, 1024] {
        let x = values(n_rows * VOCAB, 10.0);
        let want = cpu::argmax(&x, VOCAB);
        let dx = s.clone_htod(&x).unwrap();
        let mut out = s.alloc_zeros::<u32>(n_rows).unwrap();
        let ms = harness.median_ms(|| kdtree_kernels::argmax(k, &dx, VOCAB, &mut out).unwrap());
        let bytes = x.len() * 4;
        let got = s.clone_dtoh(&out).unwrap();
        let wrong = got.iter().zip(&want).filter(|(a, b)| a != b).count() as f64;
        rows.push(Row {
            kernel: "argmax",
            shape: format!("{n_rows} x {VOCAB}"),
            max_error: wrong,
            speed: Some((ms, bytes, fraction(ms, bytes))),
        });
    }

    {
        let x = values(128 * VOCAB, 30.0);
        let mut want = x.clone();
        cpu::softmax(&mut want, VOCAB);
        let mut dx = s.clone_htod(&x).unwrap();
        kdtree_kernels::softmax(k, &mut dx, VOCAB).unwrap();
        let got = s.clone_dtoh(&dx).unwrap();
        rows.push(Row {
            kernel: "softmax",
            shape: format!("128 x {VOCAB}"),
            max_error: max_error(&got, &want),
            speed: None,
        });
    }
    {
        let n = 128 * 18432;
        let (g, u) = (values(n, 12.0), values(n + 7, 2.0)[7..].to_vec());
        let mut want = vec![0.0; n];
        cpu::silu_mul(&g, &u, &mut want);
        let (dg, du) = (s.clone_htod(&g).unwrap(), s.clone_htod(&u).unwrap());
        let mut out = s.alloc_zeros::<f32>(n).unwrap();
        kdtree_kernels::silu_mul(k, &dg, &du, &mut out).unwrap();
        let got = s.clone_dtoh(&out).unwrap();
        rows.push(Row {
            kernel: "silu_mul",
            shape: "128 x 18432".to_string(),
            max_error: max_error(&got, &want),
            speed: None,
        });
    }
    {
        let (heads, head_dim) = (64, 64);
        let positions: Vec<usize> = (0..128).map(|i| 4000 + i * 3).collect();
        let inv_freq: Vec<f64> = (0..head_dim / 2).map(|i| 10000f64.powf(-2.0 * i as f64 / head_dim as f64)).collect();
        let table = RopeTable::new(&inv_freq, 4096 + 400, 1.0);
        let x = values(128 * heads * head_dim, 2.0);
        let mut want = x.clone();
        cpu::rope_interleaved(&mut want, head_dim, &positions, &table.cos, &table.sin);
        let mut dx = s.clone_htod(&x).unwrap();
        let (cos, sin) = (s.clone_htod(&table.cos).unwrap(), s.clone_htod(&table.sin).unwrap());
        kdtree_kernels::rope_interleaved(k, &mut dx, head_dim, &positions, &cos, &sin).unwrap();
        let got = s.clone_dtoh(&dx).unwrap();
        rows.push(Row {
            kernel: "rope_interleaved",
            shape: format!("128 x {heads} x {head_dim}"),
            max_error: max_error(&got, &want),
            speed: None,
        });
    }
    {
        let vocab = 16384;
        let table = values(vocab * HIDDEN, 1.0);
        let ids: Vec<u32> = (0..128u32).map(|i| i.wrapping_mul(7919) % vocab as u32).collect();
        let mut want = vec![0.0; ids.len() * HIDDEN];
        cpu::embedding(&table, HIDDEN, &ids, &mut want).unwrap();
        let dt = s.clone_htod(&table).unwrap();
        let mut out = s.alloc_zeros::<f32>(want.len()).unwrap();
        kdtree_kernels::embedding(k, &dt, HIDDEN, &ids, &mut out).unwrap();
        let got = s.clone_dtoh(&out).unwrap();
        rows.push(Row {
            kernel: "embedding",
            shape: format!("128 ids of {vocab} x {HIDDEN}"),
            max_error: max_error(&got, &want),
            speed: None,
        });
    }

    println!("device-to-device copy: {copy_gbs:.0} GB/s (read + write, 1 GiB, the tuner's copy peer)");
    println!("{:<18} {:<26} {:>11} {:>10} {:>9} {:>9}", "kernel", "shape", "max error", "median us", "GB/s", "of copy");
    for r in &rows {
        let speed = r.speed.map_or(String::new(), |(ms, bytes, f)| {
            format!("{:>10.1} {:>9.0} {:>8.0}%", ms * 1e3, bytes as f64 / ms / 1e6, f * 100.0)
        });
        println!("{:<18} {:<26} {:>11.2e} {speed}", r.kernel, r.shape, r.max_error);
    }
    // argmax's "error" is the number of rows that differ; the others' are bounded as in tests/gpu.rs.
    for r in &rows {
        let bound = match r.kernel {
            "argmax" | "embedding" => 0.0,
            "rmsnorm" => 2e-5,
            "softmax" => 1e-5,
            _ => 1e-6,
        };
        assert!(r.max_error <= bound, "{} {}: error {} over {bound}", r.kernel, r.shape, r.max_error);
    }
    let rms_large =
        rows.iter().find(|r| r.kernel == "rmsnorm" && r.shape.starts_with("4096")).and_then(|r| r.speed).unwrap();
    assert!(rms_large.2 > 0.5, "RMSNorm reaches only {:.0}% of copy bandwidth", rms_large.2 * 100.0);
}
