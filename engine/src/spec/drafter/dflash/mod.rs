//! DFlash block-diffusion drafters, in the layout the published checkpoints use (`config.json` with
//! `dflash_config`, safetensors with `layers.N.*`, `fc`, `hidden_norm`, `norm`), run on the target's
//! backend: on CUDA its layers stay on the GPU, and only its logits come back.
//!
//! A DFlash drafter is a small Qwen3-style decoder (GQA, per-head q/k RMSNorm, half-split rope,
//! SwiGLU) with no embedding or LM head of its own: it embeds its block `[bonus, MASK × (L−1)]` with
//! the target's embedding and reads logits through the target's LM head. Each of its layers attends,
//! without a causal mask, over keys and values of two kinds:
//!
//! - the **context**: for every committed token, `hidden_norm(fc(taps))`, where the taps are the
//!   target's hidden states after each of `target_layer_ids`, concatenated; every layer projects the
//!   same context rows with its own `k_proj` (then `k_norm`, rope at the token's position) and `v_proj`.
//!   They depend on nothing drafted, so they are computed once per token and cached ([`DflashContext`]);
//! - the **block** itself, at the positions after the context.
//!
//! | module | what |
//! |---|---|
//! | `config` | config.json, checked against the target |
//! | `weights` | the tensors, shapes checked against the config |
//! | `forward` | the context cache and one round's forward, to logits, over [`crate::registry::Backend`]'s ops (grouped-query attention is [`crate::registry::Backend::gqa_attention`]) |
//! | `drafter` | the [`crate::spec::Drafter`] that decoding calls: a context fed by the target's taps |
//!
//! Checked against the reference implementation run by transformers on a random-weight drafter for a
//! tiny target (`engine/tests/all/dflash.rs`, fixture and generator under
//! `engine/tests/fixtures/dflash/`).

mod config;
mod drafter;
mod forward;
mod weights;

pub use config::{DflashConfig, DraftYarn};
pub use drafter::DflashDrafter;
pub use forward::DflashContext;
pub use weights::DflashModel;
