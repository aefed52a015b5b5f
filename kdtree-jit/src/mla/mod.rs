//! Absorbed multi-head latent attention (DeepSeek-V3's MLA as its own inference code and FlashMLA
//! run it): the cache holds per token only `[c_kv | k_pe]` (`latent + rope` values, shared by every
//! head), queries are moved into latent space by `W_UK` ([`reference::absorb_query`]), attention runs
//! over the latent entries, and `W_UV` takes each head's latent output back to its value width
//! ([`reference::unabsorb_output`]).
//!
//! | concept | where |
//! |---|---|
//! | head sizes | [`MlaShape`] |
//! | which new tokens each new token sees | [`NewMask`] |
//! | the CPU reference | [`reference`] |

pub mod reference;

pub use reference::NewMask;

/// MLA's sizes as the absorbed form sees them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MlaShape {
    pub heads: usize,
    /// Non-rotary query/key width per head (`qk_nope_head_dim`).
    pub nope: usize,
    /// Rotary width, shared key (`qk_rope_head_dim`).
    pub rope: usize,
    /// Value width per head (`v_head_dim`).
    pub v: usize,
    /// The compressed kv width (`kv_lora_rank`).
    pub latent: usize,
    /// Multiplies `q · k` before the softmax.
    pub scale: f32,
}

impl MlaShape {
    /// Values a cache entry holds: `[c_kv | k_pe]`.
    pub fn width(&self) -> usize {
        self.latent + self.rope
    }
}
