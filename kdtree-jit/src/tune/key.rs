//! What a tuning result is for: the problem key, its M buckets, and the shapes of known models.

use kdtree_quant::Dtype;
use serde::{Deserialize, Serialize};

use crate::arch::Arch;

/// The op every key of this module names: `Y = X · dequant(W)ᵀ` with int4 W.
pub(crate) const OP_W4A16: &str = "w4a16";

/// The M buckets a model's decode GEMMs are tuned at: a DDTree forward runs 1..128 tokens.
pub const M_BUCKETS: [u32; 8] = [1, 2, 4, 8, 16, 32, 64, 128];

/// The bucket of `m`: the smallest power of two at least `m`. A kernel tuned for M = 4 is the
/// right pick for M = 3 too: tile shapes and grids only change at these steps.
pub fn m_bucket(m: u32) -> u32 {
    m.max(1).next_power_of_two()
}

/// One tuned problem. M enters through its bucket, so nearby M share an entry.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ProblemKey {
    pub op: String,
    pub m_bucket: u32,
    pub n: u32,
    pub k: u32,
    pub group_size: u32,
    pub dtype: Dtype,
    pub arch: Arch,
}

impl ProblemKey {
    pub fn w4a16(m: u32, shape: Shape, group_size: u32, dtype: Dtype, arch: Arch) -> ProblemKey {
        ProblemKey { op: OP_W4A16.into(), m_bucket: m_bucket(m), n: shape.n, k: shape.k, group_size, dtype, arch }
    }

    /// Whether `other` is the same problem up to its M bucket: a candidate for the nearest-M fallback.
    pub fn same_but_m(&self, other: &ProblemKey) -> bool {
        (&self.op, self.n, self.k, self.group_size, self.dtype, self.arch)
            == (&other.op, other.n, other.k, other.group_size, other.dtype, other.arch)
    }

    pub fn shape(&self) -> Shape {
        Shape { n: self.n, k: self.k }
    }
}

/// The weight's shape: N output features by K input features.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Shape {
    pub n: u32,
    pub k: u32,
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}", self.n, self.k)
    }
}

impl std::str::FromStr for Shape {
    type Err = String;
    /// `N,K` (or `NxK`), as `--shape` takes it.
    fn from_str(s: &str) -> Result<Shape, String> {
        let parts: Vec<&str> = s.split([',', 'x']).map(str::trim).collect();
        let [n, k] = parts.as_slice() else {
            return Err(format!("shape `{s}`: expected N,K such as 4096,7168"));
        };
        let parse = |v: &str| v.parse::<u32>().ok().filter(|&v| v > 0);
        match (parse(n), parse(k)) {
            (Some(n), Some(k)) => Ok(Shape { n, k }),
            _ => Err(format!("shape `{s}`: N and K must be positive integers")),
        }
    }
}

/// A model's set of GEMM problems to tune together.
#[derive(Clone, Debug)]
pub struct Preset {
    pub name: &'static str,
    pub shapes: &'static [Shape],
    pub group_size: u32,
    pub dtype: Dtype,
    pub ms: &'static [u32],
}

/// Kimi K2's decode GEMMs: the routed experts are int4 with group 32 (its quantization config), in
/// the shapes the engine runs them ([`KIMI_K2_EXPERTS`]); the dense MLP's projections are bf16 in
/// K2's checkpoints (the engine runs them on cuBLAS) and are tuned for comparison, one projection
/// alone (an int4 copy loaded by the engine would run gate and up stacked, 36864x7168).
pub const KIMI_K2: Preset = Preset {
    name: "kimi-k2",
    shapes: &[
        Shape { n: 4096, k: 7168 },  // routed expert gate and up, stacked
        Shape { n: 7168, k: 2048 },  // routed expert down
        Shape { n: 18432, k: 7168 }, // dense MLP gate (or up)
        Shape { n: 7168, k: 18432 }, // dense MLP down
    ],
    group_size: 32,
    dtype: Dtype::Bf16,
    ms: &M_BUCKETS,
};

/// The W4A16 GEMMs the engine plans per shape for Kimi K2's routed experts: each expert's gate and
/// up projections loaded as one stacked [2 x 2048, 7168] weight, and its down projection. They run
/// with `--per-expert-moe` (and tune at the engine's startup then); the engine's default grouped
/// path runs every expert of a layer in one launch per projection instead. The engine's
/// `tests/startup_tune.rs` checks these against what its loader plans for K2's experts.
pub const KIMI_K2_EXPERTS: Preset = Preset {
    name: "kimi-k2-experts",
    shapes: &[
        Shape { n: 4096, k: 7168 }, // routed expert gate and up, stacked
        Shape { n: 7168, k: 2048 }, // routed expert down
    ],
    ..KIMI_K2
};

pub const PRESETS: [Preset; 2] = [KIMI_K2, KIMI_K2_EXPERTS];

pub fn preset(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}
