//! The MLA variant spaces: the decode kernel's tile shapes ([`MlaDecode`]), and the small kernels
//! around it ([`MlaAux`]).
//!
//! - `kv`: the cache's entries: bf16 (`[c_kv | k_pe]`; no part of the name, the names of before the
//!   FP8 cache), or `fp8_`: the latent in e4m3 with a power-of-two scale per 32 values, the rope key
//!   in bf16 ([`super::fp8`]; 656 bytes an entry at K2's sizes against 1152). A tile's FP8 entries
//!   land in shared memory as they are (half the bytes in flight) and are widened to the bf16 tile
//!   the math reads, exactly: the same arithmetic as a bf16 cache holding the dequantized values.
//!   sm_89 and later (the e4m3 conversions); in the wgmma form 32-entry tiles in 2 or 3 stages,
//!   warpgroup 1 widening the next tile while warpgroup 0 computes S.
//! - `mma`: `mma` runs mma.sync (every arch), its warps reading each tile from shared memory once
//!   per 16 heads; `wgmma` runs Hopper's warpgroup MMA (compiled for sm_90a on an sm_90 device) on
//!   64 heads and 32- or 64-entry tiles, reading each tile once a block.
//! - `hb`: heads per block, 16, 32 or 64: the MMA's M is 16 heads, so a block runs `hb / 16` head
//!   groups of two warps. Every head reads the same cache entries: more heads a block read each
//!   tile fewer times (K2 has 64 heads: one head group of 64 reads the cache once per row), fewer
//!   put more blocks on the GPU when there are few rows and splits. Models with fewer heads pad.
//! - `bn`: cache entries per tile, 16, 32 or 64: the online softmax's step. Bigger tiles pay the
//!   softmax's two block barriers per more entries, and cost shared memory (`bn` x 1168 bytes a
//!   stage at K2's width).
//! - `stages`: 1 to 4 tiles in shared memory: with more than 1, the next `stages - 1` tiles'
//!   cp.async overlap this tile's math (one barrier a tile either way).
//! - `max_splits`: 32, 64 or 128: the most splits (flash-decoding) a row's sequence is cut into, the
//!   grid's z. A row of L entries runs `ceil(L / split_len)` splits of `split_len = bn * ceil(ceil(L /
//!   bn) / max_splits)`, a function of L alone: a row's bits never depend on the batch. More splits
//!   fill the GPU at few rows, and cost workspace and combine work.

use serde::{Deserialize, Serialize};

use crate::{Arch, AxisValue, Target, Variant};

/// The tensor-core instruction an MLA decode variant runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MlaMma {
    /// `mma.sync` m16n8k16, every arch from sm_80.
    Mma,
    /// Hopper's `wgmma.mma_async` (sm_90a).
    Wgmma,
}

impl AxisValue for MlaMma {
    fn as_str(&self) -> &'static str {
        match self {
            MlaMma::Mma => "mma",
            MlaMma::Wgmma => "wgmma",
        }
    }
}

/// How an MLA cache stores its entries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum MlaKv {
    /// `[c_kv | k_pe]` in bf16.
    #[default]
    Bf16,
    /// The latent in e4m3 with a scale per 32 values, the rope key in bf16 ([`super::fp8`]).
    Fp8,
}

impl AxisValue for MlaKv {
    /// The part of a variant's name: none for bf16, whose variants kept their names.
    fn as_str(&self) -> &'static str {
        match self {
            MlaKv::Bf16 => "",
            MlaKv::Fp8 => "fp8_",
        }
    }
}

impl MlaKv {
    /// Bytes of one entry of `s`.
    pub fn entry_bytes(self, s: &super::MlaShape) -> usize {
        match self {
            MlaKv::Bf16 => 2 * s.width(),
            MlaKv::Fp8 => super::fp8::entry_bytes(s.latent, s.rope),
        }
    }

    /// 16-bit words of one entry of `s`: the kernels' unit of address.
    pub fn entry_words(self, s: &super::MlaShape) -> usize {
        self.entry_bytes(s) / 2
    }

    /// `entries` (`[count, width]` f32) as the words a cache of this kind holds, and the values they
    /// hold (what attention reads).
    pub fn encode(self, entries: &[f32], s: &super::MlaShape) -> (Vec<u16>, Vec<f32>) {
        match self {
            MlaKv::Bf16 => {
                let words: Vec<u16> = entries.iter().map(|&x| half::bf16::from_f32(x).to_bits()).collect();
                let values = words.iter().map(|&w| half::bf16::from_bits(w).to_f32()).collect();
                (words, values)
            }
            MlaKv::Fp8 => super::fp8::quantize_words(entries, s.latent, s.rope),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            MlaKv::Bf16 => "bf16",
            MlaKv::Fp8 => "fp8",
        }
    }
}

impl std::str::FromStr for MlaKv {
    type Err = String;

    fn from_str(s: &str) -> Result<MlaKv, String> {
        match s {
            "bf16" => Ok(MlaKv::Bf16),
            "fp8" => Ok(MlaKv::Fp8),
            _ => Err(format!("`{s}` is not a KV cache dtype the MLA kernels read: bf16 or fp8")),
        }
    }
}

crate::variant_space! {
    /// One absorbed MLA attention kernel over a paged latent cache, and its split combine.
    pub space MlaDecode {
        template = "mla_decode.cu.tera";
        name = "mla_decode_{mma}_{kv}h{hb}n{bn}_s{stages}_x{max_splits}";
        axes {
            /// the tensor-core instruction
            mma: MlaMma = [Mma, Wgmma],
            /// the cache's entries
            kv: MlaKv = [Bf16, Fp8],
            /// heads per block (MMA M, 16 per head group)
            hb: u32 = [16, 32, 64],
            /// cache entries per tile
            bn: u32 = [16, 32, 64],
            /// cp.async pipeline depth
            stages: u32 = [1, 2, 3, 4],
            /// the most splits of a row's sequence
            max_splits: u32 = [32, 64, 128],
        }
        check = crate::mla::rules::check;
    }
}

crate::variant_space! {
    /// The small MLA kernels: query absorption (its entry is the variant's name), output
    /// unabsorption, cache append and gather.
    pub space MlaAux {
        template = "mla_aux.cu.tera";
        name = "mla_aux_{kv}r{rows}";
        axes {
            /// the cache's entries, which append writes and gather reads
            kv: MlaKv = [Bf16, Fp8],
            /// rows a block of absorb / unabsorb takes (kv_b is read once per `rows` rows)
            rows: u32 = [16],
        }
        check = crate::mla::rules::check_aux;
    }
}

impl MlaDecode {
    /// The name of the template's second entry, which merges the splits.
    pub fn combine_name(&self) -> String {
        format!("{}_combine", self.name())
    }

    /// f32 elements of the workspace a launch of `n` rows needs: `[n, max_splits, heads, latent]`
    /// partial outputs, then `[n, max_splits, heads, 2]` (max, sum) pairs.
    pub fn workspace_len(&self, n: usize, heads: usize, latent: usize) -> usize {
        n * self.max_splits as usize * heads * (latent + 2)
    }

    /// Splits a row of `len` compact entries runs (0 for an empty row): the kernel's plan.
    pub fn splits(&self, len: usize) -> usize {
        if len == 0 {
            return 0;
        }
        let tiles = len.div_ceil(self.bn as usize);
        let per = tiles.div_ceil(self.max_splits as usize);
        tiles.div_ceil(per)
    }

    /// The engine's default until tuning picks, for a bf16 cache: on Hopper the wgmma form in 2
    /// stages with up to 64 splits (the best single point over 1 and 64 rows at 4K-131K entries on an
    /// H100); elsewhere 64 heads a block (K2's heads, the cache read once per row), 32-entry tiles in
    /// 2 stages, up to 64 splits, and where that does not fit the arch's shared memory (sm_120's 99
    /// KiB), 16-entry tiles in 1 stage.
    /// An FP8 cache ([`MlaDecode::default_for_kv`]) takes the mma form's points.
    pub fn default_for(target: &Target) -> MlaDecode {
        MlaDecode::default_for_kv(target, MlaKv::Bf16)
    }

    /// [`MlaDecode::default_for`] a cache of `kv`: the first of these that fits the arch (an FP8
    /// cache's wgmma form fits 32-entry tiles only; its mma form 32 heads a block on sm_120). On an
    /// arch that takes none (FP8 before sm_89) the last, whose check says why.
    pub fn default_for_kv(target: &Target, kv: MlaKv) -> MlaDecode {
        let point = |mma, hb, bn, stages| MlaDecode { mma, kv, hb, bn, stages, max_splits: 64 };
        let preferred = [
            point(MlaMma::Wgmma, 64, 64, 2),
            // FP8: the most splits, since an FP8 tile costs more than a bf16 one and a long
            // context's one row wants all the SMs (153 against 259 µs at 131072 entries on an H100).
            MlaDecode { max_splits: 128, ..point(MlaMma::Wgmma, 64, 32, 2) },
            point(MlaMma::Mma, 64, 32, 2),
            point(MlaMma::Mma, 64, 16, 1),
            point(MlaMma::Mma, 32, 16, 2),
        ];
        preferred.into_iter().find(|v| v.check(target).is_ok()).unwrap_or(preferred[4])
    }

    /// The decode variants valid on a device of `arch` (wgmma ones compiled for its arch-specific
    /// target, [`MlaDecode::compile_arch`]).
    pub fn valid_on(arch: Arch) -> Vec<MlaDecode> {
        MlaDecode::valid(&Target { arch })
    }

    /// The target this variant compiles for on a device of `device`: wgmma needs the arch-specific
    /// one (sm_90a).
    pub fn compile_arch(&self, device: Arch) -> Arch {
        match self.mma {
            MlaMma::Mma => device,
            MlaMma::Wgmma => device.specific(),
        }
    }
}

impl MlaAux {
    pub(crate) fn unabsorb_name(&self) -> String {
        format!("{}_unabsorb", self.name())
    }

    pub(crate) fn append_name(&self) -> String {
        format!("{}_append", self.name())
    }

    pub fn gather_name(&self) -> String {
        format!("{}_gather", self.name())
    }

    /// An FP8 cache's widening of a layer to bf16 ([`crate::mla::AuxKernel::widen`]).
    pub(crate) fn widen_name(&self) -> String {
        format!("{}_widen", self.name())
    }

    /// Every entry the module holds: absorb, unabsorb, append, gather, and an FP8 cache's widen.
    pub fn entry_names(&self) -> Vec<String> {
        let mut names = vec![self.name(), self.unabsorb_name(), self.append_name(), self.gather_name()];
        if self.kv == MlaKv::Fp8 {
            names.push(self.widen_name());
        }
        names
    }

    /// The only point of a bf16 cache.
    pub fn default_for(_: &Target) -> MlaAux {
        MlaAux { kv: MlaKv::Bf16, rows: 16 }
    }

    /// The aux kernels beside `decode`: those of its cache.
    pub fn beside(decode: &MlaDecode) -> MlaAux {
        MlaAux { kv: decode.kv, rows: 16 }
    }
}
