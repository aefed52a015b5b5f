//! Tuning MLA attention: one decode variant per head shape and arch, chosen over a grid of row
//! counts (a decode step, trees) and contexts.
//!
//! One variant serves every forward because a row's bits depend on the variant's tiles and split
//! bound: a tree row equals greedy decoding's only when both ran the same variant. So the choice
//! minimises the mean, over the grid, of each point's time over the best variant's time there: the
//! variant nearest to the best everywhere, not the fastest at one point.
//!
//! Each valid variant is first gated against the CPU reference ([`crate::mla::reference`]) on a
//! causal block and a tree, then screened at every point (L2 flushed, early stop at 1.5x the best
//! of the point); the winner is timed again at every point with the final reps. An FP8 point is
//! timed as the engine runs it ([`crate::mla::widen::launch`]): from
//! [`WIDE_ROWS`](crate::mla::widen::WIDE_ROWS) rows, widening the layer and its bf16 twin.

use kdtree_quant::Dtype;
use kdtree_quant::sample::symmetric;
use serde::Serialize;

use super::bench::{BenchConfig, Timing, measure};
use super::db::{Entry, TuningDb};
use super::error::Result;
use super::key::{MlaKey, ProblemKey};
use super::peers::Peers;
use super::problem::{from_bits, to_bits};
use super::search::Rejection;
use super::session::Session;
use crate::mla::reference::{Weights, attention};
use crate::mla::widen::{self, Widening, bf16_pages};
use crate::mla::{
    AuxKernel, DeviceMask, MlaAux, MlaBuffers, MlaDecode, MlaKernel, MlaKv, MlaShape, NewMask, PagedCache, mla_host,
    upload_cache,
};
use crate::{Cache, Variant, compile_all_for};

/// New rows per launch the grid times: a decode step, a small tree, DDTree's usual verify.
pub const ROWS: [usize; 3] = [1, 8, 64];
/// Contexts the grid times.
pub const CONTEXTS: [usize; 3] = [4096, 32768, 131072];
/// Entries a cache page holds while timing: the engine's page.
const PAGE: usize = 64;
/// The most split partials a launch is given, as the engine gives them (rows run in slices).
const WORKSPACE_BYTES: usize = 256 << 20;
/// The gate's bound on `max |got - want|`, in units of the largest latent magnitude: the kernel and
/// the reference round the same P to bf16 and part only where a score's last f32 bits move a weight
/// across a rounding boundary (2^-8 relative), so a correct kernel is within about 2^-8; 1e-2 leaves
/// 2.5x.
const TOLERANCE: f32 = 1e-2;

/// One point of the grid: the chosen variant's time and the best variant's there.
#[derive(Clone, Debug, Serialize)]
pub struct MlaPoint {
    pub rows: usize,
    pub context: usize,
    pub chosen: Timing,
    pub best_variant: String,
    pub best_us: f64,
    /// The latent entries the launch reads once (in the cache's dtype), over the chosen variant's time.
    pub gbps: f64,
    /// Tensor-core FLOPs (scores and the latent output, both 2 per multiply-add) a second.
    pub tflops: f64,
}

/// The outcome of one MLA tuning run.
#[derive(Clone, Debug, Serialize)]
pub struct MlaTuned {
    pub key: ProblemKey,
    pub variant: String,
    /// Mean over the grid of the chosen variant's time over the best's (1.0: best everywhere).
    pub mean_slowdown: f64,
    pub points: Vec<MlaPoint>,
    pub copy_gbps: f64,
    pub rejected: Vec<Rejection>,
}

fn to_bf16(v: &[f32]) -> Vec<u16> {
    v.iter().map(|&x| to_bits(Dtype::Bf16, x)).collect()
}

fn widen(b: &[u16]) -> Vec<f32> {
    b.iter().map(|&x| from_bits(Dtype::Bf16, x)).collect()
}

/// The gate's cases, a causal block and a tree, with the reference's output: bf16 bits of q, kv as
/// the cache's words, the committed entries, the mask, and `o_lat` over the values the cache holds.
struct GateCase {
    q: Vec<u16>,
    kv: Vec<u16>,
    past: usize,
    mask: NewMask,
    want: Vec<f32>,
}

fn gate_cases(s: &MlaShape, kv_dtype: MlaKv) -> Vec<GateCase> {
    let w = s.width();
    let tree = NewMask::tree(&[None, Some(0), Some(0), Some(1), Some(3)]);
    [(1u64, 1000usize, 8usize, NewMask::Causal), (2, 37, 5, tree)]
        .into_iter()
        .map(|(seed, past, n, mask)| {
            let q = to_bf16(&symmetric(n * s.heads * w, seed, 1.0));
            let (kv, values) = kv_dtype.encode(&symmetric((past + n) * w, seed + 10, 1.0), s);
            let want = attention(&widen(&q), &values, past, &mask, s, Weights::Bf16);
            GateCase { q, kv, past, mask, want }
        })
        .collect()
}

/// The worst error of `kernel` against the reference over `cases` (inputs in [-1, 1], so in units of
/// the largest latent magnitude), or why it fails.
fn gate(
    session: &Session,
    kernel: &MlaKernel,
    s: &MlaShape,
    cases: &[GateCase],
) -> Result<std::result::Result<f32, String>> {
    let mut error = 0.0f32;
    for c in cases {
        let got = mla_host(session.gpu, kernel, s, &c.q, &c.kv, c.past, &c.mask, PAGE)?;
        let worst = got.iter().zip(&c.want).map(|(g, w)| if g.is_finite() { (g - w).abs() } else { f32::INFINITY });
        let worst = worst.fold(0.0, f32::max);
        if worst > TOLERANCE {
            let n = c.q.len() / (s.heads * s.width());
            return Ok(Err(format!("{} + {n} rows: max error {worst:.3e} over {TOLERANCE:e}", c.past)));
        }
        error = error.max(worst);
    }
    Ok(Ok(error))
}

/// The grid's device buffers, made once and shared by every variant and both passes: a cache per
/// context, queries per row count, each point's committed length, one workspace and output; for an
/// FP8 cache, bf16 pages per context to widen into.
struct Grid {
    /// Per context: its pool (kept alive) and page table.
    caches: Vec<(cudarc::driver::CudaSlice<u16>, cudarc::driver::CudaSlice<u64>)>,
    /// Per context, for an FP8 cache: bf16 pages and their table.
    wide: Vec<(cudarc::driver::CudaSlice<u16>, cudarc::driver::CudaSlice<u64>)>,
    /// Per row count.
    queries: Vec<cudarc::driver::CudaSlice<u16>>,
    /// Per point: (row count's index, context's index, rows, `context - rows` on the device).
    points: Vec<(usize, usize, usize, cudarc::driver::CudaSlice<u32>)>,
    workspace: cudarc::driver::CudaSlice<f32>,
    o_lat: cudarc::driver::CudaSlice<f32>,
}

impl Grid {
    /// Points are (rows, context) in context-major order, rows no more than the context.
    #[allow(clippy::too_many_arguments)]
    fn new(
        session: &Session,
        s: &MlaShape,
        kv: MlaKv,
        rows: &[usize],
        contexts: &[usize],
        most_ws: usize,
    ) -> Result<Grid> {
        let (gpu, w) = (session.gpu, s.width());
        let st = &gpu.stream;
        let (mut caches, mut wide) = (Vec::new(), Vec::new());
        for &c in contexts {
            caches.push(upload_cache(gpu, &kv.encode(&symmetric(c * w, 3, 1.0), s).0, kv.entry_words(s), PAGE, 1, 0)?);
            if kv == MlaKv::Fp8 {
                wide.push(bf16_pages(gpu, c, PAGE, w)?);
            }
        }
        let mut queries = Vec::new();
        for &r in rows {
            queries.push(st.clone_htod(&to_bf16(&symmetric(r * s.heads * w, 7, 1.0)))?);
        }
        let mut points = Vec::new();
        for (ci, &c) in contexts.iter().enumerate() {
            for (ri, &r) in rows.iter().enumerate().filter(|(_, r)| **r <= c) {
                points.push((ri, ci, r, st.clone_htod(&[(c - r) as u32])?));
            }
        }
        let most_rows = rows.iter().copied().max().unwrap_or(1);
        // Every variant's slice (`Grid::time`) fits: rows x its own row, or the byte bound.
        let workspace = (most_rows * most_ws).min(WORKSPACE_BYTES / 4 + most_ws);
        Ok(Grid {
            caches,
            wide,
            queries,
            points,
            workspace: st.alloc_zeros::<f32>(workspace)?,
            o_lat: st.alloc_zeros::<f32>(most_rows * s.heads * s.latent)?,
        })
    }

    /// Times `kernel` at point `p`, as the engine runs it with `widening` (an FP8 variant's twin and
    /// the FP8 aux kernels) where the grid has pages to widen into.
    #[allow(clippy::too_many_arguments)]
    fn time(
        &mut self,
        session: &mut Session,
        kernel: &MlaKernel,
        widening: Option<(&MlaKernel, &AuxKernel)>,
        s: &MlaShape,
        p: usize,
        cfg: &BenchConfig,
        best: Option<f64>,
    ) -> Result<Timing> {
        let (ri, ci, rows, past) = &self.points[p];
        let row_len = kernel.variant().workspace_len(1, s.heads, s.latent);
        let ws = (WORKSPACE_BYTES / 4 / row_len).clamp(1, *rows) * row_len;
        let Session { gpu, clock, flusher, .. } = session;
        let pages = self.wide.get(*ci).map(|(_, table)| table);
        let mut run = || {
            let b = MlaBuffers {
                q: self.queries[*ri].as_view(),
                cache: PagedCache { table: self.caches[*ci].1.as_view(), page: PAGE, layer: 0 },
                past: past.as_view(),
                mask: DeviceMask::Causal,
                workspace: self.workspace.slice_mut(..ws),
                o_lat: self.o_lat.slice_mut(..*rows * s.heads * s.latent),
            };
            let wide = widening.zip(pages).map(|((twin, aux), pages)| Widening { twin, aux, pages: pages.as_view() });
            Ok(widen::launch(gpu, s, *rows, kernel, wide, b)?)
        };
        measure(clock, cfg, best, || flusher.flush(&gpu.stream), &mut run)
    }
}

/// Tunes the decode variant of `s` over a cache of `kv` at `rows` x `contexts` and saves the winner
/// in `db` (not to disk). Every valid variant of the arch for that cache is a candidate; `progress`
/// gets (done, total) of the measurements.
#[allow(clippy::too_many_arguments)]
pub fn tune_mla(
    session: &mut Session,
    db: &mut TuningDb,
    cache: Option<&Cache>,
    s: &MlaShape,
    kv: MlaKv,
    rows: &[usize],
    contexts: &[usize],
    progress: &mut dyn FnMut(usize, usize),
) -> Result<MlaTuned> {
    let arch = session.gpu.arch;
    let key = ProblemKey::mla(MlaKey::of(s, kv), arch);
    let mut rejected = Vec::new();
    let (mut kernels, mut errors) = (Vec::new(), Vec::new());
    let cases = gate_cases(s, kv);
    let candidates: Vec<MlaDecode> = MlaDecode::valid_on(arch).into_iter().filter(|v| v.kv == kv).collect();
    for (v, compiled) in compile_all_for(&candidates, |v| v.compile_arch(arch), cache, |_| {}) {
        let kernel = compiled.and_then(|c| MlaKernel::load(session.gpu, v, &c));
        match kernel {
            Ok(k) => match gate(session, &k, s, &cases)? {
                Ok(error) => {
                    kernels.push(k);
                    errors.push(error);
                }
                Err(reason) => rejected.push(Rejection { variant: v.name(), reason }),
            },
            Err(e) => rejected.push(Rejection { variant: v.name(), reason: e.to_string() }),
        }
    }
    if kernels.is_empty() {
        return Err(crate::Error::Unsupported {
            variant: key.to_string(),
            reason: "no variant passed the gate".into(),
        }
        .into());
    }
    // FP8: each gated variant's bf16 twin where the arch runs it, and the aux kernels that widen.
    let (twins, aux) = match kv {
        MlaKv::Fp8 => {
            let fits: Vec<MlaDecode> = kernels.iter().filter_map(|k| widen::twin_on(k.variant(), arch)).collect();
            let mut loaded = std::collections::HashMap::new();
            for (v, compiled) in compile_all_for(&fits, |v| v.compile_arch(arch), cache, |_| {}) {
                loaded.insert(v.name(), MlaKernel::load(session.gpu, v, &compiled?)?);
            }
            let twins: Vec<Option<MlaKernel>> =
                kernels.iter().map(|k| loaded.remove(&widen::twin(k.variant()).name())).collect();
            (twins, Some(AuxKernel::compile(session.gpu, MlaAux::beside(kernels[0].variant()), cache)?))
        }
        MlaKv::Bf16 => (kernels.iter().map(|_| None).collect(), None),
    };
    let widening = |i: usize| twins[i].as_ref().zip(aux.as_ref());
    let most_ws = kernels.iter().map(|k| k.variant().workspace_len(1, s.heads, s.latent)).max().unwrap_or(1);
    let mut grid = Grid::new(session, s, kv, rows, contexts, most_ws)?;
    let points = grid.points.len();
    if points == 0 {
        let reason = "no point of the grid has at most as many rows as its context".into();
        return Err(crate::Error::Unsupported { variant: key.to_string(), reason }.into());
    }
    let total = points * (kernels.len() + 1);
    // Screen: every variant at every point; times[p][v].
    let mut times = vec![vec![f64::INFINITY; kernels.len()]; points];
    let mut done = 0;
    for (p, times) in times.iter_mut().enumerate() {
        let mut best: Option<f64> = None;
        for (i, k) in kernels.iter().enumerate() {
            let t = grid.time(session, k, widening(i), s, p, &BenchConfig::SCREEN, best)?.median_us;
            times[i] = t;
            best = Some(best.map_or(t, |b| b.min(t)));
            done += 1;
            progress(done, total);
        }
    }
    let score = |i: usize| times.iter().map(|t| t[i] / t.iter().copied().fold(f64::INFINITY, f64::min)).sum::<f64>();
    let chosen = (0..kernels.len()).min_by(|&a, &b| score(a).total_cmp(&score(b))).expect("some kernel");
    let mean_slowdown = score(chosen) / points as f64;
    // The winner's final times, point by point.
    let mut reports = Vec::new();
    for (p, times) in times.iter().enumerate() {
        let t = grid.time(session, &kernels[chosen], widening(chosen), s, p, &BenchConfig::FINAL, None)?;
        let (r, c) = (grid.points[p].2, contexts[grid.points[p].1]);
        let (best_i, best_us) =
            times.iter().enumerate().min_by(|a, b| a.1.total_cmp(b.1)).map(|(i, &t)| (i, t)).expect("timed");
        let bytes = (c * kv.entry_bytes(s)) as f64;
        let flops = 2.0 * (r * s.heads) as f64 * c as f64 * (s.width() + s.latent) as f64;
        reports.push(MlaPoint {
            rows: r,
            context: c,
            chosen: t,
            best_variant: kernels[best_i].variant().name(),
            best_us,
            gbps: bytes / t.median_us / 1e3,
            tflops: flops / t.median_us / 1e6,
        });
        done += 1;
        progress(done, total);
    }
    let variant = kernels[chosen].variant().name();
    let decode = reports.iter().filter(|p| p.rows == 1).max_by_key(|p| p.context).unwrap_or(&reports[0]);
    db.insert(Entry {
        key: key.clone(),
        env: session.env.clone(),
        variant: variant.clone(),
        m: decode.rows as u32,
        timing: decode.chosen,
        error: f64::from(errors[chosen]),
        peers: Peers { cublas_bf16: None, cublas_f16: None, copy_gbps: session.copy_gbps },
        bytes: (decode.context * kv.entry_bytes(s)) as u64,
        timed: kernels.len() as u32,
        rejected: rejected.clone(),
        tuned_at_unix: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
    });
    Ok(MlaTuned { key, variant, mean_slowdown, points: reports, copy_gbps: session.copy_gbps, rejected })
}

/// The decode variant the DB holds for `s` over a cache of `kv` on this environment, if any.
pub fn tuned_variant(
    db: &TuningDb,
    env: &super::env::Environment,
    arch: crate::Arch,
    s: &MlaShape,
    kv: MlaKv,
) -> Option<MlaDecode> {
    let key = ProblemKey::mla(MlaKey::of(s, kv), arch);
    let v = MlaDecode::from_name(&db.best_variant(&key, env)?.variant)?;
    (v.kv == kv && v.check(&crate::Target { arch }).is_ok()).then_some(v)
}
