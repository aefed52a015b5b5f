//! The CUDA backend: every op of the forward on the GPU. Activations, the KV cache and the weights
//! stay on the device; a forward uploads its token ids, positions and mask and returns argmax ids
//! (or logits). Nothing else crosses to the host, unless routed experts run one chain per expert
//! (`grouped_moe` off, or weights the grouped kernel cannot serve), which reads each layer's routing
//! back to size their launches.
//!
//! | op | how |
//! |---|---|
//! | dense linears, the router, the LM head | cuBLAS (bf16/f16 in, f32 out; f32 for the router; f32 weights of an f32 model in f32 with no TF32), `gemm`; at up to 128 rows the streamed 16-bit variant where the tuning DB has one faster than cuBLAS (`streamed`) |
//! | W4A16 linears | the tuned kdtree-jit variant of the weight's shape (`select`) |
//! | W4A16 shapes the tuning DB lacks | tuned before the load, within a budget ([`CudaBackend::tune_at_startup`]) |
//! | embedding, RMSNorm, rope, casts, residual adds | `#[kernel]`s of kdtree-kernels |
//! | MLA attention over the paged latent cache, tree-masked | kdtree-jit's MLA family: absorb, split attention on the tensor cores, combine, unabsorb (`mla`); an f32 model's in f32 on the CUDA cores (`mla_f32`) |
//! | routing and routed experts | `noaux_tc` routing, then kdtree-jit's grouped W4A16: every expert of a layer in one launch per projection (`moe`) |
//! | a DFlash drafter's attention and per-depth top-k | kdtree-kernels' `gqa_attention` (split over the keys, combined) over its context in device row stores ([`CudaRows`]); `top_k_log_softmax`, only the candidates read back |
//!
//! Exact mode (the default) keeps every op batch-invariant: a row's bits never depend on how many
//! rows run with it, so DDTree's output equals greedy decoding's on this backend too. W4A16 runs one
//! variant per shape for every M ([`select::Mode::Exact`]), cuBLAS runs fixed 128-row chunks
//! (`gemm`), and the small kernels compute each row on its own.

mod cubin_cache;
mod gemm;
mod graph;
mod kv;
mod linear;
mod mla;
mod mla_f32;
mod moe;
mod ops;
mod rows;
mod select;
mod startup_tune;
mod streamed;
mod tensor;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream};
use kdtree_jit::kernel::Kernels;
use kdtree_jit::mla::{MlaDecode, MlaKv};
use kdtree_jit::tune::db::TuningDb;
use kdtree_jit::tune::env::Environment;
use kdtree_jit::w4a16::dense::{DenseFamily, DenseVariant};
use kdtree_jit::{Cache, Gpu, Target, compile_all_for};

pub use kv::{CudaKv, KvBudget};
pub use linear::{CudaLinear, ShapeKernels};
pub use mla::CudaAbsorb;
pub(crate) use mla::{LatentKernels, MlaKernels};
pub(crate) use mla_f32::MlaF32Kernels;
pub use moe::CudaExperts;
pub use rows::CudaRows;
pub use select::{Mode, Plan, Source, VariantChoice, WeightShape, default_variant, plan};
pub use startup_tune::{Missing, StartupProgress, TuneSummary, missing};
pub use streamed::MAX_STREAMED_ROWS;
use tensor::HostBatch;
pub use tensor::{CudaBatch, CudaTensor};

use crate::error::{EngineError, Result};
use crate::mask::TreeMask;
use crate::registry::{
    Argmax, Backend, ComputeDtype, GqaShape, Heads, HostExperts, HostLinear, KvDtype, KvStore, LogitTransform,
    RopeSpan, RowStore, Taps, check_gqa, check_norm, eager_forward_argmax,
};

/// What the CUDA backend is opened with.
#[derive(Clone, Debug, PartialEq)]
pub struct CudaOptions {
    /// Which GPU (0 is the first).
    pub ordinal: usize,
    /// The tuning DB; a missing file is an empty DB (every shape then runs the default variant).
    pub tuning_db: PathBuf,
    pub mode: Mode,
    /// How routed INT4 experts run.
    pub moe: MoeKernels,
    /// Record each forward size of up to `MAX_GRAPH_TOKENS` tokens as a CUDA graph the second
    /// time it runs, and replay it after that.
    pub graphs: bool,
    /// How many bytes a KV cache's pages may take.
    pub kv_budget: KvBudget,
    /// The MLA attention variant; `None` is [`MlaDecode::default_for`] the GPU.
    pub mla: Option<MlaDecode>,
    /// Over an FP8 cache, forwards of [`kdtree_jit::mla::widen::WIDE_ROWS`] rows or more widen each layer to bf16 once and
    /// run the FP8 variant's bf16 twin over it (the same bits), where the FP8 variant widens the
    /// cache again for every row; each page then keeps bf16 room for one layer. `false` runs every
    /// forward on the FP8 kernels and leaves that room to tokens.
    pub fp8_widen: bool,
}

/// How routed INT4 experts run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoeKernels {
    /// One grouped launch per projection, by this variant or, when `None`, by
    /// [`W4a16Grouped::default_for`](kdtree_jit::w4a16::grouped::W4a16Grouped::default_for).
    Grouped(Option<kdtree_jit::w4a16::grouped::W4a16Grouped>),
    /// One launch chain per expert, the routing read back to the host each layer: for comparison.
    PerExpert,
}

impl Default for MoeKernels {
    fn default() -> Self {
        MoeKernels::Grouped(None)
    }
}

/// One GPU with its kernels, cuBLAS, the tuning DB and the W4A16 plans of the shapes loaded so far.
pub struct CudaBackend {
    gpu: Gpu,
    kernels: Arc<Kernels>,
    blas: CudaBlas,
    /// cuBLAS's workspace, set by us so that a captured GEMM never allocates its own.
    _blas_workspace: cudarc::driver::CudaSlice<u8>,
    tuning: Tuning,
    attention: AttentionKernels,
    weights: WeightKernels,
    monitor: Monitor,
    graphs: bool,
    kv_budget: KvBudget,
}

/// How kernels are chosen and where compiled ones are kept.
struct Tuning {
    /// What the DB's entries are keyed by: the GPU, driver and NVRTC versions.
    env: Environment,
    db: TuningDb,
    /// Where `db` was read from, and is saved to when tuning at startup adds to it.
    db_path: PathBuf,
    mode: Mode,
    /// `None` when the cache directory is refused (a note says why): kernels then compile every time.
    cubins: Option<Cache>,
}

/// The attention kernels, loaded with the first model's attention weights, whose head sizes pick the
/// tuned variant.
struct AttentionKernels {
    mla: OnceLock<Arc<MlaKernels>>,
    /// The tensor-core family over an FP8 cache, loaded when a model's cache is set to fp8.
    mla_fp8: OnceLock<Arc<MlaKernels>>,
    /// The f32 family, loaded with the first f32 model's attention weights.
    mla_f32: OnceLock<Arc<MlaF32Kernels>>,
    /// [`CudaOptions::fp8_widen`].
    fp8_widen: bool,
    /// `--mla-variant`: the variant asked for, over the DB's, for the cache it reads.
    variant: Option<MlaDecode>,
}

/// The linear layers' kernels, by weight shape, compiled as weights of each shape are loaded.
struct WeightKernels {
    shapes: Mutex<BTreeMap<WeightShape, Arc<ShapeKernels>>>,
    /// The streamed kernel of each dense weight shape loaded so far; `None` where cuBLAS runs it.
    streamed: Mutex<BTreeMap<crate::model::DenseShape, Option<Arc<kdtree_jit::dense16::Dense16Kernel>>>>,
    moe: MoeKernels,
}

/// What forwards did: the profile, the experts launched, whether one read back mid-forward.
#[derive(Default)]
struct Monitor {
    /// Set when an MoE layer runs one chain per expert, which reads its routing back to the host
    /// mid-forward: such a forward cannot be recorded.
    host_synced: AtomicBool,
    /// Experts launched by MoE layers since the last [`CudaBackend::take_experts_launched`].
    experts_launched: AtomicUsize,
    /// While profiling: each op's class and the events recorded around it on the stream.
    profile: Mutex<Option<Vec<(String, CudaEvent, CudaEvent)>>>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend").field("gpu", &self.gpu.name).field("arch", &self.gpu.arch).finish()
    }
}

impl CudaBackend {
    /// Opens the GPU on a stream of its own, loads NVRTC, cuBLAS and every `#[kernel]`, and reads
    /// the tuning DB. Without a driver, a GPU, NVRTC or cuBLAS this is an error saying which (never
    /// cudarc's panic).
    pub fn open(options: &CudaOptions) -> Result<CudaBackend> {
        let mut gpu = Gpu::open(options.ordinal)?;
        // A stream of its own rather than the legacy default one, which cannot be captured in a graph.
        gpu.stream = gpu.ctx.new_stream()?;
        // SAFETY: every buffer of this backend is allocated, used and freed on that one stream, in
        // order, so cudarc's per-buffer events (a record and a wait per argument of every launch,
        // the host's main cost per op) have nothing to synchronise.
        unsafe { gpu.ctx.disable_event_tracking() };
        let env = Environment::detect(&gpu)?;
        let db = TuningDb::open(&options.tuning_db)?;
        let cache = cubin_cache::open(&Cache::default_dir());
        if !kdtree_jit::tune::cublas_present() {
            return Err(EngineError::BackendUnavailable {
                reason: "libcublas was not found on the loader path".into(),
            });
        }
        let blas = CudaBlas::new(gpu.stream.clone())
            .map_err(|e| EngineError::BackendUnavailable { reason: format!("cuBLAS could not start: {e}") })?;
        let blas_workspace = kdtree_jit::cublas::set_workspace(&blas, &gpu.stream)?;
        kdtree_kernels::launch::all();
        let kernels = Arc::new(Kernels::load(&gpu, cache.as_ref())?);
        Ok(CudaBackend {
            gpu,
            kernels,
            blas,
            _blas_workspace: blas_workspace,
            tuning: Tuning { env, db, db_path: options.tuning_db.clone(), mode: options.mode, cubins: cache },
            attention: AttentionKernels {
                mla: OnceLock::new(),
                mla_fp8: OnceLock::new(),
                mla_f32: OnceLock::new(),
                fp8_widen: options.fp8_widen,
                variant: options.mla,
            },
            weights: WeightKernels { shapes: Mutex::default(), streamed: Mutex::default(), moe: options.moe },
            monitor: Monitor::default(),
            graphs: options.graphs,
            kv_budget: options.kv_budget,
        })
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.gpu.stream
    }

    pub(crate) fn kernels(&self) -> &Kernels {
        &self.kernels
    }

    pub(crate) fn blas(&self) -> &CudaBlas {
        &self.blas
    }

    pub fn mode(&self) -> Mode {
        self.tuning.mode
    }

    /// Waits until the GPU has done everything enqueued.
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.stream().synchronize()?)
    }

    /// The plan of every W4A16 weight shape loaded so far, by shape.
    pub fn plans(&self) -> Vec<(WeightShape, Plan)> {
        let shapes = self.weights.shapes.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        shapes.iter().map(|(s, k)| (*s, k.plan.clone())).collect()
    }

    /// How many experts the MoE layers launched since the last call: the distinct experts each
    /// layer's tokens routed to, summed over layers and forwards. The grouped path counts on the
    /// device and reads the count back only while profiling ([`Self::start_profile`]).
    pub fn take_experts_launched(&self) -> usize {
        self.monitor.experts_launched.swap(0, Ordering::Relaxed)
    }

    /// Starts timing ops by class: CUDA events around each op, so the time of an op is the GPU's
    /// from reaching it to finishing it, host bubbles before it included.
    pub fn start_profile(&self) {
        *self.monitor.profile.lock().unwrap_or_else(|p| p.into_inner()) = Some(Vec::new());
    }

    /// Stops profiling; microseconds by op class since [`Self::start_profile`], largest first.
    pub fn take_profile(&self) -> Result<Vec<(String, f64)>> {
        let taken = self.monitor.profile.lock().unwrap_or_else(|p| p.into_inner()).take().unwrap_or_default();
        let mut by_class: BTreeMap<String, f64> = BTreeMap::new();
        for (class, start, end) in taken {
            *by_class.entry(class).or_default() += 1e3 * f64::from(start.elapsed_ms(&end)?);
        }
        let mut out: Vec<(String, f64)> = by_class.into_iter().collect();
        out.sort_by(|a, b| b.1.total_cmp(&a.1));
        Ok(out)
    }

    /// Runs `op`, timed under `class` while profiling.
    fn timed<T>(&self, class: impl FnOnce() -> String, op: impl FnOnce() -> Result<T>) -> Result<T> {
        if self.monitor.profile.lock().unwrap_or_else(|p| p.into_inner()).is_none() {
            return op();
        }
        let event = || self.stream().record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT));
        let start = event()?;
        let out = op()?;
        let end = event()?;
        if let Some(p) = self.monitor.profile.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            p.push((class(), start, end));
        }
        Ok(out)
    }

    /// Whether forwards are recorded as graphs now: asked for, no MoE layer reads back mid-forward,
    /// and not profiling (which times each op with events of its own).
    fn graphs_now(&self) -> bool {
        self.graphs
            && !self.monitor.host_synced.load(Ordering::Relaxed)
            && self.monitor.profile.lock().unwrap_or_else(|p| p.into_inner()).is_none()
    }

    fn count_experts(&self, n: usize) {
        self.monitor.experts_launched.fetch_add(n, Ordering::Relaxed);
    }

    /// The kernels of `shape`: planned from the tuning DB and compiled (through the cubin cache) the
    /// first time a weight of that shape is loaded.
    fn shape_kernels(&self, shape: WeightShape) -> Result<Arc<ShapeKernels>> {
        let mut shapes = self.weights.shapes.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(k) = shapes.get(&shape) {
            return Ok(k.clone());
        }
        let p = plan(&self.tuning.db, &self.tuning.env, self.gpu.arch, &shape, self.tuning.mode);
        // Tuned variants were checked when chosen; this catches a default that cannot run here.
        let arch = self.gpu.arch;
        if let Err(why) = p.general.variant.check_on(arch) {
            return Err(EngineError::NoKernel { shape: shape.to_string(), reason: why.to_string() });
        }
        let variants: Vec<DenseVariant> = p.variants();
        let mut functions = HashMap::new();
        for (v, compiled) in compile_all_for(&variants, |v| v.compile_arch(arch), self.tuning.cubins.as_ref(), |_| {}) {
            functions.insert(v, self.gpu.load(&compiled?)?);
        }
        let k = Arc::new(ShapeKernels::new(shape, p, functions));
        shapes.insert(shape, k.clone());
        Ok(k)
    }

    fn upload_linear(&self, _name: &str, w: HostLinear) -> Result<CudaLinear> {
        match &w {
            HostLinear::Dense(d) => CudaLinear::dense(self, d),
            HostLinear::Int4(q) => CudaLinear::int4(self, q, self.shape_kernels(WeightShape::of(q))?),
        }
    }

    /// A buffer for a kernel's output, which the kernel writes in full: not zeroed, which would
    /// cost a memset launch per op.
    pub(crate) fn output<T: cudarc::driver::DeviceRepr>(&self, len: usize) -> Result<cudarc::driver::CudaSlice<T>> {
        // SAFETY: the caller passes the buffer to a kernel that writes every element before anything
        // reads it; device memory holds no Rust invariants.
        Ok(unsafe { self.stream().alloc::<T>(len.max(1)) }?)
    }

    /// Loads the MLA kernels of `h.kv` once: for bf16 and fp8, the --mla-variant given where it
    /// reads that cache, else the tuning DB's variant for these head sizes and cache, else
    /// [`MlaDecode::default_for_kv`] the GPU; for f32, the f32 family.
    fn load_mla(&self, h: Heads) -> Result<()> {
        let Some(kv) = h.kv.latent() else {
            if self.attention.mla_f32.get().is_none() {
                let _ =
                    self.attention.mla_f32.set(Arc::new(MlaF32Kernels::load(&self.gpu, self.tuning.cubins.as_ref())?));
            }
            return Ok(());
        };
        let cell = self.tensor_core_cell(kv);
        if cell.get().is_some() {
            return Ok(());
        }
        let arch = self.gpu.arch;
        let tuned = || kdtree_jit::tune::mla::tuned_variant(&self.tuning.db, &self.tuning.env, arch, &h.mla, kv);
        let given = self.attention.variant.filter(|v| v.kv == kv);
        let decode = given.or_else(tuned).unwrap_or_else(|| MlaDecode::default_for_kv(&Target { arch }, kv));
        let widen = self.attention.fp8_widen;
        let _ = cell.set(Arc::new(MlaKernels::load(&self.gpu, decode, widen, self.tuning.cubins.as_ref())?));
        Ok(())
    }

    fn tensor_core_cell(&self, kv: MlaKv) -> &OnceLock<Arc<MlaKernels>> {
        match kv {
            MlaKv::Bf16 => &self.attention.mla,
            MlaKv::Fp8 => &self.attention.mla_fp8,
        }
    }

    /// The kernels of a cache of `kv`, once a model with such a cache is loaded.
    fn latent_kernels(&self, kv: KvDtype) -> Option<LatentKernels> {
        match kv.latent() {
            Some(kv) => self.tensor_core_cell(kv).get().cloned().map(LatentKernels::TensorCore),
            None => self.attention.mla_f32.get().cloned().map(LatentKernels::F32),
        }
    }

    /// The MLA kernels of a cache of `kv`, loaded with the model's attention weights.
    fn mla(&self, kv: KvDtype) -> Result<LatentKernels> {
        self.latent_kernels(kv).ok_or_else(|| EngineError::NotLoaded {
            op: "attention",
            what: format!("a model with a {} cache", kv.name()),
        })
    }

    /// The MLA decode variant the backend runs over a cache of `kv`, once a model is loaded (and,
    /// for fp8, its cache set to fp8).
    pub fn mla_variant(&self, kv: MlaKv) -> Option<MlaDecode> {
        self.tensor_core_cell(kv).get().map(|k| *k.variant())
    }

    /// The f32 MLA variant the backend runs, once an f32 model is loaded.
    pub fn mla_f32_variant(&self) -> Option<kdtree_jit::mla_f32::MlaF32> {
        self.attention.mla_f32.get().map(|k| *k.variant())
    }

    fn tensor(&self, rows: usize, cols: usize) -> Result<CudaTensor> {
        Ok(CudaTensor::new(self.output::<f32>(rows * cols)?, rows, cols))
    }

    /// A buffer for bf16 bits of `rows` rows of `cols`, padded to the rows an exact-mode GEMM reads
    /// ([`CudaTensor`]'s `bf16`).
    fn gemm_rows(&self, rows: usize, cols: usize) -> Result<CudaSlice<u16>> {
        self.output::<u16>(gemm::padded_rows(rows) * cols)
    }
}

/// `silu(a) * b` of rows `[a | b]` in f32 (the CPU's formula), for f32 weights: the halves copied
/// out, then the element-wise product.
fn silu_mul_f32(b: &CudaBackend, x: &CudaTensor) -> Result<CudaTensor> {
    let half = x.cols / 2;
    let (mut gate, mut up, mut out) = (b.tensor(x.rows, half)?, b.tensor(x.rows, half)?, b.tensor(x.rows, half)?);
    kdtree_kernels::copy_cols(&b.kernels, &x.data, x.cols, 0, half, &mut gate.data)?;
    kdtree_kernels::copy_cols(&b.kernels, &x.data, x.cols, half, half, &mut up.data)?;
    kdtree_kernels::silu_mul(&b.kernels, &gate.data, &up.data, &mut out.data)?;
    Ok(out)
}

/// Whether CUDA computes dense weights in `dtype`, and if not, what it computes in.
fn computes_in(dtype: ComputeDtype) -> std::result::Result<(), String> {
    match dtype {
        ComputeDtype::Bf16 | ComputeDtype::F32 => Ok(()),
        ComputeDtype::F16 => Err("its embedding, SiLU and MoE kernels take bf16 or f32 activations, not f16".into()),
    }
}

/// Why CUDA keeps a model's KV cache in the dtypes it does: each layer's `kv_b_proj` is uploaded
/// once, for the kernels of the cache of the model's compute dtype.
const KV_FOLLOWS_COMPUTE: &str = "its kv_b_proj was loaded for the cache of the model's compute dtype: f32 for a \
                                  model computed in f32, bf16 or fp8 for one computed in bf16";

/// Profile classes of the small kernels and of attention (with its cache writes).
fn rest() -> String {
    "rest".to_owned()
}

fn attention() -> String {
    "attention".to_owned()
}

impl Backend for CudaBackend {
    type Tensor = CudaTensor;
    type Vector = cudarc::driver::CudaSlice<f32>;
    type Linear = CudaLinear;
    type Experts = CudaExperts;
    type Batch = CudaBatch;
    type Cache = CudaKv;
    type Absorb = CudaAbsorb;
    type Rows = CudaRows;

    fn describe(&self) -> String {
        format!("cuda ({}, {})", self.gpu.name, self.gpu.arch)
    }

    fn vector(&self, v: &[f32]) -> Result<Self::Vector> {
        Ok(self.stream().clone_htod(v)?)
    }

    fn linear_weight(&self, name: &str, w: HostLinear) -> Result<CudaLinear> {
        self.upload_linear(name, w)
    }

    fn experts(&self, name: &str, e: HostExperts) -> Result<CudaExperts> {
        CudaExperts::upload(self, name, e)
    }

    fn absorb(&self, name: &str, kv_b: &HostLinear, heads: Heads) -> Result<CudaAbsorb> {
        let absorb = CudaAbsorb::upload(self, name, kv_b, heads)?;
        self.load_mla(heads)?;
        Ok(absorb)
    }

    /// f32 for f32 weights (the f32 family, `MlaF32Kernels`), else bf16 (the tensor-core family).
    fn kv_dtype(&self, f32_weights: bool) -> KvDtype {
        if f32_weights { KvDtype::F32 } else { KvDtype::Bf16 }
    }

    /// The KV dtype of a model on CUDA follows its compute dtype, since its `kv_b_proj` is uploaded
    /// for the kernels of that cache: f32 for an f32 model; bf16 or fp8 (the same bf16 `kv_b_proj`)
    /// for a 16-bit one, whose fp8 kernels load here.
    fn prepare_kv(&self, heads: Heads) -> std::result::Result<(), String> {
        let loaded = |kv| self.latent_kernels(kv).is_some();
        match heads.kv {
            KvDtype::Fp8 if loaded(KvDtype::Bf16) => self.load_mla(heads).map_err(|e| e.to_string()),
            kv if loaded(kv) => Ok(()),
            _ => Err(KV_FOLLOWS_COMPUTE.into()),
        }
    }

    fn supports_compute(&self, dtype: ComputeDtype) -> std::result::Result<(), String> {
        computes_in(dtype)
    }

    fn new_cache(&self, layers: usize, heads: Heads, max_tokens: usize) -> CudaKv {
        let mla = self.latent_kernels(heads.kv);
        CudaKv::new(self.kernels.clone(), mla, layers, heads, max_tokens, self.kv_budget)
    }

    fn batch(&self, tokens: &[u32], positions: &[usize], mask: &TreeMask, past: usize) -> Result<CudaBatch> {
        HostBatch::new(tokens, positions, mask, past)?.upload(self.stream())
    }

    fn embedding(&self, table: &CudaLinear, batch: &CudaBatch) -> Result<CudaTensor> {
        self.timed(rest, || {
            let mut out = self.tensor(batch.n, table.k())?;
            match table {
                CudaLinear::Dense { k, dtype, w, .. } => {
                    ops::embedding(&self.kernels, w, *dtype, *k, &batch.tokens, &mut out.data)?
                }
                // Token ids were checked on the host; the gather gives NaN rows for any other.
                CudaLinear::Dense32 { k, w, .. } => {
                    kdtree_kernels::gather_rows_f32(&self.kernels, w, *k, &batch.tokens, 0, batch.n, &mut out.data)?
                }
                CudaLinear::Int4 { .. } => {
                    return Err(EngineError::shape("embedding", "the table is INT4; embeddings must be dense".into()));
                }
            }
            Ok(out)
        })
    }

    fn rmsnorm(&self, x: &CudaTensor, weight: &Self::Vector, eps: f32) -> Result<CudaTensor> {
        check_norm("rmsnorm", x, weight)?;
        self.timed(rest, || {
            let (mut out, mut bits) = (self.tensor(x.rows, x.cols)?, self.gemm_rows(x.rows, x.cols)?);
            kdtree_kernels::rmsnorm(&self.kernels, &x.data, weight, eps, &mut out.data, Some(&mut bits))?;
            out.bf16 = Some(bits);
            Ok(out)
        })
    }

    /// One launch, reading the columns in place; the norm also writes its bf16 bits.
    fn rmsnorm_columns(
        &self,
        x: &CudaTensor,
        (start, len): (usize, usize),
        weight: &Self::Vector,
        eps: f32,
    ) -> Result<CudaTensor> {
        if weight.len() != len {
            return Err(EngineError::shape("rmsnorm", format!("{len} columns against a weight of {}", weight.len())));
        }
        self.timed(rest, || {
            let (mut out, mut bits) = (self.tensor(x.rows, len)?, self.gemm_rows(x.rows, len)?);
            let x = (&x.data, x.cols, start);
            kdtree_kernels::ops::rmsnorm_columns(&self.kernels, x, weight, eps, &mut out.data, Some(&mut bits))?;
            out.bf16 = Some(bits);
            Ok(out)
        })
    }

    /// One launch: the residual add, then the norm, which also writes its bf16 bits.
    fn add_rmsnorm(&self, x: &mut CudaTensor, y: &CudaTensor, weight: &Self::Vector, eps: f32) -> Result<CudaTensor> {
        check_norm("add_rmsnorm", x, weight)?;
        self.timed(rest, || {
            let (mut out, mut bits) = (self.tensor(x.rows, x.cols)?, self.gemm_rows(x.rows, x.cols)?);
            let x = x.data_mut();
            kdtree_kernels::add_rmsnorm(&self.kernels, x, &y.data, weight, eps, &mut out.data, Some(&mut bits))?;
            out.bf16 = Some(bits);
            Ok(out)
        })
    }

    fn linear(&self, x: &CudaTensor, w: &CudaLinear) -> Result<CudaTensor> {
        let class = || {
            let kind = match w {
                CudaLinear::Int4 { .. } => "W4A16",
                CudaLinear::Dense { .. } => "bf16 GEMM",
                CudaLinear::Dense32 { .. } => "f32 GEMM",
            };
            format!("{kind} {}x{}", w.n(), w.k())
        };
        self.timed(class, || linear::forward(self, x, w))
    }

    fn add_assign(&self, x: &mut CudaTensor, y: &CudaTensor) -> Result<()> {
        self.timed(rest, || Ok(kdtree_kernels::add_assign(&self.kernels, x.data_mut(), &y.data)?))
    }

    /// Rounded to bf16 (what a 16-bit or INT4 `down` reads anyway), or kept f32 for an f32 `down`.
    fn silu_mul(&self, x: &CudaTensor, down: &CudaLinear) -> Result<CudaTensor> {
        if !x.cols.is_multiple_of(2) {
            return Err(EngineError::shape("silu_mul", format!("rows of {} do not split in halves", x.cols)));
        }
        if down.half_dtype().is_none() {
            return self.timed(rest, || silu_mul_f32(self, x));
        }
        self.timed(rest, || {
            let mut half = self.gemm_rows(x.rows, x.cols / 2)?;
            kdtree_kernels::silu_mul_halves_f32(&self.kernels, &x.data, x.rows, x.cols / 2, &mut half)?;
            let mut out = self.tensor(x.rows, x.cols / 2)?;
            ops::from_half(&self.kernels, &half, kdtree_quant::Dtype::Bf16, &mut out.data)?;
            // `down` reads these bits as they are.
            out.bf16 = Some(half);
            Ok(out)
        })
    }

    fn reshape(&self, x: CudaTensor, cols: usize) -> Result<CudaTensor> {
        let rows = crate::cpu::whole_rows("reshape", x.len(), cols)?;
        Ok(CudaTensor::new(x.data, rows, cols))
    }

    fn columns(&self, x: &CudaTensor, start: usize, len: usize) -> Result<CudaTensor> {
        self.timed(rest, || {
            let mut out = self.tensor(x.rows, len)?;
            kdtree_kernels::copy_cols(&self.kernels, &x.data, x.cols, start, len, &mut out.data)?;
            Ok(out)
        })
    }

    fn zeros(&self, rows: usize, cols: usize) -> Result<CudaTensor> {
        let len =
            rows.checked_mul(cols).ok_or_else(|| EngineError::shape("zeros", format!("{rows} rows of {cols}")))?;
        Ok(CudaTensor::new(self.stream().alloc_zeros(len.max(1))?, rows, cols))
    }

    fn place_columns(&self, dst: &mut CudaTensor, start: usize, x: &CudaTensor) -> Result<()> {
        if x.rows != dst.rows {
            return Err(EngineError::shape("place_columns", format!("{} rows into {}", x.rows, dst.rows)));
        }
        self.timed(rest, || {
            let cols = dst.cols;
            Ok(kdtree_kernels::place_cols(&self.kernels, &x.data, x.cols, dst.data_mut(), cols, start)?)
        })
    }

    fn select_rows(&self, x: &CudaTensor, rows: &[usize]) -> Result<CudaTensor> {
        if let Some(&row) = rows.iter().find(|&&r| r >= x.rows) {
            return Err(EngineError::shape("select_rows", format!("row {row} of {}", x.rows)));
        }
        if rows.is_empty() {
            return self.tensor(0, x.cols);
        }
        self.timed(rest, || {
            let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
            let idx = self.stream().clone_htod(&idx)?;
            let mut out = self.tensor(rows.len(), x.cols)?;
            kdtree_kernels::gather_rows_f32(&self.kernels, &x.data, x.cols, &idx, 0, rows.len(), &mut out.data)?;
            Ok(out)
        })
    }

    fn rope(
        &self,
        x: &mut CudaTensor,
        span: RopeSpan,
        cos: &Self::Vector,
        sin: &Self::Vector,
        batch: &CudaBatch,
    ) -> Result<()> {
        if x.rows != batch.n {
            return Err(EngineError::shape("rope", format!("{} rows for a batch of {}", x.rows, batch.n)));
        }
        let cols = x.cols;
        self.timed(rest, || ops::rope(&self.kernels, x.data_mut(), cols, span, &batch.positions, cos, sin))
    }

    fn kv_append(
        &self,
        cache: &mut CudaKv,
        layer: usize,
        latent: &CudaTensor,
        k_rope: &CudaTensor,
        batch: &CudaBatch,
    ) -> Result<()> {
        let h = cache.heads;
        if latent.rows != batch.n || k_rope.rows != batch.n || latent.cols != h.mla.latent || k_rope.cols != h.mla.rope
        {
            return Err(EngineError::shape(
                "kv_append",
                format!(
                    "latent [{}, {}] and k_rope [{}, {}] for a batch of {}",
                    latent.rows, latent.cols, k_rope.rows, k_rope.cols, batch.n
                ),
            ));
        }
        if layer >= cache.layers {
            return Err(EngineError::shape("kv_append", format!("no layer {layer}")));
        }
        // The kernel appends at the batch's `past`, which is the cache's length.
        cache.reserve(cache.len() + batch.n)?;
        let table = cache.table.as_ref().expect("reserved above");
        let mla = self.mla(h.kv)?;
        self.timed(attention, || mla.append(table, h, layer, &latent.data, &k_rope.data, batch.n, &batch.past))
    }

    fn attention(
        &self,
        q: &CudaTensor,
        cache: &CudaKv,
        layer: usize,
        batch: &CudaBatch,
        kv_b: &CudaAbsorb,
    ) -> Result<CudaTensor> {
        let h = cache.heads;
        if cache.len() + batch.n > cache.capacity() || layer >= cache.layers {
            return Err(EngineError::shape(
                "attention",
                format!(
                    "layer {layer} of {}, {} entries, room for {}",
                    cache.layers,
                    cache.len() + batch.n,
                    cache.capacity()
                ),
            ));
        }
        let table = cache.table.as_ref().expect("a cache with room has a table");
        let mla = self.mla(h.kv)?;
        self.timed(attention, || {
            let mut out = self.tensor(batch.n, h.mla.heads * h.mla.v)?;
            mla.attention(self, &q.data, table, cache.wide_table.as_ref(), h, layer, batch, kv_b, &mut out.data)?;
            Ok(out)
        })
    }

    fn new_rows(&self, cols: usize) -> Result<CudaRows> {
        CudaRows::new(self, cols)
    }

    fn append_rows(&self, rows: &mut CudaRows, x: &CudaTensor) -> Result<()> {
        self.timed(rest, || rows.append(self, x))
    }

    fn gqa_attention(
        &self,
        q: &CudaTensor,
        context: [&CudaRows; 2],
        block: [&CudaTensor; 2],
        shape: GqaShape,
    ) -> Result<CudaTensor> {
        let rows = |r: &CudaRows| (r.len(), r.cols());
        check_gqa((q.rows, q.cols), context.map(rows), block.map(|t| (t.rows, t.cols)), shape)?;
        let mut out = self.tensor(q.rows, q.cols)?;
        if q.rows == 0 {
            return Ok(out);
        }
        let sizes = kdtree_kernels::shape::GqaSizes {
            n: q.rows,
            context: context[0].len(),
            heads: shape.heads,
            kv_heads: shape.kv_heads,
            head_dim: shape.head_dim,
        };
        self.timed(attention, || {
            let ctx = context.map(|r| &r.data);
            kdtree_kernels::gqa_attention(&self.kernels, &q.data, ctx, block.map(|t| &t.data), sizes, &mut out.data)?;
            Ok(out)
        })
    }

    fn moe(&self, x: &CudaTensor, experts: &CudaExperts) -> Result<CudaTensor> {
        self.timed(|| "MoE (router, W4A16 experts)".to_owned(), || moe::forward(self, x, experts))
    }

    fn argmax(&self, x: &CudaTensor) -> Result<Vec<u32>> {
        self.timed(rest, || {
            let mut out = self.output::<u32>(x.rows)?;
            kdtree_kernels::argmax(&self.kernels, &x.data, x.cols, &mut out)?;
            Ok(self.stream().clone_dtoh(&out)?)
        })
    }

    fn top_k_log_softmax(&self, x: &CudaTensor, k: usize, transform: LogitTransform) -> Result<Vec<Vec<(u32, f32)>>> {
        if k == 0 {
            return Ok(vec![Vec::new(); x.rows]);
        }
        self.timed(rest, || {
            let (m, cap) = (transform.multiplier, transform.softcap);
            Ok(kdtree_kernels::top_k_log_softmax(&self.kernels, &x.data, x.cols, k, m, cap)?)
        })
    }

    fn argmax_checked(&self, x: &CudaTensor) -> Result<(Vec<u32>, usize)> {
        self.timed(rest, || {
            let (mut ids, mut count) = (self.output(x.rows)?, self.output(1)?);
            ops::argmax_checked(&self.kernels, &x.data, x.cols, &mut ids, &mut count)?;
            ops::read_argmax_checked(&self.kernels, &ids, &count)
        })
    }

    fn to_host(&self, x: &CudaTensor) -> Result<Vec<f32>> {
        Ok(self.stream().clone_dtoh(&x.data)?)
    }

    fn upload(&self, data: &[f32], cols: usize) -> Result<CudaTensor> {
        let rows = crate::cpu::whole_rows("upload", data.len(), cols)?;
        Ok(CudaTensor::new(self.stream().clone_htod(data)?, rows, cols))
    }

    fn forward_argmax<F>(
        &self,
        cache: &mut CudaKv,
        tokens: &[u32],
        positions: &[usize],
        mask: &TreeMask,
        taps: Option<Taps<'_>>,
        forward: F,
    ) -> Result<Argmax<CudaTensor>>
    where
        F: FnOnce(&mut CudaKv, &CudaBatch, Option<&mut CudaTensor>) -> Result<CudaTensor>,
    {
        if self.graphs_now() {
            graph::forward_argmax(self, cache, tokens, positions, mask, taps, forward)
        } else {
            eager_forward_argmax(self, cache, tokens, positions, mask, taps, forward)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_say_what_is_accepted_and_name_no_flag() {
        // The library has no flags: the CLI names --dtype where it reports these.
        assert!(computes_in(ComputeDtype::Bf16).is_ok() && computes_in(ComputeDtype::F32).is_ok());
        let f16 = computes_in(ComputeDtype::F16).unwrap_err();
        assert!(f16.contains("bf16 or f32") && !f16.contains("--"), "{f16}");
        assert!(KV_FOLLOWS_COMPUTE.contains("f32 for a model computed in f32") && !KV_FOLLOWS_COMPUTE.contains("--"));
    }
}
