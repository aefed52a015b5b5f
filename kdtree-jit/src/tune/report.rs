//! What `tune` and `bench` print: a table for people, the same rows as JSON for machines.

use std::io::Write;

use serde::Serialize;

use super::db::{Entry, Stale, TuningDb};
use super::env::Environment;
use super::flush::FlushMode;
use super::key::{MoeShape, Shape};

/// One measured problem, with the figures the targets are stated in.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// The weight's shape; an MoE step's gate-up weight.
    pub shape: Shape,
    /// An MoE step's layer and routing; absent for a GEMM.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeShape>,
    /// M; an MoE step's tokens T.
    pub m: u32,
    pub variant: String,
    pub us: f64,
    pub p10_us: f64,
    pub p90_us: f64,
    /// Achieved bytes per second over the device's copy bandwidth measured in the same run.
    pub pct_copy_bw: f64,
    /// The time the copy bandwidth allows for the bytes the problem must move.
    pub floor_us: f64,
    pub cublas_bf16_us: Option<f64>,
    pub cublas_f16_us: Option<f64>,
    /// cuBLAS's time over the variant's: above 1 is faster than cuBLAS.
    pub x_cublas_bf16: Option<f64>,
    pub x_cublas_f16: Option<f64>,
    pub gate_error: f64,
    pub timed: u32,
    pub rejected: usize,
}

impl Row {
    pub fn from_entry(e: &Entry) -> Row {
        let us = e.timing.median_us;
        let floor_us = e.bytes as f64 / (e.peers.copy_gbps * 1e3);
        let speedup = |peer: Option<f64>| peer.map(|p| p / us);
        let cublas_bf16_us = e.peers.cublas_bf16.map(|t| t.median_us);
        let cublas_f16_us = e.peers.cublas_f16.map(|t| t.median_us);
        Row {
            shape: e.key.shape(),
            moe: e.key.moe_shape(),
            m: e.m,
            variant: e.variant.clone(),
            us,
            p10_us: e.timing.p10_us,
            p90_us: e.timing.p90_us,
            pct_copy_bw: 100.0 * floor_us / us,
            floor_us,
            cublas_bf16_us,
            cublas_f16_us,
            x_cublas_bf16: speedup(cublas_bf16_us),
            x_cublas_f16: speedup(cublas_f16_us),
            gate_error: e.error,
            timed: e.timed,
            rejected: e.rejected.len(),
        }
    }
}

/// The whole JSON document of a run.
#[derive(Debug, Serialize)]
pub struct Report {
    pub device: String,
    pub copy_gbps: f64,
    /// How the L2 was evicted before each timed rep.
    pub flush: FlushMode,
    pub rows: Vec<Row>,
    /// Entries of the DB that belong to another environment, with why.
    pub stale: Vec<StaleRow>,
}

#[derive(Clone, Debug, Serialize)]
pub struct StaleRow {
    pub shape: Shape,
    pub m_bucket: u32,
    pub variant: String,
    pub differences: Vec<String>,
}

impl StaleRow {
    pub(crate) fn from_stale(s: &Stale<'_>) -> StaleRow {
        StaleRow {
            shape: s.entry.key.shape(),
            m_bucket: s.entry.key.m_bucket,
            variant: s.entry.variant.clone(),
            differences: s.differences.iter().map(|d| d.to_string()).collect(),
        }
    }
}

/// The entries of `db` measured in another environment than `env`, which are kept but not used.
pub fn stale_rows(db: &TuningDb, env: &Environment) -> Vec<StaleRow> {
    db.partition(env).1.iter().map(StaleRow::from_stale).collect()
}

/// The table: one line per (shape, M); an MoE step's line names its routing for the shape (the
/// JSON has the whole layer) and T for M.
pub fn write_table(out: &mut impl Write, rows: &[Row]) -> std::io::Result<()> {
    let x = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2}x"));
    let problem = |r: &Row| r.moe.map_or_else(|| r.shape.to_string(), |l| format!("moe {}", l.routing));
    let width = rows.iter().map(|r| r.variant.len()).max().unwrap_or(0).max("best variant".len());
    writeln!(
        out,
        "{:<12} {:>4}  {:<width$}  {:>8} {:>17}  {:>7}  {:>8} {:>8}",
        "shape", "M", "best variant", "us", "p10..p90", "% copy", "x bf16", "x f16"
    )?;
    for r in rows {
        writeln!(
            out,
            "{:<12} {:>4}  {:<width$}  {:>8.1} {:>17}  {:>6.1}%  {:>8} {:>8}",
            problem(r),
            r.m,
            r.variant,
            r.us,
            format!("{:.1}..{:.1}", r.p10_us, r.p90_us),
            r.pct_copy_bw,
            x(r.x_cublas_bf16),
            x(r.x_cublas_f16),
        )?;
    }
    Ok(())
}
