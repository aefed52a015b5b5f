//! `bench --spec --drafter dflash`: a model drafter's round timed beside the target's verify forward,
//! and what the cost model makes of it.
//!
//! A round is all a drafter does between two verifications: for DFlash, the block embedded by the
//! target, the drafter's layers over its context and the block, the target's LM head, the softmax
//! and the per-depth top-K the tree builder reads. Committing the accepted tokens' features (the
//! context's keys and values) is not in it: it is a few rows a round, not a block.

use std::time::Instant;

use kdtree_jit::tune::bench::Timing;
use serde::Serialize;

use super::{CostModel, DflashModel, Drafter};
use crate::error::{EngineError, Result};
use crate::model::Model;
use crate::registry::Backend;

/// A drafter's round, timed on the host's clock (the target's part of it ends with its results on
/// the host, so nothing is left queued).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RoundTiming {
    /// The drafter's kind (`dflash`).
    pub drafter: String,
    /// Tokens committed to the drafter before the timed rounds: the prompt's.
    pub context: usize,
    /// Depths each round drafted, and candidates kept per depth.
    pub depths: usize,
    pub top_k: usize,
    pub median_us: f64,
    pub p10_us: f64,
    pub p90_us: f64,
    pub reps: u32,
    /// Of the round, the median of the model's forward alone, to the LM head's logits ([`time_forward`]);
    /// the rest is the softmax and the top-K and reading them back. `None` where it was not measured.
    pub forward_median_us: Option<f64>,
}

/// Times `reps` rounds of `drafter` (after one untimed) after `prompt`: the target prefills the
/// prompt and hands the drafter its tokens' features, then each round drafts `len` positions after
/// the prefill's greedy token, each cut to its best `top_k`. Every round drafts from the same state.
pub fn time_rounds<B: Backend>(
    target: &Model<B>,
    drafter: &mut dyn Drafter<B>,
    name: &str,
    prompt: &[u32],
    (len, top_k): (usize, usize),
    reps: usize,
) -> Result<RoundTiming> {
    check_timing("timing a drafter's round", prompt, reps)?;
    let mut cache = target.new_cache();
    let layers = drafter.target_layers().to_vec();
    let bonus = target.prefill_tapped(&mut cache, prompt, &layers, |taps| drafter.commit(taps))?;
    let mut depths = 0;
    let t = host_timed(reps, || {
        depths = drafter.draft(prompt, bonus, len, top_k)?.len();
        Ok(())
    })?;
    Ok(RoundTiming {
        drafter: name.into(),
        context: prompt.len(),
        depths,
        top_k,
        median_us: t.median_us,
        p10_us: t.p10_us,
        p90_us: t.p90_us,
        reps: t.reps,
        forward_median_us: None,
    })
}

/// The median µs of `reps` forwards of the DFlash drafter `model` (after one untimed) from the same
/// state as [`time_rounds`]'s rounds: the block embedded by the target, the drafter's layers, the
/// target's LM head; no softmax, no top-K. Each rep ends by reading back the rows' argmax, a sync
/// that moves a few bytes.
pub fn time_forward<B: Backend>(target: &Model<B>, model: &DflashModel<B>, prompt: &[u32], reps: usize) -> Result<f64> {
    check_timing("timing a drafter's forward", prompt, reps)?;
    let mut cache = target.new_cache();
    let mut context = model.new_context()?;
    let layers = &model.config.target_layer_ids;
    let bonus = target.prefill_tapped(&mut cache, prompt, layers, |taps| model.extend_context(&mut context, taps))?;
    let forward = || target.backend().argmax(&model.block_logits(target, &context, bonus)?).map(drop);
    Ok(host_timed(reps, forward)?.median_us)
}

/// `reps` runs of `run` on the host's clock, after one untimed (warm-up) run.
fn host_timed(reps: usize, mut run: impl FnMut() -> Result<()>) -> Result<Timing> {
    run()?;
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        run()?;
        samples.push(start.elapsed().as_secs_f64() * 1e6);
    }
    Ok(Timing::from_samples(samples))
}

/// The round beside the target's verify forward of T tokens at the same context.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BesideVerify {
    pub t: usize,
    pub verify_us: f64,
    /// The drafter's round over the verify forward's time.
    pub round_share: f64,
}

/// The round beside each forward `cost` measured.
pub fn beside_verify(cost: &CostModel, round_us: f64) -> Vec<BesideVerify> {
    cost.points.iter().map(|&(t, us)| BesideVerify { t, verify_us: us, round_share: round_us / us }).collect()
}

/// The cost model's speed-up for an assumed acceptance length.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Estimate {
    /// Tokens accepted a round, the root counted.
    pub tau: f64,
    /// Tokens verified a round.
    pub t: usize,
    /// [`CostModel::speedup`]: the drafter's round counted.
    pub speedup: f64,
    /// The same without the drafter's round: what a free drafter would give.
    pub speedup_free_drafter: f64,
}

/// The speed-ups of rounds verifying `t` tokens at each acceptance length of `taus`.
pub fn estimates(cost: &CostModel, taus: &[f64], t: usize) -> Vec<Estimate> {
    let free = CostModel { draft_us: 0.0, ..cost.clone() };
    taus.iter()
        .map(|&tau| Estimate { tau, t, speedup: cost.speedup(tau, t), speedup_free_drafter: free.speedup(tau, t) })
        .collect()
}

/// A table for people: the round, then the round beside each verify forward, then the estimates.
pub fn table(round: &RoundTiming, beside: &[BesideVerify], estimates: &[Estimate]) -> String {
    let mut out = format!(
        "{} drafter round after {} tokens of context ({} depths, top {} each): median {:.1} us (p10 {:.1}, p90 {:.1}, \
         {} reps)\n",
        round.drafter,
        round.context,
        round.depths,
        round.top_k,
        round.median_us,
        round.p10_us,
        round.p90_us,
        round.reps
    );
    if let Some(forward) = round.forward_median_us {
        out += &format!(
            "  of which the forward to logits on the host {forward:.1} us, softmax and top-K {:.1} us\n",
            round.median_us - forward
        );
    }
    let mut t = crate::table::table(&["T (verified tokens)", "verify us", "round us", "round / verify"], &[0, 1, 2, 3]);
    for b in beside {
        t.add_row(vec![
            b.t.to_string(),
            format!("{:.1}", b.verify_us),
            format!("{:.1}", round.median_us),
            format!("{:.1}%", 100.0 * b.round_share),
        ]);
    }
    out += &format!("{t}\n");
    if !estimates.is_empty() {
        let header = ["assumed tau", "T", "estimated speedup", "with a free drafter"];
        let mut t = crate::table::table(&header, &[0, 1, 2, 3]);
        for e in estimates {
            t.add_row(vec![
                format!("{:.2}", e.tau),
                e.t.to_string(),
                format!("{:.2}x", e.speedup),
                format!("{:.2}x", e.speedup_free_drafter),
            ]);
        }
        out += &format!("cost model: tau x t(1) / (t(T) + round)\n{t}\n");
    }
    out
}

/// A timing needs a prompt to prefill and at least one rep to time.
fn check_timing(op: &'static str, prompt: &[u32], reps: usize) -> Result<()> {
    if prompt.is_empty() {
        return Err(EngineError::EmptyPrompt { op });
    }
    if reps == 0 {
        return Err(EngineError::ArgumentOutOfRange {
            what: format!("{op}'s reps"),
            value: 0,
            limit: "at least 1".into(),
        });
    }
    Ok(())
}
