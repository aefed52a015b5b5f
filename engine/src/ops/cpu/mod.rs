//! The CPU reference ops. Every reduction runs in a fixed order (matmuls through
//! [`kdtree_quant::reference::dot`]), work is split over rows only, so a row's result is the
//! same bits whether it is computed alone or in a batch: the property tree verification needs.
//! Attention's reference is the MLA family's own ([`kdtree_jit::mla::reference`]).

mod elementwise;
mod embedding;
mod gqa;
mod linear;
mod norm;
mod rope;
mod route;
mod top_k;

pub use elementwise::{argmax, count_nonfinite, silu_mul, softmax};
pub use embedding::embedding;
pub use gqa::gqa_attention;
pub(crate) use linear::{dense_linear, linear, w4a16_linear};
pub use norm::rmsnorm;
pub(crate) use rope::rope_half_split;
pub use rope::rope_interleaved;
pub use route::route;
pub(crate) use top_k::{log_softmax, rank_order};
pub use top_k::{top_k, top_k_log_softmax};
