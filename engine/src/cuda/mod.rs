//! The CUDA backend: W4A16 linears run the tuned kernels of kdtree-jit on the GPU; every other op
//! (dense linears, norms, rope, attention, routing) stays on the CPU reference, so a forward's
//! only GPU work is the INT4 GEMMs, which is where an INT4 checkpoint's time goes.
//!
//! At load, [`CudaBackend::upload`] takes the model's W4A16 weights: it plans the variants of
//! every distinct weight shape from the tuning DB ([`select`]), compiles them all in parallel
//! through the cubin cache, then repacks and uploads each weight once.

mod linear;
mod select;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use kdtree_jit::tune::db::TuningDb;
use kdtree_jit::tune::env::Environment;
use kdtree_jit::w4a16::W4a16;
use kdtree_jit::{Cache, Gpu, Target, Variant, compile_all};

pub use linear::{CudaLinear, ShapeKernels};
pub use select::{Choice, Mode, Plan, Source, WeightShape, default_variant, plan};

use crate::error::{EngineError, Result};
use crate::registry::LinearWeight;

/// What the CUDA backend is opened with.
#[derive(Clone, Debug, PartialEq)]
pub struct CudaOptions {
    /// Which GPU (0 is the first).
    pub ordinal: usize,
    /// The tuning DB; a missing file is an empty DB (every shape then runs the default variant).
    pub tuning_db: PathBuf,
    pub mode: Mode,
}

/// One GPU with its tuning DB, and the plans of the weight shapes uploaded so far.
pub struct CudaBackend {
    gpu: Gpu,
    env: Environment,
    db: TuningDb,
    mode: Mode,
    /// `None` when the cache directory cannot be opened: kernels then compile every time.
    cache: Option<Cache>,
    plans: Mutex<BTreeMap<WeightShape, Plan>>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend").field("gpu", &self.gpu.name).field("arch", &self.gpu.arch).finish()
    }
}

impl CudaBackend {
    /// Opens the GPU, loads NVRTC and reads the tuning DB. Without a driver, a GPU or NVRTC this is
    /// an error saying which (never cudarc's panic).
    pub fn open(options: &CudaOptions) -> Result<CudaBackend> {
        let gpu = Gpu::open(options.ordinal)?;
        let env = Environment::detect(&gpu)?;
        let db = TuningDb::open(&options.tuning_db)?;
        let cache = Cache::open(&Cache::default_dir()).ok();
        Ok(CudaBackend { gpu, env, db, mode: options.mode, cache, plans: Mutex::default() })
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The plan of every weight shape uploaded so far, by shape.
    pub fn plans(&self) -> Vec<(WeightShape, Plan)> {
        let plans = self.plans.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        plans.iter().map(|(s, p)| (*s, p.clone())).collect()
    }

    /// Replaces every W4A16 weight of `weights` by its GPU copy. All variants the shapes' plans
    /// need are compiled first, in parallel; a weight is repacked and uploaded once.
    pub fn upload<'a>(&self, weights: impl IntoIterator<Item = &'a mut LinearWeight>) -> Result<()> {
        let mut weights: Vec<&mut LinearWeight> =
            weights.into_iter().filter(|w| matches!(w, LinearWeight::W4a16(_))).collect();
        let mut plans = BTreeMap::new();
        for w in &weights {
            if let LinearWeight::W4a16(q) = &**w {
                let shape = WeightShape::of(q);
                plans.entry(shape).or_insert_with(|| plan(&self.db, &self.env, self.gpu.arch, &shape, self.mode));
            }
        }
        // Tuned variants were checked when chosen; this catches a default that cannot run here.
        let target = Target { arch: self.gpu.arch };
        for (shape, p) in &plans {
            if let Err(why) = p.general.variant.check(&target) {
                return Err(EngineError::NoKernel { shape: shape.to_string(), reason: why.to_string() });
            }
        }
        let mut variants: Vec<W4a16> = plans.values().flat_map(Plan::variants).collect();
        variants.sort_by_key(Variant::name);
        variants.dedup();
        let mut functions = HashMap::new();
        for (v, compiled) in compile_all(&variants, self.gpu.arch, self.cache.as_ref(), |_| {}) {
            functions.insert(v, self.gpu.load(&compiled?)?);
        }
        let kernels: HashMap<WeightShape, Arc<ShapeKernels>> = plans
            .iter()
            .map(|(s, p)| Ok((*s, Arc::new(ShapeKernels::new(*s, p.clone(), &functions)?))))
            .collect::<Result<_>>()?;
        for w in weights.iter_mut() {
            if let LinearWeight::W4a16(q) = &**w {
                let on_gpu = CudaLinear::upload(&self.gpu, q, kernels[&WeightShape::of(q)].clone())?;
                **w = LinearWeight::Cuda(Arc::new(on_gpu));
            }
        }
        self.plans.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).extend(plans);
        Ok(())
    }
}
