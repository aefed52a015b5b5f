//! The cost-aware tree budget: each round, the tree size that maximises expected accepted tokens per
//! microsecond of the target's forward, from the drafter's marginals and a measured cost model.
//!
//! For a MoE target the forward's cost grows with T much faster than a dense model's, because each
//! extra token routes to experts no other token touched (a Kimi K2 layer reads 8 of 384 experts at
//! T = 1 and ~280 at T = 64). A fixed budget that suits a dense model then buys tokens at many times
//! their price. The model here is t(T), the median forward time that `kdtree-engine bench` measured
//! at T tokens on this GPU for this model (with random tokens, so with the experts that T random
//! tokens touch), plus the drafter's round where one was measured beside it: a model drafter (DFlash)
//! pays one forward a round whatever the tree's size, which makes larger trees cheaper per token.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};

/// Forward time against T, measured on one device for one model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CostModel {
    /// The GPU it was measured on, as the backend describes itself.
    pub device: String,
    /// The model folder it was measured for (informational).
    pub model: String,
    /// (T, median forward µs), T ascending, T >= 1.
    pub points: Vec<(usize, f64)>,
    /// A drafter round's median µs (its forward over the block and the per-depth top-K), paid once a
    /// round whatever the tree's size; 0 where none was measured (a lookup drafter's round is
    /// negligible), and in files written before it was.
    #[serde(default)]
    pub draft_us: f64,
}

impl CostModel {
    /// Checks that the points are usable: at least one, T ascending and >= 1, times finite and > 0.
    pub fn new(device: String, model: String, points: Vec<(usize, f64)>) -> Result<CostModel> {
        let bad = |why: &str| Err(EngineError::CostModel { file: None, reason: why.into() });
        if points.is_empty() {
            return bad("no points");
        }
        if points.iter().any(|&(t, us)| t == 0 || !us.is_finite() || us <= 0.0) {
            return bad("every point needs T >= 1 and a finite time > 0");
        }
        if points.windows(2).any(|w| w[0].0 >= w[1].0) {
            return bad("T must ascend");
        }
        Ok(CostModel { device, model, points, draft_us: 0.0 })
    }

    /// The same model with a drafter round of `us` µs added to every round (finite, >= 0).
    pub fn with_draft_us(self, us: f64) -> Result<CostModel> {
        if !(us.is_finite() && us >= 0.0) {
            return Err(EngineError::CostModel {
                file: None,
                reason: format!("a drafter round of {us} µs: it must be finite and >= 0"),
            });
        }
        Ok(CostModel { draft_us: us, ..self })
    }

    /// The most bytes a cost model's file may have: its points are a few dozen.
    pub(crate) const MAX_FILE_BYTES: u64 = 1 << 20;

    pub fn load(path: &Path) -> Result<CostModel> {
        let text = crate::model::json::read_capped(path, "a cost model", Self::MAX_FILE_BYTES)?;
        let file = || Some(path.display().to_string());
        let m: CostModel =
            serde_json::from_str(&text).map_err(|e| EngineError::CostModel { file: file(), reason: e.to_string() })?;
        CostModel::new(m.device, m.model, m.points).and_then(|c| c.with_draft_us(m.draft_us)).map_err(|e| match e {
            EngineError::CostModel { reason, .. } => EngineError::CostModel { file: file(), reason },
            other => other,
        })
    }

    /// Writes the model as JSON, creating the folder it goes in (the default one, beside the tuning
    /// DB, need not exist on a fresh machine).
    pub fn save(&self, path: &Path) -> Result<()> {
        let file = || path.display().to_string();
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| EngineError::CostModel { file: Some(file()), reason: e.to_string() })?;
        let io = |source: std::io::Error| EngineError::Io { file: file(), source };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        std::fs::write(path, text).map_err(io)
    }

    /// t(T) in µs: linear between measured points, the first point's below it, and the last segment's
    /// slope beyond the last (a single point: proportional to T).
    pub fn us(&self, t: usize) -> f64 {
        let p = &self.points;
        let i = p.partition_point(|&(pt, _)| pt < t);
        let (lo, hi) = match i {
            0 => return p[0].1,
            i if i < p.len() => (p[i - 1], p[i]),
            _ if p.len() == 1 => return p[0].1 * t as f64 / p[0].0 as f64,
            _ => (p[p.len() - 2], p[p.len() - 1]),
        };
        let f = (t as f64 - lo.0 as f64) / (hi.0 - lo.0) as f64;
        lo.1 + f * (hi.1 - lo.1)
    }

    /// A round's µs when it verifies T tokens: the forward t(T) and the drafter's round.
    pub(crate) fn round_us(&self, t: usize) -> f64 {
        self.us(t) + self.draft_us
    }

    /// The speed-up over greedy decoding (one forward t(1) a token) of rounds that verify T tokens
    /// and accept `tau` of them, the root counted: `tau · t(1) / (t(T) + draft_us)`. Host work
    /// outside the forward and the drafter (the tree, the walk) is not counted.
    pub fn speedup(&self, tau: f64, t: usize) -> f64 {
        tau * self.us(1) / self.round_us(t)
    }

    /// How many of a best-first tree's nodes to verify: `scores` are its nodes' log q(prefix) in pop
    /// order (so every prefix of them is a tree, and the best one of its size). Verifying b nodes
    /// accepts 1 + Σ_{i<b} q_i tokens in expectation (the root always, node i when its whole path is
    /// right) in a round of `Self::round_us(b + 1)`; the b with the most tokens per µs wins, the
    /// smaller on a tie. The drafter's round is paid whatever b is (it ran before the choice).
    ///
    /// Only the sizes the model measured are candidates (T = b + 1 one of its points), and b = 0, one
    /// greedy step: their prices are measured, not interpolated, and a size that recurs from round
    /// to round replays one recorded CUDA graph, where a new size each round would run eagerly and be
    /// recorded again.
    pub fn choose(&self, scores: &[f64]) -> usize {
        let mut expected = 1.0;
        let mut best = (expected / self.round_us(1), 0);
        for (i, s) in scores.iter().enumerate() {
            expected += s.exp();
            let rate = expected / self.round_us(i + 2);
            if rate > best.0 && self.measured(i + 2) {
                best = (rate, i + 1);
            }
        }
        best.1
    }

    /// Whether T is one of the measured points.
    pub fn measured(&self, t: usize) -> bool {
        self.points.binary_search_by_key(&t, |&(pt, _)| pt).is_ok()
    }

    /// The largest tree a round can choose: the last point's T less the root.
    pub(crate) fn max_nodes(&self) -> usize {
        self.points.last().map_or(0, |&(t, _)| t - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(points: Vec<(usize, f64)>) -> CostModel {
        CostModel::new("gpu".into(), "m".into(), points).unwrap()
    }

    #[test]
    fn time_interpolates_and_extrapolates() {
        let m = model(vec![(1, 100.0), (4, 160.0), (8, 400.0)]);
        assert_eq!(m.us(1), 100.0);
        assert_eq!(m.us(2), 120.0);
        assert_eq!(m.us(6), 280.0);
        assert_eq!(m.us(12), 640.0);
        assert_eq!(model(vec![(2, 50.0)]).us(6), 150.0);
        assert!(CostModel::new("g".into(), "m".into(), vec![(4, 1.0), (2, 1.0)]).is_err());
        assert!(CostModel::new("g".into(), "m".into(), vec![(1, f64::NAN)]).is_err());
    }

    #[test]
    fn files_round_trip_and_bad_ones_name_themselves() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new folder").join("cost.json");
        let m = model(vec![(1, 100.0), (4, 160.0)]).with_draft_us(12.5).unwrap();
        m.save(&path).unwrap();
        assert_eq!(CostModel::load(&path).unwrap(), m);
        // A file from before the drafter's round was measured: none.
        std::fs::write(&path, r#"{"device": "g", "model": "m", "points": [[1, 100.0]]}"#).unwrap();
        assert_eq!(CostModel::load(&path).unwrap().draft_us, 0.0);
        std::fs::write(&path, "{not json").unwrap();
        let e = CostModel::load(&path).unwrap_err().to_string();
        assert!(e.contains("cost.json is not a usable cost model: key must be a string"), "{e}");
        let missing = CostModel::load(&dir.path().join("none.json")).unwrap_err().to_string();
        assert!(missing.contains("none.json"), "{missing}");
    }

    #[test]
    fn a_flat_cost_takes_every_likely_node_and_a_steep_one_stops_early() {
        let scores = [0.9f64.ln(), 0.8f64.ln(), 0.7f64.ln(), 0.01f64.ln()];
        let every = |us: [f64; 5]| model((1..=5).zip(us).collect());
        // Free extra rows: every node adds tokens.
        assert_eq!(every([100.0; 5]).choose(&scores), 4);
        // Each row doubles the cost: one token per forward is the best rate.
        assert_eq!(every([100.0, 200.0, 300.0, 400.0, 500.0]).choose(&scores), 0);
        // A mild slope: the three likely nodes pay (1 + 2.4 tokens for 130 µs), the unlikely one not.
        assert_eq!(every([100.0, 110.0, 120.0, 130.0, 140.0]).choose(&scores), 3);
        assert_eq!(model(vec![(1, 100.0)]).choose(&[]), 0);
        assert_eq!((every([1.0; 5]).max_nodes(), model(vec![(1, 100.0), (8, 100.0)]).max_nodes()), (4, 7));
    }

    #[test]
    fn a_drafter_round_paid_every_round_makes_larger_trees_pay() {
        let scores = [0.9f64.ln(), 0.8f64.ln(), 0.7f64.ln(), 0.01f64.ln()];
        let steep = model((1..=5).zip([100.0, 200.0, 300.0, 400.0, 500.0]).collect());
        assert_eq!(steep.choose(&scores), 0);
        // With 1000 µs of drafting a round, 3.4 tokens for 1400 µs beat 1 for 1100.
        let drafted = steep.clone().with_draft_us(1000.0).unwrap();
        assert_eq!((drafted.round_us(4), drafted.choose(&scores)), (1400.0, 3));
        // tau 3 at T = 4: 3 x 100 / 1400.
        assert!((drafted.speedup(3.0, 4) - 300.0 / 1400.0).abs() < 1e-12);
        assert_eq!(steep.speedup(3.0, 1), 3.0);
        assert!(steep.clone().with_draft_us(f64::NAN).is_err() && steep.with_draft_us(-1.0).is_err());
    }

    #[test]
    fn only_measured_sizes_are_chosen() {
        let scores = [0.9f64.ln(), 0.1f64.ln(), 0.05f64.ln()];
        // Interpolated, b = 1 (T = 2, 133 µs, 1.9 tokens) would be the best rate; T = 4 is the first
        // size measured past T = 1, and it beats one greedy step (2.05 tokens for 200 µs).
        let m = model(vec![(1, 100.0), (4, 200.0)]);
        assert!(m.measured(4) && !m.measured(2));
        assert_eq!(m.choose(&scores), 3);
        // Too few nodes for a measured size: a greedy step.
        assert_eq!(m.choose(&scores[..2]), 0);
    }
}
