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
//! | the CPU reference | [`reference`](mod@reference) |
//! | the attention kernels' variant space, and which points fit an arch | [`MlaDecode`], [`rules`] |
//! | the paged cache, the launch, a host round trip | [`PagedCache`], [`MlaKernel`], [`mla_host`] |
//! | absorb, unabsorb, cache append and gather on the GPU | [`MlaAux`], [`AuxKernel`], launched through [`Companions`] (shared with the f32 family) |
//! | many rows over an FP8 cache: one widening a layer, then the bf16 twin | [`widen`](mod@widen) |
//!
//! The GPU family (`templates/mla_decode.cu.tera`): block (row, group of `hb` heads, split) runs
//! one split of the row's compact sequence on the tensor cores, a second entry merges the splits by
//! log-sum-exp. Two forms ([`MlaMma`]): `mma` (mma.sync, every arch) and `wgmma` (Hopper's
//! warpgroup MMA on all 64 heads of a row, sm_90a; the default on sm_90). Tiles and splits are cut
//! from the compact sequence by its length alone, so a row's bits do not depend on how many rows
//! run with it: a tree row equals the same row decoded alone.
//!
//! ```no_run
//! use kdtree_jit::mla::{MlaDecode, MlaKernel, MlaShape, NewMask, mla_host};
//! use kdtree_jit::{Gpu, Target};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let gpu = Gpu::open(0)?;
//! let kernel = MlaKernel::compile(&gpu, MlaDecode::default_for(&Target { arch: gpu.arch }), None)?;
//! let s = MlaShape { heads: 4, nope: 32, rope: 16, v: 32, latent: 64, scale: 0.1 };
//! let (past, n) = (100, 2);
//! let q = vec![0x3f80u16; n * s.heads * s.width()]; // bf16 ones
//! let kv = vec![0x3f80u16; (past + n) * s.width()];
//! let o_lat = mla_host(&gpu, &kernel, &s, &q, &kv, past, &NewMask::Causal, 64)?; // [n, heads, latent]
//! # Ok(()) }
//! ```

pub mod aux;
pub mod companions;
pub mod fp8;
pub mod launch;
pub mod reference;
pub mod rules;
pub mod space;
pub mod widen;

pub use aux::AuxKernel;
pub use companions::{Companions, absorb_host, unabsorb_host};
pub use launch::{DeviceMask, MlaBuffers, MlaKernel, PagedCache, mla_host, shape_error, upload_cache};
pub use reference::NewMask;
pub use space::{MlaAux, MlaDecode, MlaKv, MlaMma};

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
