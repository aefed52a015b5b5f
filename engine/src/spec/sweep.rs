//! `bench --spec`: greedy decoding, chain speculation and DDTree (fixed and cost-aware sizes) on one
//! model and prompt, with the noisy oracle as the drafter at several accuracies, or with a model
//! drafter (DFlash), every output checked against greedy decoding's.

use serde::Serialize;

use super::{CostModel, Drafter, Method, NoisyOracle, TreeLimits, speculative_generate};
use crate::error::Result;
use crate::generate::{Generation, greedy_generate_timed, rate};
use crate::model::Model;
use crate::registry::Backend;

/// The methods of a sweep: chains of 2..=8, DDTree of 4, 8, .. `max_budget` nodes, and, with a cost
/// model, DDTree sized per round up to `max_budget`; trees `draft_len` deep.
pub fn methods(max_budget: usize, draft_len: usize, cost: Option<&CostModel>) -> Vec<Method> {
    let chains = (2..=8).map(|len| Method::Chain { len });
    let budgets = std::iter::successors(Some(4usize), |b| b.checked_mul(2)).take_while(|&b| b <= max_budget);
    let trees = budgets.map(|budget| Method::Tree(TreeLimits { budget, draft_len }));
    let aware =
        cost.map(|c| Method::CostAware { limits: TreeLimits { budget: max_budget, draft_len }, cost: c.clone() });
    chains.chain(trees).chain(aware).collect()
}

/// The methods of a sweep with a drafter that drafts at most `depth` positions a round (a DFlash
/// block's masks), each round costing a forward of the drafter: the chain of its depth, DDTree of
/// `max_budget` nodes, and with a cost model, DDTree sized per round up to `max_budget`.
pub fn drafter_methods(max_budget: usize, depth: usize, cost: Option<&CostModel>) -> Vec<Method> {
    let limits = TreeLimits { budget: max_budget, draft_len: depth };
    let aware = cost.map(|c| Method::CostAware { limits, cost: c.clone() });
    [Method::Chain { len: depth }, Method::Tree(limits)].into_iter().chain(aware).collect()
}

/// One method at one oracle accuracy.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SpecRow {
    pub method: String,
    /// `noisy-oracle`, a model drafter's kind (`dflash`), or `-` for greedy decoding.
    pub drafter: String,
    /// The oracle's p; `None` for greedy decoding and for a model drafter.
    pub p: Option<f64>,
    /// Tokens after the first (which the prefill yields) per second of the rounds that made them.
    pub decode_tokens_per_s: f64,
    /// Against greedy decoding in the same run.
    pub speedup: f64,
    /// What the cost model predicts for this row's tau and mean tree size ([`CostModel::speedup`],
    /// its drafter round counted), set by [`estimate`]; `None` for greedy decoding.
    pub estimated_speedup: Option<f64>,
    pub tau: f64,
    pub forwards_per_token: f64,
    pub mean_tree_size: f64,
    /// Of the rounds' time, the share outside the target forwards.
    pub host_share: f64,
    /// The output equals greedy decoding's, token for token.
    pub identical: bool,
}

/// Runs greedy decoding of `tokens` after `prompt`, then every method at every p, the noisy oracle
/// (seeded with `seed`) reading greedy decoding's output.
pub fn compare<B: Backend>(
    target: &Model<B>,
    prompt: &[u32],
    tokens: usize,
    ps: &[f64],
    methods: &[Method],
    seed: u64,
    mut progress: impl FnMut(&SpecRow),
) -> Result<Vec<SpecRow>> {
    let greedy = greedy_generate_timed(target, prompt, tokens, &[])?;
    let mut rows = vec![greedy_row(&greedy)];
    progress(&rows[0]);
    let truth: Vec<u32> = prompt.iter().chain(&greedy.tokens).copied().collect();
    for &p in ps {
        for method in methods {
            let mut oracle = NoisyOracle::new(truth.clone(), p, seed, target.config.vocab_size)?;
            let row = method_row(target, &mut oracle, prompt, &greedy, method, ("noisy-oracle", Some(p)))?;
            progress(&row);
            rows.push(row);
        }
    }
    Ok(rows)
}

/// Runs greedy decoding of `tokens` after `prompt`, then every method with a fresh drafter from
/// `drafter` (a model drafter, named `name` in the rows).
pub fn compare_drafter<'d, B: Backend>(
    target: &Model<B>,
    prompt: &[u32],
    tokens: usize,
    methods: &[Method],
    name: &str,
    mut drafter: impl FnMut() -> Result<Box<dyn Drafter<B> + 'd>>,
    mut progress: impl FnMut(&SpecRow),
) -> Result<Vec<SpecRow>> {
    let greedy = greedy_generate_timed(target, prompt, tokens, &[])?;
    let mut rows = vec![greedy_row(&greedy)];
    progress(&rows[0]);
    for method in methods {
        let row = method_row(target, drafter()?.as_mut(), prompt, &greedy, method, (name, None))?;
        progress(&row);
        rows.push(row);
    }
    Ok(rows)
}

/// Sets every speculative row's [`SpecRow::estimated_speedup`]: `cost`'s speed-up at the row's tau,
/// verifying its mean tree size (rounded) plus the root a round.
pub fn estimate(rows: &mut [SpecRow], cost: &CostModel) {
    for r in rows.iter_mut().filter(|r| r.method != "greedy") {
        r.estimated_speedup = Some(cost.speedup(r.tau, r.mean_tree_size.round() as usize + 1));
    }
}

fn greedy_row(greedy: &Generation) -> SpecRow {
    SpecRow {
        method: "greedy".into(),
        drafter: "-".into(),
        p: None,
        decode_tokens_per_s: greedy.decode_tokens_per_s(),
        speedup: 1.0,
        estimated_speedup: None,
        tau: 1.0,
        forwards_per_token: 1.0,
        mean_tree_size: 0.0,
        host_share: 0.0,
        identical: true,
    }
}

/// One speculative run of `method` with `drafter`, beside greedy decoding's `greedy`; `(name, p)`
/// name the drafter in the row.
fn method_row<B: Backend>(
    target: &Model<B>,
    drafter: &mut dyn Drafter<B>,
    prompt: &[u32],
    greedy: &Generation,
    method: &Method,
    (name, p): (&str, Option<f64>),
) -> Result<SpecRow> {
    let (out, stats) = speculative_generate(target, drafter, prompt, greedy.tokens.len(), method, &[])?;
    let rounds_s = stats.elapsed.saturating_sub(stats.prefill_time).as_secs_f64();
    // The first token comes from the prefill, as in greedy decoding.
    let tps = rate(stats.generated.saturating_sub(1), rounds_s);
    Ok(SpecRow {
        method: method.label(),
        drafter: name.into(),
        p,
        decode_tokens_per_s: tps,
        speedup: tps / greedy.decode_tokens_per_s().max(f64::MIN_POSITIVE),
        estimated_speedup: None,
        tau: stats.tau(),
        forwards_per_token: stats.forwards_per_token(),
        mean_tree_size: stats.mean_tree_size(),
        host_share: stats.host_share(),
        identical: out == greedy.tokens,
    })
}

/// A table for people.
pub fn table(rows: &[SpecRow]) -> String {
    let header =
        ["method", "drafter", "p", "tokens/s", "speedup", "estimated", "tau", "fwd/tok", "tree", "host %", "identical"];
    let mut t = crate::table::table(&header, &[2, 3, 4, 5, 6, 7, 8, 9]);
    for r in rows {
        t.add_row(vec![
            r.method.clone(),
            r.drafter.clone(),
            r.p.map_or("-".into(), |p| format!("{p:.2}")),
            format!("{:.1}", r.decode_tokens_per_s),
            format!("{:.2}x", r.speedup),
            r.estimated_speedup.map_or("-".into(), |s| format!("{s:.2}x")),
            format!("{:.2}", r.tau),
            format!("{:.3}", r.forwards_per_token),
            format!("{:.1}", r.mean_tree_size),
            format!("{:.1}", 100.0 * r.host_share),
            if r.identical { "yes" } else { "NO" }.into(),
        ]);
    }
    format!("{t}\n")
}
