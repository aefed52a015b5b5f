//! The error type of kdtree-jit's core (probing, rendering, compiling, loading, launching); the
//! tuner wraps it in its own, [`crate::tune::error::TuneError`].

use std::path::PathBuf;

use thiserror::Error;

use crate::Arch;
use crate::cache::CACHE_DIR_ENV;
use crate::probe::NVRTC_DIR_ENV;

/// Everything that can go wrong from probing the CUDA libraries to launching a kernel.
#[derive(Debug, Error)]
pub enum Error {
    #[error(
        "NVRTC (libnvrtc.so.13) not found; searched: {}. Install it with \
         `pip install --target target/nvrtc nvidia-cuda-nvrtc` or point KDTREE_NVRTC_DIR at its lib directory",
        list(searched)
    )]
    NoNvrtc { searched: Vec<PathBuf> },

    #[error(
        "the directory to find NVRTC in is an empty path: {NVRTC_DIR_ENV}, where set, names the directory holding \
         libnvrtc.so.13 (unset, the workspace's target/nvrtc and the loader path are searched)"
    )]
    EmptyNvrtcDir,

    #[error("cannot load {path}: {message}")]
    Library { path: PathBuf, message: String },

    /// A file where a CUDA library should be that is not one, found before it is loaded.
    #[error(
        "{} is not {library}: {problem}. NVRTC 13 comes with a CUDA 13 toolkit, or with \
         `pip install --target target/nvrtc nvidia-cuda-nvrtc`",
        path.display()
    )]
    BadLibrary { path: PathBuf, library: &'static str, problem: LibraryProblem },

    #[error("no CUDA driver found (libcuda.so.1 is not on the loader path): {reason}")]
    NoDriver { reason: String },

    #[error("no GPU {ordinal}: {reason}")]
    NoGpu { ordinal: usize, reason: String },

    #[error("{name} was compiled for {compiled}, the GPU is {device}")]
    WrongArch { name: String, compiled: Arch, device: Arch },

    #[error("the loaded function `{function}` is not {variant}'s: a variant launches only its own kernel")]
    WrongKernel { variant: String, function: String },

    #[error("`{0}` is not an arch: write it as sm_90 or 90")]
    Arch(String),

    #[error(
        "{arch} is not an arch kdtree compiles for: the known ones are {} (with `a`, the arch-specific \
         target, from sm_90 on: sm_90a)",
        Arch::known_list()
    )]
    UnknownArch { arch: String },

    #[error("`{name}` is not a variant of the {space} space")]
    UnknownVariant { space: &'static str, name: String },

    #[error("{variant} cannot do this: {reason}")]
    Unsupported { variant: String, reason: String },

    #[error(transparent)]
    Quant(#[from] kdtree_quant::QuantError),

    #[error("rendering {template} for {variant}: {message}")]
    Render { template: String, variant: String, message: String },

    #[error("compiling {variant} (from {origin}) failed; NVRTC says:\n{log}")]
    Compile { origin: String, variant: String, log: String },

    #[error("NVRTC: {0}")]
    Nvrtc(String),

    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),

    #[error("cuBLAS: {0}")]
    Cublas(#[from] cudarc::cublas::result::CublasError),

    #[error("cubin cache at {}: {source}", path.display())]
    Cache {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error(
        "the cubin cache's directory is an empty path: {CACHE_DIR_ENV}, where set, names a directory (unset, the \
         user's cache directory holds the cache)"
    )]
    EmptyCacheDir,

    #[error("cubin cache at {}: {problem}", path.display())]
    CacheRefused { path: PathBuf, problem: CacheProblem },
}

pub type Result<T> = std::result::Result<T, Error>;

/// What is wrong with a library's file ([`Error::BadLibrary`]).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum LibraryProblem {
    #[error("cannot read it ({reason})")]
    Unreadable { reason: String },

    #[error("it is not an ELF file")]
    NotElf,

    #[error("it is not a 64-bit little-endian ELF shared library")]
    NotSharedLibrary,

    #[error("it is truncated: its headers describe {needs} bytes, the file has {size}")]
    Truncated { needs: u64, size: u64 },

    #[error("its soname is {}, not {expected}", soname.as_deref().unwrap_or("missing"))]
    Soname { soname: Option<String>, expected: &'static str },

    #[error("it does not define `{symbol}`")]
    MissingSymbol { symbol: &'static str },
}

fn list(paths: &[PathBuf]) -> String {
    let shown: Vec<String> = paths
        .iter()
        .map(|p| match p.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => p.display().to_string(),
            _ => format!("{} on the system loader path", p.display()),
        })
        .collect();
    if shown.is_empty() { "nothing".to_owned() } else { shown.join(", ") }
}

/// Why a cubin cache directory, or an entry of it, is not used ([`Error::CacheRefused`]).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum CacheProblem {
    #[error("is {kind}, not a directory")]
    NotADirectory { kind: &'static str },

    #[error(
        "is owned by uid {owner}, not by this user (uid {user}); a cache is used only when it is the user's own, \
         since whoever writes it chooses the code the GPU runs"
    )]
    NotOwned { owner: u32, user: u32 },

    #[error(
        "may be written by its group or others (mode {mode:o}); a cache is used only when only its owner may \
         write it (`chmod go-w`), since whoever writes it chooses the code the GPU runs"
    )]
    WritableByOthers { mode: u32 },
}
