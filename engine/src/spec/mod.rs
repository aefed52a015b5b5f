//! DDTree speculative decoding ("Accelerating Speculative Decoding with Block Diffusion Draft Trees").
//!
//! | step | where |
//! |---|---|
//! | a drafter proposes distributions q_1..q_L after the bonus token | [`Drafter`]: [`LookupDrafter`], [`ModelDrafter`], [`BlockDrafter`] |
//! | the best B prefixes under q(u) = Π q_i(u_i) form the tree | [`DraftTree::build`] |
//! | one target forward over [bonus, tree] with the ancestor mask; greedy walk; KV compaction | [`verify`] |
//! | rounds until `max_new`, with statistics | [`ddtree_generate`], [`Stats`] |
//! | chain speculation, and DDTree with a cost-aware size per round | [`Method`], [`CostModel`] |
//! | a benchmark drafter that knows the answer and errs at a set rate | [`NoisyOracle`] |
//! | `generate --spec ddtree|chain` beside plain greedy | [`SpecArgs`], [`Comparison`] |
//! | `bench --spec`: every method at several oracle accuracies, or with a model drafter | [`sweep`] |
//! | `bench --spec --drafter dflash`: the drafter's round beside the target's verify forward | [`round`] |
//!
//! The output is exactly plain greedy decoding's: every committed token is the target's argmax after
//! the committed text, and the backend is batch-invariant, so the tree forward's logits at a node
//! are bit for bit those of feeding its path one token at a time. The CPU backend is by
//! construction; the CUDA backend is in its exact mode (the default), which runs one kernel variant
//! per weight shape for every M (see [`crate::cuda`]), and not with `--fast`.
//!
//! ```no_run
//! use kdtree_engine::Model;
//! use kdtree_engine::spec::{LookupDrafter, TreeLimits, ddtree_generate};
//!
//! let target = Model::load("tiny-model".as_ref())?;
//! let mut drafter = LookupDrafter::new(3, target.config.vocab_size);
//! let limits = TreeLimits { budget: 32, draft_len: 8 };
//! let (tokens, stats) = ddtree_generate(&target, &mut drafter, &[1, 2, 3, 1, 2], 64, limits, &[])?;
//! println!("{tokens:?}: tau {:.2}, {:.2} target forwards per token", stats.tau(), stats.forwards_per_token());
//! # Ok::<(), kdtree_engine::EngineError>(())
//! ```

mod cli;
mod cost;
mod decode;
mod drafter;
pub mod plot;
pub mod round;
pub mod sweep;
mod tree;
mod verify;

pub use cli::{Comparison, DraftWeights, DrafterKind, SpecArgs, SpecMethod};
pub use cost::CostModel;
pub(crate) use decode::speculative_generate_streamed;
pub use decode::{Method, Stats, TreeLimits, ddtree_generate, speculative_generate};
pub use drafter::dflash::{DflashConfig, DflashContext, DflashModel, DraftYarn};
pub use drafter::{BlockDrafter, Choice, DflashDrafter, Draft, Drafter, LookupDrafter, ModelDrafter, NoisyOracle};
pub use tree::DraftTree;
pub use verify::{Verified, verify};
