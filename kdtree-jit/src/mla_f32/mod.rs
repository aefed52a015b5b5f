//! Absorbed MLA in f32 on the CUDA cores: the attention of an f32 model (an f32 checkpoint computed
//! in its own dtype), whose queries, `kv_b_proj` weight and latent cache stay f32. The tensor-core
//! family ([`crate::mla`]) reads bf16 only; this one is what keeps an f32 checkpoint's greedy tokens
//! those of its reference implementation, not what races a K2 decode step: one block a (row, head).
//!
//! | concept | where |
//! |---|---|
//! | the variant (one point) and its five entries | [`MlaF32`] (`templates/mla_f32.cu.tera`) |
//! | the launches | [`MlaF32Kernel`] |
//! | the CPU reference it is checked against | [`crate::mla::reference`] with [`Weights::F32`](crate::mla::reference::Weights) |
//! | absorb, unabsorb, append and gather | [`crate::mla::Companions`], as the bf16 family's |
//! | a host round trip, for tests | [`attention_host`]; [`crate::mla::absorb_host`] and [`crate::mla::unabsorb_host`] take either family |
//!
//! The cache is [`crate::mla::PagedCache`]'s layout with f32 values: entry t of layer `layer` is the
//! `latent + rope` f32 values at `table[t / page] + (layer * page + t % page) * width` (elements).

mod host;
mod launch;

pub use host::attention_host;
pub use launch::MlaF32Kernel;

use crate::Target;

crate::variant_space! {
    /// Absorbed MLA attention over a paged f32 latent cache, with its absorb, unabsorb, append and
    /// gather: the whole of an f32 model's attention.
    pub space MlaF32 {
        template = "mla_f32.cu.tera";
        name = "mla_f32_t{threads}_n{tile}";
        axes {
            /// threads a block (its warps each take a cache entry's score; latent <= 4 x threads)
            threads: u32 = [128],
            /// cache entries whose softmax weights a block holds at once
            tile: u32 = [64],
        }
    }
}

impl MlaF32 {
    /// The only point.
    pub fn default_for(_: &Target) -> MlaF32 {
        MlaF32 { threads: 128, tile: 64 }
    }

    pub(crate) fn absorb_name(&self) -> String {
        format!("{}_absorb", crate::Variant::name(self))
    }

    pub(crate) fn unabsorb_name(&self) -> String {
        format!("{}_unabsorb", crate::Variant::name(self))
    }

    pub(crate) fn append_name(&self) -> String {
        format!("{}_append", crate::Variant::name(self))
    }

    pub fn gather_name(&self) -> String {
        format!("{}_gather", crate::Variant::name(self))
    }

    /// Every entry's name, the attention's (the variant's name) first.
    pub fn entry_names(&self) -> [String; 5] {
        [crate::Variant::name(self), self.absorb_name(), self.unabsorb_name(), self.append_name(), self.gather_name()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Arch, Variant, render};

    #[test]
    fn the_one_point_renders_its_five_entries_and_fits_every_arch() {
        let v = MlaF32::default_for(&Target { arch: Arch(90) });
        assert_eq!(MlaF32::all(), [v]);
        assert_eq!(MlaF32::from_name(&v.name()), Some(v));
        let source = render(&v).unwrap();
        for name in v.entry_names() {
            assert!(source.contains(&format!(" {name}(")), "{name} is not in the source");
        }
        assert!(!source.contains("{{") && !source.contains("{%"));
        for arch in [Arch(90), Arch(120)] {
            assert!(v.check(&Target { arch }).is_ok());
        }
    }
}
