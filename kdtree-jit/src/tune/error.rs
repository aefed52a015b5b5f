//! What can go wrong while tuning. The tuner is the last stage of the pipeline, so its error
//! wraps the core's ([`crate::Error`]: probing, compiling, loading) and adds its own.

use std::path::PathBuf;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum TuneError {
    #[error(transparent)]
    Jit(#[from] crate::Error),

    #[error(transparent)]
    Quant(#[from] kdtree_quant::QuantError),

    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),

    #[error("cuBLAS: {0}")]
    Cublas(#[from] cudarc::cublas::result::CublasError),

    #[error(
        "tuning DB {}: {message}. The file was left as it is: fix or move it, or use another tuning DB",
        path.display()
    )]
    CorruptDb { path: PathBuf, message: String },

    #[error("tuning DB {}: {source}", path.display())]
    DbIo {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{0}")]
    Problem(String),

    #[error("writing the plot {}: {message}", path.display())]
    Plot { path: PathBuf, message: String },
}

pub type Result<T> = std::result::Result<T, TuneError>;
