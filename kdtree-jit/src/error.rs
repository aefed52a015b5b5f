//! The error type of kdtree-jit's core (probing, rendering, compiling, loading, launching); the
//! tuner wraps it in its own, [`crate::tune::error::TuneError`].

use std::path::PathBuf;

use thiserror::Error;

use crate::Arch;

/// Everything that can go wrong from probing the CUDA libraries to launching a kernel.
#[derive(Debug, Error)]
pub enum Error {
    #[error(
        "NVRTC (libnvrtc.so.13) not found; searched: {}. Install it with \
         `pip install --target target/nvrtc nvidia-cuda-nvrtc` or point KDTREE_NVRTC_DIR at its lib directory",
        list(searched)
    )]
    NoNvrtc { searched: Vec<PathBuf> },

    #[error("cannot load {path}: {message}")]
    Library { path: PathBuf, message: String },

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
}

pub type Result<T> = std::result::Result<T, Error>;

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
