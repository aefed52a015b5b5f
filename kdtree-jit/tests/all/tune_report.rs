//! The figures the targets are stated in, the table, and the SVG plot, from DB entries alone.

use kdtree_jit::Arch;
use kdtree_jit::tune::bench::Timing;
use kdtree_jit::tune::db::Entry;
use kdtree_jit::tune::env::Environment;
use kdtree_jit::tune::key::{KIMI_K2, ProblemKey};
use kdtree_jit::tune::peers::Peers;
use kdtree_jit::tune::plot;
use kdtree_jit::tune::report::{Row, write_table};
use kdtree_quant::Dtype;

fn timing(us: f64) -> Timing {
    Timing { median_us: us, p10_us: us - 0.5, p90_us: us + 1.0, reps: 100 }
}

/// An entry where the kernel takes `us` against cuBLAS's `cublas_us`, at 4000 GB/s of copy bandwidth.
fn entry(n: u32, k: u32, m: u32, us: f64, cublas_us: f64) -> Entry {
    let shape = kdtree_jit::tune::key::Shape { n, k };
    let bytes = (n as u64 * k as u64) / 2 + (n as u64 * k as u64 / 32) * 2 + 2 * m as u64 * (n + k) as u64;
    Entry {
        key: ProblemKey::w4a16(m, shape, 32, Dtype::Bf16, Arch(90)),
        env: Environment::sample_h200(),
        variant: format!("w4a16_mma_bf16_g32_m16n64k128_w4_s4_sk{}_f32acc", if m < 8 { 4 } else { 1 }),
        m,
        timing: timing(us),
        error: 3e-3,
        peers: Peers {
            cublas_bf16: Some(timing(cublas_us)),
            cublas_f16: Some(timing(cublas_us * 1.01)),
            copy_gbps: 4000.0,
        },
        bytes,
        timed: 6,
        rejected: Vec::new(),
        tuned_at_unix: 0,
    }
}

#[test]
fn a_row_carries_the_speedup_and_the_share_of_copy_bandwidth() {
    let e = entry(4096, 7168, 1, 5.0, 27.0);
    let row = Row::from_entry(&e);
    assert!((row.x_cublas_bf16.unwrap() - 5.4).abs() < 1e-12);
    // 16.5 MB (14.7 of int4, 1.8 of scales) at 4000 GB/s is 4.13 us: 83% of the copy bandwidth in 5 us.
    assert!((row.floor_us - e.bytes as f64 / 4000e3).abs() < 1e-9);
    assert!((row.pct_copy_bw - 100.0 * row.floor_us / 5.0).abs() < 1e-9);
    assert!(row.pct_copy_bw > 82.0 && row.pct_copy_bw < 83.0, "{}", row.pct_copy_bw);

    let mut table = Vec::new();
    write_table(&mut table, &[row]).unwrap();
    let table = String::from_utf8(table).unwrap();
    assert!(table.contains(&e.variant), "{table}");
    assert!(table.contains("5.40x"), "{table}");
    assert!(table.contains("4096x7168"), "{table}");
}

#[test]
fn the_plot_draws_every_shape_with_its_three_series() {
    let rows: Vec<Row> = KIMI_K2
        .shapes
        .iter()
        .flat_map(|&s| {
            KIMI_K2.ms.iter().map(move |&m| Row::from_entry(&entry(s.n, s.k, m, 10.0 + m as f64 / 8.0, 30.0)))
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k2.svg");
    plot::write_svg(&path, &rows).unwrap();
    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
    for label in ["best variant", "cuBLAS bf16", "copy-bandwidth floor", "N x K = 18432 x 7168", "N x K = 7168 x 2048"]
    {
        assert!(svg.contains(label), "{label} missing");
    }
    // An unwritable path is an error, not a panic.
    let err = plot::write_svg(&dir.path().join("no/such/dir/k2.svg"), &rows).unwrap_err();
    assert!(err.to_string().contains("k2.svg"), "{err}");
}
