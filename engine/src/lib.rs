//! The DDTree speculative-decoding engine.

pub mod error;
pub mod mask;
pub mod ops;
pub mod registry;

pub use error::{EngineError, Result};
pub use mask::TreeMask;
