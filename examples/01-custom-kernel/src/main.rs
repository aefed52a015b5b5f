//! A custom kernel in a few lines: a residual add with a learned per-channel scale (LayerScale),
//! `out[r, c] = residual[r, c] + gamma[c] * x[r, c]`, declared with `#[kernel]`, compiled by the same
//! JIT and cache as the GEMM variants, and checked against a CPU version of the same formula.

use anyhow::{Context, Result};
use clap::Parser;
use cudarc::driver::CudaSlice;
use kdtree_jit::kernel::{Kernels, kernel};
use kdtree_jit::{Cache, Gpu};

/// The kernel: its CUDA source inline, its launch shape from the arguments. The macro checks this
/// signature against the `extern "C"` one below (count, pointers, element types, const) at compile time.
#[kernel(
    source = r#"
        extern "C" __global__ void layer_scale_add(const float* __restrict__ x, const float* __restrict__ gamma,
                                                   const float* __restrict__ residual, float* __restrict__ out,
                                                   unsigned int rows, unsigned int cols) {
            const unsigned int c = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
            if (c < cols && r < rows) out[(size_t)r * cols + c] = residual[(size_t)r * cols + c] + gamma[c] * x[(size_t)r * cols + c];
        }"#,
    grid = (cols.div_ceil(128), rows),
    block = 128,
)]
unsafe fn layer_scale_add(
    x: &CudaSlice<f32>,
    gamma: &CudaSlice<f32>,
    residual: &CudaSlice<f32>,
    out: &mut CudaSlice<f32>,
    rows: u32,
    cols: u32,
);

/// The CPU reference: the same formula, in the same f32 arithmetic.
fn layer_scale_add_cpu(x: &[f32], gamma: &[f32], residual: &[f32]) -> Vec<f32> {
    x.iter().zip(residual).enumerate().map(|(i, (&x, &r))| r + gamma[i % gamma.len()] * x).collect()
}

#[derive(Parser)]
#[command(
    about = "Runs a #[kernel]-declared LayerScale residual add on the GPU (when there is one) and on the CPU, and prints both"
)]
struct Args {
    /// Rows of the activations.
    #[arg(long, default_value_t = 4)]
    rows: u32,
    /// Channels per row.
    #[arg(long, default_value_t = 6)]
    cols: u32,
    /// GPU ordinal to run on.
    #[arg(long, default_value_t = 0)]
    gpu: usize,
    /// Print the results as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// What ran where: the CPU result always, the GPU's when a GPU was found.
struct Outcome {
    cpu: Vec<f32>,
    gpu: std::result::Result<Vec<f32>, String>,
}

fn run_gpu(args: &Args, x: &[f32], gamma: &[f32], residual: &[f32]) -> kdtree_jit::Result<Vec<f32>> {
    let gpu = Gpu::open(args.gpu)?;
    let cache = Cache::open(&Cache::default_dir())?;
    let kernels = Kernels::load(&gpu, Some(&cache))?;
    let s = kernels.stream();
    let (x, gamma, residual) = (s.clone_htod(x)?, s.clone_htod(gamma)?, s.clone_htod(residual)?);
    let mut out = s.alloc_zeros::<f32>(x.len())?;
    // SAFETY: x, residual and out hold rows * cols values, gamma cols, as the arguments say.
    unsafe { layer_scale_add(&kernels, &x, &gamma, &residual, &mut out, args.rows, args.cols)? };
    Ok(s.clone_dtoh(&out)?)
}

fn main() -> Result<()> {
    let args = Args::parse();
    let n = (args.rows as usize).checked_mul(args.cols as usize).context("rows * cols overflows")?;
    anyhow::ensure!(n > 0, "--rows and --cols must be positive");
    let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
    let gamma: Vec<f32> = (0..args.cols).map(|c| 0.1 * (c + 1) as f32).collect();
    let residual: Vec<f32> = (0..n).map(|i| (i % 7) as f32 - 3.0).collect();
    let outcome = Outcome {
        cpu: layer_scale_add_cpu(&x, &gamma, &residual),
        gpu: run_gpu(&args, &x, &gamma, &residual).map_err(|e| e.to_string()),
    };
    print(&args, &outcome);
    Ok(())
}

fn print(args: &Args, o: &Outcome) {
    let max_error = o.gpu.as_ref().ok().map(|g| g.iter().zip(&o.cpu).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max));
    if args.json {
        let gpu = match &o.gpu {
            Ok(values) => serde_json::json!({ "values": values, "max_abs_error": max_error }),
            Err(reason) => serde_json::json!({ "unavailable": reason }),
        };
        println!("{}", serde_json::json!({ "rows": args.rows, "cols": args.cols, "cpu": o.cpu, "gpu": gpu }));
        return;
    }
    match &o.gpu {
        Ok(_) => println!("layer_scale_add on GPU {} and on the CPU reference:", args.gpu),
        Err(reason) => println!("no GPU ({reason}); the CPU reference alone:"),
    }
    println!("{:>6} {:>12} {:>12}", "index", "cpu", "gpu");
    for (i, c) in o.cpu.iter().enumerate() {
        let g = o.gpu.as_ref().map_or("-".to_owned(), |g| format!("{:12.6}", g[i]));
        println!("{i:>6} {c:>12.6} {g:>12}");
    }
    if let Some(e) = max_error {
        println!("max |gpu - cpu| = {e:e}");
    }
}
