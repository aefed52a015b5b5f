//! The DDTree speculative-decoding engine: a DeepSeek-V3 / Kimi K2-architecture model loaded from
//! safetensors checkpoints (dense or INT4 routed experts), run through an op registry with two
//! backends (the deterministic, batch-invariant CPU reference, and CUDA with every op on the GPU),
//! and on top plain greedy decoding and DDTree speculative decoding, which reproduces it token for
//! token.
//!
//! | concept | where |
//! |---|---|
//! | the ops a forward runs, over a backend's own tensors | [`registry::Backend`] |
//! | CPU reference ops, and the backend made of them | [`ops::cpu`], [`cpu::CpuBackend`] |
//! | every op on the GPU: JIT kernels, tuned W4A16 variants, cuBLAS | [`cuda`] |
//! | visibility among new tokens (tree attention) | [`TreeMask`] |
//! | the model, its config and KV cache | [`Model`], [`Config`], [`KvCache`] |
//! | the dtype dense weights are computed in: the checkpoint's, or one asked for | [`Model::load_as`], [`registry::ComputeDtype`] |
//! | greedy decoding | [`greedy_generate`] ([`generate`]) |
//! | tokenizers (`tokenizer.json`, Kimi's `tiktoken.model`), chat templates, text streamed as decoded | [`text`] |
//! | tensor/expert/vocabulary parallelism simulated over CPU ranks, bitwise equal to one rank | [`sharded::ShardedCpu`] |
//! | DDTree speculative decoding: drafters, the draft tree, verification, the decode loop | [`spec`] |
//! | tiny random checkpoints for tests and demos, and Kimi K2-shaped ones for benchmarks | [`tiny`] |
//! | what `kdtree-engine bench` measures: a forward's time against its bandwidth floor | [`bench`](mod@bench) |
//! | the tables printed for people | [`table`] |
//! | what can go wrong, by kind | [`EngineError`] ([`error`]) |
//!
//! ```
//! use kdtree_engine::tiny::{TinySpec, write_tiny_model};
//! use kdtree_engine::registry::KvStore;
//! use kdtree_engine::{Model, TreeMask, greedy_generate};
//!
//! let dir = tempfile::tempdir()?;
//! write_tiny_model(dir.path(), &TinySpec { int4_experts: true, ..TinySpec::default() })?;
//! let model = Model::load(dir.path())?;
//! let tokens = greedy_generate(&model, &[1, 2, 3], 8, &[])?;
//! assert_eq!(tokens.len(), 8);
//!
//! // A tree forward: after the prompt, node 0 with children 1 and 2, each at its depth's position.
//! let mut cache = model.new_cache();
//! model.forward(&mut cache, &[1, 2, 3], &[0, 1, 2], None)?;
//! let mask = TreeMask::from_parents(&[None, Some(0), Some(0)]);
//! let logits = model.forward(&mut cache, &[4, 5, 6], &[3, 4, 4], Some(&mask))?;
//! assert_eq!(logits.len(), 3 * model.config.vocab_size);
//! cache.compact(3, &[0, 2])?; // keep the path 0 -> 2
//! assert_eq!(cache.len(), 5);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod bench;
pub mod cpu;
pub mod cuda;
pub mod error;
pub mod generate;
pub mod mask;
pub mod model;
pub mod ops;
pub mod registry;
pub mod sharded;
pub mod spec;
pub mod table;
pub mod text;
pub mod tiny;

pub use cpu::KvCache;
pub use error::{EngineError, Result};
pub use generate::{Generation, greedy_generate, greedy_generate_timed};
pub use mask::TreeMask;
pub use model::{Config, Model, WeightBytes};
