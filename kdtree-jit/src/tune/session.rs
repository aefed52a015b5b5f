//! One tuning (or benchmark) run on the GPU: the device's peers measured once, the candidates
//! compiled once, then per shape the problem built, uploaded and searched at every M.

use std::collections::HashMap;

use cudarc::cublas::CudaBlas;
use cudarc::driver::sys::CUdevice_attribute;
use kdtree_quant::Dtype;

use super::bench::BenchConfig;
use super::clock::CudaClock;
use super::db::{CompileFailure, Entry, TuningDb};
use super::env::Environment;
use super::error::Result;
use super::flush::{FlushMode, Flusher};
use super::gpu::{ShapeBuffers, W4a16Runner};
use super::key::{ProblemKey, Shape};
use super::peers::{self, DensePeer, Peers};
use super::problem::Problem;
use super::search::{self, Rejection, SearchConfig};
use crate::w4a16::dense::{DenseFamily, DenseKernel, DenseVariant};
use crate::{Arch, Cache, Compiled, Error, Gpu, Variant};

pub struct Session<'g> {
    pub gpu: &'g Gpu,
    pub env: Environment,
    pub sms: u32,
    /// Device-to-device copy bandwidth measured at the start of the run, GB/s.
    pub copy_gbps: f64,
    pub(super) clock: CudaClock,
    pub(super) flusher: Flusher,
    /// `None` where libcublas is missing: the results then carry no cuBLAS peer.
    pub(super) blas: Option<CudaBlas>,
}

/// The M to tune at and the candidates to try there.
pub type AtM<V = DenseVariant> = (u32, Vec<V>);

/// The result of one (shape, M): the DB entry when some candidate was correct, and the rejections.
#[derive(Clone, Debug)]
pub struct Tuned {
    pub key: ProblemKey,
    pub entry: Option<Entry>,
    pub rejected: Vec<Rejection>,
}

/// Random problems are seeded by shape, so every run (and `bench`) measures the same data.
fn seed(shape: Shape) -> u64 {
    0x6b64_7472_6565 ^ (shape.n as u64) << 32 ^ shape.k as u64
}

impl<'g> Session<'g> {
    /// Opens a run on `gpu`, evicting the L2 before each timed rep by `flush`. NVRTC must be loaded.
    pub fn open(gpu: &'g Gpu, flush: FlushMode) -> Result<Session<'g>> {
        let env = Environment::detect(gpu)?;
        let sms = gpu.ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(1) as u32;
        let mut clock = CudaClock::new(gpu.stream.clone());
        let copy_gbps = peers::copy_bandwidth(&gpu.stream, &mut clock)?;
        let flusher = Flusher::new(gpu, flush, sms)?;
        let blas = if crate::cublas::present() { Some(CudaBlas::new(gpu.stream.clone())?) } else { None };
        Ok(Session { gpu, env, sms, copy_gbps, clock, flusher, blas })
    }

    pub fn flush_mode(&self) -> FlushMode {
        self.flusher.mode()
    }

    /// Compiles and loads `variants`, each for its [`DenseFamily::compile_arch`]. A compile failure
    /// is recorded in `db` and that variant is left out; one recorded earlier for this arch, NVRTC
    /// and templates is not tried again unless `retry_failed`. `progress` gets the number of
    /// variants done.
    pub fn compile(
        &self,
        variants: &[DenseVariant],
        db: &mut TuningDb,
        cache: Option<&Cache>,
        retry_failed: bool,
        progress: impl Fn(usize) + Sync,
    ) -> Result<HashMap<String, DenseKernel>> {
        let device = self.gpu.arch;
        self.compile_with(variants, |v| v.compile_arch(device), db, cache, retry_failed, progress, DenseKernel::load)
    }

    /// [`compile`](Self::compile) for any family, each variant for `arch_of` it, loading each cubin
    /// with `load`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn compile_with<V: Variant + Copy, K>(
        &self,
        variants: &[V],
        arch_of: impl Fn(&V) -> Arch + Sync,
        db: &mut TuningDb,
        cache: Option<&Cache>,
        retry_failed: bool,
        progress: impl Fn(usize) + Sync,
        load: impl Fn(&Gpu, V, &Compiled) -> crate::Result<K>,
    ) -> Result<HashMap<String, K>> {
        let todo: Vec<V> = variants
            .iter()
            .filter(|v| retry_failed || db.compile_failure(&v.name(), arch_of(v), &self.env).is_none())
            .copied()
            .collect();
        let mut kernels = HashMap::new();
        for (v, compiled) in crate::compile_all_for(&todo, &arch_of, cache, progress) {
            match compiled {
                Ok(c) => {
                    kernels.insert(v.name(), load(self.gpu, v, &c)?);
                }
                Err(Error::Compile { log, .. }) => db.record_compile_failure(CompileFailure {
                    variant: v.name(),
                    arch: arch_of(&v),
                    nvrtc: self.env.nvrtc,
                    templates: self.env.templates.clone(),
                    log,
                }),
                Err(other) => return Err(other.into()),
            }
        }
        Ok(kernels)
    }

    /// Tunes one shape at each `(m, candidates)` of `work`, in order, asking `proceed` before each
    /// M and stopping at the first `false`; `progress` is called once per candidate gated.
    pub fn tune_shape(
        &mut self,
        (shape, group_size, dtype): (Shape, u32, Dtype),
        work: &[AtM],
        kernels: &HashMap<String, DenseKernel>,
        cfg: &SearchConfig,
        mut proceed: impl FnMut() -> bool,
        mut progress: impl FnMut(),
    ) -> Result<Vec<Tuned>> {
        let m_max = work.iter().map(|(m, _)| *m as usize).max().unwrap_or(1);
        let problem = Problem::random(shape, group_size, dtype, m_max, seed(shape))?;
        let compiled: Vec<DenseVariant> =
            work.iter().flat_map(|(_, vs)| vs).filter(|v| kernels.contains_key(&v.name())).copied().collect();
        let mut buffers = ShapeBuffers::upload(self.gpu, &problem, &compiled)?;
        let mut dense = [
            DensePeer::new(&self.gpu.stream, &problem, Dtype::Bf16)?,
            DensePeer::new(&self.gpu.stream, &problem, Dtype::F16)?,
        ];
        let mut results = Vec::new();
        for (m, candidates) in work {
            if !proceed() {
                break;
            }
            let candidates: Vec<DenseVariant> =
                candidates.iter().filter(|v| kernels.contains_key(&v.name())).copied().collect();
            let mut runner = W4a16Runner {
                gpu: self.gpu,
                problem: &problem,
                kernels,
                buffers: &mut buffers,
                flusher: &mut self.flusher,
                m: *m as usize,
            };
            let outcome = search::search(
                &mut runner,
                &mut self.clock,
                &candidates,
                problem.reference(*m as usize),
                cfg,
                &mut progress,
            )?;
            let key = ProblemKey::w4a16(*m, shape, group_size, dtype, self.gpu.arch);
            let entry = match outcome.best {
                None => None,
                Some(best) => Some(Entry {
                    key: key.clone(),
                    env: self.env.clone(),
                    variant: best.name,
                    m: *m,
                    timing: best.timing,
                    error: best.error,
                    peers: self.peers(&mut dense, (*m as usize, shape))?,
                    bytes: problem.bytes(*m as usize),
                    timed: outcome.timed.len() as u32,
                    rejected: outcome.rejected.clone(),
                    tuned_at_unix: now_unix(),
                }),
            };
            results.push(Tuned { key, entry, rejected: outcome.rejected });
        }
        Ok(results)
    }

    /// Measures `entries` (all of one shape, group size and dtype) again: gated, then timed with
    /// [`BenchConfig::FINAL`], with fresh peers. A variant that is now wrong comes back rejected.
    pub fn bench_shape(&mut self, entries: &[&Entry], kernels: &HashMap<String, DenseKernel>) -> Result<Vec<Tuned>> {
        let work: Vec<AtM> =
            entries.iter().map(|e| (e.m, DenseVariant::from_name(&e.variant).into_iter().collect())).collect();
        let Some(first) = entries.first() else { return Ok(Vec::new()) };
        let cfg = SearchConfig { screen: BenchConfig::FINAL, finalists: 0, fin: BenchConfig::FINAL };
        let key = &first.key;
        self.tune_shape((key.shape(), key.group_size, key.dtype), &work, kernels, &cfg, || true, || {})
    }

    fn peers(&mut self, dense: &mut [DensePeer; 2], (m, shape): (usize, Shape)) -> Result<Peers> {
        let dims = (m, shape.n as usize, shape.k as usize);
        let mut time = |peer: &mut DensePeer| match &self.blas {
            Some(blas) => peer.time(blas, &self.gpu.stream, &mut self.clock, &mut self.flusher, dims).map(Some),
            None => Ok(None),
        };
        let [bf16, f16] = dense;
        Ok(Peers { cublas_bf16: time(bf16)?, cublas_f16: time(f16)?, copy_gbps: self.copy_gbps })
    }
}

pub(super) fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
