//! What a tuning result is for: the problem key, its M buckets, and the shapes of known models.

use kdtree_quant::Dtype;
use serde::{Deserialize, Serialize};

use crate::arch::Arch;
use crate::mla::MlaKv;

/// The op of a GEMM's key: `Y = X · dequant(W)ᵀ` with int4 W.
pub(crate) const OP_W4A16: &str = "w4a16";

/// The op of an MoE step's key: the grouped gate-up product, then the grouped down product, by one
/// grouped variant (the engine runs both with one alignment, so with one tile height).
pub(crate) const OP_W4A16_MOE: &str = "w4a16_moe";

/// The op of an MLA attention key: one decode variant for every row count and context (a row's
/// bits must not depend on the batch, so exact decoding runs one variant), chosen over a grid of both.
pub(crate) const OP_MLA: &str = "mla";

/// The op of a streamed 16-bit product's key: `Y = X · Wᵀ` with W in the key's dtype, Y in f32.
pub(crate) const OP_DENSE16: &str = "dense16";

/// The M buckets a model's decode GEMMs are tuned at: a DDTree forward runs 1..128 tokens.
pub const M_BUCKETS: [u32; 8] = [1, 2, 4, 8, 16, 32, 64, 128];

/// The bucket of `m`: the smallest power of two at least `m`. A kernel tuned for M = 4 is the
/// right pick for M = 3 too: tile shapes and grids only change at these steps. M past 2^31 (a
/// caller's saturated count) is in the last bucket, 2^31.
pub fn m_bucket(m: u32) -> u32 {
    m.max(1).checked_next_power_of_two().unwrap_or(1 << 31)
}

/// The T buckets (tokens of one forward) an MoE layer is tuned at: a DDTree forward's 1..128
/// tokens and a prefill chunk's 256. Buckets as [`m_bucket`] makes them.
pub const T_BUCKETS: [u32; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 256];

/// One tuned problem. M (or an MoE step's tokens T) enters through its bucket, so nearby M share
/// an entry.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ProblemKey {
    pub op: String,
    pub m_bucket: u32,
    /// The weight's shape; an MoE step's gate-up weight.
    pub n: u32,
    pub k: u32,
    pub group_size: u32,
    pub dtype: Dtype,
    pub arch: Arch,
    /// The rest of an MoE step's problem; absent from a GEMM's key, so the DB files written before
    /// MoE steps were tuned read as they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeKey>,
    /// An MLA key's head sizes; absent from the other keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mla: Option<MlaKey>,
}

/// What an MLA attention key holds: the sizes the kernel's time depends on, and the cache's entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MlaKey {
    pub heads: u32,
    pub latent: u32,
    pub rope: u32,
    /// Absent for a bf16 cache, so the DB files written before the FP8 cache read as they are.
    #[serde(default, skip_serializing_if = "is_bf16")]
    pub kv: MlaKv,
}

fn is_bf16(kv: &MlaKv) -> bool {
    *kv == MlaKv::Bf16
}

impl MlaKey {
    /// The key of `s` over a cache of `kv`.
    pub fn of(s: &crate::mla::MlaShape, kv: MlaKv) -> MlaKey {
        MlaKey { heads: s.heads as u32, latent: s.latent as u32, rope: s.rope as u32, kv }
    }
}

/// What an MoE step's key adds to a GEMM's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MoeKey {
    pub down: Shape,
    pub experts: u32,
    pub top_k: u32,
    pub routing: RoutingDist,
}

impl ProblemKey {
    pub fn w4a16(m: u32, shape: Shape, group_size: u32, dtype: Dtype, arch: Arch) -> ProblemKey {
        let (n, k) = (shape.n, shape.k);
        ProblemKey { op: OP_W4A16.into(), m_bucket: m_bucket(m), n, k, group_size, dtype, arch, moe: None, mla: None }
    }

    /// The key of a streamed 16-bit product ([`crate::dense16`]) of `m` rows.
    pub fn dense16(m: u32, shape: Shape, dtype: Dtype, arch: Arch) -> ProblemKey {
        ProblemKey { op: OP_DENSE16.into(), group_size: 0, ..ProblemKey::w4a16(m, shape, 0, dtype, arch) }
    }

    /// The key of MLA attention with these head sizes (bf16 cache and queries): `n` is the heads,
    /// `k` an entry's width, and one bucket holds every row count.
    pub fn mla(key: MlaKey, arch: Arch) -> ProblemKey {
        ProblemKey {
            op: OP_MLA.into(),
            m_bucket: 1,
            n: key.heads,
            k: key.latent + key.rope,
            group_size: 0,
            dtype: Dtype::Bf16,
            arch,
            moe: None,
            mla: Some(key),
        }
    }

    /// The key of `layer`'s MoE step at `tokens` tokens.
    pub fn moe(tokens: u32, layer: &MoeShape, group_size: u32, dtype: Dtype, arch: Arch) -> ProblemKey {
        let MoeShape { gate_up, down, experts, top_k, routing } = *layer;
        ProblemKey {
            op: OP_W4A16_MOE.into(),
            moe: Some(MoeKey { down, experts, top_k, routing }),
            ..ProblemKey::w4a16(tokens, gate_up, group_size, dtype, arch)
        }
    }

    /// Whether `other` is the same problem up to its M bucket: a candidate for the nearest-M fallback.
    pub fn same_but_m(&self, other: &ProblemKey) -> bool {
        (&self.op, self.n, self.k, self.group_size, self.dtype, self.arch, self.moe, self.mla)
            == (&other.op, other.n, other.k, other.group_size, other.dtype, other.arch, other.moe, other.mla)
    }

    pub fn shape(&self) -> Shape {
        Shape { n: self.n, k: self.k }
    }

    /// The MoE layer of an MoE step's key.
    pub fn moe_shape(&self) -> Option<MoeShape> {
        let MoeKey { down, experts, top_k, routing } = self.moe?;
        Some(MoeShape { gate_up: self.shape(), down, experts, top_k, routing })
    }
}

/// `4096x7168 M=4`; `moe 4096x7168+7168x2048 E=384 top-8 uniform T=4`; `mla 64 heads, latent 512 +
/// rope 64, bf16 cache`.
impl std::fmt::Display for ProblemKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(MlaKey { heads, latent, rope, kv }) = self.mla {
            return write!(f, "mla {heads} heads, latent {latent} + rope {rope}, {} cache", kv.name());
        }
        match self.moe_shape() {
            None if self.op == OP_DENSE16 => write!(f, "dense16 {} {} M={}", self.dtype, self.shape(), self.m_bucket),
            None => write!(f, "{} M={}", self.shape(), self.m_bucket),
            Some(layer) => write!(f, "{layer} T={}", self.m_bucket),
        }
    }
}

/// How the tokens of a tuned MoE step are routed. The grouped kernel's best tile height depends on
/// how many tokens each touched expert gets, which the routing decides.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum RoutingDist {
    /// Every token's top-k drawn uniformly among the experts: a load-balanced router (K2's is
    /// trained to be). What the engine asks for.
    #[default]
    Uniform,
    /// Drawn with Zipf-like weights 1 / (e + 1): a few hot experts take many tokens and most
    /// experts none, as a router on skewed input does.
    Skewed,
}

impl std::fmt::Display for RoutingDist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RoutingDist::Uniform => "uniform",
            RoutingDist::Skewed => "skewed",
        })
    }
}

/// An MoE layer's routed experts as one tuning problem, T aside: `experts` weights of each
/// projection, each token routed to `top_k` of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MoeShape {
    /// Gate and up stacked: [2 x intermediate, hidden].
    pub gate_up: Shape,
    /// [hidden, intermediate].
    pub down: Shape,
    pub experts: u32,
    pub top_k: u32,
    pub routing: RoutingDist,
}

impl std::fmt::Display for MoeShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let MoeShape { gate_up, down, experts, top_k, routing } = self;
        write!(f, "moe {gate_up}+{down} E={experts} top-{top_k} {routing}")
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
/// `engine/tests/all/startup_tune.rs` checks these against what its loader plans for K2's experts.
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

/// A model's MoE layers to tune as grouped steps, at every T of `ts` and every routing asked.
#[derive(Clone, Debug)]
pub struct MoePreset {
    pub name: &'static str,
    /// The layer, its routing left to the request (the value here is the default).
    pub layer: MoeShape,
    pub group_size: u32,
    pub dtype: Dtype,
    pub ts: &'static [u32],
}

/// Kimi K2's routed experts as the engine runs them: 384 experts of [2 x 2048, 7168] (gate and up
/// fused) and [7168, 2048], top-8 per token, int4 group 32, bf16.
pub const KIMI_K2_MOE: MoePreset = MoePreset {
    name: "kimi-k2-moe",
    layer: MoeShape {
        gate_up: KIMI_K2_EXPERTS.shapes[0],
        down: KIMI_K2_EXPERTS.shapes[1],
        experts: 384,
        top_k: 8,
        routing: RoutingDist::Uniform,
    },
    group_size: 32,
    dtype: Dtype::Bf16,
    ts: &T_BUCKETS,
};

pub const MOE_PRESETS: [MoePreset; 1] = [KIMI_K2_MOE];

pub fn moe_preset(name: &str) -> Option<&'static MoePreset> {
    MOE_PRESETS.iter().find(|p| p.name == name)
}
