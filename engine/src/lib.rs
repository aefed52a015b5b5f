//! The DDTree speculative-decoding engine: a DeepSeek-V3 / Kimi K2-architecture model loaded from
//! safetensors checkpoints (dense or INT4 routed experts), run through an op registry whose CPU
//! backend is deterministic and batch-invariant, and greedy decoding on top.
//!
//! | concept | where |
//! |---|---|
//! | CPU reference ops | [`ops::cpu`] |
//! | ops by name, backend, per-shape choice | [`registry::OpRegistry`] |
//! | visibility among new tokens (tree attention) | [`TreeMask`] |
//! | the model, its config and KV cache | [`Model`], [`Config`], [`KvCache`] |
//! | greedy decoding | [`greedy_generate`] |
//! | tiny random checkpoints for tests and demos | [`tiny`] |

pub mod error;
pub mod generate;
pub mod mask;
pub mod model;
pub mod ops;
pub mod registry;
pub mod spec;
pub mod tiny;

pub use error::{EngineError, Result};
pub use generate::{Generation, greedy_generate, greedy_generate_timed};
pub use mask::TreeMask;
pub use model::{Config, KvCache, Model};
