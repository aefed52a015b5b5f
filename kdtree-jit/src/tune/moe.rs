//! Tuning the grouped MoE kernels: one MoE step of a layer per T bucket and routing, the grouped
//! gate-up product then the grouped down product by one variant, as the engine runs them (one
//! alignment, so one tile height, serves both). This is the GPU-free half: the routing drawn as a
//! router would, the variants worth timing, the problem's data and CPU reference, and the engine's
//! lookup. The device half is `moe_gpu`.
//!
//! Pruning: the problem fixes the dtype and group size (25 of the 150 valid sm_90 points are bf16
//! g32); then no tile of more rows than four times the busiest expert's (rounded up to a power of
//! two), the rule [`super::prune`] applies to stream blocks, since a grouped block is a stream
//! block over one expert's rows. The busiest expert is that of the routing actually drawn, which
//! is deterministic, so the plan knows it before anything runs.

use kdtree_quant::{Dtype, QuantizedWeight};

use super::db::{Match, TuningDb};
use super::env::Environment;
use super::error::{Result, TuneError};
use super::key::{MoeShape, ProblemKey, RoutingDist, Shape, m_bucket};
use super::problem::{from_bits, to_bits};
use super::run::Family;
use crate::w4a16::accuracy::RandomGemm;
use crate::w4a16::grouped::{W4a16Grouped, XRows, align, grouped_reference, sample_routing};
use crate::{Arch, Target, Variant};

/// Distinct random weights per projection; expert e has weight e mod this. Timing does not depend
/// on the values (every expert has its own place in memory and the L2 is flushed), and an expert
/// index gone wrong by less than this still reads other values and fails the gate; making all 384
/// of K2's experts distinct would cost minutes of CPU time at every run.
pub(crate) const DISTINCT: usize = 4;

impl RoutingDist {
    /// The skewed draw's exponent: Zipf's classic weights 1 / (e + 1).
    const ZIPF: f64 = 1.0;

    /// `tokens` tokens' expert ids as the router writes them (top_k distinct experts per token,
    /// ascending), deterministic in `seed`. Needs 1 <= top_k <= experts.
    pub fn draw(self, tokens: usize, experts: usize, top_k: usize, seed: u64) -> Vec<u32> {
        let skew = match self {
            RoutingDist::Uniform => 0.0,
            RoutingDist::Skewed => Self::ZIPF,
        };
        sample_routing(tokens, experts, top_k, skew, None, seed)
    }
}

impl MoeShape {
    /// Why the layer cannot be tuned with `group_size`, if it cannot: the engine's shapes (gate-up
    /// [2 x inter, hidden], down [hidden, inter]), K a multiple of the group, 1 <= top_k <= experts.
    pub fn check(&self, group_size: u32) -> Result<()> {
        let MoeShape { gate_up, down, experts, top_k, .. } = *self;
        let why = if gate_up.k != down.n || u64::from(gate_up.n) != 2 * u64::from(down.k) {
            format!("gate-up {gate_up} and down {down} are not [2 x inter, hidden] and [hidden, inter]")
        } else if group_size == 0 || !gate_up.k.is_multiple_of(group_size) || !down.k.is_multiple_of(group_size) {
            format!("K of {gate_up} or {down} is not a multiple of the group size {group_size}")
        } else if top_k == 0 || top_k > experts {
            format!("top-{top_k} of {experts} experts")
        } else {
            return Ok(());
        };
        Err(TuneError::Problem(format!("{self}: {why}")))
    }

    /// The ids of the step at `tokens` tokens: seeded by T and routing, so every run (and the plan)
    /// draws the same. For a layer that passed [`check`](Self::check).
    pub fn ids(&self, tokens: u32) -> Vec<u32> {
        let seed = 0x6d6f_6500 ^ u64::from(tokens) << 8 ^ self.routing as u64;
        self.routing.draw(tokens as usize, self.experts as usize, self.top_k as usize, seed)
    }
}

/// The most tokens one expert gets among `ids`.
fn busiest(ids: &[u32], experts: usize) -> u32 {
    let mut count = vec![0u32; experts];
    ids.iter().for_each(|&e| count[e as usize] += 1);
    count.into_iter().max().unwrap_or(0)
}

impl Family for W4a16Grouped {
    type Problem = MoeShape;

    fn candidates(layer: &MoeShape, tokens: u32, group: u32, dtype: Dtype, arch: Arch, _: u32) -> Result<Vec<Self>> {
        layer.check(group)?;
        let rows = m_bucket(busiest(&layer.ids(tokens), layer.experts as usize)).saturating_mul(4);
        let valid = W4a16Grouped::valid(&Target { arch });
        Ok(valid.into_iter().filter(|v| (v.dtype, v.group_size) == (dtype, group) && v.bm <= rows).collect())
    }
}

/// A layer's random weights: `DISTINCT` of each projection, [`RandomGemm`]'s.
pub struct MoeLayer {
    pub shape: MoeShape,
    pub dtype: Dtype,
    pub gate_up: Vec<QuantizedWeight>,
    pub down: Vec<QuantizedWeight>,
}

/// One step's data: the routing, its sorted assignments, the inputs of both products and their
/// reference.
pub struct MoeStep {
    pub tokens: usize,
    /// The router's ids, `[tokens * top_k]`; aligned with each candidate's tile height.
    pub ids: Vec<u32>,
    /// Assignments in (expert, index) order, whatever the tile height: row r of both products' Y.
    pub sorted: Vec<u32>,
    pub experts_touched: usize,
    /// Gate-up's X, [tokens, hidden], dtype bits; row r of Y reads token `sorted[r] / top_k`.
    pub x: Vec<u16>,
    /// Down's X, [assignments, inter], dtype bits, in sorted order (random, not gate-up's SiLU: the
    /// products are gated one by one, and the SiLU between them is no variant's).
    pub act: Vec<u16>,
    /// Both references in f32, gate-up's [assignments, 2 inter] then down's [assignments, hidden],
    /// each divided by its largest magnitude ([`MoeStep::scales`]).
    pub reference: Vec<f32>,
    /// What each product's output is divided by before the gate: its reference's largest |value|.
    /// The gate's norm-wise error over both is then the larger of theirs, so neither product's
    /// error hides behind the other's larger outputs.
    pub scales: [f32; 2],
}

impl MoeLayer {
    /// The layer's random weights (the problem checked first), deterministic in its shapes.
    pub fn random(shape: MoeShape, group_size: u32, dtype: Dtype) -> Result<MoeLayer> {
        shape.check(group_size)?;
        let g = group_size as usize;
        let weights = |s: Shape, salt: u64| -> Result<Vec<QuantizedWeight>> {
            (0..DISTINCT as u64)
                .map(|e| {
                    let seed = 0x6d6f_6577 ^ salt << 40 ^ e << 32 ^ u64::from(s.n) << 16 ^ u64::from(s.k);
                    Ok(RandomGemm::random(1, s.n as usize, s.k as usize, g, dtype, seed)?.w)
                })
                .collect()
        };
        Ok(MoeLayer { shape, dtype, gate_up: weights(shape.gate_up, 1)?, down: weights(shape.down, 2)? })
    }

    /// Every expert's weight of one projection (`of`, the distinct ones).
    fn experts<'a>(&self, of: &'a [QuantizedWeight]) -> Vec<&'a QuantizedWeight> {
        (0..self.shape.experts as usize).map(|e| &of[e % of.len()]).collect()
    }

    /// The step at `tokens` tokens: the routing, random inputs and the CPU reference of both products.
    pub fn step(&self, tokens: u32) -> Result<MoeStep> {
        let MoeShape { gate_up, down, experts, top_k, .. } = self.shape;
        let ids = self.shape.ids(tokens);
        // Tiles of one row: the sorted order, all the reference needs, is every tile height's.
        let a = align(&ids, experts as usize, 1);
        let mut sample = kdtree_quant::sample::Uniform::new(0x6d6f_6578 ^ u64::from(tokens));
        let mut random = |len: usize| -> Vec<u16> {
            (0..len).map(|_| to_bits(self.dtype, 2.0 * sample.next().expect("endless") - 1.0)).collect()
        };
        let x = random(tokens as usize * gate_up.k as usize);
        let act = random(a.sorted.len() * down.k as usize);
        let f32s = |bits: &[u16]| -> Vec<f32> { bits.iter().map(|&b| from_bits(self.dtype, b)).collect() };
        let gathered = XRows::Gather { index: &a.sorted, div: top_k as usize };
        let mut reference =
            grouped_reference(&f32s(&x), gate_up.k as usize, gathered, &self.experts(&self.gate_up), &a)?;
        let split = reference.len();
        let down_experts = self.experts(&self.down);
        reference.extend(grouped_reference(&f32s(&act), down.k as usize, XRows::Identity, &down_experts, &a)?);
        let scales = [normalise(&mut reference[..split]), normalise(&mut reference[split..])];
        let (sorted, experts_touched) = (a.sorted, a.experts_touched);
        Ok(MoeStep { tokens: tokens as usize, ids, sorted, experts_touched, x, act, reference, scales })
    }

    /// What one step must move at least: each touched expert's weights and scales of both
    /// projections, X, the activations and both outputs.
    pub fn bytes(&self, step: &MoeStep) -> u64 {
        let rows = step.sorted.len();
        let (gu, d) = (&self.gate_up[0], &self.down[0]);
        let weights = step.experts_touched * (gu.bytes() + d.bytes());
        let halves = step.tokens * gu.k + rows * (gu.n + d.k + d.n);
        (weights + 2 * halves) as u64
    }
}

/// Divides `values` by their largest magnitude (1 where all are zero) and returns it.
fn normalise(values: &mut [f32]) -> f32 {
    let max = values.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scale = if max > 0.0 { max } else { 1.0 };
    values.iter_mut().for_each(|v| *v /= scale);
    scale
}

/// The tuned grouped variant for `layer`'s MoE step at `tokens` tokens on `target`: the DB's fresh
/// entry of the T bucket, else of the nearest tuned bucket ([`TuningDb::lookup`]; entries of another
/// environment are never used), among entries whose variant exists, suits `group_size` and `dtype`
/// and runs on `target`. `None` when there is none.
pub fn best_grouped(
    db: &TuningDb,
    env: &Environment,
    target: &Target,
    layer: &MoeShape,
    (group_size, dtype): (u32, Dtype),
    tokens: u32,
) -> Option<(W4a16Grouped, Match)> {
    let usable = |name: &str| {
        W4a16Grouped::from_name(name)
            .filter(|v| (v.group_size, v.dtype) == (group_size, dtype) && v.check(target).is_ok())
    };
    let key = ProblemKey::moe(tokens, layer, group_size, dtype, target.arch);
    let hit = db.lookup(&key, env, |e| usable(&e.variant).is_some()).hit?;
    Some((usable(&hit.entry.variant)?, hit.matched))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::key::{KIMI_K2_MOE, T_BUCKETS};

    #[test]
    fn the_plan_keeps_small_tiles_for_few_tokens_and_all_for_many() {
        let count = |routing, t| {
            let layer = MoeShape { routing, ..KIMI_K2_MOE.layer };
            W4a16Grouped::candidates(&layer, t, 32, Dtype::Bf16, Arch(90), 132).unwrap()
        };
        let counts = |routing| T_BUCKETS.map(|t| count(routing, t).len());
        // The counts `kdtree-jit tune --help` states.
        assert_eq!(counts(RoutingDist::Uniform), [14, 14, 21, 21, 21, 25, 25, 25, 25]);
        assert_eq!(counts(RoutingDist::Skewed), [14, 21, 25, 25, 25, 25, 25, 25, 25]);
        // One token: one row per expert, tiles of 1 and 4 rows.
        assert!(count(RoutingDist::Uniform, 1).iter().all(|v| v.bm <= 4));
        let bad = MoeShape { top_k: 400, ..KIMI_K2_MOE.layer };
        let err = W4a16Grouped::candidates(&bad, 1, 32, Dtype::Bf16, Arch(90), 132).unwrap_err().to_string();
        assert!(err.contains("top-400 of 384 experts"), "{err}");
    }
}
