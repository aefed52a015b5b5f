//! The one error type of kdtree-kernels.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    /// Buffer lengths that do not describe the operation (the CPU op would panic or error on them).
    #[error("{op}: {reason}")]
    Shape { op: &'static str, reason: String },

    /// Sizes the kernel was not built for (a limit of its registers, shared memory or 32-bit indices),
    /// though they describe a valid operation.
    #[error("{op}: {reason}")]
    Unsupported { op: &'static str, reason: String },

    #[error("token id {id} is out of range for a vocabulary of {vocab}")]
    TokenOutOfRange { id: u32, vocab: usize },

    #[error("position {position} is past the rotary table's {max} positions")]
    PositionOutOfRange { position: usize, max: usize },

    #[error(transparent)]
    Jit(#[from] kdtree_jit::Error),

    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
}

pub type Result<T> = std::result::Result<T, Error>;
