//! NVRTC straight to CUBIN for a real arch, one variant or many in parallel, through the cache.

use std::sync::RwLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::cache::{CacheKey, CacheLookup, CachedCubin};
use crate::{Arch, Cache, Error, Result, Variant, probe, render, sys};

mod stats;

pub use stats::KernelStats;

/// A compiled kernel: the cubin of one `extern "C" __global__` function and what ptxas said about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compiled {
    /// The kernel's function name.
    pub name: String,
    pub arch: Arch,
    pub cubin: Vec<u8>,
    pub stats: KernelStats,
    /// Wall time of this call: the compile, or the cache lookup on a hit.
    pub compile_time: Duration,
    /// Whether the cubin came from the cache.
    pub cached: bool,
    /// Why a cache entry was unusable (corrupt, truncated, unreadable) or could not be written.
    pub cache_error: Option<String>,
}

/// What every compile passes NVRTC besides the arch: C++17, and `ptxas -v` for [`KernelStats`].
const OPTIONS: [&str; 2] = ["-std=c++17", "--ptxas-options=-v"];

/// The full NVRTC option list for `arch`.
pub fn options(arch: Arch) -> Vec<String> {
    let mut options = vec![format!("--gpu-architecture={arch}")];
    options.extend(OPTIONS.iter().map(|o| o.to_string()));
    options
}

/// Held shared by every compile, and exclusively by a retry that must run alone.
static ALONE: RwLock<()> = RwLock::new(());

/// Compiles `source`, whose kernel is `extern "C" __global__ void <name>(...)`, for `arch`.
/// `origin` (a template file, a `#[kernel]` source) names the source in errors.
pub fn compile_source(name: &str, origin: &str, source: &str, arch: Arch, cache: Option<&Cache>) -> Result<Compiled> {
    let start = Instant::now();
    let options = options(arch);
    let key = CacheKey::new(name, source, &options, probe::nvrtc_version()?, arch);
    let mut cache_error = None;
    if let Some(cache) = cache {
        match cache.get(&key) {
            CacheLookup::Hit(CachedCubin { stats, cubin }) => {
                let compile_time = start.elapsed();
                return Ok(Compiled { name: name.into(), arch, cubin, stats, compile_time, cached: true, cache_error });
            }
            CacheLookup::Miss => {}
            CacheLookup::Unusable(reason) => cache_error = Some(reason),
        }
    }
    let file_name = format!("{name}.cu");
    let succeeded = |o: &sys::Output| o.cubin.is_some();
    let mut output = {
        let _shared = ALONE.read().unwrap_or_else(|e| e.into_inner());
        sys::compile(source, &file_name, &options)?
    };
    if !succeeded(&output) {
        // Concurrent compiles on the H200's NVRTC 13.0 once failed a variant with an empty log
        // that compiles fine by itself: before reporting an error, compile it again with no
        // other compile running.
        let _alone = ALONE.write().unwrap_or_else(|e| e.into_inner());
        output = sys::compile(source, &file_name, &options)?;
    }
    let failed = |log: String| Error::Compile { origin: origin.into(), variant: name.into(), log };
    let cubin = output.cubin.ok_or_else(|| failed(output.log.clone()))?;
    if !has_kernel(&cubin, name) {
        return Err(failed(format!("no `extern \"C\" __global__` function `{name}` in the cubin\n{}", output.log)));
    }
    // A log without ptxas' report (seen with NVRTC 13.0) only leaves the stats unknown.
    let stats = KernelStats::parse(&output.log, name).unwrap_or_default();
    if let Some(cache) = cache
        && let Err(e) = cache.put(&key, &CachedCubin { stats, cubin: cubin.clone() })
    {
        cache_error = Some(e.to_string());
    }
    Ok(Compiled { name: name.into(), arch, cubin, stats, compile_time: start.elapsed(), cached: false, cache_error })
}

/// Whether the cubin holds the code of kernel `name`: its ELF section `.text.<name>`.
fn has_kernel(cubin: &[u8], name: &str) -> bool {
    let section = format!(".text.{name}\0");
    cubin.windows(section.len()).any(|w| w == section.as_bytes())
}

/// Renders `v` and compiles it for `arch`.
pub fn compile_variant<V: Variant>(v: &V, arch: Arch, cache: Option<&Cache>) -> Result<Compiled> {
    compile_source(&v.name(), &v.template(), &render::render(v)?, arch, cache)
}

/// Compiles every variant in parallel (rayon's pool), calling `progress(done)` after each one.
/// Results are in the order of `vs`.
pub fn compile_all<V: Variant>(
    vs: &[V],
    arch: Arch,
    cache: Option<&Cache>,
    progress: impl Fn(usize) + Sync,
) -> Vec<(V, Result<Compiled>)> {
    compile_all_for(vs, |_| arch, cache, progress)
}

/// [`compile_all`] with each variant's own target: families of one device that need different ones
/// (wgmma's sm_90a beside the tiles' sm_90, [`crate::w4a16::dense::DenseFamily::compile_arch`]).
pub fn compile_all_for<V: Variant>(
    vs: &[V],
    arch_of: impl Fn(&V) -> Arch + Sync,
    cache: Option<&Cache>,
    progress: impl Fn(usize) + Sync,
) -> Vec<(V, Result<Compiled>)> {
    let done = AtomicUsize::new(0);
    vs.par_iter()
        .map(|v| {
            let compiled = compile_variant(v, arch_of(v), cache);
            progress(done.fetch_add(1, Ordering::Relaxed) + 1);
            (v.clone(), compiled)
        })
        .collect()
}

/// The JSON form of a compile's outcome, as the CLI prints it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CompileReport {
    pub name: String,
    pub arch: Arch,
    pub stats: KernelStats,
    pub cubin_bytes: usize,
    pub compile_ms: f64,
    pub cached: bool,
    pub cache_error: Option<String>,
}

impl From<&Compiled> for CompileReport {
    fn from(c: &Compiled) -> CompileReport {
        CompileReport {
            name: c.name.clone(),
            arch: c.arch,
            stats: c.stats,
            cubin_bytes: c.cubin.len(),
            compile_ms: c.compile_time.as_secs_f64() * 1e3,
            cached: c.cached,
            cache_error: c.cache_error.clone(),
        }
    }
}
