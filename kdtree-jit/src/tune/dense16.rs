//! Tuning the streamed 16-bit family ([`crate::dense16`]) per weight shape and M bucket, with cuBLAS
//! (16-bit in, f32 out: what the engine runs otherwise) timed beside it on the same data.
//!
//! Per (shape, M): the candidates are the variants whose rows are M's bucket clamped to 8..=32 (fewer
//! rows than M would re-read W per block; more hold registers for nothing); each runs once against
//! the CPU reference ([`crate::dense16::reference`]) and a wrong one is rejected; the correct ones
//! are screened and the finalists timed as every tuner here does ([`super::search`]). The entry
//! records the cuBLAS time: the engine uses the variant only where it is the faster.

use std::collections::HashMap;
use std::time::Instant;

use cudarc::driver::CudaSlice;
use kdtree_quant::Dtype;
use kdtree_quant::sample::symmetric;
use serde::Serialize;

use super::bench::{BenchConfig, Timing, measure};
use super::db::{Entry, Match, TuningDb};
use super::env::Environment;
use super::error::Result;
use super::flush::Flusher;
use super::key::{ProblemKey, Shape, m_bucket};
use super::peers::Peers;
use super::problem::to_bits;
use super::search::{self, Rejection, Runner, SearchConfig};
use super::session::{Session, now_unix};
use crate::cublas::{self, GemmType};
use crate::dense16::reference::product;
use crate::dense16::{Dense16, Dense16Buffers, Dense16Kernel};
use crate::{Arch, Cache, Gpu, Variant};

/// The gate's bound, norm-wise (`max |y - r| / max |r|`): the kernels sum exact products in f32 in
/// their own order, which parts from the reference's exact sum by about K f32 ulps of the partial
/// sums at worst (2^-24 x 7168 x the sum of |products| over the largest output: ~1e-3 on uniform
/// data, ~1e-6 typically); a wrong fragment or split lands at O(1).
pub const TOLERANCE: f64 = 2e-3;

/// Kimi K2's bf16 weights a decode step reads, N x K: `q_a_proj` and `kv_a_proj_with_mqa` stacked
/// (both read the layer's input: the engine runs them as one GEMM), `q_b_proj`, `o_proj`, the shared
/// expert's gate and up (stacked) and down, and the dense first layers' gate and up (stacked) and
/// down. `lm_head` (163840 x 7168) is left to `--shape`: its CPU reference alone is 1.2 G
/// multiply-adds a row.
pub const KIMI_K2_BF16: [Shape; 7] = [
    Shape { n: 2112, k: 7168 },
    Shape { n: 12288, k: 1536 },
    Shape { n: 7168, k: 8192 },
    Shape { n: 4096, k: 7168 },
    Shape { n: 7168, k: 2048 },
    Shape { n: 36864, k: 7168 },
    Shape { n: 7168, k: 18432 },
];

/// The rows of every cuBLAS call of the engine's exact mode (its `gemm::EXACT_ROWS`): M padded to
/// them, so that a row's bits never depend on M.
pub(crate) const PADDED_ROWS: usize = 128;

/// The rows of the variants worth timing at `m`: its bucket within the space's 8..=32.
pub(crate) fn rows_for(m: u32) -> u32 {
    m_bucket(m).clamp(8, 32)
}

/// The variants of `valid` worth timing on `m` rows of `shape`: rows of [`rows_for`], and able to
/// compute the shape.
pub(crate) fn candidates(valid: &[Dense16], shape: Shape, m: u32) -> impl Iterator<Item = Dense16> + '_ {
    let (rows, n, k) = (rows_for(m), shape.n as usize, shape.k as usize);
    let fits = move |v: &&Dense16| v.rows == rows && v.unsupported((m as usize).min(rows as usize), n, k).is_none();
    valid.iter().filter(fits).copied()
}

/// Whether any variant on `arch` can be tuned for `m` rows of `shape` (`candidates`).
pub fn can_tune(arch: Arch, shape: Shape, dtype: Dtype, m: u32) -> bool {
    candidates(&Dense16::valid_on(arch, dtype), shape, m).next().is_some()
}

/// One (shape, M) tuned: the winner beside cuBLAS.
#[derive(Clone, Debug, Serialize)]
pub struct Dense16Tuned {
    pub key: ProblemKey,
    /// `None` when no candidate was correct.
    pub variant: Option<String>,
    pub timing: Option<Timing>,
    pub cublas: Option<Timing>,
    /// cuBLAS on `PADDED_ROWS` rows, as the engine's exact mode calls it whatever M.
    pub cublas_padded: Option<Timing>,
    /// Bytes one run must move (W, X and Y once), over the winner's time.
    pub gbps: Option<f64>,
    pub rejected: Vec<Rejection>,
}

/// The key of a streamed 16-bit product.
pub fn key(m: u32, shape: Shape, dtype: Dtype, arch: Arch) -> ProblemKey {
    ProblemKey::dense16(m, shape, dtype, arch)
}

/// Bytes one run of `m` rows moves at least: W and X read once, Y written once (f32).
pub fn bytes(shape: Shape, m: usize) -> u64 {
    let (n, k) = (shape.n as u64, shape.k as u64);
    2 * n * k + 2 * m as u64 * k + 4 * m as u64 * n
}

/// One shape's data on the host and the device.
struct ShapeData {
    shape: Shape,
    x: CudaSlice<u16>,
    w: CudaSlice<u16>,
    y: CudaSlice<f32>,
    workspace: CudaSlice<f32>,
    /// `[m_max, n]`: the reference is row-independent, so its first m rows are M = m's.
    reference: Vec<f32>,
}

/// Runs candidates on one shape at `m` rows, in blocks of each variant's rows.
struct Dense16Runner<'a> {
    gpu: &'a Gpu,
    flusher: &'a mut Flusher,
    kernels: &'a HashMap<String, Dense16Kernel>,
    data: &'a mut ShapeData,
    m: usize,
}

impl Dense16Runner<'_> {
    fn run(&mut self, v: &Dense16) -> Result<()> {
        let kernel = &self.kernels[&v.name()];
        let (n, k) = (self.data.shape.n as usize, self.data.shape.k as usize);
        let rows = v.rows as usize;
        for start in (0..self.m).step_by(rows) {
            let r = rows.min(self.m - start);
            let b = Dense16Buffers {
                x: self.data.x.slice(start * k..(start + r) * k),
                w: self.data.w.as_view(),
                y: self.data.y.slice_mut(start * n..(start + r) * n),
                workspace: self.data.workspace.as_view_mut(),
            };
            kernel.launch(self.gpu, (r, n, k), b)?;
        }
        Ok(())
    }
}

impl Runner for Dense16Runner<'_> {
    type Candidate = Dense16;

    fn name(&self, c: &Dense16) -> String {
        c.name()
    }

    fn output(&mut self, c: &Dense16) -> Result<Vec<f32>> {
        self.run(c)?;
        let n = self.data.shape.n as usize;
        Ok(self.gpu.stream.clone_dtoh(&self.data.y.slice(..self.m * n))?)
    }

    fn tolerance(&self, _: &Dense16) -> f64 {
        TOLERANCE
    }

    /// The split-K counters are left at zero by every launch: nothing to ready.
    fn prepare(&mut self, _: &Dense16) -> Result<()> {
        Ok(())
    }

    fn launch(&mut self, c: &Dense16) -> Result<()> {
        self.run(c)
    }

    fn flush(&mut self) -> Result<()> {
        self.flusher.flush(&self.gpu.stream)
    }
}

/// Random data for `shape` with `m_max` rows (at least [`PADDED_ROWS`] on the device, for cuBLAS),
/// seeded by the shape, and the reference of the first `m_max`.
fn shape_data(session: &Session, shape: Shape, m_max: usize, dtype: Dtype, most_ws: usize) -> Result<ShapeData> {
    let (n, k) = (shape.n as usize, shape.k as usize);
    let seed = 0x0064_3136 ^ (n as u64) << 32 ^ k as u64;
    let bits = |v: Vec<f32>| -> Vec<u16> { v.into_iter().map(|f| to_bits(dtype, f)).collect() };
    let rows = m_max.max(PADDED_ROWS);
    let (x, w) = (bits(symmetric(rows * k, seed, 1.0)), bits(symmetric(n * k, seed + 1, 1.0)));
    let reference = product(&x, &w, (m_max, n, k), dtype);
    let s = &session.gpu.stream;
    Ok(ShapeData {
        shape,
        x: s.clone_htod(&x)?,
        w: s.clone_htod(&w)?,
        y: s.alloc_zeros(rows * n)?,
        workspace: s.alloc_zeros(most_ws.max(1))?,
        reference,
    })
}

/// cuBLAS on the same data: 16-bit in, f32 out, as the engine's dense path calls it.
fn time_cublas(session: &mut Session, data: &mut ShapeData, m: usize, dtype: Dtype) -> Result<Option<Timing>> {
    let Session { gpu, clock, flusher, blas, .. } = session;
    let Some(blas) = blas.as_ref() else { return Ok(None) };
    let (n, k) = (data.shape.n as usize, data.shape.k as usize);
    let types = (GemmType::of(dtype), GemmType::F32);
    let (x, w) = (data.x.slice(..m * k), data.w.as_view());
    let mut y = data.y.slice_mut(..m * n);
    let t = measure(
        clock,
        &BenchConfig::FINAL,
        None,
        || flusher.flush(&gpu.stream),
        || Ok(cublas::gemm(blas, &gpu.stream, types, (m, n, k), &x, &w, &mut y)?),
    )?;
    Ok(Some(t))
}

/// What [`tune_dense16`] tunes: every shape at every M of `ms` (in 1..=1024), of one dtype.
#[derive(Clone, Debug)]
pub struct Dense16Request<'a> {
    pub shapes: &'a [Shape],
    pub ms: &'a [u32],
    pub dtype: Dtype,
    /// No shape starts after it; one started is finished.
    pub deadline: Option<Instant>,
}

/// Tunes `request` and saves each winner in `db` (not to disk); returns the (shape, M) pairs it
/// tuned, in order (those a deadline leaves out are absent). `progress` gets (done, total) of the
/// pairs.
pub fn tune_dense16(
    session: &mut Session,
    db: &mut TuningDb,
    cache: Option<&Cache>,
    request: &Dense16Request,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<Dense16Tuned>> {
    let Dense16Request { shapes, ms, dtype, deadline } = *request;
    let arch = session.gpu.arch;
    // Only the rows the M asked for time (rows_for): the rest are not compiled.
    let rows: Vec<u32> = ms.iter().map(|&m| rows_for(m)).collect();
    let valid: Vec<Dense16> = Dense16::valid_on(arch, dtype).into_iter().filter(|v| rows.contains(&v.rows)).collect();
    let kernels = session.compile_with(&valid, |_| arch, db, cache, false, |_| {}, Dense16Kernel::load)?;
    let m_max = ms.iter().copied().max().unwrap_or(1) as usize;
    let total = shapes.len() * ms.len();
    let mut out = Vec::new();
    for &shape in shapes {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let most_ws = valid.iter().map(|v| v.workspace_len(m_max.min(v.rows as usize), shape.n as usize)).max();
        let mut data = shape_data(session, shape, m_max, dtype, most_ws.unwrap_or(1))?;
        for &m in ms {
            let mu = m as usize;
            let candidates: Vec<Dense16> =
                candidates(&valid, shape, m).filter(|v| kernels.contains_key(&v.name())).collect();
            let reference = data.reference[..mu * shape.n as usize].to_vec();
            let cublas = time_cublas(session, &mut data, mu, dtype)?;
            let cublas_padded = time_cublas(session, &mut data, PADDED_ROWS, dtype)?;
            let Session { gpu, clock, flusher, .. } = &mut *session;
            let mut runner = Dense16Runner { gpu, flusher, kernels: &kernels, data: &mut data, m: mu };
            let cfg = SearchConfig::default();
            let outcome = search::search(&mut runner, clock, &candidates, &reference, &cfg, || {})?;
            let key = key(m, shape, dtype, arch);
            let best = outcome.best.as_ref();
            if let Some(best) = best {
                let (cublas_bf16, cublas_f16) = if dtype == Dtype::Bf16 { (cublas, None) } else { (None, cublas) };
                db.insert(Entry {
                    key: key.clone(),
                    env: session.env.clone(),
                    variant: best.name.clone(),
                    m,
                    timing: best.timing,
                    error: best.error,
                    peers: Peers { cublas_bf16, cublas_f16, copy_gbps: session.copy_gbps },
                    bytes: bytes(shape, mu),
                    timed: outcome.timed.len() as u32,
                    rejected: outcome.rejected.clone(),
                    tuned_at_unix: now_unix(),
                });
            }
            out.push(Dense16Tuned {
                key,
                variant: best.map(|b| b.name.clone()),
                timing: best.map(|b| b.timing),
                cublas,
                cublas_padded,
                gbps: best.map(|b| bytes(shape, mu) as f64 / b.timing.median_us / 1e3),
                rejected: outcome.rejected,
            });
            progress(out.len(), total);
        }
    }
    Ok(out)
}

/// Whether the DB holds a fresh entry of `m`'s own bucket for `shape` on this environment, whichever
/// won (another bucket's entry would run, but `m` is still worth tuning).
pub fn is_tuned(db: &TuningDb, env: &Environment, arch: Arch, shape: Shape, dtype: Dtype, m: u32) -> bool {
    let hit = db.lookup(&key(m, shape, dtype, arch), env, |_| true).hit;
    hit.is_some_and(|h| matches!(h.matched, Match::Exact))
}

/// The variant the DB holds for `m` rows of `shape` on this environment when it beat cuBLAS there
/// (an entry without a cuBLAS time is not trusted to).
pub fn tuned_variant(
    db: &TuningDb,
    env: &Environment,
    arch: Arch,
    shape: Shape,
    dtype: Dtype,
    m: u32,
) -> Option<Dense16> {
    let entry = db.best_variant(&key(m, shape, dtype, arch), env)?;
    let cublas = entry.peers.cublas_bf16.or(entry.peers.cublas_f16)?;
    let v = Dense16::from_name(&entry.variant)?;
    let usable = v.dtype == dtype && v.check(&crate::Target { arch }).is_ok();
    (usable && entry.timing.median_us < cublas.median_us).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::gate;
    use crate::tune::problem::from_bits;

    /// A row of `(x, w)` summed in f32 as a kernel may: `order` gives the k of each step.
    fn f32_sum(x: &[u16], w: &[u16], k: usize, order: impl Fn(usize) -> usize) -> f32 {
        (0..k).fold(0.0f32, |s, i| {
            let j = order(i);
            s + from_bits(Dtype::Bf16, x[j]) * from_bits(Dtype::Bf16, w[j])
        })
    }

    #[test]
    fn the_gate_passes_f32_sums_in_any_order_and_refuses_a_misplaced_fragment() {
        let (m, n, k) = (2, 64, 7168);
        let bits = |v: Vec<f32>| -> Vec<u16> { v.into_iter().map(|f| to_bits(Dtype::Bf16, f)).collect() };
        let (x, w) = (bits(symmetric(m * k, 1, 1.0)), bits(symmetric(n * k, 2, 1.0)));
        let want = product(&x, &w, (m, n, k), Dtype::Bf16);
        let run = |order: &dyn Fn(usize) -> usize, wk: &dyn Fn(usize) -> usize| -> Vec<f32> {
            let mut y = Vec::new();
            for r in 0..m {
                for c in 0..n {
                    let (xr, wc) = (&x[r * k..(r + 1) * k], &w[c * k..(c + 1) * k]);
                    let wc: Vec<u16> = (0..k).map(|i| wc[wk(i)]).collect();
                    y.push(f32_sum(xr, &wc, k, order));
                }
            }
            y
        };
        // In order, and backwards: one running f32 sum, the worst a kernel does.
        for order in [&(|i| i) as &dyn Fn(usize) -> usize, &(|i| k - 1 - i)] {
            let error = gate::pass(&run(order, &|i| i), &want, TOLERANCE).unwrap();
            assert!(error < TOLERANCE / 10.0, "{error}");
        }
        // X's k 8t+2..8t+3 paired with W's 8t+4..8t+5: a fragment in the wrong mma.
        let swapped = |i: usize| match i % 8 {
            2 | 3 => i + 2,
            4 | 5 => i - 2,
            _ => i,
        };
        assert!(gate::pass(&run(&|i| i, &swapped), &want, TOLERANCE).is_err());
    }

    #[test]
    fn candidates_are_the_rows_of_m_that_compute_the_shape() {
        let valid = Dense16::valid_on(Arch(90), Dtype::Bf16);
        let k2: Vec<Dense16> = candidates(&valid, Shape { n: 2112, k: 7168 }, 3).collect();
        assert!(!k2.is_empty() && k2.iter().all(|v| v.rows == 8 && v.dtype == Dtype::Bf16));
        assert!(candidates(&valid, Shape { n: 2112, k: 7168 }, 100).all(|v| v.rows == 32));
        // K must be a multiple of 32.
        assert!(!can_tune(Arch(90), Shape { n: 64, k: 48 }, Dtype::Bf16, 1));
        assert!(can_tune(Arch(90), Shape { n: 64, k: 64 }, Dtype::F16, 1));
    }

    #[test]
    fn candidates_take_rows_of_m_bucket_within_the_space() {
        assert_eq!([1, 8, 9, 16, 17, 64, 128].map(rows_for), [8, 8, 16, 16, 32, 32, 32]);
        assert_eq!(bytes(Shape { n: 576, k: 7168 }, 1), 2 * 576 * 7168 + 2 * 7168 + 4 * 576);
        let key = key(3, Shape { n: 576, k: 7168 }, Dtype::Bf16, Arch(90));
        assert_eq!(key.to_string(), "dense16 bf16 576x7168 M=4");
    }
}
