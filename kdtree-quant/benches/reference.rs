//! GFLOP/s of the CPU reference W4A16 GEMM at Kimi K2's expert gate+up shape.
//! `cargo bench -p kdtree-quant --bench reference [-- N K M...]`

use std::time::Instant;

use comfy_table::{CellAlignment, Table, presets};
use half::bf16;
use kdtree_quant::{Dtype, QuantizedWeight, reference};

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (n, k) = match args[..] {
        [n, k, ..] => (n, k),
        _ => (4096, 7168),
    };
    let ms = if args.len() > 2 { args[2..].to_vec() } else { vec![1, 16, 128] };
    let w: Vec<f32> = (0..n * k).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 500.0).collect();
    let w = QuantizedWeight::quantize(&w, n, k, 32, Dtype::Bf16).expect("valid shape");
    println!("CPU reference W4A16 GEMM, N x K = {n} x {k}, group 32, bf16, {} threads", rayon::current_num_threads());
    let mut table = Table::new();
    table.load_preset(presets::ASCII_MARKDOWN).set_header(["M", "median ms", "GFLOP/s"]);
    table.column_iter_mut().for_each(|c| c.set_cell_alignment(CellAlignment::Right));
    for m in ms {
        let x: Vec<bf16> = (0..m * k).map(|i| bf16::from_f32(((i * 31 % 97) as f32 - 48.0) / 48.0)).collect();
        let reps = if m >= 64 { 3 } else { 7 };
        let mut times: Vec<f64> = (0..reps)
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(reference::w4a16_gemm(&x, m, &w).expect("valid input"));
                t.elapsed().as_secs_f64()
            })
            .collect();
        times.sort_by(f64::total_cmp);
        let t = times[reps / 2];
        let gflops = 2.0 * (m * n * k) as f64 / t / 1e9;
        table.add_row([m.to_string(), format!("{:.2}", t * 1e3), format!("{gflops:.2}")]);
    }
    println!("{table}");
}
