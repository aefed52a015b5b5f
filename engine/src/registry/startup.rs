//! Choosing the backend at startup (`--backend auto|cpu|cuda`).

use crate::error::{EngineError, Result};

/// Which backend to run on.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackendKind {
    /// CUDA when a GPU, its driver and NVRTC are found, else the CPU with a one-line note.
    #[default]
    Auto,
    Cpu,
    /// CUDA, or an error saying what is missing.
    Cuda,
}

/// What [`select`] decided; `G` is the opened GPU backend.
#[derive(Debug)]
pub enum Selection<G> {
    /// The CPU, with the reason when `auto` could not take the GPU.
    Cpu {
        note: Option<String>,
    },
    Gpu(G),
}

/// The backend `kind` asks for. `open_gpu` is called for `auto` and `cuda` only.
pub fn select<G>(kind: BackendKind, open_gpu: impl FnOnce() -> Result<G>) -> Result<Selection<G>> {
    match kind {
        BackendKind::Cpu => Ok(Selection::Cpu { note: None }),
        BackendKind::Cuda => {
            open_gpu().map(Selection::Gpu).map_err(|e| EngineError::BackendUnavailable { reason: e.to_string() })
        }
        BackendKind::Auto => Ok(match open_gpu() {
            Ok(gpu) => Selection::Gpu(gpu),
            Err(e) => Selection::Cpu { note: Some(format!("no usable GPU, running on the CPU: {e}")) },
        }),
    }
}
